"""Python side of the bundled kernels: tile shape, split-KV count, workspace, launch."""

from __future__ import annotations

import functools
import math

import torch

from .checks import DecodeProblem
from .config import MAX_KV_SPLITS, MLABackendConfig
from .shapes import KV_LORA_RANK

TOKENS_PER_TILE = 32
MIN_TILES_PER_SPLIT = 8  # a split shorter than 256 tokens costs more in merging than it saves


def tile_shape(rows: int, fp8: bool) -> tuple[int, int]:
    """(row groups, 16-row fragments per warp) of the CTA for ``rows`` = heads x q_len."""
    if rows <= 16:
        return 1, 1
    return 2, 1


def tile_rows(rows: int, fp8: bool) -> int:
    row_groups, rf = tile_shape(rows, fp8)
    return 16 * row_groups * rf


def workspace_bytes(batch: int, rows: int, num_splits: int) -> int:
    """Bytes of workspace split-KV needs: fp32 partial outputs plus their LSE."""
    return 0 if num_splits == 1 else batch * num_splits * rows * (KV_LORA_RANK + 1) * 4


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(batch: int, rows: int, fp8: bool, max_seq_len: int, sms: int, workspace_capacity: int) -> int:
    """Split each request's KV until the grid covers the GPU about twice, keeping splits >= 256
    tokens and the partials within the workspace. Depends only on host values: graph-safe."""
    ctas = batch * math.ceil(rows / tile_rows(rows, fp8))
    if ctas >= sms or batch == 0:
        return 1
    useful = max(1, math.ceil(max_seq_len / (TOKENS_PER_TILE * MIN_TILES_PER_SPLIT)))
    splits = min(math.ceil(2 * sms / ctas), useful, MAX_KV_SPLITS)
    per_split = workspace_bytes(batch, rows, 2) // 2
    if splits > 1 and per_split * splits > workspace_capacity:
        splits = max(1, workspace_capacity // per_split)
    return splits


def _scale_args(scale: float | torch.Tensor) -> tuple[float, torch.Tensor | None]:
    return (1.0, scale) if isinstance(scale, torch.Tensor) else (float(scale), None)


def run_xqa_decode(problem: DecodeProblem, workspace: torch.Tensor | None, config: MLABackendConfig,
                   enable_pdl: bool | None, return_lse: bool) -> torch.Tensor | None:
    """Launch the kernel for a validated problem; fills ``problem.out``, returns the LSE or None."""
    from .jit import ensure_loaded

    device = problem.query.device
    ensure_loaded(device.index if device.index is not None else torch.cuda.current_device())
    fp8 = problem.query.dtype == torch.float8_e4m3fn
    rows = problem.q_len * problem.heads
    capacity = 0 if workspace is None else workspace.numel() * workspace.element_size()
    if config.num_kv_splits is not None:
        splits = config.num_kv_splits
        need = workspace_bytes(problem.batch, rows, splits)
        if need > capacity:
            raise ValueError(f"workspace_buffer holds {capacity} bytes but num_kv_splits={splits} needs {need} "
                             f"(batch {problem.batch} x {rows} rows x {splits} splits x 513 floats)")
    else:
        splits = choose_num_splits(problem.batch, rows, fp8, problem.max_seq_len,
                                   sm_count(device.index or 0), capacity)
    if enable_pdl is None:
        enable_pdl = config.enable_pdl
    if enable_pdl is None:
        enable_pdl = torch.cuda.get_device_capability(device)[0] >= 9
    lse = torch.empty(problem.batch, problem.q_len, problem.heads, dtype=torch.float32, device=device) \
        if return_lse else None
    if workspace is None:
        workspace = torch.empty(0, dtype=torch.uint8, device=device)
    row_groups, rf = tile_shape(rows, fp8)
    bmm1, bmm1_t = _scale_args(problem.bmm1_scale)
    bmm2, bmm2_t = _scale_args(problem.bmm2_scale)
    torch.ops.mla_backend.decode(
        problem.query, problem.cache, problem.block_tables, problem.seq_lens, problem.out, lse,
        workspace, splits, row_groups, rf, bmm1, bmm1_t, bmm2, bmm2_t, bool(enable_pdl),
    )
    return lse
