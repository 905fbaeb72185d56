"""FlashInfer's three MLA decode entry points, with FlashInfer's signatures and conventions.

Switch from FlashInfer by changing the import::

    from mla_backend import batch_mla_paged_attention  # was: from flashinfer.mla import ...

``batch_mla_paged_attention`` (keyword-only) and its aliases ``trtllm_batch_decode_with_kv_cache_mla``
and ``xqa_batch_decode_with_kv_cache_mla`` take every keyword FlashInfer's take, in FlashInfer's order
with FlashInfer's defaults. Each keyword is honoured with FlashInfer's meaning, or, for a value the
bundled kernels cannot serve, refused with a ValueError naming the keyword, the value and what is
supported, before anything runs.

The LSE follows FlashInfer (0.7.2, flashinfer/mla/_core.py): ``return_lse_base="base2"`` or
``"basee"`` picks the base; ``None`` keeps FlashInfer's default for the path the call takes: base 2
for fixed-length queries (trtllm-gen's ``log2e * max + log2(sum)``, include/flashinfer/trtllm/fmha/
lse.cuh), the natural log under ``enable_dcp`` and for packed variable-length queries (FlashInfer runs
both on its monolithic CuTe DSL kernel, whose LSE is base e: ``_cute_dsl_monolithic_log_scale``).
A row that sees no key has LSE -inf in either base. The package's own ``mla_decode`` always returns
the natural log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from . import shapes
from .config import MLABackendConfig
from .decode import KVCache, Query, Scale, check_lse_buffer, mla_decode
from .packed_queries import PackedQueries

LOG2E = 1.0 / math.log(2.0)
SUPPORTED_BACKENDS = ("auto", "xqa", "trtllm-gen")
CUTE_DSL_IMPLS = ("auto", "monolithic", "modular")
KV_SCALE_FORMATS = ("auto", "pow2_fp32", "arbitrary_fp32")
LSE_BASES = (None, "base2", "basee")


def _refuse(keyword: str, value, supported: str) -> None:
    raise ValueError(f"{keyword}={value!r} is not supported by mla_backend: {supported}")


def _pick_pair(name: str, packed, first, second, first_name: str, second_name: str):
    """The packed tensor, else the complete (first, second) pair; a half pair is an error."""
    if (first is None) != (second is None):
        raise ValueError(f"{first_name} and {second_name} must be given together (got only one of them)")
    if packed is not None:
        return packed
    if first is None:
        raise ValueError(f"give {name}, or both {first_name} and {second_name}")
    return (first, second)


def _check_unserved_keywords(
    *,
    backend,
    sparse_mla_top_k,
    sparse_mla_top_k_lens,
    sinks,
    skip_softmax_threshold_scale_factor,
    uses_shared_paged_kv_idx,
    cute_dsl_impl,
    kv_scale_format,
    use_fp16_softmax,
    return_lse_base,
    is_var_seq,
    multi_ctas_kv_counter_buffer,
) -> None:
    """Refuse, by keyword, every value the bundled kernels cannot serve."""
    if backend not in SUPPORTED_BACKENDS:
        _refuse(
            "backend",
            backend,
            f"one of {SUPPORTED_BACKENDS} (FlashInfer's cute-dsl, sparse, fa2, fa3 and cutlass are not bundled)",
        )
    if not isinstance(sparse_mla_top_k, int) or isinstance(sparse_mla_top_k, bool) or sparse_mla_top_k < 0:
        _refuse("sparse_mla_top_k", sparse_mla_top_k, "0 (dense) or the index lists' width K > 0 (sparse)")
    if sparse_mla_top_k_lens is not None and sparse_mla_top_k == 0:
        _refuse("sparse_mla_top_k_lens", "a tensor", "None without sparse_mla_top_k")
    if sinks is not None:
        _refuse("sinks", "a value", "None (no attention sinks in the bundled kernels)")
    if skip_softmax_threshold_scale_factor is not None:
        _refuse("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor, "None (exact softmax only)")
    if uses_shared_paged_kv_idx is not True:
        _refuse(
            "uses_shared_paged_kv_idx",
            uses_shared_paged_kv_idx,
            "True (one [batch, max_pages] page table for K and V; TRT-LLM's 3-D table is trtllm-gen only)",
        )
    if cute_dsl_impl not in CUTE_DSL_IMPLS:
        _refuse("cute_dsl_impl", cute_dsl_impl, f"one of {CUTE_DSL_IMPLS} (unused: no cute-dsl backend here)")
    if kv_scale_format not in KV_SCALE_FORMATS:
        _refuse(
            "kv_scale_format", kv_scale_format, f"one of {KV_SCALE_FORMATS} (fp8_ds_mla's scales, applied as stored)"
        )
    if use_fp16_softmax:
        _refuse("use_fp16_softmax", use_fp16_softmax, "None or False (the softmax runs in fp32)")
    if return_lse_base not in LSE_BASES:
        _refuse("return_lse_base", return_lse_base, f"one of {LSE_BASES}")
    if not isinstance(is_var_seq, bool):
        raise TypeError(f"is_var_seq must be a bool, got {type(is_var_seq).__name__}")
    if multi_ctas_kv_counter_buffer is not None and not isinstance(multi_ctas_kv_counter_buffer, torch.Tensor):
        raise TypeError(
            "multi_ctas_kv_counter_buffer must be a torch.Tensor or None, "
            f"got {type(multi_ctas_kv_counter_buffer).__name__}"
        )


@dataclass(frozen=True)
class ContextParallel:
    """Cyclic decode context parallelism: this rank holds global KV positions rank, rank + world, ...;
    ``global_bound`` [B] is each request's exclusive global causal bound for its newest query token."""

    world: int
    rank: int
    global_bound: torch.Tensor

    def visible_lengths(self, local_lens: torch.Tensor, q_len: int) -> torch.Tensor:
        """[B, q_len] local KV positions query token i sees: those l with l * world + rank below
        global_bound - (q_len - 1 - i), never more than the rank holds (local_lens)."""
        steps = torch.arange(q_len, device=local_lens.device, dtype=torch.int64)
        bound = self.global_bound.to(torch.int64)[:, None] - (q_len - 1) + steps[None, :] - self.rank
        count = torch.div(bound + self.world - 1, self.world, rounding_mode="floor").clamp(min=0)
        return torch.minimum(count, local_lens.to(torch.int64)[:, None]).to(torch.int32)


