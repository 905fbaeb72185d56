"""The lightning indexer's logits without DeepGEMM (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5).

vLLM's sparse-attention indexer scores every cached token for every query token with DeepGEMM, then
keeps the top 2048 with its own top-k kernels. These are DeepGEMM's scoring functions in plain torch
(any device), with DeepGEMM 2.5.0's signatures as vLLM 0.26 vendors and calls them, FP8 only:

    logits[t, s] = (sum_h weights[t, h] * relu(q[t, h] . k[s])) * k_scale[s]       (float32)

q and k are e4m3 values (q's own scale is folded into ``weights`` by vLLM), k_scale the fp32 scale the
cache stores per token; applying it after the head sum equals relu(q . k * k_scale) for the positive
scales vLLM writes. Row t scores positions [start, end) only; every other logit is -inf (DeepGEMM's
``clean_logits=True``; with False DeepGEMM leaves them unwritten and vLLM's top-k never reads them).

- ``fp8_fp4_mqa_logits`` (prefill): K ragged [N, D] with scales [N]; row t's range is
  [cu_seq_len_k_start[t], cu_seq_len_k_end[t]); logits [M, N] (or [M, max_seqlen_k], column j being
  position start + j).
- ``fp8_fp4_paged_mqa_logits`` (decode): K in the paged index cache; q [B, next_n, H, D], logits
  [B * next_n, max_context_len]; row (b, j) scores [0, end) with end = context_lens[b, j] (2-D, what
  vLLM 0.26 passes) or context_lens[b] - next_n + j + 1 (1-D, causal within the draft tokens).
- ``get_paged_mqa_logits_metadata``: the schedule tensor's shape and dtype; the paged function here
  does not read it.

The index cache (vLLM's indexer_k_quant_and_cache writes it): per block of ``block_size`` tokens,
block_size x D e4m3 values, token-major, then block_size fp32 scales; 132 bytes a token for D = 128,
shaped [num_blocks, block_size, 1, D + 4] uint8 as DeepGEMM takes it.

On a GPU with Triton, both functions run ``mla_backend.indexer_triton``'s kernels (decode reads each
request's length on the device, so a captured CUDA graph scores only the blocks in use). Elsewhere (CPU,
no Triton, shapes those kernels do not take) they run in torch, in tiles whose temporaries stay near
TILE_BYTES, the largest being the [rows, heads, columns] fp32 scores (vLLM's DeepSeek-V3.2: 64 heads,
up to 163840 positions). The torch prefill reads its ranges' bounds on the host (vLLM runs prefill
eagerly); the torch decode does so only outside CUDA-graph capture, and under capture scores every
block of the table.
"""

from __future__ import annotations

import functools

import torch

TILE_BYTES = 64 << 20
MIN_TILE_COLUMNS = 512  # prefill rows a tile takes are capped so a tile spans at least this many columns
NEG_INF = float("-inf")


