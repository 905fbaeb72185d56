"""Float64 reference for paged MLA decode: the contract every kernel is checked against.

logits = (q . k) * bmm1_scale on the stored values (fp8 is dequantised exactly to float64);
out = softmax(logits) . v * bmm2_scale, with v = k[..., :kv_lora_rank].
Query token i of a request with q_len tokens sees KV positions 0 .. seq_len - q_len + i.
A row that sees no key yields zeros and LSE -inf.

sparse_mla_reference: the same softmax over the cache rows each token's top-k slot ids name (DeepSeek
Sparse Attention), out = softmax(q . k * sm_scale) . k[..., :v_dim].
"""

from __future__ import annotations

import math

import torch

from .shapes import pages_view, ragged_rows
from .sparse_cache import unpack_fp8_ds_mla

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


# Elements of gathered float64 keys one step of sparse_mla_reference holds (256 MiB): T x K x 576 at
# T = 256, K = 4096 would take 4.8 GB at once.
SPARSE_GATHER_ELEMENTS = 1 << 25


def _sparse_valid(indices: torch.Tensor, num_rows: int, topk_lens: torch.Tensor | None) -> torch.Tensor:
    """bool [T, K]: the entries that name a row of the cache and lie within their token's topk_lens."""
    valid = (indices >= 0) & (indices < num_rows)
    if topk_lens is not None:
        positions = torch.arange(indices.shape[1], device=indices.device)
        valid &= positions[None, :] < topk_lens.to(indices.device, torch.long)[:, None]
    return valid


def sparse_mla_reference(
    query: torch.Tensor,
    kv_rows: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | torch.Tensor,
    topk_lens: torch.Tensor | None = None,
    v_dim: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode (DeepSeek Sparse Attention): each query token attends to the cache rows its
    top-k indices name. Returns (out float64 [T, H, v_dim], lse float64 [T, H], natural log) on
    query's device.

    query [T, H, 576] of any float dtype; kv_rows [N, 576] dequantised rows, or the uint8 [N, 656]
    fp8_ds_mla rows a sparse kernel reads (dequantised here, exactly); indices int [T, K] slot ids into
    kv_rows. An entry < 0 or >= N is masked, as is any at a position >= topk_lens[t] when topk_lens [T]
    is given. out = softmax(q . k * sm_scale) . k[:, :v_dim].
    A valid slot id listed twice counts twice, as a kernel that reads each entry reads it twice.
    A token with no valid entry gets zeros and LSE -inf.
    """
    if kv_rows.dtype == torch.uint8:
        kv_rows = unpack_fp8_ds_mla(kv_rows)
    if query.dim() != 3 or kv_rows.dim() != 2 or query.shape[-1] != kv_rows.shape[-1]:
        raise ValueError(f"need query [T, H, D] and kv_rows [N, D], got {tuple(query.shape)}, {tuple(kv_rows.shape)}")
    if indices.dim() != 2 or indices.shape[0] != query.shape[0] or indices.is_floating_point():
        raise ValueError(f"indices must be integer [T={query.shape[0]}, K], got {indices.dtype} {tuple(indices.shape)}")
    if topk_lens is not None and tuple(topk_lens.shape) != (query.shape[0],):
        raise ValueError(f"topk_lens must be [T={query.shape[0]}], got {tuple(topk_lens.shape)}")
    if not 0 < v_dim <= kv_rows.shape[-1]:
        raise ValueError(f"v_dim must lie in 1..{kv_rows.shape[-1]}, got {v_dim}")
    device = query.device
    tokens, heads, dim = query.shape
    slots = indices.to(device, torch.long)
    valid = _sparse_valid(slots, kv_rows.shape[0], topk_lens)
    safe = slots.masked_fill(~valid, 0)  # masked entries read row 0 (if any) and then weigh nothing
    keys = kv_rows.to(device, torch.float64)
    if keys.shape[0] == 0:  # nothing to read: every entry is masked, one row of zeros stands in
        keys = torch.zeros(1, dim, dtype=torch.float64, device=device)
    q = query.to(torch.float64)
    out = torch.zeros(tokens, heads, v_dim, dtype=torch.float64, device=device)
    lse = torch.full((tokens, heads), -math.inf, dtype=torch.float64, device=device)
    step = max(1, SPARSE_GATHER_ELEMENTS // max(1, slots.shape[1] * dim))
    for start in range(0, tokens, step):
        part = slice(start, start + step)
        count = safe[part].shape[0]
        gathered = keys.index_select(0, safe[part].reshape(-1)).view(count, slots.shape[1], dim)  # [t, K, D]
        # Masked entries weigh nothing, and their stand-in row (row 0, NaN in a poisoned cache) adds nothing.
        gathered.masked_fill_(~valid[part, :, None], 0.0)
        logits = torch.matmul(q[part], gathered.mT).mul_(scale_value(sm_scale))  # [t, H, K]
        logits.masked_fill_(~valid[part, None, :], -math.inf)
        part_lse = torch.logsumexp(logits, dim=-1)  # -inf where a token has no valid entry
        # In place: at T x H x K = 2^27 logits each extra pass costs seconds. A token with no valid entry
        # subtracts 0, so its weights are exp(-inf) = 0 rather than NaN.
        probs = logits.sub_(part_lse.masked_fill(torch.isneginf(part_lse), 0.0)[..., None]).exp_()
        out[part] = torch.matmul(probs, gathered[..., :v_dim])
        lse[part] = part_lse
    return out, lse