def _check_context_parallel(enable_dcp, cp_world, cp_rank, causal_seqlens_kv_global, return_lse, query):
    if not isinstance(enable_dcp, bool):
        raise TypeError(f"enable_dcp must be a bool, got {type(enable_dcp).__name__}")
    if not isinstance(cp_world, int) or isinstance(cp_world, bool) or cp_world <= 0:
        raise ValueError(f"cp_world must be a positive integer, got {cp_world!r}")
    if not isinstance(cp_rank, int) or isinstance(cp_rank, bool):
        raise TypeError(f"cp_rank must be an integer, got {type(cp_rank).__name__}")
    if not enable_dcp:
        stray = [f"cp_world={cp_world}"] * (cp_world != 1) + [f"cp_rank={cp_rank}"] * (cp_rank != 0)
        stray += ["causal_seqlens_kv_global"] * (causal_seqlens_kv_global is not None)
        if stray:
            raise ValueError(f"DCP arguments require enable_dcp=True; got {', '.join(stray)}")
        return None
    if not isinstance(query, torch.Tensor) or query.dim() != 4:
        raise ValueError("enable_dcp=True requires a dense query [batch, q_len, heads, 576] (or its split pair)")
    if not 0 <= cp_rank < cp_world:
        raise ValueError(f"cp_rank must satisfy 0 <= cp_rank < cp_world, got cp_rank={cp_rank}, cp_world={cp_world}")
    if not return_lse:
        raise ValueError("enable_dcp=True requires return_lse=True so rank-local attention states can be merged")
    bound, batch, device = causal_seqlens_kv_global, query.shape[0], query.device
    if not isinstance(bound, torch.Tensor):
        raise TypeError(f"causal_seqlens_kv_global must be a torch.Tensor, got {type(bound).__name__}")
    if bound.dtype != torch.int32 or tuple(bound.shape) != (batch,) or bound.device != device:
        raise ValueError(
            f"causal_seqlens_kv_global must be int32 [batch={batch}] on {device}, "
            f"got {bound.dtype} {tuple(bound.shape)} on {bound.device}"
        )
    if not bound.is_contiguous():
        raise ValueError("causal_seqlens_kv_global must be contiguous")
    return ContextParallel(cp_world, cp_rank, bound)


