"""Input validation for the decode op: every bad input fails here, in Python, before any launch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import shapes


@dataclass(frozen=True)
class DecodeProblem:
    """A validated decode call, in the shapes the kernel and the reference take."""

    q_nope: torch.Tensor  # [B, q_len, H, 512] latent part of the query, read in place
    q_pe: torch.Tensor  # [B, q_len, H, 64] rope part (both: rows contiguous, strides 16-byte multiples)
    query_given: torch.Tensor | None  # the caller's [B, q_len, H, 576] tensor, when it passed one
    kv_nope: torch.Tensor  # [P, page, 512] latent part of the cache, read in place
    kv_pe: torch.Tensor  # [P, page, 64] rope part (both: rows contiguous, strides 16-byte multiples)
    kv_given: torch.Tensor | None  # the caller's [P, page, 576] cache (3-D view), when it passed one
    block_tables: torch.Tensor  # int32 [B, max_pages], rows contiguous; or ragged ids [n] (kv_indptr)
    kv_indptr: torch.Tensor | None  # int32 [B + 1]: request b's ids are block_tables[kv_indptr[b]:kv_indptr[b + 1]]
    causal: bool  # query token i of q_len sees seq_len - q_len + i + 1 keys (else all seq_len)
    seq_lens: torch.Tensor  # int32 [B]
    max_seq_len: int
    qk_nope_head_dim: int  # the model's pre-absorption nope dim (trtllm-gen takes it)
    out: torch.Tensor  # bf16 [B, q_len, H, 512] view of the user's out (or a new tensor)
    out_given: torch.Tensor | None  # the tensor the caller passed, returned as passed
    bmm1_scale: float | torch.Tensor
    bmm2_scale: float | torch.Tensor

    @property
    def query(self) -> torch.Tensor:
        """The whole [B, q_len, H, 576] query (a new tensor if the caller passed the two parts)."""
        return self.query_given if self.query_given is not None else torch.cat((self.q_nope, self.q_pe), dim=-1)

    @property
    def cache(self) -> torch.Tensor:
        """The whole [P, page, 576] cache (a new tensor if the caller passed the two parts)."""
        return self.kv_given if self.kv_given is not None else torch.cat((self.kv_nope, self.kv_pe), dim=-1)

    @property
    def dtype(self) -> torch.dtype:
        return self.q_nope.dtype

    @property
    def device(self) -> torch.device:
        return self.q_nope.device

    @property
    def batch(self) -> int:
        return self.q_nope.shape[0]

    @property
    def q_len(self) -> int:
        return self.q_nope.shape[1]

    @property
    def heads(self) -> int:
        return self.q_nope.shape[2]

    @property
    def page_size(self) -> int:
        return self.kv_nope.shape[1]

    @property
    def num_pages(self) -> int:
        return self.kv_nope.shape[0]

    def table_rows(self) -> list[torch.Tensor]:
        """Each request's page ids (reads kv_indptr on the host)."""
        return shapes.ragged_rows(self.block_tables, self.kv_indptr)


def _require(cond: bool, message: str, exc: type[Exception] = ValueError) -> None:
    if not cond:
        raise exc(message)


def check_scale(name: str, scale, device: torch.device) -> float | torch.Tensor:
    if isinstance(scale, torch.Tensor):
        _require(scale.dtype == torch.float32, f"{name} tensor must be float32, got {scale.dtype}", TypeError)
        _require(scale.numel() == 1, f"{name} tensor must have one element, got shape {tuple(scale.shape)}")
        _require(scale.device == device, f"{name} is on {scale.device} but query is on {device}")
        return scale
    _require(
        isinstance(scale, (int, float)) and not isinstance(scale, bool),
        f"{name} must be a float or a one-element float32 tensor, got {type(scale).__name__}",
        TypeError,
    )
    value = float(scale)
    _require(math.isfinite(value), f"{name} must be finite, got {scale!r}")
    return value


