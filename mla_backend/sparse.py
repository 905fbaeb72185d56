"""The package's own sparse MLA decode op, ``sparse_mla_decode`` (DeepSeek Sparse Attention:
DeepSeek-V3.2, GLM-5): each query token attends to the cache rows its top-k index list names.

Semantics: logits = (q . k) * sm_scale over the listed rows, out = softmax(logits) . v with
v = k[..., :512], bf16 output, and the LSE as the natural log of the sum of exp(logits) (-inf, and a
zero output, for a token whose list names no row). An entry outside the cache (-1: empty) is masked
(sparse_inputs.py says the rule); a row listed twice counts twice. CPU tensors run the float64
reference. FlashInfer's name (``sparse_mla_top_k``) is in ``flashinfer_api``.
"""

from __future__ import annotations

import torch

from .config import BackendUnavailableError, MLABackendConfig, default_config
from .decode import check_lse_buffer
from .reference import sparse_mla_reference
from .route import sparse_route
from .sparse_inputs import SparseProblem, check_sparse_ids, check_sparse_inputs


def run_sparse(
    problem: SparseProblem,
    workspace_buffer: torch.Tensor | None,
    config: MLABackendConfig,
    enable_pdl: bool | None,
    lse: torch.Tensor | None,
) -> None:
    """Fill problem.out and, when given, lse (contiguous fp32 [T, H], natural log)."""
    if problem.device.type == "cpu":
        check_sparse_ids(problem)
        # The reference unpacks fp8_ds_mla rows and reads a tensor scale itself.
        out, reference_lse = sparse_mla_reference(
            problem.query, problem.kv_rows, problem.indices, problem.sm_scale, topk_lens=problem.topk_lens
        )
        problem.out.copy_(out)
        if lse is not None:
            lse.copy_(reference_lse)
        return
    route = sparse_route(config, torch.cuda.get_device_capability(problem.device))
    if route.kernel != "bundled":
        raise BackendUnavailableError(f"sparse MLA decode runs the bundled kernels: {route.describe()}")
    if config.validate_page_ids:
        check_sparse_ids(problem)
    from .launcher import launch_sparse

    launch_sparse(problem, workspace_buffer, config, enable_pdl, lse)


def sparse_mla_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | torch.Tensor,
    *,
    topk_lens: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    return_lse: bool = False,
    workspace_buffer: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
    config: MLABackendConfig | None = None,
):
    """Sparse MLA decode; returns ``out``, or ``(out, lse)`` with ``return_lse=True``.

    ``query``: bf16 [T, H, 576] (512 latent + 64 rope; H 1..128), or [B, q_len, H, 576]: every query
    token (decode, MTP drafts, prefill chunks alike) has its own list. ``kv_cache``: bf16 rows of 576 or
    uint8 fp8_ds_mla rows of 656 bytes (sparse_cache.py; both scale formats: the scales are applied as
    stored), as [N, width], [pages, page, width] or [pages, 1, page, width]. ``indices``: int32 [T, K]
    (or [B, q_len, K]) slot ids (page id x page size + offset), any K. ``topk_lens``: int32 [T], each
    list's valid prefix (default K). ``lse``: an fp32 buffer of the query's leading dims x H to fill and
    return. ``workspace_buffer``: bytes for the split partials (without one, or too small, the call
    takes its own).
    """
    problem = check_sparse_inputs(query, kv_cache, indices, sm_scale, topk_lens, out)
    lse_shape = (*problem.lead_shape, problem.heads)
    if lse is not None:
        check_lse_buffer(lse, [lse_shape, (problem.tokens, problem.heads)], problem.device)
    config = config or default_config()
    lse_rows = None
    if lse is not None or return_lse:
        lse_rows = (
            lse.view(problem.tokens, problem.heads)
            if lse is not None and lse.is_contiguous()
            else torch.empty(problem.tokens, problem.heads, dtype=torch.float32, device=problem.device)
        )
    run_sparse(problem, workspace_buffer, config, enable_pdl, lse_rows)
    if lse is not None and lse_rows is not None and lse_rows.data_ptr() != lse.data_ptr():
        lse.copy_(lse_rows.view(lse.shape))
    result_out = problem.out_given if problem.out_given is not None else problem.out.view(*lse_shape, -1)
    if not return_lse:
        return result_out
    return result_out, (lse if lse is not None else lse_rows.view(lse_shape))  # type: ignore[union-attr]


__all__ = ["sparse_mla_decode"]
