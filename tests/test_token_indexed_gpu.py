"""KV read token by token on the GPU: pages of one token (a slot id a token), small powers of two,
FlashInfer's ragged kv_indices/kv_indptr, causal=False, NaN past each request's length, and slot ids
beyond 2^32 bytes of cache, each against the float64 reference on poisoned outputs."""

import math

import pytest
import torch
from graph_capture import capture
from peer_grids import assert_lse_exact

from mla_backend import mla_decode, mla_decode_reference
from mla_backend.inputs import make_paged_problem
from mla_backend.reference import ROW_ERROR_TOLERANCE
from mla_backend.step_plan import plan_decode

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SM_SCALE = 1 / math.sqrt(192)
DTYPES = [torch.bfloat16, torch.float8_e4m3fn]


@pytest.fixture(scope="module")
def workspace():
    return torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")


def decode(problem, workspace, *, causal=True, kv_indptr=None, block_tables=None, plan=None):
    """The op on NaN-poisoned out and LSE buffers; returns (out, natural-log LSE)."""
    batch, q_len, heads, _ = problem.query.shape
    out = torch.full((batch, q_len, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((batch, q_len, heads), float("nan"), device="cuda")
    tables = problem.block_tables if block_tables is None else block_tables
    mla_decode(
        problem.query, problem.kv_cache, workspace, tables, problem.seq_lens, problem.max_seq_len, out=out,
        lse=lse, bmm1_scale=SM_SCALE, bmm2_scale=1.3, causal=causal, kv_indptr=kv_indptr, plan=plan,
    )  # fmt: skip
    return out, lse


def assert_matches_reference(out, lse, problem, causal=True):
    want, want_lse = mla_decode_reference(
        problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, SM_SCALE, 1.3, causal=causal
    )
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN output"
    scale = want.norm(dim=-1)
    empty = scale == 0
    assert torch.all(out[empty] == 0), "rows that see no key must be zero"
    rel = (out.double() - want).norm(dim=-1)[~empty] / scale[~empty]
    tolerance = ROW_ERROR_TOLERANCE[problem.kv_cache.dtype]
    assert rel.numel() == 0 or rel.max() <= tolerance, f"max row rel err {rel.max():.3e}"
    assert_lse_exact(lse, want_lse)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [1, 2, 8, 256])
@pytest.mark.parametrize("heads, q_len", [(16, 1), (128, 1), (16, 4), (1, 8)])
def test_small_and_large_pages(workspace, dtype, page_size, heads, q_len):
    problem = make_paged_problem([1, 37, 0, 700, 2500], q_len, heads, page_size, dtype, "cuda", seed=page_size)
    assert_matches_reference(*decode(problem, workspace), problem)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("batch", [3, 40])  # 40: the call plans its splits on the GPU
def test_ragged_ids_give_the_table_s_result_bit_for_bit(workspace, dtype, page_size, batch):
    lengths = [(977 * b) % 3001 for b in range(batch)]
    problem = make_paged_problem(lengths, 2, 16, page_size, dtype, "cuda", seed=batch)
    indices, indptr = problem.ragged_ids()
    table = decode(problem, workspace)
    by_ids = decode(problem, workspace, kv_indptr=indptr, block_tables=indices)
    assert torch.equal(table[0], by_ids[0]) and torch.equal(table[1], by_ids[1])
    assert_matches_reference(*by_ids, problem)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("heads, q_len", [(16, 4), (128, 2), (8, 8)])
def test_not_causal_every_query_token_sees_every_key(workspace, dtype, heads, q_len):
    problem = make_paged_problem([3, 50, 1300], q_len, heads, 1, dtype, "cuda", seed=q_len)
    assert_matches_reference(*decode(problem, workspace, causal=False), problem, causal=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_nan_past_each_request_s_length_never_reaches_the_output(workspace, dtype, page_size):
    """Every cache slot no request reads holds NaN: the kernels zero-fill past seq_len."""
    problem = make_paged_problem([5, 31, 1000], 1, 16, page_size, dtype, "cuda", seed=7)
    read = torch.zeros(problem.kv_cache.shape[:2], dtype=torch.bool, device="cuda")
    for row, n in zip(problem.block_tables, problem.seq_lens.tolist()):
        slots = torch.arange(n, device="cuda")
        read[row[slots // page_size].long(), slots % page_size] = True
    nan_bits = 0x7F if dtype == torch.float8_e4m3fn else 0x7FC0  # e4m3fn's NaN, a quiet bf16 NaN
    problem.kv_cache.view(torch.uint8 if dtype == torch.float8_e4m3fn else torch.int16)[~read] = nan_bits
    assert problem.kv_cache[~read].float().isnan().all()
    assert_matches_reference(*decode(problem, workspace), problem)


def test_slot_ids_beyond_4_gib_of_cache(workspace):
    """Page size 1 over a 4.5 GiB bf16 cache: slot ids near its end address bytes past 2^32."""
    slots = (9 << 29) // 1152  # 4.5 GiB of 1152-byte rows
    cache = torch.empty(slots, 1, 576, dtype=torch.bfloat16, device="cuda")
    lengths = [300, 4000]
    problem = make_paged_problem(lengths, 2, 16, 1, torch.bfloat16, "cuda", seed=3, extra_pages=0)
    far = slots - 1 - torch.randperm(sum(lengths), device="cuda").to(torch.int32)  # the last slots, shuffled
    table = problem.block_tables.clone()
    table[0, :300], table[1, :4000] = far[:300], far[300:]
    cache[far.long()] = torch.randn(far.numel(), 1, 576, device="cuda").to(torch.bfloat16)
    assert far.min().item() * 1152 > 1 << 32
    problem.kv_cache, problem.block_tables = cache, table
    assert_matches_reference(*decode(problem, workspace), problem)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp8"])
def test_a_graph_of_ragged_ids_replays_with_new_lengths_and_ids(workspace, dtype):
    """The step's plan and the call captured once on static buffers; each step copies in new
    queries, lengths and ids (kv_indptr and kv_indices of a new ragged layout) and replays."""
    capacity, batch, q_len, heads = 3000, 36, 1, 16
    static = make_paged_problem([capacity] * batch, q_len, heads, 1, dtype, "cuda", seed=51)
    indices = torch.zeros(batch * capacity, dtype=torch.int32, device="cuda")
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    plan_buffer = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")

    def step():
        plan = plan_decode(
            static.seq_lens, indices, 1, heads=heads, kv_dtype=dtype, workspace_buffer=workspace, buffer=plan_buffer
        )
        return decode(static, workspace, kv_indptr=indptr, block_tables=indices, plan=plan)

    graph, (out, lse) = capture(step)
    for seed in range(3):
        lengths = [(389 * (b + seed) + seed) % capacity for b in range(batch)]
        fresh = make_paged_problem(lengths, q_len, heads, 1, dtype, "cuda", seed=60 + seed)
        fresh_indices, fresh_indptr = fresh.ragged_ids()
        static.query.copy_(fresh.query)
        static.seq_lens.copy_(fresh.seq_lens)
        static.kv_cache.view(-1)[: fresh.kv_cache.numel()].copy_(fresh.kv_cache.view(-1))
        indices[: fresh_indices.numel()].copy_(fresh_indices)
        indptr.copy_(fresh_indptr)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        fresh.kv_cache = static.kv_cache[: fresh.kv_cache.shape[0]]
        assert_matches_reference(out, lse, fresh)


def test_a_corrupted_slot_id_fails_the_check(workspace):
    """The check can fail: one slot id pointing at another token's row is caught."""
    problem = make_paged_problem([400], 1, 16, 1, torch.bfloat16, "cuda", seed=9)
    out, lse = decode(problem, workspace)
    wrong = problem.block_tables.clone()
    wrong[0, 10] = wrong[0, 11]
    out_wrong, lse_wrong = decode(problem, workspace, block_tables=wrong)
    with pytest.raises(AssertionError):
        assert_matches_reference(out_wrong, lse_wrong, problem)
    assert_matches_reference(out, lse, problem)