def split_query(query) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q_nope, q_pe, the caller's whole tensor or None) from one [B, q_len, H, 576] tensor or a
    (q_nope [B, q_len, H, 512], q_pe [B, q_len, H, 64]) pair."""
    if isinstance(query, (tuple, list)):
        _require(
            len(query) == 2 and all(isinstance(t, torch.Tensor) for t in query),
            "a split query must be a pair of tensors (q_nope, q_pe)",
            TypeError,
        )
        q_nope, q_pe = query
        _require(
            q_nope.dim() == 4 and q_nope.shape[-1] == shapes.KV_LORA_RANK,
            f"q_nope must be [batch, q_len, heads, {shapes.KV_LORA_RANK}], got shape {tuple(q_nope.shape)}",
        )
        _require(
            q_pe.dim() == 4 and q_pe.shape[-1] == shapes.ROPE_DIM,
            f"q_pe must be [batch, q_len, heads, {shapes.ROPE_DIM}], got shape {tuple(q_pe.shape)}",
        )
        _require(
            q_pe.shape[:3] == q_nope.shape[:3],
            f"q_nope {tuple(q_nope.shape)} and q_pe {tuple(q_pe.shape)} must agree in batch, q_len, heads",
        )
        _require(
            q_pe.dtype == q_nope.dtype, f"q_pe dtype {q_pe.dtype} must match q_nope dtype {q_nope.dtype}", TypeError
        )
        _require(q_pe.device == q_nope.device, f"q_pe is on {q_pe.device} but q_nope is on {q_nope.device}")
        return q_nope, q_pe, None
    _require(
        isinstance(query, torch.Tensor),
        f"query must be a torch.Tensor or a (q_nope, q_pe) pair, got {type(query).__name__}",
        TypeError,
    )
    _require(query.dim() == 4, f"query must be [batch, q_len, heads, 576], got shape {tuple(query.shape)}")
    _require(
        query.shape[-1] == shapes.HEAD_DIM,
        f"query last dim must be {shapes.HEAD_DIM} (512 nope + 64 rope), got {query.shape[-1]}",
    )
    return query[..., : shapes.KV_LORA_RANK], query[..., shapes.KV_LORA_RANK :], query


def split_kv_cache(kv_cache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(latent [P, page, 512], rope [P, page, 64], the caller's whole cache as [P, page, 576] or None)
    from one [P, page, 576] / [P, 1, page, 576] cache or a (ckv_cache, kpe_cache) pair of such caches."""
    if isinstance(kv_cache, (tuple, list)):
        _require(
            len(kv_cache) == 2 and all(isinstance(t, torch.Tensor) for t in kv_cache),
            "a split KV cache must be a pair of tensors (ckv_cache, kpe_cache)",
            TypeError,
        )
        parts = []
        for name, t, dim in zip(("ckv_cache", "kpe_cache"), kv_cache, (shapes.KV_LORA_RANK, shapes.ROPE_DIM)):
            _require(
                t.dim() in (3, 4) and (t.dim() == 3 or t.shape[1] == 1) and t.shape[-1] == dim,
                f"{name} must be [pages, page_size, {dim}] or [pages, 1, page_size, {dim}], got {tuple(t.shape)}",
            )
            parts.append(shapes.pages_view(t))
        ckv, kpe = parts
        _require(
            kpe.shape[:2] == ckv.shape[:2],
            f"ckv_cache {tuple(ckv.shape)} and kpe_cache {tuple(kpe.shape)} must agree in pages and page size",
        )
        _require(
            kpe.dtype == ckv.dtype, f"kpe_cache dtype {kpe.dtype} must match ckv_cache dtype {ckv.dtype}", TypeError
        )
        _require(kpe.device == ckv.device, f"kpe_cache is on {kpe.device} but ckv_cache is on {ckv.device}")
        return ckv, kpe, None
    _require(
        isinstance(kv_cache, torch.Tensor),
        f"kv_cache must be a torch.Tensor or a (ckv_cache, kpe_cache) pair, got {type(kv_cache).__name__}",
        TypeError,
    )
    _require(
        kv_cache.dim() in (3, 4),
        f"kv_cache must be [pages, page_size, 576] or [pages, 1, page_size, 576], got {tuple(kv_cache.shape)}",
    )
    if kv_cache.dim() == 4:
        _require(kv_cache.shape[1] == 1, f"4-D kv_cache must have size 1 in dim 1, got {tuple(kv_cache.shape)}")
    cache = shapes.pages_view(kv_cache)
    _require(cache.shape[-1] == shapes.HEAD_DIM, f"kv_cache last dim must be {shapes.HEAD_DIM}, got {cache.shape[-1]}")
    return cache[..., : shapes.KV_LORA_RANK], cache[..., shapes.KV_LORA_RANK :], cache


def kv_layout_problem(name: str, t: torch.Tensor) -> str | None:
    """Why the kernels cannot copy this cache part's token rows in 16-byte chunks, or None."""
    size = t.element_size()
    if t.stride(-1) != 1:
        return f"{name} token rows must be contiguous (last-dim stride 1), got strides {t.stride()}"
    if (t.shape[1] > 1 and t.stride(1) * size % 16) or (t.shape[0] > 1 and t.stride(0) * size % 16):
        return (
            f"{name} token and page strides must be multiples of 16 bytes (the kernels copy 16-byte chunks), "
            f"got {tuple(st * size for st in t.stride())} bytes"
        )
    if t.data_ptr() % 16:
        return f"{name} must start at a 16-byte aligned address"
    return None