def _check_packed_queries(cum_seq_lens_q, max_q_len, query) -> PackedQueries | None:
    if cum_seq_lens_q is None:
        if max_q_len is not None:
            raise ValueError("max_q_len is only supported when cum_seq_lens_q is provided")
        return None
    if not isinstance(query, torch.Tensor) or query.dim() != 3:
        raise ValueError("with cum_seq_lens_q the query must be [total_q, heads, 576] (or its split pair)")
    total, device, cum = query.shape[0], query.device, cum_seq_lens_q
    if not isinstance(cum, torch.Tensor):
        raise TypeError(f"cum_seq_lens_q must be an int32 torch.Tensor, got {type(cum).__name__}")
    if cum.dtype != torch.int32 or cum.dim() != 1 or cum.shape[0] < 2 or cum.device != device:
        raise ValueError(
            f"cum_seq_lens_q must be int32 [batch + 1] (at least 2 entries) on {device}, "
            f"got {cum.dtype} {tuple(cum.shape)} on {cum.device}"
        )
    if max_q_len is None:  # FlashInfer validates on the host here too (a device sync)
        values = cum.tolist()
        if values[0] != 0 or values[-1] != total or any(b < a for a, b in zip(values, values[1:])):
            raise ValueError(
                f"cum_seq_lens_q must start at 0, never decrease and end at query.size(0) = {total}, got {values}"
            )
        max_q_len = max(b - a for a, b in zip(values, values[1:]))
    if not isinstance(max_q_len, int) or isinstance(max_q_len, bool) or not 1 <= max_q_len <= shapes.MAX_Q_LEN:
        raise ValueError(f"max_q_len must be an int in 1..{shapes.MAX_Q_LEN}, got {max_q_len!r}")
    return PackedQueries(cum, max_q_len, total)


def _query_parts(query) -> tuple[torch.Tensor, ...]:
    return tuple(query) if isinstance(query, (tuple, list)) else (query,)


