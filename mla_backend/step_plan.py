"""A decode step's split-KV plan, made once on the GPU and read by every layer's call.

An engine step sends the same batch through each of its layers. Planning the step's split-KV once,
as FlashMLA's ``get_mla_metadata`` does, takes the plan kernel off each layer's call, and lets
batches under ``kernel_constants.PLAN_MIN_BATCH`` use the plan too. The plan is made from the real
``seq_lens`` into a buffer that stays put, so a CUDA graph captured with it replays with whatever
plan the step wrote there before the replay. A plan stays correct for other lengths than those it
was made from (each split's tiles come from its request's length when it runs), only less even.

    plan = plan_decode(seq_lens, block_tables, page_size=64, heads=16, q_len=1,
                       kv_dtype=torch.float8_e4m3fn, workspace_buffer=workspace)
    for layer in layers:
        out = mla_decode(..., workspace, block_tables, seq_lens, max_seq_len, plan=plan)
"""

from __future__ import annotations

import torch

from . import shapes
from .checks import DecodeProblem, _require
from .config import MLABackendConfig, default_config
from .kernel_constants import MAX_PLAN_PIECES
from .launcher import DecodePlan, launch_plan, load_library, plan_ints, workspace_capacity
from .route import Route, op_route


def plan_buffer(max_batch: int, device: torch.device | str, config: MLABackendConfig | None = None) -> torch.Tensor:
    """An int32 buffer that holds the plan of any step of up to ``max_batch`` requests: made once,
    before graphs are captured, and passed to every ``plan_decode``. Sized by the kernel library
    (loaded for a CUDA ``device`` with ``config``'s kernel variant); empty on other devices, whose
    steps are never planned."""
    _require(max_batch >= 0, f"max_batch must be >= 0, got {max_batch}")
    device = torch.device(device)
    if device.type != "cuda":
        return torch.zeros(0, dtype=torch.int32, device=device)
    load_library(device, config or default_config())
    return torch.zeros(plan_ints(max_batch, MAX_PLAN_PIECES), dtype=torch.int32, device=device)


def _check_plan_inputs(seq_lens, block_tables, page_size, heads, q_len, kv_dtype, workspace_buffer, buffer) -> None:
    for name, tensor in (("seq_lens", seq_lens), ("block_tables", block_tables)):
        _require(isinstance(tensor, torch.Tensor), f"{name} must be a torch.Tensor", TypeError)
        _require(tensor.dtype == torch.int32, f"{name} must be int32, got {tensor.dtype}", TypeError)
    _require(
        seq_lens.dim() == 1 and seq_lens.is_contiguous(),
        f"seq_lens must be a contiguous [batch] tensor, got shape {tuple(seq_lens.shape)}",
    )
    batch = seq_lens.shape[0]
    _require(
        (block_tables.dim() == 2 and block_tables.shape[0] == batch) or block_tables.dim() == 1,
        f"block_tables must be [batch={batch}, max_pages] or ragged page ids [n], got {tuple(block_tables.shape)}",
    )
    _require(
        block_tables.device == seq_lens.device,
        f"block_tables is on {block_tables.device} but seq_lens on {seq_lens.device}",
    )
    _require(
        page_size in shapes.PAGE_SIZES,
        f"page_size must be a power of two in 1..{shapes.PAGE_SIZES[-1]}, got {page_size}",
    )
    _require(1 <= heads <= shapes.MAX_HEADS, f"heads must be 1..{shapes.MAX_HEADS}, got {heads}")
    _require(1 <= q_len <= shapes.MAX_Q_LEN, f"q_len must be 1..{shapes.MAX_Q_LEN}, got {q_len}")
    _require(kv_dtype in shapes.DTYPES, f"kv_dtype must be one of {shapes.DTYPES}, got {kv_dtype}", TypeError)
    if workspace_buffer is not None:
        _require(isinstance(workspace_buffer, torch.Tensor), "workspace_buffer must be a torch.Tensor", TypeError)
    if buffer is not None:
        _require(
            isinstance(buffer, torch.Tensor) and buffer.dtype == torch.int32 and buffer.is_contiguous(),
            "buffer must be a contiguous int32 tensor (plan_buffer makes one)",
            TypeError,
        )
        _require(buffer.device == seq_lens.device, f"buffer is on {buffer.device} but seq_lens on {seq_lens.device}")


