"""A step's split plan (mla_backend.step_plan), made once and read by many calls, on the GPU: the plan
is the oracle's, every call that reads it matches the float64 reference, a plan made from other
lengths stays correct, and a CUDA graph replays with the plan written before each replay."""

import math

import pytest
import torch
from peer_grids import assert_lse_exact
from plan_oracle import assert_plan_is_the_oracles, counts_in, launcher_pieces, plan_in_workspace

from mla_backend import MLABackendConfig, mla_decode, mla_decode_reference, plan_buffer
from mla_backend.inputs import make_paged_problem
from mla_backend.kernel_constants import PLAN_MIN_BATCH
from mla_backend.reference import ROW_ERROR_TOLERANCE

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

WORKSPACE_BYTES = 256 << 20
BMM1, BMM2 = 1 / math.sqrt(192), 1.3
CONFIG = MLABackendConfig.from_sources({"backend": "xqa"})  # ours, where auto may route elsewhere
DTYPES = [torch.bfloat16, torch.float8_e4m3fn]


@pytest.fixture(scope="module")
def workspace():
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")


def make_plan(problem, workspace, buffer=None):
    return problem.step_plan(workspace, CONFIG, buffer)


def decode_with(problem, workspace, plan, out=None, lse=None):
    """The op with ``plan`` into ``out`` and ``lse`` (new NaN-poisoned ones where not given)."""
    batch, q_len, heads, _ = problem.query.shape
    if out is None:
        out = torch.full((batch, q_len, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((batch, q_len, heads), float("nan"), dtype=torch.float32, device="cuda")
    mla_decode(
        *problem.decode_args(workspace), out=out, lse=lse, bmm1_scale=BMM1, bmm2_scale=BMM2, config=CONFIG, plan=plan
    )
    return out, lse


def assert_matches_reference(out, lse, problem):
    """Every row within the dtype's tolerance of float64 on the dequantised inputs, rows that see no
    key zero, the LSE exact (-inf exactly there, FlashMLA's LSE rule elsewhere)."""
    want, want_lse = mla_decode_reference(
        problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, BMM1, BMM2
    )
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) output"
    scale = want.norm(dim=-1)
    seen = scale > 0
    assert torch.all(out[~seen] == 0), "rows that see no key must be zero"
    rel = (out.double() - want).norm(dim=-1)[seen] / scale[seen]
    assert rel.numel() == 0 or rel.max() <= ROW_ERROR_TOLERANCE[problem.query.dtype], f"row rel err {rel.max():.3e}"
    assert_lse_exact(lse, want_lse)


def assert_step_plan_is_the_oracles(plan, problem) -> list[int]:
    assert plan.pieces == launcher_pieces(problem, WORKSPACE_BYTES, step_plan=True) > 0
    return assert_plan_is_the_oracles(plan.ints, problem, plan.pieces)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads, q_len", [(16, 1), (128, 1), (20, 2), (8, 4)])
@pytest.mark.parametrize(
    "lengths",
    [[20000, 300, 0, 2], [20000] + [300] * 30 + [0, 4], [4096] * 8, [1, 1, 0, 1]],
    ids=["small-mixed", "33-mixed", "equal-8", "one-token"],
)
def test_calls_reading_one_step_plan_match_the_reference(workspace, dtype, heads, q_len, lengths):
    """The plan of small batches too (which a call would not plan for itself), int for int the
    oracle's; three layers' calls, each its own query and cache over the step's lengths, read it."""
    layers = [make_paged_problem(lengths, q_len, heads, 64, dtype, "cuda", seed=s) for s in range(3)]
    plan = make_plan(layers[0], workspace)
    splits = assert_step_plan_is_the_oracles(plan, layers[0])
    if lengths[0] == 20000:
        assert splits[0] > 1 and splits[0] >= 4 * max(splits[1:-2], default=1), splits
    for layer in layers:
        assert_matches_reference(*decode_with(layer, workspace, plan), layer)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads, q_len", [(1, 1), (16, 1), (20, 2)])
def test_every_way_the_planned_merge_takes_matches_the_reference(workspace, dtype, heads, q_len):
    """The planned merge takes requests cut into 2-8 splits a warp a row, 9-16 a warp a (row, slice of
    128 dims), more a block a (row, slice); at one row a block's eight warps take units of several
    requests, some of them left to the blocks."""
    lengths = [60000, 20000, 12000, 9000, 6000, 4000, 3000, 2000, 1000, 300, 0, 5]
    problem = make_paged_problem(lengths, q_len, heads, 64, dtype, "cuda", seed=5)
    plan = make_plan(problem, workspace)
    counts = assert_step_plan_is_the_oracles(plan, problem)
    assert max(counts) > 16 and any(8 < c <= 16 for c in counts) and any(1 < c <= 8 for c in counts), counts
    assert_matches_reference(*decode_with(problem, workspace, plan), problem)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
def test_a_plan_made_from_other_lengths_stays_correct(workspace, dtype):
    """Each split's tiles come from its request's length when the decode runs: a plan made before the
    lengths changed (in place, as an engine's persistent buffer changes) only balances worse."""
    problem = make_paged_problem([9000] * 5, 1, 16, 64, dtype, "cuda", seed=3)  # pages for 9000 each
    problem.seq_lens.copy_(torch.tensor([9000, 9000, 64, 700, 1], dtype=torch.int32))
    plan = make_plan(problem, workspace)
    counts = counts_in(plan_in_workspace(plan.ints, 5, plan.pieces), 5)
    assert counts[0] > 1 and counts[2] == 1, counts  # the first shrinks to 1 token, the third grows to 9000
    problem.seq_lens.copy_(torch.tensor([1, 8999, 9000, 0, 700], dtype=torch.int32))
    assert_matches_reference(*decode_with(problem, workspace, plan), problem)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
def test_a_graph_replays_with_the_plan_written_before_each_replay(workspace, dtype):
    """The engines' order: capture with a plan in a fixed buffer; then each step writes new lengths,
    plans again into that buffer outside the graph, and replays."""
    batch = PLAN_MIN_BATCH // 2  # under the in-call plan's threshold: only the step plan cuts here
    problem = make_paged_problem([6000] * batch, 1, 16, 64, dtype, "cuda", seed=7)
    buffer = plan_buffer(batch, "cuda")
    out = torch.empty(batch, 1, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(batch, 1, 16, dtype=torch.float32, device="cuda")

    def step():
        decode_with(problem, workspace, plan, out, lse)

    plan = make_plan(problem, workspace, buffer)
    step()  # loads the kernels and sets their attributes outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    gen = torch.Generator().manual_seed(11)
    for lengths in ([6000] + [40] * (batch - 1), [0] * batch, torch.randint(0, 6001, (batch,), generator=gen).tolist()):
        problem.seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        replanned = make_plan(problem, workspace, buffer)
        assert replanned.ints.data_ptr() == buffer.data_ptr() and replanned.pieces == plan.pieces
        assert_step_plan_is_the_oracles(replanned, problem)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        assert_matches_reference(out, lse, problem)


def test_steps_of_fewer_requests_keep_the_hosts_split_count(workspace):
    """One to three requests: no plan (kernel_constants.STEP_PLAN_MIN_BATCH), and the calls split as before."""
    for lengths in ([30000], [30000, 1000, 5]):
        problem = make_paged_problem(lengths, 1, 16, 64, torch.float8_e4m3fn, "cuda", seed=len(lengths))
        assert make_plan(problem, workspace) is None
        assert_matches_reference(*decode_with(problem, workspace, None), problem)


def test_a_plan_for_another_call_is_refused_before_launch(workspace):
    lengths = [3000, 20, 7, 1]
    problem = make_paged_problem(lengths, 1, 16, 64, torch.float8_e4m3fn, "cuda", seed=1)
    plan = make_plan(problem, workspace)
    other_heads = make_paged_problem(lengths, 1, 32, 64, torch.float8_e4m3fn, "cuda", seed=1)
    with pytest.raises(ValueError, match="plan was made for batch 4, 16 rows"):
        decode_with(other_heads, workspace, plan)
    other_dtype = make_paged_problem(lengths, 1, 16, 64, torch.bfloat16, "cuda", seed=1)
    with pytest.raises(ValueError, match="fp8; this call has batch 4, 16 rows, bf16"):
        decode_with(other_dtype, workspace, plan)
    with pytest.raises(ValueError, match="split partials need"):
        decode_with(problem, workspace[:1024], plan)


def test_a_plan_buffer_too_small_for_the_step_is_refused_before_anything_runs():
    problem = make_paged_problem([300] * 3, 1, 16, 64, torch.float8_e4m3fn, device="cuda")
    short = torch.zeros(10, dtype=torch.int32, device="cuda")
    with pytest.raises(
        ValueError, match=r"buffer holds 10 ints, a plan of 3 requests may need \d+ \(plan_buffer\(3\)\)"
    ):
        problem.step_plan(torch.zeros(1 << 20, dtype=torch.uint8, device="cuda"), CONFIG, short)
