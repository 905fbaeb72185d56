"""Input validation for the decode op: every bad input fails here, in Python, before any launch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import shapes


@dataclass(frozen=True)
class DecodeProblem:
    """A validated decode call, in the shapes the kernel and the reference take."""

    query: torch.Tensor  # [B, q_len, H, 576], contiguous
    cache: torch.Tensor  # [P, page, 576], each token row contiguous
    block_tables: torch.Tensor  # int32 [B, max_pages], rows contiguous
    seq_lens: torch.Tensor  # int32 [B]
    max_seq_len: int
    out: torch.Tensor  # bf16 [B, q_len, H, 512] view of the user's out (or a new tensor)
    out_given: torch.Tensor | None  # the tensor the caller passed, returned as passed
    bmm1_scale: float | torch.Tensor
    bmm2_scale: float | torch.Tensor

    @property
    def batch(self) -> int:
        return self.query.shape[0]

    @property
    def q_len(self) -> int:
        return self.query.shape[1]

    @property
    def heads(self) -> int:
        return self.query.shape[2]

    @property
    def page_size(self) -> int:
        return self.cache.shape[1]


def _require(cond: bool, message: str, exc: type[Exception] = ValueError) -> None:
    if not cond:
        raise exc(message)


def check_scale(name: str, scale, device: torch.device) -> float | torch.Tensor:
    if isinstance(scale, torch.Tensor):
        _require(scale.dtype == torch.float32, f"{name} tensor must be float32, got {scale.dtype}", TypeError)
        _require(scale.numel() == 1, f"{name} tensor must have one element, got shape {tuple(scale.shape)}")
        _require(scale.device == device, f"{name} is on {scale.device} but query is on {device}")
        return scale
    _require(isinstance(scale, (int, float)) and not isinstance(scale, bool),
             f"{name} must be a float or a one-element float32 tensor, got {type(scale).__name__}", TypeError)
    return float(scale)


def check_decode_inputs(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor | None,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out: torch.Tensor | None,
    bmm1_scale,
    bmm2_scale,
    sinks,
) -> DecodeProblem:
    for name, t in (("query", query), ("kv_cache", kv_cache), ("block_tables", block_tables),
                    ("seq_lens", seq_lens)):
        _require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
    _require(sinks is None, "sinks are not supported by MLA decode (DeepSeek-V3-class models have none)")
    _require(kv_lora_rank == shapes.KV_LORA_RANK, f"kv_lora_rank must be {shapes.KV_LORA_RANK}, got {kv_lora_rank}")
    _require(qk_rope_head_dim == shapes.ROPE_DIM, f"qk_rope_head_dim must be {shapes.ROPE_DIM}, got {qk_rope_head_dim}")
    _require(qk_nope_head_dim in shapes.QK_NOPE_HEAD_DIMS,
             f"qk_nope_head_dim must be one of {shapes.QK_NOPE_HEAD_DIMS}, got {qk_nope_head_dim}")

    # dtypes
    _require(query.dtype in shapes.DTYPES,
             f"query dtype must be bfloat16 or float8_e4m3fn, got {query.dtype}", TypeError)
    _require(kv_cache.dtype == query.dtype,
             f"kv_cache dtype {kv_cache.dtype} must match query dtype {query.dtype}", TypeError)
    _require(block_tables.dtype == torch.int32, f"block_tables must be int32, got {block_tables.dtype}", TypeError)
    _require(seq_lens.dtype == torch.int32, f"seq_lens must be int32, got {seq_lens.dtype}", TypeError)

    # ranks and sizes
    _require(query.dim() == 4, f"query must be [batch, q_len, heads, 576], got shape {tuple(query.shape)}")
    batch, q_len, heads, dim = query.shape
    _require(dim == shapes.HEAD_DIM, f"query last dim must be {shapes.HEAD_DIM} (512 nope + 64 rope), got {dim}")
    _require(1 <= q_len <= shapes.MAX_Q_LEN, f"q_len (query.shape[1]) must be 1..{shapes.MAX_Q_LEN}, got {q_len}")
    _require(1 <= heads <= shapes.MAX_HEADS, f"number of heads must be 1..{shapes.MAX_HEADS}, got {heads}")
    _require(kv_cache.dim() in (3, 4),
             f"kv_cache must be [pages, page_size, 576] or [pages, 1, page_size, 576], got {tuple(kv_cache.shape)}")
    if kv_cache.dim() == 4:
        _require(kv_cache.shape[1] == 1, f"4-D kv_cache must have size 1 in dim 1, got {tuple(kv_cache.shape)}")
    cache = shapes.pages_view(kv_cache)
    num_pages, page_size, kv_dim = cache.shape
    _require(kv_dim == shapes.HEAD_DIM, f"kv_cache last dim must be {shapes.HEAD_DIM}, got {kv_dim}")
    _require(page_size in shapes.PAGE_SIZES, f"page size must be one of {shapes.PAGE_SIZES}, got {page_size}")
    _require(block_tables.dim() == 2 and block_tables.shape[0] == batch,
             f"block_tables must be [batch={batch}, max_pages], got {tuple(block_tables.shape)}")
    _require(seq_lens.dim() == 1 and seq_lens.shape[0] == batch,
             f"seq_lens must be [batch={batch}], got {tuple(seq_lens.shape)}")
    max_pages = block_tables.shape[1]
    _require(isinstance(max_seq_len, int) and not isinstance(max_seq_len, bool) and max_seq_len >= 0,
             f"max_seq_len must be a non-negative int, got {max_seq_len!r}", TypeError)
    _require(max_seq_len <= max_pages * page_size,
             f"max_seq_len {max_seq_len} exceeds what block_tables can address "
             f"({max_pages} pages x {page_size} tokens = {max_pages * page_size})")

    # devices
    device = query.device
    for name, t in (("kv_cache", kv_cache), ("block_tables", block_tables), ("seq_lens", seq_lens),
                    ("workspace_buffer", workspace_buffer), ("out", out)):
        if t is not None:
            _require(t.device == device, f"{name} is on {t.device} but query is on {device}")

    # layouts the kernel relies on
    _require(query.is_contiguous(), "query must be contiguous")
    _require(cache.stride(2) == 1 and cache.stride(1) == shapes.HEAD_DIM,
             f"kv_cache token rows must be contiguous (strides ..., {shapes.HEAD_DIM}, 1), got {cache.stride()}")
    _require(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    _require(seq_lens.is_contiguous(), "seq_lens must be contiguous")
    if workspace_buffer is not None:
        _require(isinstance(workspace_buffer, torch.Tensor), "workspace_buffer must be a torch.Tensor", TypeError)
        _require(workspace_buffer.is_contiguous(), "workspace_buffer must be contiguous")

    # output
    full_shape = (batch, q_len, heads, shapes.KV_LORA_RANK)
    if out is None:
        out_view = torch.empty(full_shape, dtype=torch.bfloat16, device=device)
    else:
        _require(isinstance(out, torch.Tensor), "out must be a torch.Tensor", TypeError)
        _require(out.dtype == torch.bfloat16, f"out must be bfloat16, got {out.dtype}", TypeError)
        allowed = [full_shape] + ([(batch, heads, shapes.KV_LORA_RANK)] if q_len == 1 else [])
        _require(tuple(out.shape) in allowed, f"out must have shape {' or '.join(map(str, allowed))}, "
                 f"got {tuple(out.shape)}")
        _require(out.is_contiguous(), "out must be contiguous")
        out_view = out.view(full_shape)

    return DecodeProblem(
        query=query, cache=cache, block_tables=block_tables, seq_lens=seq_lens, max_seq_len=max_seq_len,
        out=out_view, out_given=out,
        bmm1_scale=check_scale("bmm1_scale", bmm1_scale, device),
        bmm2_scale=check_scale("bmm2_scale", bmm2_scale, device),
    )


def check_page_ids(problem: DecodeProblem) -> None:
    """Host-side check that every page a request reads exists and seq_lens <= max_seq_len.

    Reads seq_lens and block_tables on the host (a device sync on GPU tensors)."""
    lengths = problem.seq_lens.tolist()
    num_pages = problem.cache.shape[0]
    for b, seq_len in enumerate(lengths):
        _require(0 <= seq_len <= problem.max_seq_len,
                 f"seq_lens[{b}] = {seq_len} is outside 0..max_seq_len ({problem.max_seq_len})")
        used = -(-seq_len // problem.page_size)
        ids = problem.block_tables[b, :used]
        if used and (int(ids.min()) < 0 or int(ids.max()) >= num_pages):
            bad = ids[(ids < 0) | (ids >= num_pages)][0].item()
            raise ValueError(f"block_tables[{b}] names page {bad}, but kv_cache has pages 0..{num_pages - 1}")
