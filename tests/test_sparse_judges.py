"""The float64 judges of sparse engine runs (integration/judges/sparse_check.py) on CPU: they pass a
correct call and a true top-k, and fail a scaled output, a wrong slot and a wrong top-k choice."""

from __future__ import annotations

import torch

from integration.judges.sparse_check import (
    TIE_RELATIVE,
    SparseCall,
    boundary_near_ties,
    check_sparse_call,
    indexer_logits64,
    paged_index_keys,
    physical_slots,
    topk_problems,
)
from mla_backend import sparse_mla_decode
from mla_backend.sparse_cache import pack_fp8_ds_mla


def sparse_call(seed=0, fp8=True) -> SparseCall:
    torch.manual_seed(seed)
    blocks, page, tokens, heads, k = 8, 64, 6, 4, 48
    values = torch.randn(blocks, page, 576) * 0.5
    cache = pack_fp8_ds_mla(values, "pow2_fp32") if fp8 else values.to(torch.bfloat16)
    block_table = torch.randperm(blocks, dtype=torch.int32).view(2, 4)
    req_ids = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.int32)
    topk = torch.randint(0, 4 * page, (tokens, k), dtype=torch.int32)
    topk[2, 40:] = -1
    query = (torch.randn(tokens, heads, 576) * 0.5).to(torch.bfloat16)
    slots = physical_slots(topk, req_ids, block_table, page).to(torch.int32)
    out, lse = sparse_mla_decode(query, cache, slots, 0.1, return_lse=True)
    return SparseCall(query, topk, req_ids, block_table, page, cache, 0.1, out, lse)


def test_physical_slots_follow_the_block_table():
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    topk = torch.tensor([[0, 65, -1], [64, 1, 200]], dtype=torch.int32)
    slots = physical_slots(topk, torch.tensor([0, 1], dtype=torch.int32), table, 64)
    assert slots.tolist() == [[192, 65, -1], [128, 1, -1]]  # 200 lies past the table


def test_the_sparse_call_check_passes_the_op_and_fails_a_wrong_output():
    for fp8 in (True, False):
        call = sparse_call(fp8=fp8)
        verdict = check_sparse_call(call)
        assert verdict.rows == 6 * 4 and verdict.out_error < 1e-2 and verdict.lse_ok
        call.out = call.out * 1.05
        assert check_sparse_call(call).out_error > 4e-2
    call = sparse_call(seed=1)
    call.topk = call.topk.clone()
    call.topk[0, 0] = (call.topk[0, 0] + 1) % 256  # the engine read another row than the list names
    assert check_sparse_call(call).out_error > 1e-3


def test_indexer_logits_and_the_top_k_judge():
    torch.manual_seed(2)
    dim, page, heads, length, k = 32, 16, 4, 40, 8
    values = (torch.randn(3, page, dim) * 2).to(torch.float8_e4m3fn)
    scales = torch.rand(3, page) + 0.5
    cache = torch.cat([values.view(torch.uint8).reshape(3, -1), scales.view(torch.uint8).reshape(3, -1)], dim=1)
    cache = cache.view(3, page, 1, dim + 4)
    table = torch.tensor([2, 0, 1], dtype=torch.int32)
    keys, key_scales = paged_index_keys(cache, table, length, dim)
    assert torch.equal(keys[:page], values[2].double()) and torch.equal(key_scales[page : 2 * page], scales[0].double())
    q = (torch.randn(1, heads, dim)).to(torch.float8_e4m3fn)
    weights = torch.rand(1, heads)
    logits = indexer_logits64(q, keys, key_scales, weights)
    want = sum(weights[0, h].double() * (q[0, h].double() @ keys.T).relu() for h in range(heads)) * key_scales
    torch.testing.assert_close(logits[0], want)
    best = torch.topk(logits[0], k).indices.to(torch.int32)
    chosen = torch.cat([best, torch.full((4,), -1, dtype=torch.int32)])[None]
    assert topk_problems(chosen, logits, [length], k) == []
    worst = torch.topk(-logits[0], 1).indices.to(torch.int32)
    wrong = chosen.clone()
    wrong[0, 0] = worst[0]
    assert topk_problems(wrong, logits, [length], k)
    assert topk_problems(chosen[:, 1:], logits, [length], k)  # one entry short
    short = torch.tensor([[0, 1, 2, -1, -1]], dtype=torch.int32)
    assert topk_problems(short, logits, [3], k) == []  # a row shorter than k keeps all of it


def test_boundary_near_ties_counts_rows_whose_k_th_and_next_scores_lie_within_a_tie():
    """Of the rows longer than k, those whose k-th best and next best logits are within TIE_RELATIVE of
    the row's largest |logit|; a row that keeps all of its keys selects nothing."""
    k = 3
    logits = torch.tensor(
        [
            [10.0, 9.0, 8.0, 8.0 - TIE_RELATIVE * 5, 1.0],  # the 4th within a tie of the 3rd
            [10.0, 9.0, 8.0, 8.0 - TIE_RELATIVE * 20, 1.0],  # a clear choice
            [10.0, 10.0, 10.0, 10.0, 10.0],  # every key tied, but the row keeps all 3 it has
        ],
        dtype=torch.float64,
    )
    assert boundary_near_ties(logits, [5, 5, 3], k) == (2, 1)
    assert boundary_near_ties(logits, [5, 5, 5], k) == (3, 2)


