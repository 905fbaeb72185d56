"""FlashInfer's ``BatchMLAPagedAttentionWrapper`` (flashinfer.mla) on the bundled kernels.

Switch by changing the import::

    from mla_backend import BatchMLAPagedAttentionWrapper  # was: from flashinfer.mla import ...

``__init__``, ``plan`` and ``run`` take FlashInfer's arguments (names, order, defaults) with FlashInfer's
meaning; what the bundled kernels cannot serve is refused by name with a ValueError before anything
runs. CPU tensors run the package's float64 reference. How a plan maps onto the kernels (query
lengths, chunks, page sizes) is in ``wrapper_layout``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import shapes
from .decode import mla_decode
from .flashinfer_api import LOG2E
from .fp8_query import quantise_query
from .wrapper_layout import INT32_LIMIT, KernelLayout, build_layout

SERVED_BACKENDS = ("auto", "fa2", "fa3")
# (q_data_type, kv_data_type) the kernels serve; fp8 KV with a bf16 query quantises the query in run.
PLAN_DTYPES = (
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float8_e4m3fn),
    (torch.float8_e4m3fn, torch.float8_e4m3fn),
)
# The derived ids a CUDA-graph plan may hold at most (int32): 128 MiB.
MAX_GRAPH_IDS = 1 << 25


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_index_tensor(name: str, t, device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32 or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int32 tensor, got {t.dtype} {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the workspace buffer is on {device}")


def _check_bounds(name: str, bounds: list[int]) -> None:
    if bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"{name} must start at 0 and never decrease, got {bounds}")


def _check_tensor(name: str, t, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} must be {dtype} {shape} on {device}, got {t.dtype} {tuple(t.shape)} on {t.device}")


def _positive_scale(name: str, value) -> float:
    scale = float(value)
    if not math.isfinite(scale) or scale <= 0.0:
        raise ValueError(f"{name} must be a finite positive value, got {value}")
    return scale


def _token_view(name: str, cache: torch.Tensor) -> torch.Tensor:
    """[pages * page_size, 1, dim] view of a [pages, page_size, dim] cache, for token slot ids."""
    try:
        return cache.view(-1, 1, cache.shape[-1])
    except RuntimeError as error:
        raise ValueError(
            f"{name}: a page size the kernels cannot read (not a power of two in 1..{shapes.PAGE_SIZES[-1]}) "
            "is served through token slot ids, which needs the cache viewable as [pages * page_size, 1, dim] "
            f"(tokens of a page contiguous with the next page's); got strides {cache.stride()}"
        ) from error


class BatchMLAPagedAttentionWrapper:
    r"""FlashInfer's MLA paged-attention wrapper (decode and incremental prefill over a paged
    compressed-KV cache, after matrix absorption) on the bundled kernels.

    ``backend``: ``"auto"``, ``"fa2"`` and ``"fa3"`` all run the bundled kernels; ``"cutlass"`` is
    refused (its ``run`` takes another layout: concatenated caches with ``kv_len``/``page_table``).
    Served: head_dim_ckv 512 and head_dim_kpe 64 (DeepSeek-V2/V3), 1..128 heads, bf16 q with bf16 or
    fp8 e4m3 KV (FlashInfer's ``ckv_scale``/``kpe_scale``; the query is quantised to e4m3 on the device
    with a per-tensor scale), fp8 q with fp8 KV, any page size (powers of two 1..1024 read natively,
    others through token slot ids made at plan time), any query lengths (requests of equal
    qo_len <= 8 run in place; others as causal chunks of at most 8 tokens), causal or not, CUDA graphs
    (``use_cuda_graph=True``: ``run`` reads only tensors at fixed addresses, re-filled by ``plan``).
    Refused: fp16, ``use_profiler``, ``profiler_buffer``, ``ckv_scale_arr``, and the cutlass-only
    ``kv_len``, ``page_table``, ``o_scale``.

    Example (FlashInfer's, with the import switched)::

        wrapper = BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.int8, device="cuda"))
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, num_heads, 512, 64, page_size,
                     False, sm_scale, torch.bfloat16, torch.bfloat16)
        out = wrapper.run(q_nope, q_pe, ckv_cache, kpe_cache)  # [total_q, num_heads, 512]
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        """``float_workspace_buffer``: the kernels' split-KV workspace (128 MiB recommended), on the
        device of the inputs. ``use_cuda_graph=True`` needs the four int32 buffers ``plan`` copies into
        (the batch size is then fixed). ``backend``: "auto", "fa2" or "fa3" (all the bundled kernels)."""
        if backend == "cutlass":
            raise ValueError(
                "backend='cutlass' is not supported by mla_backend: its run takes another layout "
                "(concatenated q_nope_pe / ckv_kpe_cache with kv_len and page_table); use 'auto', 'fa2' or 'fa3'"
            )
        if backend not in SERVED_BACKENDS:
            raise ValueError(f"backend={backend!r} is not supported by mla_backend: one of {SERVED_BACKENDS}")
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError(
                f"float_workspace_buffer must be a torch.Tensor, got {type(float_workspace_buffer).__name__}"
            )
        if not isinstance(use_cuda_graph, bool):
            raise TypeError(f"use_cuda_graph must be a bool, got {type(use_cuda_graph).__name__}")
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._backend = backend
        self._use_cuda_graph = use_cuda_graph
        buffers = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices, "kv_len_arr": kv_len_arr}
        if use_cuda_graph:
            missing = [name for name, t in buffers.items() if t is None]
            if missing:
                raise ValueError(
                    f"use_cuda_graph=True needs the buffers plan copies into: {', '.join(missing)} missing"
                )
            for name, t in buffers.items():
                _check_index_tensor(name, t, self.device)
        self._qo_indptr_buf = qo_indptr
        self._kv_indptr_buf = kv_indptr
        self._kv_indices_buf = kv_indices
        self._kv_len_arr_buf = kv_len_arr
        self._layout: KernelLayout | None = None
        # CUDA-graph mode: the wrapper's own fixed-address tensors, and the layout the first plan fixed.
        self._graph_buffers: dict[str, torch.Tensor] = {}
        self._graph_key: tuple | None = None

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_len_arr: torch.Tensor,
        num_heads: int,
        head_dim_ckv: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        q_data_type: torch.dtype,
        kv_data_type: torch.dtype,
        use_profiler: bool = False,
    ) -> None:
        """Validate the batch on the host (copies the indptrs and kv_len_arr to the CPU, as FlashInfer
        does) and prepare everything ``run`` reads. ``qo_indptr``/``kv_indptr`` int32 [B + 1],
        ``kv_indices`` int32 page ids, ``kv_len_arr`` int32 [B] (each request's KV length, its new
        query tokens included)."""
        if use_profiler:
            raise ValueError("use_profiler=True is not supported by mla_backend (no intra-kernel profiler)")
        if head_dim_ckv != shapes.KV_LORA_RANK:
            raise ValueError(f"head_dim_ckv must be {shapes.KV_LORA_RANK}, got {head_dim_ckv}")
        if head_dim_kpe != shapes.ROPE_DIM:
            raise ValueError(f"head_dim_kpe must be {shapes.ROPE_DIM} (NoPE MLA is not served), got {head_dim_kpe}")
        if not _is_int(num_heads) or not 1 <= num_heads <= shapes.MAX_HEADS:
            raise ValueError(f"num_heads must be an int in 1..{shapes.MAX_HEADS}, got {num_heads!r}")
        if not _is_int(page_size) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale):
            raise ValueError(f"sm_scale must be a finite float, got {sm_scale!r}")
        if (q_data_type, kv_data_type) not in PLAN_DTYPES:
            served = ", ".join(f"({q}, {kv})" for q, kv in PLAN_DTYPES)
            raise ValueError(
                f"(q_data_type, kv_data_type) = ({q_data_type}, {kv_data_type}) is not supported by mla_backend: "
                f"one of {served}"
            )
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                        ("kv_len_arr", kv_len_arr)):  # fmt: skip
            _check_index_tensor(name, t)
        qo_bounds, kv_bounds, kv_lens = qo_indptr.tolist(), kv_indptr.tolist(), kv_len_arr.tolist()
        batch = len(qo_bounds) - 1
        if batch < 1 or len(kv_bounds) != batch + 1 or len(kv_lens) != batch:
            raise ValueError(
                f"qo_indptr and kv_indptr must be [batch_size + 1] and kv_len_arr [batch_size], batch_size >= 1; "
                f"got {len(qo_bounds)}, {len(kv_bounds)} and {len(kv_lens)} entries"
            )
        _check_bounds("qo_indptr", qo_bounds)
        _check_bounds("kv_indptr", kv_bounds)
        if qo_bounds[-1] < 1:
            raise ValueError("qo_indptr describes no query token (qo_indptr[-1] = 0)")
        if kv_bounds[-1] > kv_indices.numel():
            raise ValueError(f"kv_indptr[-1] = {kv_bounds[-1]} exceeds kv_indices' {kv_indices.numel()} entries")
        for b, kv_len in enumerate(kv_lens):
            pages = kv_bounds[b + 1] - kv_bounds[b]
            if not 0 <= kv_len <= pages * page_size:
                raise ValueError(
                    f"kv_len_arr[{b}] = {kv_len} must be in 0..{pages * page_size} "
                    f"(request {b} has {pages} pages of {page_size})"
                )
        if self._use_cuda_graph:
            ids, lens = self._copy_into_graph_buffers(qo_indptr, kv_indptr, kv_indices, kv_len_arr, kv_bounds[-1])
        else:
            ids, lens = kv_indices.to(self.device), kv_len_arr.to(self.device)
        layout = build_layout(qo_bounds, kv_bounds, ids, kv_lens, lens, page_size, causal)
        if self._use_cuda_graph:
            max_chunks = max(-(-(b - a) // layout.q_len) for a, b in zip(qo_bounds, qo_bounds[1:]))
            layout = self._pin(
                layout, ids, lens, max_chunks * (1 if page_size == layout.kernel_page_size else page_size)
            )
        self._layout = layout
        self._num_heads = num_heads
        self._page_size = page_size
        self._causal = causal
        self._sm_scale = float(sm_scale)
        self._q_data_type = q_data_type
        self._kv_data_type = kv_data_type

    def _copy_into_graph_buffers(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, used_ids: int):
        """FlashInfer's CUDA-graph plan: the arrays copied into the caller's buffers."""
        assert self._qo_indptr_buf is not None and self._kv_indptr_buf is not None
        assert self._kv_indices_buf is not None and self._kv_len_arr_buf is not None
        pairs = (
            ("qo_indptr", self._qo_indptr_buf, qo_indptr),
            ("kv_indptr", self._kv_indptr_buf, kv_indptr),
            ("kv_len_arr", self._kv_len_arr_buf, kv_len_arr),
        )
        for name, buf, t in pairs:
            if buf.shape != t.shape:
                raise ValueError(
                    f"use_cuda_graph=True fixes the batch size: the {name} buffer holds {buf.numel()} entries, "
                    f"this plan's {name} {t.numel()}"
                )
            buf.copy_(t, non_blocking=True)
        if kv_indices.numel() > self._kv_indices_buf.numel():
            raise ValueError(
                f"kv_indices has {kv_indices.numel()} entries, more than the kv_indices buffer "
                f"({self._kv_indices_buf.numel()}) given for use_cuda_graph=True"
            )
        self._kv_indices_buf[: kv_indices.numel()].copy_(kv_indices, non_blocking=True)
        return self._kv_indices_buf[:used_ids], self._kv_len_arr_buf

    def _fixed(self, name: str, values: torch.Tensor, capacity: int) -> torch.Tensor:
        """A wrapper-owned buffer at a fixed address holding ``values`` (made at the first plan)."""
        buf = self._graph_buffers.get(name)
        if buf is None:
            buf = torch.zeros(max(capacity, values.numel()), dtype=values.dtype, device=self.device)
            self._graph_buffers[name] = buf
        if values.numel() > buf.numel():
            raise ValueError(
                f"use_cuda_graph=True: this plan needs {values.numel()} {name}, more than the {buf.numel()} the "
                "first plan sized the captured buffers for (plan the longest batch first, or use a new wrapper)"
            )
        buf[: values.numel()].copy_(values, non_blocking=True)
        return buf

    def _pin(self, layout: KernelLayout, ids: torch.Tensor, lens: torch.Tensor, ids_per_id: int) -> KernelLayout:
        """The layout with every tensor ``run`` reads at a fixed address, and max_seq_len the bound the
        ids can address (a captured graph keeps the value of its capture)."""
        key = layout.shape_key()
        if self._graph_key is None:
            self._graph_key = key
        elif key != self._graph_key:
            names = ("kernel requests", "q_len", "query tokens", "kernel page size", "in-place query")
            now = ", ".join(f"{n} {v}" for n, v in zip(names, key))
            first = ", ".join(f"{n} {v}" for n, v in zip(names, self._graph_key))
            raise ValueError(
                f"use_cuda_graph=True: this plan's layout ({now}) differs from the first plan's ({first}), which "
                "a captured graph reads; plan the same query lengths and page size, or use a new wrapper"
            )
        assert self._kv_indices_buf is not None and self._kv_indptr_buf is not None
        if layout.kv_indices is ids:  # the caller's ids, as FlashInfer reads them
            indices, indptr = self._kv_indices_buf, self._kv_indptr_buf
        else:
            capacity = min(self._kv_indices_buf.numel() * ids_per_id, MAX_GRAPH_IDS)
            indices = self._fixed("kv_indices", layout.kv_indices, capacity)
            indptr = self._fixed("kv_indptr", layout.kv_indptr, 0)
        seq_lens = lens if layout.seq_lens is lens else self._fixed("seq_lens", layout.seq_lens, 0)
        indices = indices[: (INT32_LIMIT - 1) // layout.kernel_page_size]
        sources, slots = layout.grid_sources, layout.packed_slots
        if sources is not None and slots is not None:
            sources, slots = self._fixed("grid_sources", sources, 0), self._fixed("packed_slots", slots, 0)
        return dataclasses.replace(
            layout,
            kv_indices=indices,
            kv_indptr=indptr,
            seq_lens=seq_lens,
            max_seq_len=indices.numel() * layout.kernel_page_size,
            grid_sources=sources,
            packed_slots=slots,
        )

    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        profiler_buffer: torch.Tensor | None = None,
        kv_len: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        return_lse_base_on_e: bool = False,
        o_scale: float | None = None,
        *,
        ckv_scale: float | None = None,
        ckv_scale_arr: torch.Tensor | None = None,
        kpe_scale: float | None = None,
    ):
        """The planned attention: ``q_nope`` [total_q, H, 512], ``q_pe`` [total_q, H, 64], ``ckv_cache``
        [pages, page_size, 512], ``kpe_cache`` [pages, page_size, 64]. Returns ``out`` (bf16
        [total_q, H, 512]), or ``(out, lse)`` (fp32 [total_q, H]) with ``return_lse=True``; a given
        ``lse`` is filled either way. The LSE is base 2, natural with ``return_lse_base_on_e=True``;
        -inf (output 0) for a row that sees no key. FP8 KV: ``ckv_scale`` and ``kpe_scale`` dequantise
        (real = stored * scale)."""
        layout = self._layout
        if layout is None:
            raise ValueError("run() before plan(): call plan() first")
        for name, value in (("o_scale", o_scale), ("kv_len", kv_len), ("page_table", page_table)):
            if value is not None:
                raise ValueError(
                    f"{name} is only taken by FlashInfer's cutlass backend, which mla_backend does not serve"
                )
        if profiler_buffer is not None:
            raise ValueError("profiler_buffer is not supported by mla_backend (no intra-kernel profiler): pass None")
        for name, t, dtype in (("q_nope", q_nope, self._q_data_type), ("q_pe", q_pe, self._q_data_type),
                               ("ckv_cache", ckv_cache, self._kv_data_type),
                               ("kpe_cache", kpe_cache, self._kv_data_type)):  # fmt: skip
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            kind = "q_data_type" if name.startswith("q") else "kv_data_type"
            if t.dtype != dtype:
                raise ValueError(f"{name}.dtype={t.dtype} does not match the planned {kind}={dtype}.")
        bmm1: float | torch.Tensor
        bmm1, bmm2, rope_ratio = self._scales(ckv_scale, ckv_scale_arr, kpe_scale)
        rows, heads = layout.total_q, self._num_heads
        _check_tensor("q_nope", q_nope, (rows, heads, shapes.KV_LORA_RANK), q_nope.dtype, self.device)
        _check_tensor("q_pe", q_pe, (rows, heads, shapes.ROPE_DIM), q_pe.dtype, self.device)
        pages = ckv_cache.shape[0] if ckv_cache.dim() == 3 else -1
        for name, t, dim in (("ckv_cache", ckv_cache, shapes.KV_LORA_RANK), ("kpe_cache", kpe_cache, shapes.ROPE_DIM)):
            _check_tensor(name, t, (pages, self._page_size, dim), t.dtype, self.device)
        if out is not None:
            _check_tensor("out", out, (rows, heads, shapes.KV_LORA_RANK), torch.bfloat16, self.device)
        if lse is not None:
            _check_tensor("lse", lse, (rows, heads), torch.float32, self.device)
        if layout.token_slots and self._page_size != 1:
            kv = (_token_view("ckv_cache", ckv_cache), _token_view("kpe_cache", kpe_cache))
        else:
            kv = (ckv_cache, kpe_cache)
        if rope_ratio is not None:
            q_nope, q_pe, q_scale = quantise_query(q_nope, q_pe, rope_ratio)
            bmm1 = q_scale * bmm1  # one-element fp32 on the device: no host sync
        wants_lse = return_lse or lse is not None
        if layout.grid_sources is None:
            result_out, result_lse = self._run_in_place(layout, q_nope, q_pe, kv, out, lse, wants_lse, bmm1, bmm2)
        else:
            result_out, result_lse = self._run_on_grid(layout, q_nope, q_pe, kv, out, lse, wants_lse, bmm1, bmm2)
        if result_lse is not None and not return_lse_base_on_e:
            result_lse.mul_(LOG2E)  # the kernels' natural log into FlashInfer's base 2; -inf stays -inf
        return (result_out, result_lse) if return_lse else result_out

    def _scales(self, ckv_scale, ckv_scale_arr, kpe_scale) -> tuple[float, float, float | None]:
        """(bmm1, bmm2, the rope factor the query is quantised with, or None to run it as it is)."""
        if self._kv_data_type != torch.float8_e4m3fn:
            if ckv_scale is not None or ckv_scale_arr is not None or kpe_scale is not None:
                raise ValueError("ckv_scale / ckv_scale_arr / kpe_scale are only valid when kv_data_type is FP8.")
            return self._sm_scale, 1.0, None
        if (ckv_scale is None) == (ckv_scale_arr is None):
            raise ValueError("Exactly one of ckv_scale or ckv_scale_arr is required when kv_data_type is FP8.")
        if ckv_scale_arr is not None:
            raise ValueError(
                "ckv_scale_arr (per-token, per-128-channel scales) is not supported by mla_backend: pass ckv_scale"
            )
        if kpe_scale is None:
            raise ValueError("kpe_scale is required when kv_data_type is FP8.")
        ckv = _positive_scale("ckv_scale", ckv_scale)
        ratio = _positive_scale("kpe_scale", kpe_scale) / ckv
        # An fp8 query with equal scales runs as given; otherwise q_pe is rescaled and q quantised.
        keep = self._q_data_type == torch.float8_e4m3fn and ratio == 1.0
        return self._sm_scale * ckv, ckv, None if keep else ratio

    def _kernel(self, layout: KernelLayout, query, kv, out, lse, wants_lse: bool, bmm1, bmm2):
        return mla_decode(
            query,
            kv,
            self._float_workspace_buffer,
            layout.kv_indices,
            layout.seq_lens,
            layout.max_seq_len,
            out=out,
            lse=lse,
            return_lse=wants_lse,
            bmm1_scale=bmm1,
            bmm2_scale=bmm2,
            kv_indptr=layout.kv_indptr,
            causal=self._causal,
        )

    def _run_in_place(self, layout, q_nope, q_pe, kv, out, lse, wants_lse, bmm1, bmm2):
        """Every request the same qo_len: [B, q_len, H, D] views of the packed rows, results written
        straight into the caller's contiguous buffers."""
        grid = (layout.batch, layout.q_len)
        query = (q_nope.unflatten(0, grid), q_pe.unflatten(0, grid))
        direct_out = out.view(*grid, *out.shape[1:]) if out is not None and out.is_contiguous() else None
        result = self._kernel(layout, query, kv, direct_out, lse, wants_lse, bmm1, bmm2)
        kernel_out, kernel_lse = result if wants_lse else (result, None)
        if out is None:
            out = kernel_out.view(layout.total_q, *kernel_out.shape[2:])
        elif direct_out is None:
            out.copy_(kernel_out.view(out.shape))
        if kernel_lse is not None and lse is None:
            lse = kernel_lse.view(layout.total_q, -1)
        return out, lse

    def _run_on_grid(self, layout, q_nope, q_pe, kv, out, lse, wants_lse, bmm1, bmm2):
        """Uneven or long queries: chunks right-aligned on the [chunks, q_len] grid, and back."""
        grid = (layout.batch, layout.q_len)
        query = tuple(t.index_select(0, layout.grid_sources).unflatten(0, grid) for t in (q_nope, q_pe))
        result = self._kernel(layout, query, kv, None, None, wants_lse, bmm1, bmm2)
        kernel_out, kernel_lse = result if wants_lse else (result, None)
        packed_out = kernel_out.flatten(0, 1).index_select(0, layout.packed_slots)
        out = packed_out if out is None else out.copy_(packed_out)
        if kernel_lse is not None:
            packed_lse = kernel_lse.flatten(0, 1).index_select(0, layout.packed_slots)
            lse = packed_lse if lse is None else lse.copy_(packed_lse)
        return out, lse


__all__ = ["BatchMLAPagedAttentionWrapper"]