def query_layout_problem(name: str, t: torch.Tensor) -> str | None:
    """Why the kernels cannot read this query part in place with 16-byte loads (rows contiguous,
    strides and start 16-byte aligned), or None."""
    size = t.element_size()
    if t.stride(-1) != 1:
        return f"{name} rows must be contiguous (last-dim stride 1), got strides {t.stride()}"
    if any(s * size % 16 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):  # size-1 dims: never stepped
        return f"{name} strides must be multiples of 16 bytes, got {tuple(s * size for s in t.stride())} bytes"
    if t.data_ptr() % 16:
        return f"{name} must start at a 16-byte aligned address"
    return None


def check_decode_inputs(
    query: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor | None,
    qk_nope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out: torch.Tensor | None,
    bmm1_scale,
    bmm2_scale,
    kv_indptr: torch.Tensor | None = None,
    causal: bool = True,
) -> DecodeProblem:
    q_nope, q_pe, query_given = split_query(query)
    kv_nope, kv_pe, kv_given = split_kv_cache(kv_cache)
    for name, t in (
        ("block_tables", block_tables),
        ("seq_lens", seq_lens),
        ("workspace_buffer", workspace_buffer),
        ("out", out),
    ):
        _require(
            isinstance(t, torch.Tensor) or (t is None and name in ("workspace_buffer", "out")),
            f"{name} must be a torch.Tensor, got {type(t).__name__}",
            TypeError,
        )
    _require(
        type(qk_nope_head_dim) is int and qk_nope_head_dim in shapes.QK_NOPE_HEAD_DIMS,
        f"qk_nope_head_dim must be one of {shapes.QK_NOPE_HEAD_DIMS}, got {qk_nope_head_dim}",
    )

    # dtypes
    _require(
        q_nope.dtype in shapes.DTYPES, f"query dtype must be bfloat16 or float8_e4m3fn, got {q_nope.dtype}", TypeError
    )
    _require(
        kv_nope.dtype == q_nope.dtype,
        f"kv_cache dtype {kv_nope.dtype} must match query dtype {q_nope.dtype}",
        TypeError,
    )
    _require(block_tables.dtype == torch.int32, f"block_tables must be int32, got {block_tables.dtype}", TypeError)
    _require(seq_lens.dtype == torch.int32, f"seq_lens must be int32, got {seq_lens.dtype}", TypeError)

    # ranks and sizes
    batch, q_len, heads, _ = q_nope.shape
    _require(1 <= q_len <= shapes.MAX_Q_LEN, f"q_len (query.shape[1]) must be 1..{shapes.MAX_Q_LEN}, got {q_len}")
    _require(
        1 <= heads <= shapes.MAX_HEADS, f"number of heads (query.shape[2]) must be 1..{shapes.MAX_HEADS}, got {heads}"
    )
    num_pages, page_size, _ = kv_nope.shape
    _require(
        page_size in shapes.PAGE_SIZES,
        f"page size (kv_cache.shape[-2]) must be a power of two in 1..{shapes.PAGE_SIZES[-1]}, got {page_size}",
    )
    _require(isinstance(causal, bool), f"causal must be a bool, got {type(causal).__name__}", TypeError)
    if kv_indptr is None:
        _require(
            block_tables.dim() == 2 and block_tables.shape[0] == batch,
            f"block_tables must be [batch={batch}, max_pages], got {tuple(block_tables.shape)}",
        )
        max_pages = block_tables.shape[1]
    else:
        _require(isinstance(kv_indptr, torch.Tensor), "kv_indptr must be a torch.Tensor", TypeError)
        _require(kv_indptr.dtype == torch.int32, f"kv_indptr must be int32, got {kv_indptr.dtype}", TypeError)
        _require(
            kv_indptr.dim() == 1 and kv_indptr.shape[0] == batch + 1 and kv_indptr.is_contiguous(),
            f"kv_indptr must be a contiguous [batch + 1 = {batch + 1}] tensor, got {tuple(kv_indptr.shape)}",
        )
        _require(
            block_tables.dim() == 1,
            f"with kv_indptr, block_tables holds the ragged page ids (kv_indices) [n], got {tuple(block_tables.shape)}",
        )
        max_pages = block_tables.numel()
    _require(
        max_pages * page_size < 2**31,
        f"the page ids address {max_pages} x {page_size} token positions, more than int32 holds",
    )
    _require(
        seq_lens.dim() == 1 and seq_lens.shape[0] == batch,
        f"seq_lens must be [batch={batch}], got {tuple(seq_lens.shape)}",
    )
    _require(
        isinstance(max_seq_len, int) and not isinstance(max_seq_len, bool) and max_seq_len >= 0,
        f"max_seq_len must be a non-negative int, got {max_seq_len!r}",
        TypeError,
    )
    _require(
        max_seq_len <= max_pages * page_size,
        f"max_seq_len {max_seq_len} exceeds what block_tables can address "
        f"({max_pages} pages x {page_size} tokens = {max_pages * page_size})",
    )

    # devices
    device = q_nope.device
    _require(
        device.type in ("cpu", "cuda"),
        f"query is on {device}: the op runs on CUDA tensors (kernels) or CPU tensors (float64 reference)",
    )
    for name, t in (
        ("kv_cache", kv_nope),
        ("block_tables", block_tables),
        ("kv_indptr", kv_indptr),
        ("seq_lens", seq_lens),
        ("workspace_buffer", workspace_buffer),
        ("out", out),
    ):
        if t is not None:
            _require(t.device == device, f"{name} is on {t.device} but query is on {device}")

    # layouts the kernel relies on
    parts = {"query": query_given} if query_given is not None else {"q_nope": q_nope, "q_pe": q_pe}
    for name, part in parts.items():
        problem = query_layout_problem(name, part)
        _require(problem is None, str(problem))
    kv_parts = {"kv_cache": kv_given} if kv_given is not None else {"ckv_cache": kv_nope, "kpe_cache": kv_pe}
    for name, part in kv_parts.items():
        problem = kv_layout_problem(name, part)
        _require(problem is None, str(problem))
    _require(block_tables.stride(-1) == 1, "block_tables rows must be contiguous")
    _require(seq_lens.is_contiguous(), "seq_lens must be contiguous")
    if workspace_buffer is not None:
        _require(workspace_buffer.is_contiguous(), "workspace_buffer must be contiguous")

    # output
    full_shape = (batch, q_len, heads, shapes.KV_LORA_RANK)
    if out is None:
        out_view = torch.empty(full_shape, dtype=torch.bfloat16, device=device)
    else:
        _require(out.dtype == torch.bfloat16, f"out must be bfloat16, got {out.dtype}", TypeError)
        allowed = [full_shape] + ([(batch, heads, shapes.KV_LORA_RANK)] if q_len == 1 else [])
        _require(
            tuple(out.shape) in allowed, f"out must have shape {' or '.join(map(str, allowed))}, got {tuple(out.shape)}"
        )
        _require(out.is_contiguous(), "out must be contiguous")
        out_view = out.view(full_shape)

    return DecodeProblem(
        q_nope=q_nope,
        q_pe=q_pe,
        query_given=query_given,
        kv_nope=kv_nope,
        kv_pe=kv_pe,
        kv_given=kv_given,
        block_tables=block_tables,
        kv_indptr=kv_indptr,
        causal=causal,
        seq_lens=seq_lens,
        max_seq_len=max_seq_len,
        qk_nope_head_dim=qk_nope_head_dim,
        out=out_view,
        out_given=out,
        bmm1_scale=check_scale("bmm1_scale", bmm1_scale, device),
        bmm2_scale=check_scale("bmm2_scale", bmm2_scale, device),
    )


