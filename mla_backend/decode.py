"""FlashInfer-compatible MLA decode ops.

Switch from FlashInfer by changing the import::

    from mla_backend import trtllm_batch_decode_with_kv_cache_mla

Semantics (FlashInfer's documented contract; see README): logits = (q . k) * bmm1_scale,
out = softmax(logits) . v * bmm2_scale, causal over the q_len new tokens, bf16 output,
optional natural-log LSE. CPU tensors run the float64 reference.
"""

from __future__ import annotations

import functools
import math

import torch

from .checks import DecodeProblem, check_decode_inputs, check_page_ids
from .config import BackendName, BackendUnavailableError, MLABackendConfig, resolve_backend
from .reference import mla_decode_reference

Scale = float | torch.Tensor
# One [B, q_len, H, 576] tensor (FlashInfer's form), or the (q_nope [.., 512], q_pe [.., 64]) pair
# read in place: the kernels take any strides with contiguous, 16-byte aligned rows.
Query = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
LN2 = math.log(2.0)


@functools.lru_cache(maxsize=1)
def default_config() -> MLABackendConfig:
    """The process-wide settings, read once from the environment."""
    return MLABackendConfig.from_sources()


def _run_reference(problem: DecodeProblem):
    out, lse = mla_decode_reference(
        problem.query,
        problem.cache,
        problem.block_tables,
        problem.seq_lens,
        problem.bmm1_scale,
        problem.bmm2_scale,
    )
    problem.out.copy_(out)
    return problem.out, lse.to(torch.float32)


def _finish(problem: DecodeProblem, lse: torch.Tensor, return_lse: bool):
    out = problem.out_given if problem.out_given is not None else problem.out
    return (out, lse) if return_lse else out


def _decode(
    problem: DecodeProblem,
    workspace_buffer,
    config: MLABackendConfig,
    kernel: str,
    enable_pdl: bool | None,
    return_lse: bool,
):
    if problem.device.type == "cpu":
        check_page_ids(problem)
        _, lse = _run_reference(problem)
        return _finish(problem, lse, return_lse)
    if config.validate_page_ids:
        check_page_ids(problem)
    if kernel == "bundled":
        from .launcher import launch_decode

        lse = launch_decode(problem, workspace_buffer, config, enable_pdl, return_lse)
        return _finish(problem, lse, return_lse)
    assert kernel == "trtllm-gen", kernel
    return _run_flashinfer_trtllm_gen(problem, workspace_buffer, enable_pdl, return_lse)


def _run_flashinfer_trtllm_gen(problem: DecodeProblem, workspace_buffer, enable_pdl, return_lse):
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
        return_lse=return_lse,
    )
    if not return_lse:
        return _finish(problem, None, False)
    _, lse_log2 = result
    # trtllm-gen reports the LSE in base 2; this op's contract is the natural log.
    lse = lse_log2.float().view(problem.batch, problem.q_len, problem.heads) * LN2
    return _finish(problem, lse, True)


def trtllm_batch_decode_with_kv_cache_mla(
    query: Query,
    kv_cache: torch.Tensor,
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
    backend: BackendName = "auto",
    return_lse: bool = False,
    config: MLABackendConfig | None = None,
):
    """FlashInfer's ``trtllm_batch_decode_with_kv_cache_mla``, dispatched by the config resolver.

    ``query`` is FlashInfer's [B, q_len, H, 576] tensor or, beyond FlashInfer, the (q_nope, q_pe)
    pair, which the bundled kernels read in place (no concatenated copy). ``backend`` overrides the
    configured one ("auto" keeps the configured choice); ``config`` replaces the settings read from
    the environment. Returns ``out``, or ``(out, lse)`` with ``return_lse=True``.
    """
    if sparse_mla_top_k != 0:
        raise ValueError(f"sparse MLA (sparse_mla_top_k={sparse_mla_top_k}) is not supported; pass 0")
    if skip_softmax_threshold_scale_factor is not None:
        raise ValueError("skip_softmax_threshold_scale_factor is not supported (exact softmax only)")
    problem = check_decode_inputs(
        query,
        kv_cache,
        workspace_buffer,
        qk_nope_head_dim,
        kv_lora_rank,
        qk_rope_head_dim,
        block_tables,
        seq_lens,
        max_seq_len,
        out,
        bmm1_scale,
        bmm2_scale,
        sinks,
    )
    config = config or default_config()
    if backend != "auto":
        config = config.model_copy(update={"backend": MLABackendConfig(backend=backend).backend})
    kernel = "reference"
    if problem.device.type == "cuda":
        resolution = resolve_backend(config, config.capability(torch.cuda.get_device_capability(problem.device)))
        if resolution.kernel == "fallback":  # as FlashInfer does on a GPU it has no kernel for
            raise BackendUnavailableError(
                f"no MLA decode kernel here: {resolution.reason}. The vLLM plugin serves such GPUs with vLLM's "
                "Triton MLA; the op runs the float64 reference on CPU tensors"
            )
        kernel = resolution.kernel
    return _decode(problem, workspace_buffer, config, kernel, enable_pdl, return_lse)


def xqa_batch_decode_with_kv_cache_mla(
    query: Query,
    kv_cache: torch.Tensor,
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
):
    """FlashInfer's ``xqa_batch_decode_with_kv_cache_mla`` on the bundled kernels, plus ``return_lse``.

    Unlike FlashInfer's SM120-only XQA MLA: bf16 and fp8, 1-128 heads, q_len 1-8, split-KV, LSE,
    and ``query`` may be the (q_nope, q_pe) pair. The same op as ``backend="xqa"`` above.
    """
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
        return_lse=return_lse,
    )


__all__ = [
    "BackendUnavailableError",
    "trtllm_batch_decode_with_kv_cache_mla",
    "xqa_batch_decode_with_kv_cache_mla",
]
