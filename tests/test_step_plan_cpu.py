"""The step plan's API on CPU: bad inputs fail in Python before anything runs, CPU steps need no plan,
and a plan that does not fit a call is refused with the reason (the GPU side:
tests/test_step_plan_gpu.py)."""

import pytest
import torch

from mla_backend import DecodePlan, MLABackendConfig, mla_decode, mla_decode_reference, plan_buffer, plan_decode
from mla_backend.inputs import make_paged_problem

FP8 = torch.float8_e4m3fn
PARTIALS = 50_000  # the workspace bytes the hand-made plans below say their calls need


def plan_args(batch=3, max_pages=5):
    return torch.full((batch,), 100, dtype=torch.int32), torch.zeros(batch, max_pages, dtype=torch.int32)


def test_a_cpu_step_needs_no_plan():
    seq_lens, tables = plan_args()
    assert plan_decode(seq_lens, tables, 64, heads=16, kv_dtype=FP8, workspace_buffer=None) is None


def test_a_fixed_split_count_needs_no_plan():
    seq_lens, tables = plan_args()
    config = MLABackendConfig(num_kv_splits=4)
    assert plan_decode(seq_lens, tables, 64, heads=16, kv_dtype=FP8, workspace_buffer=None, config=config) is None


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"seq_lens": torch.full((3,), 100, dtype=torch.int64)}, TypeError, "seq_lens must be int32"),
        ({"seq_lens": torch.zeros(3, 2, dtype=torch.int32)}, ValueError, "seq_lens must be a contiguous"),
        ({"block_tables": torch.zeros(4, 5, dtype=torch.int32)}, ValueError, r"block_tables must be \[batch=3"),
        ({"block_tables": torch.zeros(3, 5, dtype=torch.float32)}, TypeError, "block_tables must be int32"),
        ({"page_size": 48}, ValueError, "page_size must be a power of two in 1..1024, got 48"),
        ({"heads": 129}, ValueError, "heads must be 1..128"),
        ({"heads": 0}, ValueError, "heads must be 1..128"),
        ({"q_len": 9}, ValueError, "q_len must be 1..8"),
        ({"kv_dtype": torch.float16}, TypeError, "kv_dtype must be one of"),
        ({"buffer": torch.zeros(10, dtype=torch.int64)}, TypeError, "buffer must be a contiguous int32"),
    ],
)
def test_bad_plan_inputs_fail_before_anything_runs(change, error, match):
    seq_lens, tables = plan_args()
    kwargs = {
        "seq_lens": seq_lens,
        "block_tables": tables,
        "page_size": 64,
        "heads": 16,
        "q_len": 1,
        "kv_dtype": FP8,
        "workspace_buffer": None,
        "buffer": None,
    } | change
    with pytest.raises(error, match=match):
        plan_decode(kwargs.pop("seq_lens"), kwargs.pop("block_tables"), kwargs.pop("page_size"), **kwargs)


def test_a_cpu_step_needs_no_plan_buffer():
    """CPU steps are never planned: their buffer holds nothing (a CUDA device's is sized by the kernel
    library: tests/test_schedule_seam_gpu.py)."""
    assert plan_buffer(40, "cpu").numel() == 0
    with pytest.raises(ValueError, match="max_batch must be >= 0"):
        plan_buffer(-1, "cpu")


def problem_and_plan(batch=2, q_len=1, heads=16, fp8=True, pieces=8):
    problem = make_paged_problem([300] * batch, q_len, heads, 64, FP8 if fp8 else torch.bfloat16, seed=1)
    plan = DecodePlan(torch.zeros(64, dtype=torch.int32), batch, q_len * heads, fp8, pieces, PARTIALS)
    return problem, plan


def call(problem, plan, workspace, config=None):
    return mla_decode(*problem.decode_args(workspace), plan=plan, config=config)


def test_a_fitting_plan_leaves_the_result_as_it_is():
    problem, plan = problem_and_plan()
    workspace = torch.empty(PARTIALS, dtype=torch.uint8)
    want, _ = mla_decode_reference(problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens)
    assert torch.equal(call(problem, plan, workspace), want.to(torch.bfloat16))


@pytest.mark.parametrize(
    "plan_change, match",
    [
        ({"batch": 3}, "plan was made for batch 3, 16 rows"),
        ({"rows": 32}, "32 rows"),
        ({"fp8": False}, "bf16; this call has batch 2, 16 rows, fp8"),
    ],
)
def test_a_plan_for_another_call_is_refused(plan_change, match):
    problem, plan = problem_and_plan()
    workspace = torch.empty(PARTIALS, dtype=torch.uint8)
    fields = {"ints": plan.ints, "batch": 2, "rows": 16, "fp8": True, "pieces": 8, "workspace_bytes": PARTIALS}
    fields |= plan_change
    with pytest.raises(ValueError, match=match):
        call(problem, DecodePlan(**fields), workspace)


def test_a_plan_needs_room_for_its_partials_and_no_fixed_split_count():
    problem, plan = problem_and_plan()
    with pytest.raises(ValueError, match="split partials need"):
        call(problem, plan, torch.empty(PARTIALS - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="plan and num_kv_splits both set"):
        call(problem, plan, torch.empty(1 << 20, dtype=torch.uint8), MLABackendConfig(num_kv_splits=2))
    with pytest.raises(TypeError, match="plan must come from plan_decode"):
        call(problem, "plan", torch.empty(1 << 20, dtype=torch.uint8))
