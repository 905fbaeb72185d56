"""Launching the bundled kernels: tile shape, split-KV count, workspace, the op call."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .checks import DecodeProblem
from .config import MLABackendConfig
from .kernel_constants import (
    FIXED_TILES_PER_CTA,
    LATENT_DIM,
    MAX_KV_SPLITS,
    MAX_PLAN_PIECES,
    MIN_TILES_PER_SPLIT,
    PLAN_CUT_WAVES,
    SPLITS_PER_MERGE_TILE,
    TILE_SHAPES,
    TOKENS_PER_TILE,
)

MERGE_TILES_PER_SPLIT = 1 / SPLITS_PER_MERGE_TILE  # the merge kernel's cost of one more split, in the same units


def tile_shape(rows: int, fp8: bool) -> tuple[int, int]:
    """(row groups, 16-row fragments per warp) of the CTA for ``rows`` = heads x q_len: the first
    entry of csrc/constants.h's tile table for the dtype that covers ``rows``."""
    for shape in TILE_SHAPES:
        if shape.fp8 == fp8 and rows <= shape.max_rows:
            return shape.row_groups, shape.fragments
    raise ValueError(f"no kernel tile covers {rows} rows (query tokens x heads)")


def tile_rows(rows: int, fp8: bool) -> int:
    row_groups, rf = tile_shape(rows, fp8)
    return 16 * row_groups * rf


def workspace_bytes(batch: int, rows: int, num_splits: int) -> int:
    """Bytes of workspace split-KV needs: partial outputs plus their LSE, sized for fp32 partials
    (FP8 problems store f16 partials, so they use a little over half of it)."""
    return 0 if num_splits == 1 else batch * num_splits * rows * (LATENT_DIM + 1) * 4


def workspace_capacity(workspace: torch.Tensor | None) -> int:
    """Bytes a caller's workspace buffer holds (none: 0)."""
    return 0 if workspace is None else workspace.numel() * workspace.element_size()


MAX_GRID_Y = 65535  # CUDA's bound on grid.y
# Requests a call holds at least for the GPU's split plan made inside the call: the plan's kernel and
# its item lookup add about 7 us a call (H100, docs/performance.md), which batches this large repay
# once their lengths differ; smaller ones keep one split count for the batch, planned on the host.
PLAN_MIN_BATCH = 32
# The same for a plan made once per engine step (step_plan.py), which every layer's call reads: from
# 4 requests it gains where lengths differ (2.1-5.5x with one 32k request among 1k ones) and costs
# equal batches 0-5%. A planned grid spans more CTAs than the items need (the plan is made on the
# GPU), and the H100 then places a few of its first CTAs two to an SM: one or two requests, split
# over a hundred CTAs, run up to 25% slower than with the host's count (docs/performance.md).
STEP_PLAN_MIN_BATCH = 4


