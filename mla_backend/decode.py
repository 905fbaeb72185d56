"""The package's own MLA decode op, ``mla_decode``: the engines' entry point.

Semantics: logits = (q . k) * bmm1_scale, out = softmax(logits) . v * bmm2_scale with
v = k[..., :512], causal over the q_len new tokens, bf16 output, and the LSE as the natural log of
the sum of exp(logits) (-inf for a row that sees no key). CPU tensors run the float64 reference.
FlashInfer's names, signatures and conventions (base-2 LSE) are in ``flashinfer_api``.
"""

from __future__ import annotations

import math

import torch

from .checks import DecodeProblem, check_decode_inputs, check_page_ids
from .config import BackendName, BackendUnavailableError, MLABackendConfig, default_config
from .launcher import DecodePlan
from .reference import mla_decode_reference
from .route import TRTLLM_GEN_PAGE_SIZES, Route, op_route
from .step_plan import check_plan

Scale = float | torch.Tensor
# One [B, q_len, H, 576] tensor (FlashInfer's form), or the (q_nope [.., 512], q_pe [.., 64]) pair
# read in place: the kernels take any strides with contiguous, 16-byte aligned rows.
Query = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
# One [pages, page_size, 576] cache (or [pages, 1, page_size, 576]), or the (ckv_cache [.., 512],
# kpe_cache [.., 64]) pair, read in place the same way.
KVCache = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
LN2 = math.log(2.0)


def _decode(
    problem: DecodeProblem,
    workspace_buffer,
    config: MLABackendConfig,
    kernel: str,
    enable_pdl: bool | None,
    lse: torch.Tensor | None,
    plan: DecodePlan | None = None,
) -> None:
    """Fill problem.out and, when given, lse ([B, q_len, H] fp32, natural log). ``plan`` (checked)
    serves the bundled kernels; the reference and trtllm-gen need none."""
    if problem.device.type == "cpu":
        check_page_ids(problem)
        out, reference_lse = mla_decode_reference(
            problem.query,
            problem.cache,
            problem.block_tables,
            problem.seq_lens,
            problem.bmm1_scale,
            problem.bmm2_scale,
            kv_indptr=problem.kv_indptr,
            causal=problem.causal,
        )
        problem.out.copy_(out)
        if lse is not None:
            lse.copy_(reference_lse)
        return
    if config.validate_page_ids:
        check_page_ids(problem)
    if kernel == "bundled":
        from .launcher import launch_decode

        launch_decode(problem, workspace_buffer, config, enable_pdl, lse, plan)
        return
    assert kernel == "trtllm-gen", kernel
    _run_flashinfer_trtllm_gen(problem, workspace_buffer, enable_pdl, lse)


def _run_flashinfer_trtllm_gen(problem: DecodeProblem, workspace_buffer, enable_pdl, lse: torch.Tensor | None) -> None:
    if problem.kv_indptr is not None or not problem.causal or problem.page_size not in TRTLLM_GEN_PAGE_SIZES:
        raise ValueError(
            "backend trtllm-gen reads causal calls through a [batch, max_pages] table of "
            f"{TRTLLM_GEN_PAGE_SIZES}-token pages: ragged kv_indptr, causal=False and other page sizes run on "
            "the bundled kernels (backend='xqa')"
        )
    import flashinfer.mla

    result = flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla(
        problem.query.contiguous(),
        problem.cache,
        workspace_buffer,
        problem.qk_nope_head_dim,
        512,
        64,
        problem.block_tables,
        problem.seq_lens,
        problem.max_seq_len,
        out=problem.out,
        bmm1_scale=problem.bmm1_scale,
        bmm2_scale=problem.bmm2_scale,
        enable_pdl=enable_pdl,
        backend="trtllm-gen",
        return_lse=lse is not None,
    )
    if lse is not None:
        _, lse_log2 = result
        # trtllm-gen reports the LSE in base 2; this op's contract is the natural log.
        lse.copy_(lse_log2.float().view(lse.shape) * LN2)


