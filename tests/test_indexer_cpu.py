"""mla_backend.indexer (DeepGEMM's indexer logits in torch) against float64 loops written here: the
ragged (prefill) and paged (decode) functions, their masks (-inf outside each row's range: the
prefill rows' [start, end), the decode rows' causal end), paged against ragged on the same keys, the
tiles' memory bound, the schedule tensor, and a corrupted cache that the comparison catches."""

import math

import pytest
import torch
from indexer_cases import (
    DIM,
    ENDS,
    FP8,
    HEADS,
    LENS,
    STARTS,
    assert_logits_match,
    away_from_zero,
    causal_ends,
    naive_paged,
    naive_ragged,
    paged_case,
    quantize_tokens,
    ragged_case,
)

from mla_backend import indexer as ix


@pytest.mark.parametrize("clean_logits", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_logits_match_the_float64_loop_and_mask_with_minus_inf(seed, clean_logits):
    q, k, k_scale, weights = ragged_case(seed)
    got = ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, STARTS, ENDS, clean_logits=clean_logits)
    want = naive_ragged(q, k, k_scale, weights, STARTS, ENDS)
    assert_logits_match(got, want)
    cols = torch.arange(40)
    assert torch.equal(torch.isneginf(got), ~((cols >= STARTS[:, None]) & (cols < ENDS[:, None])))
    assert got[torch.isfinite(got)].std() > 0  # not a constant: the inputs reach the logits


def test_ragged_scales_given_as_n_by_1_and_the_legacy_name_agree():
    q, k, k_scale, weights = ragged_case(2)
    got = ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, STARTS, ENDS)
    assert torch.equal(ix.fp8_mqa_logits(q, (k, k_scale[:, None]), weights, STARTS, ENDS), got)


def test_ragged_compressed_columns_start_at_each_row_s_start():
    """max_seqlen_k > 0: column j of row t is position start[t] + j (DeepGEMM's compressed logits)."""
    q, k, k_scale, weights = ragged_case(3)
    got = ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, STARTS, ENDS, max_seqlen_k=28)
    assert_logits_match(got, naive_ragged(q, k, k_scale, weights, STARTS, ENDS, width=28))


@pytest.mark.parametrize("next_n", [1, 2, 3])
@pytest.mark.parametrize("two_d", [False, True])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_paged_logits_match_the_float64_loop_and_mask_past_each_row_s_end(next_n, two_d, ue8m0):
    q, cache, weights, table = paged_case(next_n, LENS, next_n, ue8m0=ue8m0)
    ends = causal_ends(LENS, next_n)
    if two_d:  # what vLLM 0.26 passes: each row's own end, here not causal (the last row's end for all)
        ends = [[n] * next_n for n in LENS]
        context_lens = torch.tensor(ends, dtype=torch.int32)
    else:
        context_lens = torch.tensor(LENS, dtype=torch.int32)
    width = 30
    meta = ix.get_paged_mqa_logits_metadata(context_lens, cache.shape[1], 8)
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, meta, width)
    assert_logits_match(got, naive_paged(q, cache, weights, ends, table, width))
    flat_ends = torch.tensor(ends).view(-1, 1)
    assert torch.equal(torch.isneginf(got), torch.arange(width) >= flat_ends)
    assert torch.equal(ix.fp8_paged_mqa_logits(q, cache, weights, context_lens, table, meta, width), got)


def test_paged_rows_of_one_token_take_context_lens_of_b_by_1():
    q, cache, weights, table = paged_case(5, LENS, 1)
    one_d = torch.tensor(LENS, dtype=torch.int32)
    meta = ix.get_paged_mqa_logits_metadata(one_d, 4, 2)
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, one_d[:, None], table, meta, 24)
    assert torch.equal(got, ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, one_d, table, meta, 24))


def test_paged_under_graph_capture_reads_no_lengths_and_scores_the_same(monkeypatch):
    """While a CUDA graph is captured the loop may not depend on the lengths: it reads no tensor on the
    host, covers every block of the table (up to max_context_len), junk entries included, and the
    logits stay the same."""
    q, cache, weights, table = paged_case(9, LENS, 2)
    context_lens = torch.tensor(LENS, dtype=torch.int32)
    eager = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 40)
    blocks, read = [], ix.read_index_cache
    with monkeypatch.context() as patch:
        patch.setattr(ix, "read_index_cache", lambda c, ids, dt: blocks.append(ids.shape[-1]) or read(c, ids, dt))
        patch.setattr(ix, "_capturing", lambda t: True)
        for host_read in ("__int__", "__index__", "__bool__", "item", "tolist"):
            patch.setattr(torch.Tensor, host_read, lambda *a: pytest.fail("a host read under capture"))
        captured = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 40)
    assert sum(blocks) == table.shape[1] == 8
    assert_logits_match(captured, eager.double())