def plan_ints(batch: int, pieces: int) -> int:
    """int32 entries of a split plan (csrc/params.h's PlanLayout.ints())."""
    partials = (PLAN_CUT_WAVES + 1) * pieces
    return 3 + 3 * batch + (batch + PLAN_CUT_WAVES * pieces) + min(batch, partials // 2)


def plan_partials_bytes(rows: int, pieces: int) -> int:
    """Workspace bytes a plan's split partials take: fp32 outputs and their LSE for at most
    (cut waves + 1) x pieces splits (FP8 problems store f16 partials, a little over half of it)."""
    return (PLAN_CUT_WAVES + 1) * pieces * rows * (LATENT_DIM + 1) * 4


def plan_workspace_bytes(batch: int, rows: int, pieces: int) -> int:
    """Workspace bytes a call that plans itself needs (csrc/params.h's PlanLayout): the plan's ints,
    rounded to 256 bytes, then the partials."""
    return math.ceil(plan_ints(batch, pieces) * 4 / 256) * 256 + plan_partials_bytes(rows, pieces)


def choose_plan_pieces(
    batch: int, rows: int, fp8: bool, slots: int, workspace_capacity: int, *, step_plan: bool = False
) -> int:
    """CTAs per row block the kernels' split plan (csrc/plan.cuh) spreads a call's work over: one wave
    of the GPU's resident CTAs, as many as the workspace holds; 0 (no plan: the host's split count)
    where it holds none or the batch is under PLAN_MIN_BATCH (STEP_PLAN_MIN_BATCH for a plan made
    once per step, whose ints live outside the workspace). The plan itself is made on the GPU from
    the real seq_lens, so a captured CUDA graph replays it for any lengths."""
    if batch < (STEP_PLAN_MIN_BATCH if step_plan else PLAN_MIN_BATCH):
        return 0
    row_blocks = math.ceil(rows / tile_rows(rows, fp8))
    items_room = (MAX_GRID_Y - batch) // PLAN_CUT_WAVES  # the plan's items span grid.y
    pieces = max(0, min(MAX_PLAN_PIECES, max(1, slots // row_blocks), items_room))
    need = plan_partials_bytes if step_plan else functools.partial(plan_workspace_bytes, batch)
    while pieces > 0 and need(rows, pieces) > workspace_capacity:
        pieces //= 2
    return pieces


@dataclass(frozen=True)
class DecodePlan:
    """A decode step's split plan, made on the GPU (launch_plan) and read by each of its calls.
    ``ints``: int32 plan entries for ``batch`` requests over ``pieces`` CTAs per row block, sized for
    problems of ``rows`` query rows (q_len x heads) of the ``fp8`` or bf16 kernels."""

    ints: torch.Tensor
    batch: int
    rows: int
    fp8: bool
    pieces: int


def launch_plan(
    seq_lens: torch.Tensor,
    max_pages: int,
    page_size: int,
    rows: int,
    fp8: bool,
    buffer: torch.Tensor,
    capacity: int,
    config: MLABackendConfig,
) -> DecodePlan | None:
    """Plan a step of validated inputs into ``buffer`` (int32, at least plan_ints(batch, MAX_PLAN_PIECES)):
    None where its calls keep the host's split count (too small a batch, no room for partials in
    ``capacity`` bytes of workspace)."""
    from .jit import ensure_loaded

    device = seq_lens.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    ensure_loaded(index, config.cache_dir, config.kernel_variant)
    batch = seq_lens.shape[0]
    slots = resident_slots(index, fp8, *tile_shape(rows, fp8))
    pieces = choose_plan_pieces(batch, rows, fp8, slots, capacity, step_plan=True)
    if pieces == 0:
        return None
    ints = buffer[: plan_ints(batch, pieces)]
    torch.ops.mla_backend.plan(seq_lens, ints, max_pages, page_size, pieces)
    return DecodePlan(ints, batch, rows, fp8, pieces)


@functools.cache
def resident_slots(device_index: int, fp8: bool, row_groups: int, rf: int) -> int:
    """CTAs of this tile shape the whole GPU runs at once."""
    with torch.cuda.device(device_index):
        per_sm = torch.ops.mla_backend.ctas_per_sm(fp8, row_groups, rf)
    return max(1, per_sm) * torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(batch: int, rows: int, fp8: bool, max_seq_len: int, slots: int, workspace_capacity: int) -> int:
    """Split each request's KV so the grid fills whole waves of ``slots`` resident CTAs.

    Time ~ waves x (tiles per CTA + a fixed cost of about two tiles for pipeline fill and
    epilogue) + the merge, which grows with s; the smallest s within 2% of the best wins.
    Splits keep >= 128 tokens and fit the workspace.
    Depends only on host values, so a captured CUDA graph stays valid for any seq_lens."""
    ctas = batch * math.ceil(rows / tile_rows(rows, fp8))
    if batch == 0:
        return 1
    useful = max(1, math.ceil(max_seq_len / (TOKENS_PER_TILE * MIN_TILES_PER_SPLIT)))
    per_split = workspace_bytes(batch, rows, 2) // 2
    fits = max(1, workspace_capacity // per_split) if per_split else 1
    limit = max(1, min(useful, fits, MAX_KV_SPLITS))
    tiles = max(1, math.ceil(max_seq_len / TOKENS_PER_TILE))
    cost = {
        s: math.ceil(ctas * s / slots) * (tiles / s + FIXED_TILES_PER_CTA) + (s > 1) * MERGE_TILES_PER_SPLIT * s
        for s in range(1, limit + 1)
    }
    best = min(cost.values())
    return min(s for s, c in cost.items() if c <= best * 1.02)


def _scale_args(scale: float | torch.Tensor) -> tuple[float, torch.Tensor | None]:
    return (1.0, scale) if isinstance(scale, torch.Tensor) else (float(scale), None)


def launch_decode(
    problem: DecodeProblem,
    workspace: torch.Tensor | None,
    config: MLABackendConfig,
    enable_pdl: bool | None,
    lse: torch.Tensor | None,
    plan: DecodePlan | None = None,
) -> None:
    """Launch the kernel for a validated problem; fills ``problem.out`` and, when given, ``lse``
    (contiguous fp32 [B, q_len, H], natural log). ``plan``: the step's split plan, checked against
    the problem (step_plan.check_plan), in place of one made here."""
    from .jit import ensure_loaded

    device = problem.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    ensure_loaded(index, config.cache_dir, config.kernel_variant)
    fp8 = problem.dtype == torch.float8_e4m3fn
    rows = problem.q_len * problem.heads
    row_groups, rf = tile_shape(rows, fp8)
    capacity = workspace_capacity(workspace)
    pieces = 0
    if plan is not None:
        splits, pieces = 1, plan.pieces
    elif config.num_kv_splits is not None:
        splits = config.num_kv_splits
        need = workspace_bytes(problem.batch, rows, splits)
        if need > capacity:
            raise ValueError(
                f"workspace_buffer holds {capacity} bytes but num_kv_splits={splits} needs {need} "
                f"(batch {problem.batch} x {rows} rows x {splits} splits x 513 floats)"
            )
    else:
        slots = resident_slots(index, fp8, row_groups, rf)
        pieces = choose_plan_pieces(problem.batch, rows, fp8, slots, capacity)
        splits = 1 if pieces else choose_num_splits(problem.batch, rows, fp8, problem.max_seq_len, slots, capacity)
    if enable_pdl is None:
        enable_pdl = config.enable_pdl
    if enable_pdl is None:
        enable_pdl = torch.cuda.get_device_capability(device)[0] >= 9
    assert lse is None or (lse.is_contiguous() and lse.dtype == torch.float32), "lse: contiguous fp32"
    if workspace is None:
        workspace = torch.empty(0, dtype=torch.uint8, device=device)
    bmm1, bmm1_t = _scale_args(problem.bmm1_scale)
    bmm2, bmm2_t = _scale_args(problem.bmm2_scale)
    torch.ops.mla_backend.decode(
        problem.q_nope,
        problem.q_pe,
        problem.kv_nope,
        problem.kv_pe,
        problem.block_tables,
        problem.seq_lens,
        problem.out,
        lse,
        workspace,
        problem.max_seq_len,
        splits,
        pieces,
        None if plan is None else plan.ints,
        row_groups,
        rf,
        bmm1,
        bmm1_t,
        bmm2,
        bmm2_t,
        bool(enable_pdl),
    )