def check_kv_indptr(kv_indptr: torch.Tensor, count: int) -> None:
    """FlashInfer's kv_indptr on the host: starts at 0, never decreases, ends within the ``count`` ids."""
    bounds = kv_indptr.tolist()
    _require(
        bounds[0] >= 0 and all(b >= a for a, b in zip(bounds, bounds[1:])) and bounds[-1] <= count,
        f"kv_indptr must be non-decreasing from >= 0 to <= kv_indices.numel() = {count}, got {bounds}",
    )


def check_page_ids(problem: DecodeProblem) -> None:
    """Host-side check that every page a request reads exists and seq_lens <= max_seq_len.

    Reads seq_lens, block_tables and kv_indptr on the host (a device sync on GPU tensors)."""
    lengths = problem.seq_lens.tolist()
    num_pages = problem.num_pages
    if problem.kv_indptr is not None:
        check_kv_indptr(problem.kv_indptr, problem.block_tables.numel())
    name = "block_tables" if problem.kv_indptr is None else "kv_indices of request"
    for b, (seq_len, row) in enumerate(zip(lengths, problem.table_rows())):
        _require(
            0 <= seq_len <= problem.max_seq_len,
            f"seq_lens[{b}] = {seq_len} is outside 0..max_seq_len ({problem.max_seq_len})",
        )
        used = -(-seq_len // problem.page_size)
        _require(
            used <= row.numel(),
            f"seq_lens[{b}] = {seq_len} needs {used} pages of {problem.page_size}, request {b} has {row.numel()}",
        )
        ids = row[:used]
        if used and (int(ids.min()) < 0 or int(ids.max()) >= num_pages):
            bad = ids[(ids < 0) | (ids >= num_pages)][0].item()
            raise ValueError(f"{name}[{b}] names page {bad}, but kv_cache has pages 0..{num_pages - 1}")
