"""The seam between the scheduling formulas and the kernels, which the library alone owns
(csrc/schedule/): the binding refuses a workspace or a plan one byte or one int short of what its
sizes say and takes exactly that much, and Python's sizes are the library's (GPU only: the decode and
plan ops take CUDA tensors)."""

import pytest
import torch

from mla_backend import MLABackendConfig, plan_buffer
from mla_backend.inputs import make_paged_problem
from mla_backend.jit import ensure_loaded
from mla_backend.kernel_constants import MAX_PLAN_PIECES
from mla_backend.launcher import DecodePlan, launch_plan, tile_shape

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CONFIG = MLABackendConfig.from_sources({"backend": "xqa"})
SHORT = "memory-safety invariant"


@pytest.fixture(scope="module")
def ops():
    ensure_loaded(torch.cuda.current_device(), CONFIG.cache_dir, CONFIG.kernel_variant)
    return torch.ops.mla_backend


def raw_decode(problem, workspace, num_splits=1, plan_pieces=0, plan=None):
    """The binding itself, past Python's checks: the problem's parts read in place."""
    q, kv = problem.query, problem.kv_cache
    batch, q_len, heads, _ = q.shape
    fp8 = q.dtype == torch.float8_e4m3fn
    out = torch.full((batch, q_len, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.ops.mla_backend.decode(
        q[..., :512],
        q[..., 512:],
        kv[..., :512],
        kv[..., 512:],
        problem.block_tables,
        problem.seq_lens,
        out,
        None,
        workspace,
        problem.max_seq_len,
        num_splits,
        plan_pieces,
        plan,
        *tile_shape(q_len * heads, fp8),
        0.1,
        None,
        1.0,
        None,
        False,
        None,
        True,
    )
    torch.cuda.synchronize()
    return out


def workspace_of(size: int) -> torch.Tensor:
    return torch.zeros(size, dtype=torch.uint8, device="cuda")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_split_partials_need_exactly_the_librarys_workspace(ops, dtype):
    problem = make_paged_problem([700, 300, 40], 1, 16, 64, dtype, device="cuda")
    need = ops.workspace_bytes(3, 16, 5, 0, False)
    with pytest.raises(RuntimeError, match=f"{SHORT}: workspace too small: need {need} bytes for the KV splits"):
        raw_decode(problem, workspace_of(need - 1), num_splits=5)
    assert not raw_decode(problem, workspace_of(need), num_splits=5).isnan().any()


def test_a_call_that_plans_itself_needs_exactly_the_librarys_workspace(ops):
    problem = make_paged_problem([900] * 33, 1, 16, 64, torch.float8_e4m3fn, device="cuda")
    need = ops.workspace_bytes(33, 16, 1, 40, False)  # the plan's ints, then its partials
    assert need > ops.workspace_bytes(33, 16, 1, 40, True)
    with pytest.raises(RuntimeError, match=f"{SHORT}: workspace too small: need {need} bytes for the split plan"):
        raw_decode(problem, workspace_of(need - 1), plan_pieces=40)
    assert not raw_decode(problem, workspace_of(need), plan_pieces=40).isnan().any()


def test_a_step_plan_needs_exactly_the_librarys_ints_and_its_partials(ops):
    problem = make_paged_problem([900] * 6, 2, 16, 64, torch.bfloat16, device="cuda")
    ints, partials = ops.plan_ints(6, 24), ops.workspace_bytes(6, 32, 1, 24, True)
    short = torch.zeros(ints - 1, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match=f"{SHORT}: plan: {ints} ints for batch 6 and 24 pieces, got {ints - 1}"):
        ops.plan(problem.seq_lens, short, problem.block_tables.shape[1], 64, 24)
    plan = torch.zeros(ints, dtype=torch.int32, device="cuda")
    ops.plan(problem.seq_lens, plan, problem.block_tables.shape[1], 64, 24)
    with pytest.raises(RuntimeError, match=f"{SHORT}: plan: {ints} ints"):
        raw_decode(problem, workspace_of(partials), plan_pieces=24, plan=short)
    with pytest.raises(RuntimeError, match=f"{SHORT}: workspace too small: need {partials} bytes"):
        raw_decode(problem, workspace_of(partials - 1), plan_pieces=24, plan=plan)
    assert not raw_decode(problem, workspace_of(partials), plan_pieces=24, plan=plan).isnan().any()


def test_a_plan_past_grid_y_is_refused(ops):
    """CUDA's grid.y (65535) bounds the plan's items, batch + 2 x pieces: the library's bound."""
    seq_lens = torch.ones(65535 - 2 * 4096 + 1, dtype=torch.int32, device="cuda")
    plan = torch.zeros(ops.plan_ints(seq_lens.numel(), 4096), dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match=f"{SHORT}: batch \\+ the plan's cut waves x plan_pieces must be <= 65535"):
        ops.plan(seq_lens, plan, 1, 64, 4096)


def test_the_plan_buffer_is_sized_by_the_library(ops, monkeypatch):
    assert plan_buffer(40, "cuda").numel() == ops.plan_ints(40, MAX_PLAN_PIECES)
    assert plan_buffer(40, "cpu").numel() == 0  # a CPU step is never planned
    monkeypatch.setattr(ops, "plan_ints", lambda batch, pieces: 7 * batch + pieces)
    assert plan_buffer(40, "cuda").numel() == 7 * 40 + MAX_PLAN_PIECES


def test_a_plans_workspace_need_is_the_librarys(ops, monkeypatch):
    problem = make_paged_problem([900] * 6, 1, 16, 64, torch.float8_e4m3fn, device="cuda")
    buffer = plan_buffer(6, "cuda")
    capacity = 64 << 20
    plan = launch_plan(problem.seq_lens, problem.block_tables.shape[1], 64, 16, True, buffer, capacity, CONFIG)
    assert isinstance(plan, DecodePlan)
    assert plan.workspace_bytes == ops.workspace_bytes(0, 16, 1, plan.pieces, True)
    assert plan.ints.numel() == ops.plan_ints(6, plan.pieces)
    monkeypatch.setattr(ops, "workspace_bytes", lambda *args: 4242)
    plan = launch_plan(problem.seq_lens, problem.block_tables.shape[1], 64, 16, True, buffer, capacity, CONFIG)
    assert plan is not None and plan.workspace_bytes == 4242
