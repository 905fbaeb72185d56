"""The bundled kernels against the float64 reference on dequantised inputs (GPU only)."""

import math
import os
import subprocess
import sys

import pytest
import torch
from graph_capture import capture
from peer_grids import assert_lse_exact
from plan_oracle import assert_plan_is_the_oracles, launcher_pieces

import mla_backend.decode as decode_module
from mla_backend import (
    BackendUnavailableError,
    MLABackendConfig,
    mla_decode_reference,
    trtllm_batch_decode_with_kv_cache_mla,
    xqa_batch_decode_with_kv_cache_mla,
)
from mla_backend.inputs import DRAW_CHUNK_ELEMENTS, make_paged_problem, vllm_bf16_query_layout
from mla_backend.reference import ROW_ERROR_TOLERANCE

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SM_SCALE = 1 / math.sqrt(192)
WORKSPACE_BYTES = 256 << 20


@pytest.fixture(scope="module")
def workspace():
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")


@pytest.fixture(autouse=True)
def poisoned_allocations():
    """Every tensor torch allocates (the op's LSE, its out when none is passed, the reference's
    scratch) starts as NaN (floats) or all ones (integers): a kernel that leaves an output unwritten
    cannot pass on memory an earlier, correct call left behind."""
    import torch.utils.deterministic

    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.utils.deterministic.fill_uninitialized_memory = before[2]


def op_args(problem, workspace, query=None, max_seq_len=None) -> tuple:
    """The op's positional arguments for ``problem`` (DeepSeek-V3's dims: nope 128, latent 512, rope 64)."""
    return (
        problem.query if query is None else query,
        problem.kv_cache,
        workspace,
        128,
        512,
        64,
        problem.block_tables,
        problem.seq_lens,
        problem.max_seq_len if max_seq_len is None else max_seq_len,
    )


def assert_matches_reference(got, lse, problem, bmm1, bmm2, dtype, tolerance=None):
    """Every output row within ``tolerance`` (default: the dtype's kernel tolerance) of the float64
    reference on ``problem``'s inputs, rows that see no key exactly zero, nothing NaN; the LSE, where
    given, exact: -inf exactly where a row sees nothing, FlashMLA's LSE rule elsewhere."""
    want, want_lse = mla_decode_reference(
        problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, bmm1, bmm2
    )
    got = got.view(want.shape)
    assert not torch.isnan(got).any(), "unwritten (NaN-poisoned) or NaN output"
    diff = (got.double() - want).norm(dim=-1)
    scale = want.norm(dim=-1)
    empty = scale == 0
    assert torch.all(got[empty] == 0), "rows that see no key must be zero"
    rel = diff[~empty] / scale[~empty]
    tolerance = ROW_ERROR_TOLERANCE[dtype] if tolerance is None else tolerance
    assert rel.numel() == 0 or rel.max() <= tolerance, f"max row rel err {rel.max():.3e}"
    if lse is None:
        return
    assert_lse_exact(lse, want_lse)


def run_and_check(
    problem, workspace, dtype, bmm1=SM_SCALE, bmm2=1.3, tensor_scales=False, out_3d=False, tolerance=None, query=None
):
    """Runs the op on poisoned outputs and checks every row against the float64 reference, within
    ``tolerance`` (default: the kernel tolerance of the dtype). ``query`` replaces problem.query
    in the op's call (another layout of the same values)."""
    device_scale = lambda v: torch.tensor([v], dtype=torch.float32, device="cuda")  # noqa: E731
    s1, s2 = (device_scale(bmm1), device_scale(bmm2)) if tensor_scales else (bmm1, bmm2)
    batch, q_len, heads, _ = problem.query.shape
    shape = (batch, heads, 512) if out_3d else (batch, q_len, heads, 512)
    out = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")  # poison
    got, lse = xqa_batch_decode_with_kv_cache_mla(
        *op_args(problem, workspace, query),
        out=out,
        bmm1_scale=s1,
        bmm2_scale=s2,
        return_lse=True,
        return_lse_base="basee",
    )
    assert got is out
    got = got.view(batch, q_len, heads, 512)
    assert_matches_reference(got, lse, problem, bmm1, bmm2, dtype, tolerance)
    return got, lse


