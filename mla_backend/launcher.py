"""Launching the bundled kernels: tile shape, split-KV schedule, workspace, the op call.

The scheduling formulas (the split count, the plan's pieces and layout, the workspace sizes) are the
kernel library's (csrc/schedule/), read here through its ops: the functions below ask the loaded
library, so they need it loaded (jit.ensure_loaded) and hold no arithmetic of their own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from .checks import DecodeProblem
from .config import MLABackendConfig
from .kernel_constants import TILE_SHAPES
from .sparse_inputs import KV_FORMAT_CODES, SparseProblem


def tile_shape(rows: int, fp8: bool) -> tuple[int, int]:
    """(row groups, 16-row fragments per warp) of the CTA for ``rows`` = heads x q_len: the first
    entry of csrc/constants.h's tile table for the dtype that covers ``rows``."""
    for shape in TILE_SHAPES:
        if shape.fp8 == fp8 and rows <= shape.max_rows:
            return shape.row_groups, shape.fragments
    raise ValueError(f"no kernel tile covers {rows} rows (query tokens x heads)")


def load_library(device: torch.device, config: MLABackendConfig) -> int:
    """Load the kernel library for the CUDA ``device`` (building it first if need be): its kernels and
    the formulas the functions below read. Returns the device's index."""
    from .jit import ensure_loaded

    index = device.index if device.index is not None else torch.cuda.current_device()
    ensure_loaded(index, config.cache_dir, config.kernel_variant)
    return index


def library_op(name: str) -> Any:
    """``torch.ops.mla_backend.<name>`` of the loaded kernel library."""
    try:
        return getattr(torch.ops.mla_backend, name)
    except AttributeError:
        raise RuntimeError(
            f"mla_backend: {name} is the kernel library's, and no library is loaded in this process "
            "(jit.ensure_loaded loads one)"
        ) from None


def plan_ints(batch: int, pieces: int) -> int:
    """int32 entries of a split plan of ``batch`` requests over ``pieces`` CTAs per row block."""
    return int(library_op("plan_ints")(batch, pieces))


def workspace_bytes(batch: int, rows: int, num_splits: int, plan_pieces: int = 0, step_plan: bool = False) -> int:
    """Bytes of workspace a call needs: ``num_splits`` splits a request, or a plan over ``plan_pieces``
    CTAs per row block (made in the call, or once a step: ``step_plan``, whose ints live apart)."""
    return int(library_op("workspace_bytes")(batch, rows, num_splits, plan_pieces, step_plan))


def plan_partials_bytes(rows: int, pieces: int) -> int:
    """Workspace bytes the split partials of a step's plan over ``pieces`` take."""
    return workspace_bytes(0, rows, 1, pieces, step_plan=True)


def plan_workspace_bytes(batch: int, rows: int, pieces: int) -> int:
    """Workspace bytes a call that plans itself over ``pieces`` needs: the plan's ints, then the partials."""
    return workspace_bytes(batch, rows, 1, pieces)


def workspace_capacity(workspace: torch.Tensor | None) -> int:
    """Bytes a caller's workspace buffer holds (none: 0)."""
    return 0 if workspace is None else workspace.numel() * workspace.element_size()


def schedule(
    batch: int, rows: int, fp8: bool, max_seq_len: int, slots: int, workspace_capacity: int, *, step_plan: bool = False
) -> tuple[int, int]:
    """(num_splits, plan_pieces) of a call on ``slots`` resident CTAs: the GPU's split plan where the
    batch and the workspace allow one (plan_pieces > 0, one split a request until the plan cuts them),
    else the host's split count. Depends only on host values, so a captured CUDA graph stays valid for
    any seq_lens."""
    splits, pieces = library_op("schedule")(batch, rows, fp8, max_seq_len, slots, workspace_capacity, step_plan)
    return int(splits), int(pieces)


def choose_num_splits(batch: int, rows: int, fp8: bool, max_seq_len: int, slots: int, workspace_capacity: int) -> int:
    """The host's split count of a call without a plan: the grid fills whole waves of ``slots``."""
    return int(library_op("num_splits")(batch, rows, fp8, max_seq_len, slots, workspace_capacity))


def choose_plan_pieces(
    batch: int, rows: int, fp8: bool, slots: int, workspace_capacity: int, *, step_plan: bool = False
) -> int:
    """CTAs per row block the GPU's split plan spreads a call's work over (0: no plan)."""
    return schedule(batch, rows, fp8, 0, slots, workspace_capacity, step_plan=step_plan)[1]