def checker_with(calls: dict, checks: list[dict], topk_checks: list[dict]):
    from integration.engines.vllm_sparse_checker import SparseChecker

    checker = SparseChecker(torch.bfloat16)
    checker.calls.update(calls)
    checker.checks += checks
    checker.topk_checks += topk_checks
    return checker


GOOD_CALL = {"kind": "mixed", "tokens": 700, "rows": 2800, "out_error": 3e-3, "lse_ok": True}
GOOD_TOPK = {"rows": 4, "problems": [], "selecting": 2, "ties": 1}


def test_a_graph_captured_run_s_summary_needs_no_eager_decode_step_but_an_eager_one_does():
    """A server with CUDA graphs shows the checker its mixed batches only (decode steps replay): that
    passes; an eager run whose decode steps left no judged top-k does not; nor does a run that checked
    nothing, nor one over the tolerance."""
    from integration.judges.sparse_check import judge_sparse_check, judge_sparse_selftest

    graphs = checker_with({"mixed": 3}, [GOOD_CALL], []).summary()
    assert judge_sparse_check(graphs)[0] and not judge_sparse_selftest(graphs)[0]
    eager_unjudged = checker_with({"mixed": 1, "decode": 5}, [GOOD_CALL], []).summary()
    assert not judge_sparse_check(eager_unjudged)[0]
    judged = checker_with({"mixed": 1, "decode": 5}, [GOOD_CALL], [GOOD_TOPK]).summary()
    assert judge_sparse_check(judged)[0]
    assert not checker_with({}, [], []).summary()["ok"]
    corrupt = checker_with({"mixed": 1}, [{**GOOD_CALL, "out_error": 5e-2}], []).summary()
    assert not judge_sparse_check(corrupt)[0] and judge_sparse_selftest(corrupt)[0]


def test_the_ranks_sparse_summaries_merge_into_one(tmp_path):
    """vllm_worker_check writes each rank's SparseChecker summary; merged_summary joins them (ok only
    where every rank is) and the sparse judge reads the merge."""
    import json

    from integration.engines.vllm_worker_check import merged_summary
    from integration.judges.sparse_check import judge_sparse_check

    good = checker_with({"mixed": 2, "decode": 3}, [GOOD_CALL], [GOOD_TOPK]).summary()
    bad = checker_with({"mixed": 1}, [{**GOOD_CALL, "out_error": 9e-3}], []).summary()
    (tmp_path / "rank0.json").write_text(json.dumps(good))
    assert judge_sparse_check(merged_summary(tmp_path))[0]
    (tmp_path / "rank1.json").write_text(json.dumps(bad))
    merged = merged_summary(tmp_path)
    assert merged["ranks"] == 2 and merged["calls"] == {"mixed": 3, "decode": 3}
    assert merged["worst_row_error"] == 9e-3 and merged["checked_rows"] == 5600
    assert (merged["topk_selecting_rows"], merged["topk_boundary_ties"]) == (2, 1)
    assert not judge_sparse_check(merged)[0]


def test_the_checker_scores_draft_rows_as_each_row_s_own_length():
    """A verification step's scorer call (next_n = 3, as vLLM's MTP with 2 drafts makes it): each row
    (b, j) scores up to its own end, for vLLM's 2-D lengths and DeepGEMM's 1-D causal ones; the rows
    then judge the lists of the step's forward_mqa call."""
    from indexer_cases import LENS, causal_ends, naive_paged, paged_case

    from integration.engines.vllm_sparse_checker import SparseChecker

    next_n = 3
    q, cache, weights, table = paged_case(31, LENS, next_n, heads=8)
    two_d = [[max(0, n - 2 + j) for j in range(next_n)] for n in LENS]  # vLLM 0.26's [B, next_n] lengths
    for context_lens, ends in ((torch.tensor(two_d), two_d), (torch.tensor(LENS), causal_ends(LENS, next_n))):
        checker = SparseChecker(torch.bfloat16)
        checker.armed = True
        checker.score(q, cache, weights, context_lens, table)
        ((logits, lengths),) = checker._scored
        assert lengths == [e for row in ends for e in row]
        want = naive_paged(q, cache, weights, ends, table, logits.shape[1])
        assert torch.equal(torch.isneginf(logits), torch.isneginf(want))
        finite = torch.isfinite(want)
        torch.testing.assert_close(logits[finite], want[finite])
        chosen = torch.full((len(lengths), 4), -1, dtype=torch.int32)
        for row, length in enumerate(lengths):
            best = want[row, :length].topk(min(4, length)).indices
            chosen[row, : len(best)] = best.to(torch.int32)
        assert topk_problems(chosen, logits, lengths, 4) == []
        chosen[-1, 0] = int(want[-1, : lengths[-1]].argmin())  # the worst key in place of the best
        assert topk_problems(chosen, logits, lengths, 4)