def call_kernel(device: torch.device, config: MLABackendConfig, backend: BackendName, route: Route | None) -> str:
    """The kernel this call runs: the float64 reference for CPU tensors, else the route's kernel."""
    if route is None:
        return op_route(device, config, backend).kernel
    if not isinstance(route, Route):
        raise TypeError(f"route must come from mla_backend.route.resolve_route, got {type(route).__name__}")
    if backend != "auto":
        raise ValueError(f"pass backend={backend!r} or a route, not both: the route names the kernel")
    if device.type != "cuda":
        return "reference"
    if route.kernel not in ("bundled", "trtllm-gen"):
        raise BackendUnavailableError(f"the op runs the bundled kernels or trtllm-gen, not {route.describe()}")
    return route.kernel


def check_lse_buffer(lse: torch.Tensor, shapes: list[tuple[int, ...]], device: torch.device) -> None:
    """A caller's LSE buffer: float32, one of ``shapes``, on the query's device."""
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a float32 torch.Tensor, got {type(lse).__name__}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32, got {lse.dtype}")
    if tuple(lse.shape) not in shapes:
        raise ValueError(f"lse must have shape {' or '.join(map(str, shapes))}, got {tuple(lse.shape)}")
    if lse.device != device:
        raise ValueError(f"lse is on {lse.device} but query is on {device}")


def mla_decode(
    query: Query,
    kv_cache: KVCache,
    workspace_buffer: torch.Tensor | None,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    return_lse: bool = False,
    enable_pdl: bool | None = None,
    backend: BackendName = "auto",
    config: MLABackendConfig | None = None,
    qk_nope_head_dim: int = 128,
    plan: DecodePlan | None = None,
    route: Route | None = None,
    kv_indptr: torch.Tensor | None = None,
    causal: bool = True,
):
    """Paged MLA decode; returns ``out``, or ``(out, lse)`` with ``return_lse=True``.

    ``query``: [B, q_len, H, 576] (512 latent + 64 rope), or the pair (q_nope [.., 512], q_pe [.., 64]),
    read in place. ``kv_cache``: [pages, page_size, 576] or [pages, 1, page_size, 576], or the pair
    (ckv_cache [.., 512], kpe_cache [.., 64]), read in place. ``lse``: an fp32 [B, q_len, H] (or
    [B * q_len, H]) buffer to fill and return; the LSE is the natural log, -inf for a row that sees
    no key. ``backend`` overrides the configured one ("auto" keeps it); ``config`` replaces the
    settings read from the environment. ``qk_nope_head_dim`` is the model's pre-absorption nope dim,
    which only FlashInfer's trtllm-gen route takes. ``plan``: the step's split plan from
    ``step_plan.plan_decode`` for this batch and workspace (without one, the call plans its own).
    ``route``: the engine's route (route.resolve_route), resolved once and used as given; without
    one the call resolves the GPU's from ``config`` and ``backend``.

    KV addressed token by token: pages of any power of two from 1 (page size 1: ``block_tables`` holds
    one slot id a token). ``kv_indptr`` (int32 [B + 1]): ``block_tables`` is FlashInfer's ragged
    ``kv_indices`` [n], request b's page ids ``block_tables[kv_indptr[b]:kv_indptr[b + 1]]``.
    ``causal=False``: every query token sees all ``seq_lens[b]`` keys.
    """
    problem = check_decode_inputs(
        query,
        kv_cache,
        workspace_buffer,
        qk_nope_head_dim,
        block_tables,
        seq_lens,
        max_seq_len,
        out,
        bmm1_scale,
        bmm2_scale,
        kv_indptr,
        causal,
    )
    rows = (problem.batch, problem.q_len, problem.heads)
    if lse is not None:
        check_lse_buffer(lse, [rows, (problem.batch * problem.q_len, problem.heads)], problem.device)
    config = config or default_config()
    kernel = call_kernel(problem.device, config, backend, route)
    if plan is not None:
        check_plan(plan, problem, workspace_buffer, config)
    wanted = lse is not None or return_lse
    lse_rows = None
    if wanted:
        lse_rows = (
            lse.view(rows)
            if lse is not None and lse.is_contiguous()
            else torch.empty(rows, dtype=torch.float32, device=problem.device)
        )
    _decode(problem, workspace_buffer, config, kernel, enable_pdl, lse_rows, plan)
    if lse is not None and lse_rows is not None and lse_rows.data_ptr() != lse.data_ptr():
        lse.copy_(lse_rows.view(lse.shape))
    result_out = problem.out_given if problem.out_given is not None else problem.out
    if not return_lse:
        return result_out
    return result_out, (lse if lse is not None else lse_rows)


__all__ = ["BackendUnavailableError", "mla_decode"]
