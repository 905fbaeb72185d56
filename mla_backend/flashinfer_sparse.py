"""FlashInfer's sparse MLA call (``sparse_mla_top_k > 0``, DeepSeek-V3.2 / GLM-5) on the bundled sparse
kernels, with FlashInfer's meaning (flashinfer/mla/_core.py, its SM120 sparse path, which vLLM's
FLASHINFER_MLA_SPARSE_SM120 backend calls):

- ``query`` bf16 [B, q_len, H, 576]; ``block_tables`` int32 [B, q_len, sparse_mla_top_k] of slot ids
  (page id x page size + offset), any negative id an empty entry (as every id outside the cache);
  ``kv_cache`` uint8 fp8_ds_mla [pages, page, 656] or [pages, 1, page, 656] (or bf16 rows of 576);
- ``seq_lens`` are each query token's list length: [B, q_len] or B x q_len values; None, or B values
  with q_len > 1 (which FlashInfer drops), means every list is whole. ``sparse_mla_top_k_lens``
  (FlashInfer's name for the same on its NoPE path) is taken as the lengths where given;
- ``bmm1_scale`` is the softmax scale; ``bmm2_scale`` must be 1.0 (FlashInfer's rule); ``max_seq_len``
  is unused;
- ``kv_scale_format`` ("auto", "pow2_fp32", "arbitrary_fp32"): the stored fp32 scales are applied as
  they are in every format (FlashInfer's pow2 kernel keeps only their exponent: the same result on the
  power-of-two scales DeepSeek's quantiser writes);
- the LSE is base 2 (``return_lse_base`` may ask for base e), [B * q_len, H] or [B, q_len, H], and
  -1e30 for a token whose list names no row, as FlashInfer's sparse kernel writes.
"""

from __future__ import annotations

import torch

from .config import MLABackendConfig
from .flashinfer_api import LOG2E
from .sparse import sparse_mla_decode

EMPTY_ROW_LSE = -1e30  # FlashInfer's sparse kernels' LSE of a row that sees no key


def sparse_lengths(
    seq_lens: torch.Tensor | None, top_k_lens: torch.Tensor | None, batch: int, q_len: int
) -> torch.Tensor | None:
    """Each query token's list length in FlashInfer's reading, or None (every list whole)."""
    lens = top_k_lens if top_k_lens is not None else seq_lens
    if lens is None:
        return None
    if not isinstance(lens, torch.Tensor) or lens.dtype != torch.int32:
        raise TypeError("with sparse_mla_top_k, seq_lens / sparse_mla_top_k_lens must be int32 tensors or None")
    if lens.numel() == batch * q_len:
        return lens.reshape(batch * q_len)
    if top_k_lens is None and q_len > 1 and lens.numel() == batch:
        return None  # FlashInfer drops [B] lengths at q_len > 1: every list counts whole
    raise ValueError(
        f"with sparse_mla_top_k, the lengths are per query token: {batch * q_len} values ([B, q_len]), "
        f"got shape {tuple(lens.shape)}"
    )


def run_flashinfer_sparse(
    *,
    query,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor | None,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor | None,
    sparse_mla_top_k: int,
    sparse_mla_top_k_lens: torch.Tensor | None,
    out: torch.Tensor | None,
    bmm1_scale,
    bmm2_scale,
    enable_pdl: bool | None,
    lse: torch.Tensor | None,
    return_lse: bool,
    return_lse_base: str | None,
    config: MLABackendConfig | None,
):
    """One FlashInfer sparse call (arguments as FlashInfer's); returns ``out`` or ``(out, lse)``."""
    if isinstance(query, (tuple, list)):
        query = torch.cat(tuple(query), dim=-1)
    if not isinstance(query, torch.Tensor) or query.dim() != 4:
        raise ValueError("with sparse_mla_top_k the query must be [B, q_len, H, 576] (or its split pair)")
    if isinstance(kv_cache, (tuple, list)):
        raise ValueError("with sparse_mla_top_k the cache is one tensor: fp8_ds_mla [pages, page, 656] or bf16 rows")
    if not isinstance(bmm2_scale, (int, float)) or isinstance(bmm2_scale, bool) or float(bmm2_scale) != 1.0:
        raise ValueError(f"with sparse_mla_top_k, bmm2_scale must be 1.0 (FlashInfer's rule), got {bmm2_scale!r}")
    batch, q_len = query.shape[:2]
    if not isinstance(block_tables, torch.Tensor) or tuple(block_tables.shape) != (batch, q_len, sparse_mla_top_k):
        raise ValueError(
            f"with sparse_mla_top_k={sparse_mla_top_k}, block_tables must be the index lists "
            f"[B={batch}, q_len={q_len}, {sparse_mla_top_k}], got "
            f"{tuple(block_tables.shape) if isinstance(block_tables, torch.Tensor) else type(block_tables).__name__}"
        )
    lens = sparse_lengths(seq_lens, sparse_mla_top_k_lens, batch, q_len)
    wants_lse = return_lse or lse is not None
    result = sparse_mla_decode(
        query, kv_cache, block_tables, bmm1_scale, topk_lens=lens, out=out, lse=lse, return_lse=wants_lse,
        workspace_buffer=workspace_buffer, enable_pdl=enable_pdl, config=config,
    )  # fmt: skip
    if not wants_lse:
        return result
    result_out, result_lse = result
    if (return_lse_base or "base2") == "base2":
        result_lse.mul_(LOG2E)
    result_lse.masked_fill_(torch.isneginf(result_lse), EMPTY_ROW_LSE)
    return (result_out, result_lse) if return_lse else result_out