def fp8_fp4_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seq_len_k_start: torch.Tensor,
    cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
    logits_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Prefill logits over ragged K: q (values [M, H, D] fp8, None), kv (k [N, D] fp8, scales [N] or
    [N, 1] fp32), weights [M, H] fp32, per-row ranges [M] int32. Masked logits are -inf whatever
    clean_logits says."""
    q_values = _fp8_query(q)
    k, k_scale = kv
    rows, heads, dim = q_values.shape
    n = k.shape[0]
    _check_shapes(k.shape[-1] == dim and weights.shape == (rows, heads), q_values, k, weights)
    k_scale = k_scale.reshape(n).float()
    starts = cu_seq_len_k_start.long().clamp(0, n)
    ends = torch.maximum(cu_seq_len_k_end.long().clamp(0, n), starts)
    width = max_seqlen_k if max_seqlen_k > 0 else n
    if _triton_serves(q_values, heads, dim):
        from . import indexer_triton

        return indexer_triton.ragged_logits(
            q_values, k, k_scale, weights, starts, ends, width, max_seqlen_k > 0, logits_dtype
        )
    out = torch.full((rows, width), NEG_INF, dtype=torch.float32, device=q_values.device)
    row_step = max(1, TILE_BYTES // (heads * 4 * MIN_TILE_COLUMNS))
    for r0 in range(0, rows, row_step):
        r1 = min(r0 + row_step, rows)
        lo, hi = int(starts[r0:r1].min()), int(ends[r0:r1].max())  # the columns any of these rows scores
        q_tile = q_values[None, r0:r1].float()
        w_tile = weights[None, r0:r1].float()
        col_step = _columns_per_tile(batch=1, rows=r1 - r0, heads=heads, dim=dim)
        for c0 in range(lo, hi, col_step):
            c1 = min(c0 + col_step, hi)
            scores = _score_tile(q_tile, k[None, c0:c1], k_scale[None, c0:c1], w_tile)[0]
            cols = torch.arange(c0, c1, device=out.device)
            inside = (cols >= starts[r0:r1, None]) & (cols < ends[r0:r1, None])
            if max_seqlen_k > 0:  # column j of row t is position start[t] + j
                dest = cols - starts[r0:r1, None]
                r, c = (inside & (dest < width)).nonzero(as_tuple=True)
                out[r0 + r, dest[r, c]] = scores[r, c]
            else:
                out[r0:r1, c0:c1] = torch.where(inside, scores, NEG_INF)
    return out.to(logits_dtype)


def fp8_fp4_paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    logits_dtype: torch.dtype = torch.float32,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode logits over the paged index cache: q (values [B, next_n, H, D] fp8, None), kv_cache
    [num_blocks, block_size, 1, D + 4] uint8, weights [B * next_n, H] fp32, context_lens [B] or
    [B, next_n] int32, block_table [B, max_blocks] int32. schedule_meta is not read. Masked logits are
    -inf, but for the Triton kernels with clean_logits False, which leave a row's positions past its last
    block unwritten, as DeepGEMM does (vLLM's top-k reads a row up to its length)."""
    if indices is not None:
        raise NotImplementedError("paged MQA logits with `indices` need DeepGEMM")
    q_values = _fp8_query(q)
    batch, next_n, heads, dim = q_values.shape
    block_size = kv_cache.shape[1]
    _check_shapes(kv_cache.shape[-1] == dim + 4 and weights.shape == (batch * next_n, heads), q_values, weights)
    _check_index_cache(kv_cache)
    if _triton_serves(q_values, heads, dim, block_size):
        from . import indexer_triton

        return indexer_triton.paged_logits(
            q_values, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, logits_dtype
        )
    ends = paged_row_ends(context_lens, next_n).clamp(0, min(max_context_len, block_table.shape[1] * block_size))
    out = torch.full((batch, next_n, max_context_len), NEG_INF, dtype=torch.float32, device=q_values.device)
    if batch == 0:
        return out.view(0, max_context_len).to(logits_dtype)
    request_ends = ends.max(dim=1).values
    # Blocks any row scores. Under CUDA-graph capture (vLLM captures uniform decode batches whole) the
    # loop may not depend on data, so it covers the table's width, max_context_len at most, every step.
    widest = min(block_table.shape[1], -(-max_context_len // block_size))
    used_blocks = widest if _capturing(q_values) else -(-int(request_ends.max()) // block_size)
    column_cost = next_n * heads * 4 + 5 * dim + 4  # scores, fp32 K and its fp8 gather, per request and token
    batch_step = max(1, min(batch, TILE_BYTES // (column_cost * block_size * 8)))
    weights = weights.reshape(batch, next_n, heads)
    for b0 in range(0, batch, batch_step):
        b1 = min(b0 + batch_step, batch)
        q_tile = q_values[b0:b1].float()
        block_step = max(1, TILE_BYTES // ((b1 - b0) * column_cost * block_size))
        for j0 in range(0, used_blocks, block_step):
            j1 = min(j0 + block_step, used_blocks)
            # Table entries past a request's last block can be stale or junk: read block 0 there instead.
            in_use = torch.arange(j0, j1, device=out.device) * block_size < request_ends[b0:b1, None]
            ids = torch.where(in_use, block_table[b0:b1, j0:j1].long(), 0)
            k, k_scale = read_index_cache(kv_cache, ids, q_values.dtype)
            scores = _score_tile(q_tile, k, k_scale, weights[b0:b1])
            p0, p1 = j0 * block_size, min(j1 * block_size, max_context_len)
            cols = torch.arange(p0, p1, device=out.device)
            inside = cols < ends[b0:b1, :, None]
            out[b0:b1, :, p0:p1] = torch.where(inside, scores[..., : p1 - p0], NEG_INF)
    return out.view(batch * next_n, max_context_len).to(logits_dtype)


def get_paged_mqa_logits_metadata(
    context_lens: torch.Tensor, block_kv: int, num_sms: int, indices: torch.Tensor | None = None
) -> torch.Tensor:
    """[num_sms + 1, 2] int32 like DeepGEMM's (vLLM copies it into a buffer of that shape): row i is
    the (request, block) where SM i's even share of the KV blocks starts, the last row (B, 0). The
    paged function here reads none of it; DeepGEMM's own content may differ."""
    if indices is not None:
        raise NotImplementedError("paged MQA logits with `indices` need DeepGEMM")
    out = torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)
    if context_lens.numel() == 0:
        return out
    lens = context_lens.long().reshape(context_lens.shape[0], -1).amax(dim=1).clamp(min=0)
    cum = torch.cumsum(-(-lens // block_kv), 0)
    starts = torch.arange(num_sms + 1, device=lens.device) * cum[-1] // num_sms
    request = torch.searchsorted(cum, starts, right=True)
    before = torch.cat([cum.new_zeros(1), cum])[request]
    out[:, 0], out[:, 1] = request, starts - before
    return out


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0):
    """DeepGEMM's FP8-only name (q a bare tensor), as in its tests and older vLLM."""
    return fp8_fp4_mqa_logits((q, None), kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


def fp8_paged_mqa_logits(
    q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits=False, indices=None
):
    """DeepGEMM's FP8-only name (q a bare tensor), as in its tests and older vLLM."""
    return fp8_fp4_paged_mqa_logits(
        (q, None),
        kv_cache,
        weights,
        context_lens,
        block_table,
        schedule_meta,
        max_context_len,
        clean_logits,
        indices=indices,
    )


def paged_row_ends(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """[B, next_n]: row (b, j) of the paged logits scores positions [0, end[b, j])."""
    lens = context_lens.long()
    if lens.dim() == 2:
        return lens.expand(lens.shape[0], next_n)  # [B, 1] broadcasts when next_n is 1
    return lens[:, None] - next_n + 1 + torch.arange(next_n, device=lens.device)


def read_index_cache(kv_cache: torch.Tensor, ids: torch.Tensor, fp8_dtype: torch.dtype):
    """The blocks ``ids`` ([..., n]) of the index cache as (values [..., n * block_size, D] fp8, scales
    [..., n * block_size] fp32). Only these blocks are copied: the cache is GBs and its block stride
    may carry padding; within a block its bytes must be dense."""
    block_size = kv_cache.shape[1]
    dim = kv_cache.shape[-1] - 4
    _check_index_cache(kv_cache)
    pages = kv_cache[ids].reshape(*ids.shape, block_size * (dim + 4))
    values = pages[..., : block_size * dim].view(fp8_dtype).reshape(*ids.shape[:-1], -1, dim)
    scales = pages[..., block_size * dim :].contiguous().view(torch.float32).reshape(*ids.shape[:-1], -1)
    return values, scales


def _score_tile(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[B, R, n] from q [B, R, H, D] fp32, k [B, n, D] fp8, k_scale [B, n], weights [B, R, H]."""
    b, r, h, d = q.shape
    # Both operands are raw e4m3 values: exact in fp32 (and TF32), so only the D-term sum rounds.
    dots = torch.bmm(q.reshape(b, r * h, d), k.float().transpose(1, 2)).view(b, r, h, -1)
    # Weights per head after the relu, summed over heads elementwise (a matmul here could go TF32).
    return dots.relu_().mul_(weights.unsqueeze(-1)).sum(dim=2).mul_(k_scale.unsqueeze(1))


def _check_index_cache(kv_cache: torch.Tensor) -> None:
    row = kv_cache.shape[-1]
    if kv_cache.dtype != torch.uint8 or kv_cache.stride(-1) != 1 or kv_cache.stride(1) != row:
        raise ValueError(f"index cache: uint8 with dense blocks expected, got {kv_cache.dtype} {kv_cache.stride()}")


def _triton_serves(q: torch.Tensor, heads: int, dim: int, page: int = 64) -> bool:
    """Whether indexer_triton's kernels score this call: e4m3 queries on a GPU with Triton, and
    shapes its tiles take."""
    if not q.is_cuda or q.dtype != torch.float8_e4m3fn or not _has_triton():
        return False
    from . import indexer_triton

    return indexer_triton.serves(heads, dim, page)


@functools.cache
def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _columns_per_tile(batch: int, rows: int, heads: int, dim: int) -> int:
    return max(1, TILE_BYTES // (batch * (rows * heads * 4 + 5 * dim + 4)))


def _fp8_query(q) -> torch.Tensor:
    values, scale = q if isinstance(q, tuple) else (q, None)
    if scale is not None:
        raise NotImplementedError("FP4 (MXFP4) indexer queries need DeepGEMM (SM100)")
    if values.element_size() != 1 or not values.is_floating_point():
        raise TypeError(f"indexer queries: float8 expected, got {values.dtype}")
    return values


def _check_shapes(ok: bool, *tensors: torch.Tensor) -> None:
    if not ok:
        raise ValueError("indexer logits: shapes disagree: " + ", ".join(str(tuple(t.shape)) for t in tensors))


__all__ = [
    "TILE_BYTES",
    "fp8_fp4_mqa_logits",
    "fp8_fp4_paged_mqa_logits",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "paged_row_ends",
    "read_index_cache",
]
