"""The float64 judges of sparse engine runs (integration/judges/sparse_check.py) on CPU: they pass a
correct call and a true top-k, and fail a scaled output, a wrong slot and a wrong top-k choice."""

from __future__ import annotations

import torch

from integration.judges.sparse_check import (
    SparseCall,
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