def batch_mla_paged_attention(
    *,
    query: Query | None = None,
    q_nope: torch.Tensor | None = None,
    q_pe: torch.Tensor | None = None,
    kv_cache: KVCache | None = None,
    ckv_cache: torch.Tensor | None = None,
    kpe_cache: torch.Tensor | None = None,
    workspace_buffer: torch.Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: torch.Tensor | None = None,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    sinks: list[torch.Tensor] | None = None,
    skip_softmax_threshold_scale_factor: float | None = None,
    enable_pdl: bool | None = None,
    backend: str = "auto",
    is_var_seq: bool = True,
    uses_shared_paged_kv_idx: bool = True,
    lse: torch.Tensor | None = None,
    return_lse: bool = False,
    cute_dsl_impl: str = "auto",
    kv_scale_format: str = "auto",
    cum_seq_lens_q: torch.Tensor | None = None,
    max_q_len: int | None = None,
    multi_ctas_kv_counter_buffer: torch.Tensor | None = None,
    sparse_mla_top_k_lens: torch.Tensor | None = None,
    enable_dcp: bool = False,
    cp_world: int = 1,
    cp_rank: int = 0,
    causal_seqlens_kv_global: torch.Tensor | None = None,
    use_fp16_softmax: bool | None = None,
    return_lse_base: Literal["base2", "basee"] | None = None,
    config: MLABackendConfig | None = None,
):
    """FlashInfer's ``batch_mla_paged_attention`` on the bundled kernels (see the module docstring).

    Query: packed ``query`` [B, q_len, H, 576] (or [total_q, H, 576] with ``cum_seq_lens_q``), or
    ``q_nope`` [.., 512] + ``q_pe`` [.., 64]. KV: packed ``kv_cache`` [pages, page_size, 576] (or
    [pages, 1, page_size, 576]), or ``ckv_cache`` [.., 512] + ``kpe_cache`` [.., 64]. Every form is
    read in place; given both forms, the packed one is used. Returns ``out``, or ``(out, lse)`` with
    ``return_lse=True``; a caller's ``out`` and ``lse`` buffers are filled and returned as given.

    Served: bf16 or fp8 e4m3, 1-128 heads, q_len 1-8 (or variable, via ``cum_seq_lens_q``/
    ``max_q_len``, each request 1-8), pages of any power of two from 1 to 1024 tokens, scales as floats or one-element
    fp32 device tensors, cyclic DCP (``enable_dcp``, ``cp_world``, ``cp_rank``,
    ``causal_seqlens_kv_global``: with q_len > 1 each query token runs as its own request, reading
    the KV once per token). Sparse MLA (``sparse_mla_top_k`` > 0, ``sparse_mla_top_k_lens``,
    ``kv_scale_format``) as FlashInfer's sparse path reads them: flashinfer_sparse.py. Hints without
    effect here: ``is_var_seq``, ``cute_dsl_impl``, ``multi_ctas_kv_counter_buffer`` (the split-KV merge
    needs no counters).
    Beyond FlashInfer: ``config`` replaces the settings read from the environment.
    """
    _check_unserved_keywords(
        backend=backend,
        sparse_mla_top_k=sparse_mla_top_k,
        sparse_mla_top_k_lens=sparse_mla_top_k_lens,
        sinks=sinks,
        skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
        uses_shared_paged_kv_idx=uses_shared_paged_kv_idx,
        cute_dsl_impl=cute_dsl_impl,
        kv_scale_format=kv_scale_format,
        use_fp16_softmax=use_fp16_softmax,
        return_lse_base=return_lse_base,
        is_var_seq=is_var_seq,
        multi_ctas_kv_counter_buffer=multi_ctas_kv_counter_buffer,
    )
    if kv_lora_rank != shapes.KV_LORA_RANK:
        raise ValueError(f"kv_lora_rank must be {shapes.KV_LORA_RANK}, got {kv_lora_rank}")
    if qk_rope_head_dim != shapes.ROPE_DIM:
        raise ValueError(f"qk_rope_head_dim must be {shapes.ROPE_DIM}, got {qk_rope_head_dim}")
    # Beyond FlashInfer, ``query`` and ``kv_cache`` may themselves be the split pairs.
    q = _pick_pair("query", query, q_nope, q_pe, "q_nope", "q_pe")
    kv: KVCache = _pick_pair("kv_cache", kv_cache, ckv_cache, kpe_cache, "ckv_cache", "kpe_cache")
    lead = _query_parts(q)[0]
    wants_lse = return_lse or lse is not None
    kwargs = dict(
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        enable_pdl=enable_pdl,
        backend=backend,
        config=config,
        qk_nope_head_dim=qk_nope_head_dim,
    )
    if sparse_mla_top_k > 0:
        if cum_seq_lens_q is not None or max_q_len is not None or enable_dcp is not False:
            raise ValueError("sparse_mla_top_k takes [B, q_len] queries: no cum_seq_lens_q / max_q_len / enable_dcp")
        if backend == "trtllm-gen":
            _refuse("backend", backend, "'auto' or 'xqa' with sparse_mla_top_k (the bundled sparse kernels)")
        from .flashinfer_sparse import run_flashinfer_sparse

        return run_flashinfer_sparse(
            query=q, kv_cache=kv, workspace_buffer=workspace_buffer, block_tables=block_tables, seq_lens=seq_lens,
            sparse_mla_top_k=sparse_mla_top_k, sparse_mla_top_k_lens=sparse_mla_top_k_lens, out=out,
            bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, enable_pdl=enable_pdl, lse=lse, return_lse=return_lse,
            return_lse_base=return_lse_base, config=config,
        )  # fmt: skip
    if enable_dcp is True and (cum_seq_lens_q is not None or max_q_len is not None):
        raise ValueError("enable_dcp=True does not support cum_seq_lens_q / max_q_len (as in FlashInfer)")
    packed = _check_packed_queries(cum_seq_lens_q, max_q_len, lead)
    dcp = _check_context_parallel(enable_dcp, cp_world, cp_rank, causal_seqlens_kv_global, return_lse, lead)
    if packed is not None:
        result = _run_packed(packed, q, kv, workspace_buffer, block_tables, seq_lens, max_seq_len, out, lse, kwargs)
        result = result if wants_lse else result[0]
    elif dcp is not None:
        if backend == "trtllm-gen":
            _refuse("backend", backend, "'auto' or 'xqa' with enable_dcp=True (FlashInfer's DCP runs on cute-dsl)")
        result = _run_context_parallel(
            dcp, q, kv, workspace_buffer, block_tables, seq_lens, max_seq_len, out, lse, kwargs
        )
    else:
        result = mla_decode(
            q, kv, workspace_buffer, block_tables, seq_lens, max_seq_len, out=out, lse=lse, return_lse=wants_lse,
            **kwargs,
        )  # fmt: skip
    if not wants_lse:
        return result
    result_out, result_lse = result
    # FlashInfer's default base per path: its DCP and variable-length LSE kernel (CuTe DSL) is base e.
    default_base = "basee" if packed is not None or dcp is not None else "base2"
    _to_lse_base(result_lse, return_lse_base or default_base)
    return (result_out, result_lse) if return_lse else result_out


