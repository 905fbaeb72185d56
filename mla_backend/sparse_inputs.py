"""Input validation for sparse MLA decode (DeepSeek Sparse Attention): every bad input fails here,
before any launch.

Query token t attends to the cache rows ``indices[t, :topk_lens[t]]`` names (slot ids: page id x page
size + offset). An entry outside the cache's rows (-1 marks an empty one) is masked: it is never read
and weighs nothing; with ``validate_page_ids`` any entry below -1 or past the cache is refused instead.
``topk_lens`` values are clamped to [0, K] (as FlashInfer's kernel clamps them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .checks import check_scale, query_layout_problem
from .shapes import HEAD_DIM, KV_LORA_RANK, MAX_HEADS

SparseKvFormat = Literal["bf16", "fp8_ds_mla"]
# Row widths of the two caches the sparse kernels read: bf16 values, or fp8_ds_mla bytes (512 e4m3,
# four fp32 scales, 64 bf16 rope values; sparse_cache.py).
ROW_WIDTH = {"bf16": HEAD_DIM, "fp8_ds_mla": 656}
KV_FORMAT_CODES = {"bf16": 0, "fp8_ds_mla": 1}  # the library op's kv_format


@dataclass(frozen=True)
class SparseProblem:
    """A validated sparse decode call, in the shapes the kernel and the reference take."""

    query: torch.Tensor  # bf16 [T, H, 576], rows contiguous
    kv_rows: torch.Tensor  # [N, 576] bf16 or [N, 656] uint8: one row a slot
    kv_format: SparseKvFormat
    indices: torch.Tensor  # int32 [T, K], unit stride along K
    topk_lens: torch.Tensor  # int32 [T]
    out: torch.Tensor  # bf16 [T, H, 512] contiguous: the caller's out viewed, or a new tensor
    out_given: torch.Tensor | None  # the tensor the caller passed, returned as passed
    sm_scale: float | torch.Tensor
    lead_shape: tuple[int, ...]  # the query's leading dims ([T] or [B, q_len]), which out and lse take

    @property
    def device(self) -> torch.device:
        return self.query.device

    @property
    def tokens(self) -> int:
        return self.query.shape[0]

    @property
    def heads(self) -> int:
        return self.query.shape[1]

    @property
    def topk(self) -> int:
        return self.indices.shape[1]


def _require(cond: bool, message: str, exc: type[Exception] = ValueError) -> None:
    if not cond:
        raise exc(message)


def cache_rows(kv_cache: torch.Tensor) -> tuple[torch.Tensor, SparseKvFormat]:
    """(the cache as [N, width] rows, its format) from [N, width], [pages, page, width] or
    [pages, 1, page, width]: bf16 rows of 576, or uint8 fp8_ds_mla rows of 656 bytes."""
    _require(
        isinstance(kv_cache, torch.Tensor), f"kv_cache must be a torch.Tensor, got {type(kv_cache).__name__}", TypeError
    )
    kind: SparseKvFormat | None = {torch.bfloat16: "bf16", torch.uint8: "fp8_ds_mla"}.get(kv_cache.dtype)  # type: ignore[assignment]
    _require(
        kind is not None,
        f"sparse kv_cache must be bf16 rows of 576 or uint8 fp8_ds_mla rows of 656 bytes, got {kv_cache.dtype} "
        "(an e4m3 cache with one global scale has no sparse kernel)",
        TypeError,
    )
    assert kind is not None
    width = ROW_WIDTH[kind]
    _require(
        kv_cache.dim() in (2, 3, 4) and kv_cache.shape[-1] == width and (kv_cache.dim() != 4 or kv_cache.shape[1] == 1),
        f"{kind} kv_cache must be [N, {width}], [pages, page, {width}] or [pages, 1, page, {width}], "
        f"got {tuple(kv_cache.shape)}",
    )
    try:
        rows = kv_cache.view(-1, width)
    except RuntimeError:
        raise ValueError(
            f"kv_cache must be evenly strided rows (page stride = page size x row stride), got strides "
            f"{kv_cache.stride()}"
        ) from None
    _require(rows.stride(-1) == 1, f"kv_cache rows must be contiguous, got strides {kv_cache.stride()}")
    size = rows.element_size()
    _require(
        (rows.shape[0] <= 1 or rows.stride(0) * size % 16 == 0) and rows.data_ptr() % 16 == 0,
        f"kv_cache start and row stride must be 16-byte aligned, got a row stride of {rows.stride(0) * size} bytes",
    )
    _require(rows.shape[0] < 2**31, f"kv_cache has {rows.shape[0]} rows; slot ids are int32")
    return rows, kind


def check_sparse_inputs(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | torch.Tensor,
    topk_lens: torch.Tensor | None,
    out: torch.Tensor | None,
) -> SparseProblem:
    """Validate a sparse call. ``query`` bf16 [T, H, 576] or [B, q_len, H, 576]; ``indices`` int32
    [T, K] or [B, q_len, K] (query token by query token); ``topk_lens`` int32 [T] (or [B, q_len])."""
    _require(isinstance(query, torch.Tensor), f"query must be a torch.Tensor, got {type(query).__name__}", TypeError)
    _require(query.dtype == torch.bfloat16, f"sparse decode takes a bf16 query, got {query.dtype}", TypeError)
    _require(
        query.dim() in (3, 4) and query.shape[-1] == HEAD_DIM,
        f"query must be [T, H, {HEAD_DIM}] or [B, q_len, H, {HEAD_DIM}], got {tuple(query.shape)}",
    )
    lead = tuple(query.shape[:-2])
    heads = query.shape[-2]
    _require(1 <= heads <= MAX_HEADS, f"heads must be 1..{MAX_HEADS}, got {heads}")
    device = query.device
    flat = query.reshape(-1, heads, HEAD_DIM)
    if flat.device.type == "cuda" and query_layout_problem("query", flat) is not None:
        flat = flat.contiguous()  # a view the kernels cannot read in place: copied once
    tokens = flat.shape[0]
    rows, kind = cache_rows(kv_cache)
    _require(rows.device == device, f"kv_cache is on {rows.device} but query is on {device}")
    _require(
        isinstance(indices, torch.Tensor), f"indices must be a torch.Tensor, got {type(indices).__name__}", TypeError
    )
    _require(indices.dtype == torch.int32, f"indices must be int32, got {indices.dtype}", TypeError)
    _require(
        tuple(indices.shape[:-1]) == lead and indices.shape[-1] >= 1,
        f"indices must be {list(lead) + ['K']} (one list a query token, K >= 1), got {tuple(indices.shape)}",
    )
    _require(indices.device == device, f"indices is on {indices.device} but query is on {device}")
    flat_indices = indices.reshape(tokens, indices.shape[-1])
    if flat_indices.stride(-1) != 1:
        flat_indices = flat_indices.contiguous()
    if topk_lens is None:
        lens = torch.full((tokens,), flat_indices.shape[1], dtype=torch.int32, device=device)
    else:
        _require(isinstance(topk_lens, torch.Tensor), "topk_lens must be an int32 tensor", TypeError)
        _require(topk_lens.dtype == torch.int32, f"topk_lens must be int32, got {topk_lens.dtype}", TypeError)
        _require(
            topk_lens.numel() == tokens,
            f"topk_lens must hold one length a query token ({tokens}), got shape {tuple(topk_lens.shape)}",
        )
        _require(topk_lens.device == device, f"topk_lens is on {topk_lens.device} but query is on {device}")
        lens = topk_lens.reshape(tokens).contiguous()
    scale = check_scale("sm_scale", sm_scale, device)
    out_shape = (*lead, heads, KV_LORA_RANK)
    if out is None:
        out_rows = torch.empty(tokens, heads, KV_LORA_RANK, dtype=torch.bfloat16, device=device)
    else:
        _require(isinstance(out, torch.Tensor), f"out must be a torch.Tensor, got {type(out).__name__}", TypeError)
        _require(out.dtype == torch.bfloat16, f"out must be bf16, got {out.dtype}", TypeError)
        _require(
            out.numel() == tokens * heads * KV_LORA_RANK and tuple(out.shape)[-2:] == (heads, KV_LORA_RANK),
            f"out must have shape {out_shape}, got {tuple(out.shape)}",
        )
        _require(out.device == device, f"out is on {out.device} but query is on {device}")
        _require(out.is_contiguous(), "out must be contiguous")
        out_rows = out.view(tokens, heads, KV_LORA_RANK)
    return SparseProblem(flat, rows, kind, flat_indices, lens, out_rows, out, scale, lead)


def check_sparse_ids(problem: SparseProblem) -> None:
    """Host-side check (validate_page_ids): every entry a token reads is -1 or a row of the cache, and
    every length is within 0..K. Reads indices and topk_lens on the host (a device sync on GPU tensors)."""
    lens = problem.topk_lens.tolist()
    topk, rows = problem.topk, problem.kv_rows.shape[0]
    bad_len = next((t for t, n in enumerate(lens) if not 0 <= n <= topk), None)
    _require(
        bad_len is None, f"topk_lens[{bad_len}] = {lens[bad_len] if bad_len is not None else 0} is outside 0..{topk}"
    )
    positions = torch.arange(topk, device=problem.device)[None, :]
    read = positions < problem.topk_lens[:, None]
    bad = read & ((problem.indices < -1) | (problem.indices >= rows))
    if bool(bad.any()):
        t, k = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"indices[{t}, {k}] = {int(problem.indices[t, k])}: "
            f"entries are -1 (empty) or rows 0..{rows - 1} of kv_cache"
        )