def _check_plan_buffer(buffer: torch.Tensor, batch: int) -> None:
    """The buffer holds a plan of ``batch`` requests (the loaded library's count)."""
    need = plan_ints(batch, MAX_PLAN_PIECES)
    _require(
        buffer.numel() >= need,
        f"buffer holds {buffer.numel()} ints, a plan of {batch} requests may need {need} (plan_buffer({batch}))",
    )


def plan_decode(
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    page_size: int,
    *,
    heads: int,
    kv_dtype: torch.dtype,
    workspace_buffer: torch.Tensor | None,
    q_len: int = 1,
    buffer: torch.Tensor | None = None,
    config: MLABackendConfig | None = None,
    route: Route | None = None,
) -> DecodePlan | None:
    """Plan the split-KV of a step's decode calls on the GPU, from ``seq_lens`` as they are when the
    stream reaches it. Pass the result as ``mla_decode(..., plan=...)`` to every call of the step
    with the same batch, heads, q_len, KV dtype and ``workspace_buffer`` (whose size bounds the
    splits). ``buffer`` (from ``plan_buffer``) keeps the plan at one address for CUDA graphs; without
    it a new tensor holds it. None where the step's calls plan for themselves: CPU tensors, a
    kernel other than the bundled one, a fixed ``num_kv_splits``, or a batch too small to gain.
    ``route``: the engine's route, as its calls get it (without one, the GPU's from ``config``).
    Raises ``BackendUnavailableError`` on a GPU no kernel serves, as ``mla_decode`` does.
    """
    _check_plan_inputs(seq_lens, block_tables, page_size, heads, q_len, kv_dtype, workspace_buffer, buffer)
    config = config or default_config()
    device = seq_lens.device
    if config.num_kv_splits is not None or device.type != "cuda":
        return None
    if (route or op_route(device, config)).kernel != "bundled":
        return None
    batch = seq_lens.shape[0]
    load_library(device, config)
    if buffer is None:
        buffer = torch.empty(plan_ints(batch, MAX_PLAN_PIECES), dtype=torch.int32, device=device)
    else:
        _check_plan_buffer(buffer, batch)
    fp8 = kv_dtype == torch.float8_e4m3fn
    capacity = workspace_capacity(workspace_buffer)
    max_pages = block_tables.shape[1] if block_tables.dim() == 2 else block_tables.numel()
    return launch_plan(seq_lens, max_pages, page_size, q_len * heads, fp8, buffer, capacity, config)


def check_plan(plan: DecodePlan, problem: DecodeProblem, workspace_buffer, config: MLABackendConfig) -> None:
    """A step's plan fits this call: made for its batch, rows and dtype, on its device, with room for
    its partials in the call's workspace, and no fixed split count beside it."""
    _require(isinstance(plan, DecodePlan), f"plan must come from plan_decode, got {type(plan).__name__}", TypeError)
    rows = problem.q_len * problem.heads
    fp8 = problem.dtype == torch.float8_e4m3fn
    _require(
        (plan.batch, plan.rows, plan.fp8) == (problem.batch, rows, fp8),
        f"plan was made for batch {plan.batch}, {plan.rows} rows (q_len x heads), "
        f"{'fp8' if plan.fp8 else 'bf16'}; this call has batch {problem.batch}, {rows} rows, "
        f"{'fp8' if fp8 else 'bf16'}",
    )
    _require(plan.ints.device == problem.device, f"plan is on {plan.ints.device} but query is on {problem.device}")
    _require(config.num_kv_splits is None, "plan and num_kv_splits both set: a planned call chooses its own splits")
    capacity, need = workspace_capacity(workspace_buffer), plan.workspace_bytes
    _require(
        capacity >= need,
        f"workspace_buffer holds {capacity} bytes but the plan's split partials need {need}: pass the "
        "workspace the plan was made with",
    )