def test_paged_reads_a_cache_whose_blocks_are_padded_and_refuses_one_not_dense_within_a_block():
    """vLLM may pad a layer's pages (the block stride); only a block's own bytes are read."""
    q, cache, weights, table = paged_case(21, LENS, 1)
    context_lens = torch.tensor(LENS, dtype=torch.int32)
    want = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 24)
    num_blocks, block_size, _, row = cache.shape
    storage = torch.full((num_blocks, block_size * row + 64), 0x7F, dtype=torch.uint8)  # pad: e4m3 NaN
    storage[:, : block_size * row] = cache.view(num_blocks, -1)
    padded = storage.as_strided((num_blocks, block_size, 1, row), (block_size * row + 64, row, row, 1))
    assert torch.equal(ix.fp8_fp4_paged_mqa_logits((q, None), padded, weights, context_lens, table, None, 24), want)
    token_major = cache.transpose(0, 1).contiguous().transpose(0, 1)  # blocks interleaved: not dense
    with pytest.raises(ValueError, match="dense"):
        ix.fp8_fp4_paged_mqa_logits((q, None), token_major, weights, context_lens, table, None, 24)


def test_paged_and_ragged_agree_on_the_same_keys():
    """Each request's tokens gathered from the cache bytes into one ragged K: prefill row (b, j) over
    [offset_b, offset_b + end) scores what decode row (b, j) scores over [0, end)."""
    next_n = 2
    q, cache, weights, table = paged_case(7, LENS, next_n, block_size=8)
    context_lens = torch.tensor(LENS, dtype=torch.int32)
    paged = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 32)
    flat = cache.view(cache.shape[0], -1)
    k_rows, scales, offsets = [], [], [0]
    for b, n in enumerate(LENS):
        for s in range(n):
            block, offset = int(table[b, s // 8]), s % 8
            k_rows.append(flat[block, offset * DIM : (offset + 1) * DIM].view(FP8))
            scales.append(flat[block, 8 * DIM + 4 * offset : 8 * DIM + 4 * offset + 4].view(torch.float32))
        offsets.append(offsets[-1] + n)
    ends = causal_ends(LENS, next_n)
    starts = torch.tensor([offsets[b] for b in range(len(LENS)) for _ in range(next_n)], dtype=torch.int32)
    stops = starts + torch.tensor(ends, dtype=torch.int32).view(-1)
    ragged = ix.fp8_fp4_mqa_logits(
        (q.view(-1, HEADS, DIM), None), (torch.stack(k_rows), torch.cat(scales)), weights, starts, stops
    )
    for row in range(len(LENS) * next_n):
        end = int(stops[row] - starts[row])
        assert_logits_match(paged[row : row + 1, :end], ragged[row : row + 1, starts[row] : stops[row]].double())
        assert torch.isneginf(paged[row, end:]).all()


def test_vllm_s_top_k_on_these_logits_picks_only_positions_in_range():
    """vLLM's torch top-k (rocm_aiter_mla_sparse._topk_indices_torch: the whole row, -inf taken as -1)
    on paged logits: every index is a position below the row's end, min(end, k) of them, the float64
    loop's largest."""
    q, cache, weights, table = paged_case(11, LENS, 1)
    context_lens = torch.tensor(LENS, dtype=torch.int32)
    logits = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 40)
    want = naive_paged(q, cache, weights, causal_ends(LENS, 1), table, 40)
    values, indices = torch.topk(logits, k=16, dim=-1)
    indices = torch.where(values == -math.inf, -1, indices)
    for row, n in enumerate(LENS):
        chosen = indices[row][indices[row] >= 0]
        assert len(chosen) == min(n, 16) and (chosen < n).all()
        assert set(chosen.tolist()) == set(want[row, :n].topk(min(n, 16)).indices.tolist())


@pytest.mark.parametrize("budget", [1, 1 << 16])
def test_tiles_keep_their_scores_within_the_budget_and_change_nothing(monkeypatch, budget):
    """With TILE_BYTES cut down, every [rows, heads, columns] fp32 score tile fits it (down to one
    row and one column, or one block) and the logits are those of one tile, to fp32's rounding (a dot
    product's terms summed in another order)."""
    gen = torch.Generator().manual_seed(13)
    heads = 64
    q = away_from_zero(gen, 20, heads, DIM, scale=50.0).to(FP8)
    k, k_scale = quantize_tokens(away_from_zero(gen, 300, DIM))
    weights = away_from_zero(gen, 20, heads, scale=1e-2)
    starts = torch.zeros(20, dtype=torch.int32)
    ends = torch.arange(281, 301, dtype=torch.int32)
    whole = ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, starts, ends)
    pq, cache, pweights, table = paged_case(13, [30, 17, 25], 2, block_size=4)
    pcontext = torch.tensor([30, 17, 25], dtype=torch.int32)
    paged_whole = ix.fp8_fp4_paged_mqa_logits((pq, None), cache, pweights, pcontext, table, None, 32)

    tiles, score_tile = [], ix._score_tile
    monkeypatch.setattr(ix, "_score_tile", lambda *a: tiles.append(a[0].shape[:3] + a[1].shape[1:2]) or score_tile(*a))
    monkeypatch.setattr(ix, "TILE_BYTES", budget)
    assert_logits_match(ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, starts, ends), whole.double())
    paged = ix.fp8_fp4_paged_mqa_logits((pq, None), cache, pweights, pcontext, table, None, 32)
    assert_logits_match(paged, paged_whole.double())
    assert len(tiles) > 2
    for batch, rows, tile_heads, columns in tiles:
        if budget > 1:
            assert batch * rows * tile_heads * columns * 4 <= budget
        else:  # the smallest tiles: one prefill row by one column, or one block of one request
            assert batch == 1 and (rows == columns == 1 or columns == 4)