def _to_lse_base(lse: torch.Tensor, base: str) -> None:
    """In place: the natural-log LSE into ``base``; -inf stays -inf."""
    if base == "base2":
        lse.mul_(LOG2E)


def _run_context_parallel(dcp, q, kv, workspace, block_tables, seq_lens, max_seq_len, out, lse, kwargs):
    """One rank's share under cyclic DCP: the bundled kernels' causal rule adds one key per query token,
    DCP's one per ``world`` tokens, so each query token runs as a request of its own (q_len 1) with
    the local length it may see. Returns (out, natural-log LSE)."""
    parts = _query_parts(q)
    batch, q_len, heads = parts[0].shape[:3]
    tokens = batch * q_len
    visible = dcp.visible_lengths(seq_lens, q_len).reshape(-1)
    flat = tuple(t.reshape(tokens, 1, heads, t.shape[-1]) for t in parts)
    tables = block_tables if q_len == 1 else block_tables.repeat_interleave(q_len, dim=0)
    flat_out = None
    if out is not None:
        if not out.is_contiguous() or out.numel() != tokens * heads * shapes.KV_LORA_RANK:
            raise ValueError(f"out must be a contiguous [batch, q_len, heads, 512] tensor, got {tuple(out.shape)}")
        flat_out = out.view(tokens, 1, heads, shapes.KV_LORA_RANK)
    if lse is not None:
        check_lse_buffer(lse, [(tokens, heads), (batch, q_len, heads)], parts[0].device)
    result_out, result_lse = mla_decode(
        flat if len(flat) == 2 else flat[0], kv, workspace, tables, visible, max_seq_len, out=flat_out,
        lse=None if lse is None else lse.view(-1, heads) if lse.is_contiguous() else None, return_lse=True, **kwargs,
    )  # fmt: skip
    if lse is not None and result_lse.data_ptr() != lse.data_ptr():
        lse.copy_(result_lse.view(lse.shape))
    final_lse = lse if lse is not None else result_lse.view(batch, q_len, heads)
    return (out if out is not None else result_out.view(batch, q_len, heads, -1)), final_lse