DTYPES = [torch.bfloat16, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("q_len", [1, 2, 4])
def test_ragged_batch_pages_and_q_len(workspace, dtype, page_size, q_len):
    lengths = [max(q_len, n) for n in (17, 1000, 64)]
    problem = make_paged_problem(
        lengths, q_len, heads=16, page_size=page_size, dtype=dtype, device="cuda", seed=page_size * 10 + q_len
    )
    run_and_check(problem, workspace, dtype, tensor_scales=q_len == 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads", [8, 16, 32, 64, 128])
def test_head_counts(workspace, dtype, heads):
    problem = make_paged_problem([1, 4097, 17], 1, heads, page_size=64, dtype=dtype, device="cuda", seed=heads)
    run_and_check(problem, workspace, dtype, tensor_scales=heads % 32 == 0, out_3d=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads, q_len", [(16, 1), (128, 1), (64, 2), (128, 4)])
def test_long_single_request_splits_kv(workspace, dtype, heads, q_len):
    problem = make_paged_problem([32768], q_len, heads, page_size=64, dtype=dtype, device="cuda", seed=7)
    run_and_check(problem, workspace, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads", [16, 128])
def test_batch_64_ragged(workspace, dtype, heads):
    gen = torch.Generator().manual_seed(heads)
    lengths = torch.randint(1, 4098, (64,), generator=gen).tolist()
    lengths[:3] = [1, 4097, 0]
    problem = make_paged_problem(lengths, 2, heads, page_size=32, dtype=dtype, device="cuda", seed=heads + 1)
    run_and_check(problem, workspace, dtype, tensor_scales=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads, q_len", [(16, 1), (128, 4), (8, 3)])
def test_split_strided_query_is_read_in_place(workspace, dtype, heads, q_len):
    # (q_nope, q_pe) strided views give the reference's result, bit-identical to the contiguous query.
    problem = make_paged_problem([700, 2100], q_len, heads, page_size=64, dtype=dtype, device="cuda", seed=heads)
    nope, pe = vllm_bf16_query_layout(problem.query)
    assert not nope.is_contiguous() and not pe.is_contiguous()
    got, lse = run_and_check(problem, workspace, dtype, query=(nope, pe))
    want, want_lse = run_and_check(problem, workspace, dtype)
    assert torch.equal(got, want) and torch.equal(lse, want_lse)


def test_the_stride_of_a_size_one_dim_is_ignored(workspace):
    problem = make_paged_problem([900], 1, 16, page_size=64, device="cuda", seed=5)
    odd = torch.as_strided(problem.query, problem.query.shape, (3, 7, 576, 1))  # strides of size-1 dims
    run_and_check(problem, workspace, torch.bfloat16, query=odd)


def add_score_ramp(problem, rising: bool, climb: float = 1.5) -> None:
    """Shift every query up by 1 and every key by ``climb`` x its relative position along a shared
    direction, so that scores climb (or fall) by ~90 log2 units along each request's keys."""
    query = problem.query.float() + 1.0
    problem.query.copy_(query.to(problem.query.dtype))
    page_size = problem.kv_cache.shape[1]
    raw = problem.kv_cache.view(torch.uint8)  # indexing works on bytes for every dtype
    for b, n in enumerate(problem.seq_lens.tolist()):
        pos = torch.arange(n, device=problem.kv_cache.device)
        ramp = climb * (pos / max(n - 1, 1) if rising else 1 - pos / max(n - 1, 1))
        pages, slots = problem.block_tables[b, pos // page_size].long(), pos % page_size
        rows = raw[pages, slots].view(problem.kv_cache.dtype).float() + ramp[:, None]
        raw[pages, slots] = rows.to(problem.kv_cache.dtype).view(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("rising", [True, False], ids=["rising", "falling"])
@pytest.mark.parametrize("heads", [16, 64])
def test_scores_rising_along_the_keys(workspace, dtype, rising, heads):
    # Rising scores make the online softmax raise its reference maximum (and rescale) many times
    # within one split; falling scores never do. Both must match the reference.
    problem = make_paged_problem([4000, 1500, 3], 2, heads, page_size=32, dtype=dtype, device="cuda", seed=heads)
    add_score_ramp(problem, rising)
    run_and_check(problem, workspace, dtype, bmm2=0.9)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
def test_a_dominant_key_costs_no_more_than_output_rounding(workspace, dtype):
    # Steep scores: the last keys carry almost all the weight. Their P is rounded to 16 bits for
    # P.V; the softmax sum must use the same rounded P, or that rounding (2^-9 in bf16) adds to the
    # output's own rounding error (with an unrounded sum the bf16 error is about 3.6e-3, above this bound).
    for seed in range(3):
        problem = make_paged_problem([3000, 700], 1, 128, page_size=64, dtype=dtype, device="cuda", seed=seed)
        add_score_ramp(problem, rising=True, climb=4.0)
        run_and_check(problem, workspace, dtype, bmm1=0.072, bmm2=1.0, tolerance=2.5e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 8, 9, 64])  # up to 8: the few-splits merge, else the wide one
def test_explicit_split_counts_agree(workspace, monkeypatch, splits, dtype):
    # from_sources keeps the environment's settings (MLA_BACKEND_FP8_QK in the SM120-layout run)
    config = MLABackendConfig.from_sources({"num_kv_splits": splits})
    monkeypatch.setattr(decode_module, "default_config", lambda: config)
    problem = make_paged_problem([1000, 33, 0, 5000], 4, 32, page_size=16, dtype=dtype, device="cuda", seed=splits)
    run_and_check(problem, workspace, dtype, bmm1=0.11, bmm2=0.7)


def assert_planned_as_the_oracle_says(problem, workspace) -> list[int]:
    """The plan the last call left in the workspace, int for int against tests/plan_oracle.py; the
    split count of each request."""
    pieces = launcher_pieces(problem, WORKSPACE_BYTES)
    assert pieces > 0
    return assert_plan_is_the_oracles(workspace, problem, pieces)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads, q_len", [(16, 1), (128, 1), (20, 2)])
def test_the_plan_cuts_a_long_request_among_short_ones(workspace, dtype, heads, q_len):
    """The split plan, made on the GPU from the real lengths (csrc/plan/plan_kernel.cuh), cuts the long request into
    many more splits than the short ones: the merge takes requests of different split counts next to
    requests written directly (the empty one, the one-token one). The plan is the oracle's."""
    lengths = [20000] + [300] * 30 + [0, q_len]  # 33 requests: the plan's smallest batches and more
    problem = make_paged_problem(lengths, q_len, heads, 64, dtype, "cuda", seed=heads)
    run_and_check(problem, workspace, dtype)
    splits = assert_planned_as_the_oracle_says(problem, workspace)
    assert splits[0] > 8 and splits[0] >= 4 * max(splits[1:31]) and splits[31:] == [1, 1], splits


@pytest.mark.parametrize("lengths", [[0] * 40, [1] * 40, [0] * 39 + [5000]], ids=["empty", "one-token", "one-long"])
def test_the_plan_of_a_batch_of_empty_or_tiny_requests(workspace, lengths):
    """Padded graph batches: every request empty (no tile at all, the longest is 0), or one token each,
    or empties beside one long request. The plan is the oracle's and the rows are right."""
    problem = make_paged_problem(lengths, 1, 16, 64, torch.float8_e4m3fn, "cuda", seed=len(set(lengths)))
    run_and_check(problem, workspace, torch.float8_e4m3fn)
    splits = assert_planned_as_the_oracle_says(problem, workspace)
    assert splits[:39] == [1] * 39 and (splits[39] > 1) == (lengths[39] > 32), splits


def test_the_plan_scans_more_requests_than_its_block_has_threads(workspace):
    """Over 1024 requests the plan kernel scans the batch in chunks; a few long requests among them,
    one at each end of a chunk."""
    gen = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, 129, (1500,), generator=gen).tolist()  # at most 4 tiles: never split
    for b in (0, 1023, 1024, 1499):
        lengths[b] = 9000
    problem = make_paged_problem(lengths, 1, 16, 16, torch.float8_e4m3fn, "cuda", seed=5)
    run_and_check(problem, workspace, torch.float8_e4m3fn)
    splits = assert_planned_as_the_oracle_says(problem, workspace)
    assert all(splits[b] > 1 for b in (0, 1023, 1024, 1499)) and max(splits[1:1023]) == 1, splits[:8]


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
def test_page_ids_guessed_from_max_seq_len_any_bound(workspace, monkeypatch, dtype):
    # The kernel fetches each split's first page ids as if seq_len were max_seq_len, before seq_len
    # arrives. A bound that is exact (the longest request), loose, or below some seq_lens (which
    # the op cannot see without a device sync) must all give the same, correct result.
    config = MLABackendConfig.from_sources({"num_kv_splits": 5})
    monkeypatch.setattr(decode_module, "default_config", lambda: config)
    problem = make_paged_problem([2100, 700, 2100, 31], 2, 16, page_size=16, dtype=dtype, device="cuda", seed=21)
    want, want_lse = run_and_check(problem, workspace, dtype)
    page_capacity = problem.block_tables.shape[1] * 16
    for bound in (page_capacity, 700, 1, 0):
        out, lse = xqa_batch_decode_with_kv_cache_mla(
            *op_args(problem, workspace, max_seq_len=bound),
            bmm1_scale=SM_SCALE,
            bmm2_scale=1.3,
            return_lse=True,
            return_lse_base="basee",
        )
        assert torch.equal(out, want) and torch.equal(lse, want_lse), f"max_seq_len={bound}"


def test_workspace_too_small_for_requested_splits(monkeypatch):
    config = MLABackendConfig.from_sources({"num_kv_splits": 8})
    monkeypatch.setattr(decode_module, "default_config", lambda: config)
    problem = make_paged_problem([300], 1, 16, page_size=16, device="cuda")
    with pytest.raises(ValueError, match="workspace_buffer holds 1024 bytes"):
        xqa_batch_decode_with_kv_cache_mla(*op_args(problem, torch.empty(1024, dtype=torch.uint8, device="cuda")))


def test_the_bindings_own_checks_reach_python_as_errors(workspace):
    """Through the stable ABI a failed STD_TORCH_CHECK in the binding is a Python RuntimeError, not a crash
    (the op's Python checks come first, so the raw op is called with an int64 block table)."""
    from mla_backend.jit import ensure_loaded

    config = MLABackendConfig.from_sources()  # the environment may pick the fp8_qk variant
    ensure_loaded(torch.cuda.current_device(), config.cache_dir, config.kernel_variant)
    problem = make_paged_problem([40], 1, 16, page_size=16, device="cuda")
    q = problem.query
    out = torch.full((1, 1, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="block_tables: int32 rows"):
        torch.ops.mla_backend.decode(
            q[..., :512],
            q[..., 512:],
            problem.kv_cache[..., :512],
            problem.kv_cache[..., 512:],
            problem.block_tables.long(),
            problem.seq_lens,
            out,
            None,
            workspace,
            40,
            1,
            0,
            None,
            1,
            1,
            0.1,
            None,
            1.0,
            None,
            False,
            None,
            True,
        )
    assert torch.isnan(out).all(), "nothing may run after a failed check"


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
def test_cuda_graph_replay_is_bit_identical_to_eager(workspace, dtype):
    problem = make_paged_problem([3000, 17, 900], 2, 64, page_size=64, dtype=dtype, device="cuda", seed=11)
    scale = torch.tensor([SM_SCALE], dtype=torch.float32, device="cuda")

    def step():
        return xqa_batch_decode_with_kv_cache_mla(
            *op_args(problem, workspace), bmm1_scale=scale, bmm2_scale=1.0, return_lse=True, return_lse_base="basee"
        )

    eager_out, eager_lse = step()
    graph, (graph_out, graph_lse) = capture(step)
    graph_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, eager_out) and torch.equal(graph_lse, eager_lse)
    # the device scale is read at replay time
    scale.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(graph_lse, eager_lse)


def test_pdl_on_and_off_agree(workspace):
    problem = make_paged_problem([2000, 100], 1, 128, page_size=64, dtype=torch.float8_e4m3fn, device="cuda", seed=3)
    args = op_args(problem, workspace)
    with_pdl = xqa_batch_decode_with_kv_cache_mla(*args, bmm1_scale=SM_SCALE, enable_pdl=True)
    without = xqa_batch_decode_with_kv_cache_mla(*args, bmm1_scale=SM_SCALE, enable_pdl=False)
    assert torch.equal(with_pdl, without)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="an SM90 check: it runs the other architectures' kernel variants here",
)
@pytest.mark.parametrize(
    "variant",
    [
        {"MLA_BACKEND_FP8_QK": "e4m3"},  # the SM120 FP8 layout: e4m3 Q in shared memory, mma.sync e4m3
        {"MLA_BACKEND_FP8_PV": "f16"},  # P.V summed in f16 per 16-token step
        {"MLA_BACKEND_FP8_QK": "e4m3", "MLA_BACKEND_FP8_PV": "f16"},  # both, as an SM120 build with f16 P.V
    ],
    ids=["e4m3_qk", "f16_pv", "e4m3_qk_f16_pv"],
)
def test_variant_passes_the_same_tests_on_sm90(variant):
    # Each variant is built on request and runs this whole file, with its tolerances, in a fresh
    # process (one kernel library per process); e4m3 mma.sync is emulated on SM90.
    env = dict(os.environ, **variant)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            "not variant_passes",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_allocations_are_poisoned_while_the_gpu_tests_run():
    assert torch.isnan(torch.empty(1000, device="cuda")).all()
    assert torch.isnan(torch.empty(3, 5, dtype=torch.bfloat16, device="cuda")).all()


def test_a_kernel_that_writes_nothing_fails_the_check(workspace, monkeypatch):
    """The checks above catch a kernel that leaves out and LSE unwritten, even right after a correct
    call on the same shapes (whose results the allocator could hand back)."""
    problem = make_paged_problem([300, 40], 1, 16, page_size=64, device="cuda", seed=4)
    run_and_check(problem, workspace, torch.bfloat16)  # loads the library, leaves correct results behind
    monkeypatch.setattr(torch.ops.mla_backend, "decode", lambda *args: None)
    with pytest.raises(AssertionError, match="NaN"):
        run_and_check(problem, workspace, torch.bfloat16)
    out = xqa_batch_decode_with_kv_cache_mla(*op_args(problem, workspace), return_lse=True, return_lse_base="basee")[1]
    assert torch.isnan(out).all(), "the op's own LSE allocation is poisoned too"


# --- every head count x query length x page size ---------------------------------------------------

SWEEP_HEADS = [1, 3, 8, 16, 20, 32, 64, 128]


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("heads", SWEEP_HEADS)
@pytest.mark.parametrize("q_len", range(1, 9))
def test_sweep_heads_q_len_pages(workspace, dtype, page_size, heads, q_len):
    lengths = [q_len, q_len + 16, 300 + q_len, 2 * page_size + 1]
    problem = make_paged_problem(
        lengths,
        q_len,
        heads,
        page_size=page_size,
        dtype=dtype,
        device="cuda",
        seed=heads * 100 + q_len * 10 + page_size // 16,
    )
    run_and_check(problem, workspace, dtype, tensor_scales=(heads + q_len) % 2 == 0)


# --- CUDA graphs replayed with new inputs, as vLLM replays them --------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads, q_len", [(16, 1), (128, 2), (20, 4)])
def test_graph_replayed_with_new_inputs_matches_the_reference(workspace, dtype, heads, q_len):
    """Capture once on static buffers, then for each step copy in new queries, longer seq_lens and
    a reshuffled block table (what vLLM's model runner does) and replay: each replay is checked
    against the float64 reference on that step's inputs."""
    capacity = 4096
    static = make_paged_problem(
        [capacity, capacity, capacity], q_len, heads, page_size=64, dtype=dtype, device="cuda", seed=31
    )
    out = torch.empty(3, q_len, heads, 512, dtype=torch.bfloat16, device="cuda")

    def step():
        return xqa_batch_decode_with_kv_cache_mla(
            *op_args(static, workspace, max_seq_len=capacity),
            out=out,
            bmm1_scale=SM_SCALE,
            bmm2_scale=1.3,
            return_lse=True,
            return_lse_base="basee",
        )

    graph, (_, lse) = capture(step)
    for seed, lengths in enumerate(([q_len, 700, 33], [2000, 701, 4096], [17, 0, 1500])):
        fresh = make_paged_problem(lengths, q_len, heads, page_size=64, dtype=dtype, device="cuda", seed=40 + seed)
        static.query.copy_(fresh.query)
        static.seq_lens.copy_(fresh.seq_lens)
        static.block_tables.copy_(
            torch.randperm(static.kv_cache.shape[0], device="cuda")[: static.block_tables.numel()]
            .view_as(static.block_tables)
            .int()
        )
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches_reference(out, lse, static, SM_SCALE, 1.3, dtype)


# --- programmatic dependent launch is really on ---------------------------------------------------


def graph_edge_types(graph: torch.cuda.CUDAGraph) -> list[int]:
    """The dependency type of every edge of a captured graph (0 default, 1 programmatic), read with
    the driver's cuGraphGetEdges_v2."""
    import ctypes

    class EdgeData(ctypes.Structure):
        _fields_ = [
            ("from_port", ctypes.c_ubyte),
            ("to_port", ctypes.c_ubyte),
            ("type", ctypes.c_ubyte),
            ("reserved", ctypes.c_ubyte * 5),
        ]

    driver = ctypes.CDLL("libcuda.so.1")
    get_edges = driver.cuGraphGetEdges_v2
    handle = ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    assert get_edges(handle, None, None, None, ctypes.byref(count)) == 0
    sources, targets = (ctypes.c_void_p * count.value)(), (ctypes.c_void_p * count.value)()
    data = (EdgeData * count.value)()
    assert get_edges(handle, sources, targets, data, ctypes.byref(count)) == 0
    return [edge.type for edge in data]


@pytest.mark.parametrize("pdl", [True, False])
def test_pdl_launches_become_programmatic_graph_edges(workspace, pdl):
    """enable_pdl=True must launch with programmatic stream serialization: captured after another
    kernel, such a launch becomes a programmatic edge of the graph; with False, none does. Split-KV
    (two kernels of ours) and the result are checked too."""
    problem = make_paged_problem([6000, 100], 1, 128, page_size=64, dtype=torch.float8_e4m3fn, device="cuda", seed=3)
    config = MLABackendConfig.from_sources({"num_kv_splits": 4})
    args = op_args(problem, workspace)
    bump = torch.zeros(1, device="cuda")

    def step():
        bump.add_(1)  # a kernel before ours, as in a model's forward
        return trtllm_batch_decode_with_kv_cache_mla(*args, bmm1_scale=SM_SCALE, enable_pdl=pdl, config=config)

    graph, out = capture(step, keep_graph=True)
    types = graph_edge_types(graph)
    if pdl:  # into the decode kernel and into the merge kernel
        assert types.count(1) >= 2, f"edge types {types}"
    else:
        assert 1 not in types, f"edge types {types}"
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_reference(out, None, problem, SM_SCALE, 1.0, torch.float8_e4m3fn)


# --- the public op with each backend value -------------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "xqa"])
def test_public_op_serves_auto_and_xqa_with_the_kernels(workspace, backend):
    problem = make_paged_problem([900, 37], 2, 32, page_size=32, dtype=torch.float8_e4m3fn, device="cuda", seed=8)
    out = torch.full((2, 2, 32, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    got, lse = trtllm_batch_decode_with_kv_cache_mla(
        *op_args(problem, workspace),
        out=out,
        bmm1_scale=SM_SCALE,
        bmm2_scale=1.3,
        backend=backend,
        return_lse=True,
        return_lse_base="basee",
    )
    assert got is out
    assert_matches_reference(got, lse, problem, SM_SCALE, 1.3, torch.float8_e4m3fn)


def test_public_op_refuses_trtllm_gen_where_it_cannot_run(workspace):
    capability = torch.cuda.get_device_capability()
    if capability in ((10, 0), (10, 3)):
        pytest.skip("trtllm-gen can run on this GPU")
    problem = make_paged_problem([100], 1, 16, page_size=64, device="cuda")
    with pytest.raises(BackendUnavailableError, match=f"this GPU is {capability[0]}.{capability[1]}"):
        trtllm_batch_decode_with_kv_cache_mla(*op_args(problem, workspace), backend="trtllm-gen")


@pytest.mark.parametrize("op", ["trtllm", "xqa"])
def test_public_op_on_a_gpu_without_kernels_raises(workspace, monkeypatch, op):
    """device_capability 8.0: as on an A100, no bundled kernel; the op says so instead of running slowly."""
    config = MLABackendConfig.from_sources({"device_capability": "8.0"})
    monkeypatch.setattr(decode_module, "default_config", lambda: config)
    problem = make_paged_problem([100], 1, 16, page_size=64, device="cuda")
    args = op_args(problem, workspace)
    call = trtllm_batch_decode_with_kv_cache_mla if op == "trtllm" else xqa_batch_decode_with_kv_cache_mla
    with pytest.raises(BackendUnavailableError, match="8.0"):
        call(*args)


def test_workspace_bound_written_out(monkeypatch):
    """Split-KV needs batch x splits x rows x (512 + 1) fp32 partials; one byte less is refused."""
    config = MLABackendConfig.from_sources({"num_kv_splits": 3})
    monkeypatch.setattr(decode_module, "default_config", lambda: config)
    problem = make_paged_problem([3000, 100], 2, 16, page_size=64, device="cuda", seed=2)
    need = 2 * 3 * (2 * 16) * (512 + 1) * 4
    with pytest.raises(ValueError, match=f"needs {need}"):
        xqa_batch_decode_with_kv_cache_mla(*op_args(problem, torch.empty(need - 1, dtype=torch.uint8, device="cuda")))
    run_and_check(problem, torch.empty(need, dtype=torch.uint8, device="cuda"), torch.bfloat16)


def test_a_cache_drawn_on_the_gpu_is_filled_without_a_full_size_scratch():
    # The benchmark's times depend on where the cache sits (docs/performance.md): a float32 scratch
    # of the cache's size allocated first would move it. Every element is drawn (NaN-poisoned
    # allocations would show a gap) with the requested spread.
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    problem = make_paged_problem([65536] * 16, 1, 16, 64, torch.float8_e4m3fn, "cuda", kv_scale=0.5)
    peak = torch.cuda.max_memory_allocated() - before
    scratch_bound = 4 * DRAW_CHUNK_ELEMENTS + (64 << 20)
    assert 4 * problem.kv_cache.nbytes > scratch_bound  # a full-size float32 scratch cannot pass
    assert peak < problem.kv_cache.nbytes + scratch_bound
    cache = problem.kv_cache[::7].float()
    assert torch.isfinite(cache).all()
    assert abs(cache.std().item() - 0.5) < 0.01
