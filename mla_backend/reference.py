"""Float64 reference for paged MLA decode: the contract every kernel is checked against.

logits = (q . k) * bmm1_scale on the stored values (fp8 is dequantised exactly to float64);
out = softmax(logits) . v * bmm2_scale, with v = k[..., :kv_lora_rank].
Query token i of a request with q_len tokens sees KV positions 0 .. seq_len - q_len + i.
A row that sees no key yields zeros and LSE -inf.
"""

from __future__ import annotations

import math

import torch

from .shapes import pages_view, ragged_rows

# Largest relative L2 error of one (request, token, head) output row a kernel may show against this
# reference, by KV dtype (fp8 results are judged against the dequantised inputs).
ROW_ERROR_TOLERANCE = {torch.float8_e4m3fn: 2e-2, torch.bfloat16: 5e-3}
# Largest |LSE - reference| of a row: LSE_ABS_TOLERANCE + LSE_REL_TOLERANCE x |reference|
# (vLLM's Triton MLA returns the LSE in bf16).
LSE_ABS_TOLERANCE = 1e-2
LSE_REL_TOLERANCE = 2.0**-8


def scale_value(scale: float | torch.Tensor) -> float:
    return float(scale.item()) if isinstance(scale, torch.Tensor) else float(scale)


def visible_lengths(seq_len: int, q_len: int, causal: bool = True) -> list[int]:
    """Number of KV positions query token i (0-based) may attend to."""
    return [max(0, seq_len - q_len + i + 1) if causal else seq_len for i in range(q_len)]


def mla_decode_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    bmm1_scale: float | torch.Tensor = 1.0,
    bmm2_scale: float | torch.Tensor = 1.0,
    kv_lora_rank: int = 512,
    *,
    kv_indptr: torch.Tensor | None = None,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out float64 [B, q_len, H, kv_lora_rank], lse float64 [B, q_len, H]) on query's device.
    ``kv_indptr``: ``block_tables`` holds FlashInfer's ragged page ids (shapes.ragged_rows)."""
    batch, q_len, heads, _ = query.shape
    cache = pages_view(kv_cache)
    page_size = cache.shape[1]
    s1, s2 = scale_value(bmm1_scale), scale_value(bmm2_scale)
    device = query.device
    out = torch.zeros(batch, q_len, heads, kv_lora_rank, dtype=torch.float64, device=device)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=torch.float64, device=device)
    lengths = seq_lens.tolist()
    rows = ragged_rows(block_tables, kv_indptr)
    for b in range(batch):
        seq_len = int(lengths[b])
        if seq_len == 0:
            continue
        num_pages = -(-seq_len // page_size)
        pages = rows[b][:num_pages].to(device=cache.device, dtype=torch.long)
        keys = cache[pages].reshape(-1, cache.shape[-1])[:seq_len].to(device, torch.float64)
        q = query[b].to(torch.float64)  # [q_len, H, D]
        logits = torch.einsum("thd,ld->thl", q, keys) * s1
        limit = torch.tensor(visible_lengths(seq_len, q_len, causal), device=device)
        hidden = torch.arange(seq_len, device=device)[None, :] >= limit[:, None]  # [q_len, L]
        logits = logits.masked_fill(hidden[:, None, :], -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # -inf where a row sees nothing
        probs = torch.exp(logits - row_lse[..., None]).nan_to_num(0.0)
        out[b] = torch.einsum("thl,ld->thd", probs, keys[:, :kv_lora_rank]) * s2
        lse[b] = row_lse
    return out, lse