def test_the_schedule_tensor_has_deepgemm_s_shape_and_splits_the_blocks_evenly():
    lens = torch.tensor([[100], [5], [300], [0]], dtype=torch.int32)  # 2, 1, 5, 0 blocks of 64
    meta = ix.get_paged_mqa_logits_metadata(lens, 64, 4)
    assert meta.dtype == torch.int32 and meta.shape == (5, 2)
    assert meta.tolist() == [[0, 0], [1, 0], [2, 1], [2, 3], [4, 0]]
    assert ix.get_paged_mqa_logits_metadata(lens[:0], 64, 4).tolist() == [[0, 0]] * 5


def test_fp4_queries_and_other_dtypes_are_refused():
    q, k, k_scale, weights = ragged_case(4)
    with pytest.raises(NotImplementedError, match="FP4"):
        ix.fp8_fp4_mqa_logits((q, torch.ones(6, HEADS)), (k, k_scale), weights, STARTS, ENDS)
    with pytest.raises(TypeError, match="float8"):
        ix.fp8_fp4_mqa_logits((q.float(), None), (k, k_scale), weights, STARTS, ENDS)
    with pytest.raises(ValueError, match="shapes"):
        ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights[:, :3], STARTS, ENDS)
    pq, cache, pweights, table = paged_case(4, LENS, 1)
    with pytest.raises(NotImplementedError, match="indices"):
        ix.fp8_fp4_paged_mqa_logits((pq, None), cache, pweights, torch.tensor(LENS), table, None, 24, indices=table)


@pytest.mark.parametrize("corruption", ["scale", "value", "block_table"])
def test_a_corrupted_cache_or_table_fails_the_comparison(corruption):
    """The comparison is not blind: one scale, one value byte or two swapped table entries of a used
    position make it fail."""
    q, cache, weights, table = paged_case(17, LENS, 1)
    context_lens = torch.tensor(LENS, dtype=torch.int32)
    want = naive_paged(q, cache, weights, causal_ends(LENS, 1), table, 24)
    flat = cache.view(cache.shape[0], -1)
    block = int(table[3, 0])
    if corruption == "scale":
        flat[block, 4 * DIM : 4 * DIM + 4] = torch.tensor([3.0]).view(torch.uint8)
    elif corruption == "value":
        flat[block, 5] ^= 0x40
    else:
        table[3, 0], table[3, 1] = table[3, 1].clone(), table[3, 0].clone()
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 24)
    with pytest.raises(AssertionError):
        assert_logits_match(got, want)


@pytest.mark.slow  # imports vLLM (tens of seconds on two cores)
@pytest.mark.vllm
def test_vllm_s_own_torch_fallbacks_agree():
    """vLLM 0.26's torch stand-ins for these DeepGEMM calls (v1/attention/ops/rocm_aiter_mla_sparse.py):
    the paged one for single-token rows reads the cache's block layout and scores in fp32, as here; the
    ragged one rounds its scores to bf16 (an einsum of bf16 operands), so it agrees to bf16's precision."""
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_mqa_logits_torch, fp8_paged_mqa_logits_torch

    q, cache, weights, table = paged_case(19, LENS, 1)
    context_lens = torch.tensor(LENS, dtype=torch.int32)
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens[:, None], table, None, 24)
    assert_logits_match(got, fp8_paged_mqa_logits_torch(q, cache, weights, context_lens, table, 24).double())

    q, k, k_scale, weights = ragged_case(19)
    got = ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, STARTS, ENDS)
    theirs = fp8_mqa_logits_torch(q, (k, k_scale[:, None]), weights, STARTS, ENDS)
    assert torch.equal(torch.isneginf(got), torch.isneginf(theirs))
    finite = torch.isfinite(got)
    size = got[finite].abs().max()
    torch.testing.assert_close(theirs[finite], got[finite], rtol=2e-2, atol=2e-2 * size)