@dataclass(frozen=True)
class DecodePlan:
    """A decode step's split plan, made on the GPU (launch_plan) and read by each of its calls.
    ``ints``: int32 plan entries for ``batch`` requests over ``pieces`` CTAs per row block, sized for
    problems of ``rows`` query rows (q_len x heads) of the ``fp8`` or bf16 kernels, whose calls need
    ``workspace_bytes`` of workspace for the split partials (the library's count)."""

    ints: torch.Tensor
    batch: int
    rows: int
    fp8: bool
    pieces: int
    workspace_bytes: int  # what each call's workspace must hold: the plan's split partials


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
    index = load_library(seq_lens.device, config)
    batch = seq_lens.shape[0]
    slots = resident_slots(index, fp8, *tile_shape(rows, fp8))
    pieces = choose_plan_pieces(batch, rows, fp8, slots, capacity, step_plan=True)
    if pieces == 0:
        return None
    ints = buffer[: plan_ints(batch, pieces)]
    torch.ops.mla_backend.plan(seq_lens, ints, max_pages, page_size, pieces)
    return DecodePlan(ints, batch, rows, fp8, pieces, plan_partials_bytes(rows, pieces))


@functools.cache
def resident_slots(device_index: int, fp8: bool, row_groups: int, rf: int, kv_format: int = 0) -> int:
    """CTAs of this tile shape (reading plain rows, or fp8_ds_mla ones: ``kv_format`` 1) the whole GPU
    runs at once."""
    with torch.cuda.device(device_index):
        per_sm = torch.ops.mla_backend.ctas_per_sm(fp8, row_groups, rf, kv_format)
    return max(1, per_sm) * torch.cuda.get_device_properties(device_index).multi_processor_count


def resolve_pdl(enable_pdl: bool | None, config: MLABackendConfig, device: torch.device) -> bool:
    """The call's programmatic dependent launch: as asked, else the config's, else on from SM 9.0."""
    if enable_pdl is None:
        enable_pdl = config.enable_pdl
    if enable_pdl is None:
        enable_pdl = torch.cuda.get_device_capability(device)[0] >= 9
    return bool(enable_pdl)


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
    device = problem.device
    index = load_library(device, config)
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
        splits, pieces = schedule(problem.batch, rows, fp8, problem.max_seq_len, slots, capacity)
    enable_pdl = resolve_pdl(enable_pdl, config, device)
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
        problem.kv_indptr,
        problem.causal,
    )


def launch_sparse(
    problem: SparseProblem,
    workspace: torch.Tensor | None,
    config: MLABackendConfig,
    enable_pdl: bool | None,
    lse: torch.Tensor | None,
) -> None:
    """Launch the sparse kernels for a validated problem: fills ``problem.out`` and, when given, ``lse``
    (contiguous fp32 [T, H], natural log). Each query token is a one-token request to the BF16 tiles, or
    to the FP8 tiles where the library runs fp8_ds_mla rows there (``ds_mla_fp8_tile``: sm_90a, over
    16 heads); without a caller's workspace the call takes one for the split count that fills the GPU."""
    device = problem.device
    index = load_library(device, config)
    tokens, heads = problem.tokens, problem.heads
    kv_format = KV_FORMAT_CODES[problem.kv_format]
    fp8_tile = problem.kv_format == "fp8_ds_mla" and bool(library_op("ds_mla_fp8_tile")(*tile_shape(heads, True)))
    row_groups, rf = tile_shape(heads, fp8_tile)
    slots = resident_slots(index, fp8_tile, row_groups, rf, kv_format)
    if config.num_kv_splits is not None:
        splits = config.num_kv_splits
    else:
        capacity = workspace_capacity(workspace) if workspace is not None else 1 << 62
        splits = choose_num_splits(tokens, heads, fp8_tile, problem.topk, slots, capacity)
    need = workspace_bytes(tokens, heads, splits)
    if workspace is None or workspace_capacity(workspace) < need:
        if workspace is not None and config.num_kv_splits is not None:
            raise ValueError(
                f"workspace_buffer holds {workspace_capacity(workspace)} bytes but num_kv_splits={splits} needs {need}"
            )
        workspace = torch.empty(need, dtype=torch.uint8, device=device)
    enable_pdl = resolve_pdl(enable_pdl, config, device)
    assert lse is None or (lse.is_contiguous() and lse.dtype == torch.float32), "lse: contiguous fp32"
    query = problem.query.view(tokens, 1, heads, -1)
    bmm1, bmm1_t = _scale_args(problem.sm_scale)
    torch.ops.mla_backend.sparse_decode(
        query[..., :512],
        query[..., 512:],
        problem.kv_rows,
        problem.indices,
        problem.topk_lens,
        problem.out,
        lse,
        workspace,
        splits,
        row_groups,
        rf,
        bmm1,
        bmm1_t,
        1.0,
        None,
        bool(enable_pdl),
        kv_format,
        fp8_tile,
    )