def _run_packed(packed, q, kv, workspace, block_tables, seq_lens, max_seq_len, out, lse, kwargs):
    """Variable-length queries: onto the right-aligned grid, decoded at q_len = max_q_len, and back.
    Returns (out, natural-log LSE)."""
    parts = _query_parts(q)
    for t in parts:
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[0] != packed.total:
            raise ValueError(f"with cum_seq_lens_q the query parts must be [total_q={packed.total}, heads, dim]")
    heads = parts[0].shape[1]
    rows = (packed.total, heads)
    if out is not None and (out.dtype != torch.bfloat16 or tuple(out.shape) != (*rows, shapes.KV_LORA_RANK)):
        raise ValueError(f"out must be bf16 {(*rows, shapes.KV_LORA_RANK)}, got {out.dtype} {tuple(out.shape)}")
    if lse is not None:
        check_lse_buffer(lse, [rows], parts[0].device)
    grid = tuple(packed.to_grid(t) for t in parts)
    result = mla_decode(
        grid if len(grid) == 2 else grid[0], kv, workspace, block_tables, seq_lens, max_seq_len, return_lse=True,
        **kwargs,
    )  # fmt: skip
    grid_out, grid_lse = result
    result_out = packed.from_grid(grid_out)
    if out is not None:
        result_out = out.copy_(result_out)
    result_lse = packed.from_grid(grid_lse)
    if lse is not None:
        result_lse = lse.copy_(result_lse)
    return result_out, result_lse


def trtllm_batch_decode_with_kv_cache_mla(
    query: Query,
    kv_cache: KVCache,
    workspace_buffer: torch.Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: torch.Tensor | None = None,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    sinks: list[torch.Tensor] | None = None,
    skip_softmax_threshold_scale_factor: float | None = None,
    enable_pdl: bool | None = None,
    backend: str = "auto",
    is_var_seq: bool = True,
    uses_shared_paged_kv_idx: bool = True,
    lse: torch.Tensor | None = None,
    return_lse: bool = False,
    cute_dsl_impl: str = "auto",
    kv_scale_format: str = "auto",
    cum_seq_lens_q: torch.Tensor | None = None,
    max_q_len: int | None = None,
    multi_ctas_kv_counter_buffer: torch.Tensor | None = None,
    sparse_mla_top_k_lens: torch.Tensor | None = None,
    enable_dcp: bool = False,
    cp_world: int = 1,
    cp_rank: int = 0,
    causal_seqlens_kv_global: torch.Tensor | None = None,
    use_fp16_softmax: bool | None = None,
    return_lse_base: Literal["base2", "basee"] | None = None,
    *,
    config: MLABackendConfig | None = None,
):
    """FlashInfer's ``trtllm_batch_decode_with_kv_cache_mla`` (positional form of
    :func:`batch_mla_paged_attention`). Beyond FlashInfer, ``query`` may be the (q_nope, q_pe) pair and
    ``kv_cache`` the (ckv_cache, kpe_cache) pair, both read in place."""
    return batch_mla_paged_attention(**locals())  # the same keywords, by name


def xqa_batch_decode_with_kv_cache_mla(
    query: Query,
    kv_cache: KVCache,
    workspace_buffer: torch.Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    sinks: list[torch.Tensor] | None = None,
    enable_pdl: bool | None = None,
    return_lse: bool = False,
    *,
    lse: torch.Tensor | None = None,
    return_lse_base: Literal["base2", "basee"] | None = None,
    config: MLABackendConfig | None = None,
):
    """FlashInfer's ``xqa_batch_decode_with_kv_cache_mla``: ``batch_mla_paged_attention(backend="xqa")``.

    Unlike FlashInfer's SM120-only XQA MLA: bf16 and fp8, 1-128 heads, q_len 1-8, split-KV, and,
    beyond its signature, ``return_lse``/``lse``/``return_lse_base`` (base 2 by default) and the split
    query and cache pairs."""
    return trtllm_batch_decode_with_kv_cache_mla(
        query,
        kv_cache,
        workspace_buffer,
        qk_nope_head_dim,
        kv_lora_rank,
        qk_rope_head_dim,
        block_tables,
        seq_lens,
        max_seq_len,
        out=out,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        sinks=sinks,
        enable_pdl=enable_pdl,
        backend="xqa",
        lse=lse,
        return_lse=return_lse,
        return_lse_base=return_lse_base,
        config=config,
    )


__all__ = ["batch_mla_paged_attention", "trtllm_batch_decode_with_kv_cache_mla", "xqa_batch_decode_with_kv_cache_mla"]
