"""The float64 sparse MLA reference (mla_backend.reference.sparse_mla_reference) against a naive loop
written here, its masking rules, and the dense reference where the two describe the same attention."""

import math

import pytest
import torch

from mla_backend import mla_decode_reference
from mla_backend import reference as reference_module
from mla_backend.inputs import make_paged_problem
from mla_backend.reference import sparse_mla_reference
from mla_backend.sparse_cache import pack_fp8_ds_mla, unpack_fp8_ds_mla

TIGHT = dict(rtol=1e-11, atol=1e-12)


def naive_sparse(query, kv_rows, indices, sm_scale, topk_lens=None, v_dim=512):
    """Token by token, head by head: the listed slot ids in range (up to topk_lens[t]), duplicates kept,
    softmax written out with math.exp. Shares no code with the reference."""
    q, kv = query.double(), kv_rows.double()
    tokens, heads, _ = q.shape
    out = torch.zeros(tokens, heads, v_dim, dtype=torch.float64)
    lse = torch.full((tokens, heads), -math.inf, dtype=torch.float64)
    for t in range(tokens):
        listed = indices[t].tolist() if topk_lens is None else indices[t, : int(topk_lens[t])].tolist()
        slots = [s for s in listed if 0 <= s < kv.shape[0]]
        for h in range(heads):
            if not slots:
                continue
            logits = [float(q[t, h] @ kv[s]) * sm_scale for s in slots]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            out[t, h] = sum(w * kv[s, :v_dim] for w, s in zip(weights, slots)) / total
            lse[t, h] = top + math.log(total)
    return out, lse


def random_case(tokens=5, heads=3, rows=40, topk=24, seed=0, query_dtype=torch.bfloat16):
    """Query and rows from the fp8_ds_mla round trip (what a sparse kernel reads); indices with junk."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(tokens, heads, 576, generator=gen).to(query_dtype)
    packed = pack_fp8_ds_mla(torch.randn(rows, 576, generator=gen).bfloat16(), "pow2_fp32")
    kv_rows = unpack_fp8_ds_mla(packed)
    indices = torch.randint(-3, rows + 3, (tokens, topk), generator=gen, dtype=torch.int32)
    return query, kv_rows, indices


@pytest.mark.parametrize("query_dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("v_dim", [512, 128])
@pytest.mark.parametrize("with_lens", [False, True])
def test_reference_matches_naive_loop(query_dtype, v_dim, with_lens):
    query, kv_rows, indices = random_case(seed=3, query_dtype=query_dtype)
    topk_lens = torch.tensor([24, 0, 7, 1, 19], dtype=torch.int32) if with_lens else None
    sm_scale = 576**-0.5
    out, lse = sparse_mla_reference(query, kv_rows, indices, sm_scale, topk_lens, v_dim)
    want_out, want_lse = naive_sparse(query, kv_rows, indices, sm_scale, topk_lens, v_dim)
    assert out.dtype == lse.dtype == torch.float64 and out.shape == (5, 3, v_dim)
    torch.testing.assert_close(out, want_out, **TIGHT)
    torch.testing.assert_close(lse, want_lse, **TIGHT)
    assert torch.isfinite(lse[0]).all()  # the case is not vacuous: token 0 has valid entries


def test_packed_rows_are_read_as_their_exact_dequantised_values():
    query, kv_rows, indices = random_case(seed=12)
    packed = pack_fp8_ds_mla(kv_rows, "arbitrary_fp32")
    got = sparse_mla_reference(query, packed, indices, 0.05)
    want = sparse_mla_reference(query, unpack_fp8_ds_mla(packed), indices, 0.05)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_invalid_entries_and_entries_past_topk_lens_are_ignored():
    """The same valid slot ids, then again with junk ids mixed in and valid ids parked past topk_lens."""
    query, kv_rows, _ = random_case(tokens=3, rows=30, seed=4)
    gen = torch.Generator().manual_seed(1)
    valid = torch.randint(0, 30, (3, 10), generator=gen)
    junk = torch.tensor([-1, 30, 37, 1 << 30, -(1 << 40)])
    mixed = torch.cat([valid, junk.expand(3, -1)], dim=1)[:, torch.randperm(15, generator=gen)]
    parked = torch.cat([mixed, torch.randint(0, 30, (3, 6), generator=gen)], dim=1)  # ids a kernel must not read
    lens = torch.full((3,), 15)
    out, lse = sparse_mla_reference(query, kv_rows, parked, 0.05, topk_lens=lens)
    want_out, want_lse = sparse_mla_reference(query, kv_rows, valid, 0.05)
    torch.testing.assert_close(out, want_out, **TIGHT)
    torch.testing.assert_close(lse, want_lse, **TIGHT)


def test_a_token_without_a_valid_entry_gets_zeros_and_minus_infinity():
    query, kv_rows, _ = random_case(tokens=4, rows=20, seed=5)
    indices = torch.tensor([[-1, 20, 99, -7], [3, 4, 5, 6], [3, 4, 5, 6], [-1, -1, 2, -1]])
    out, lse = sparse_mla_reference(query, kv_rows, indices, 0.1, topk_lens=torch.tensor([4, 0, 4, 2]))
    for t in (0, 1, 3):  # all junk; topk_lens 0; the one valid id parked past topk_lens
        assert torch.equal(out[t], torch.zeros_like(out[t])) and torch.isneginf(lse[t]).all(), t
    assert torch.isfinite(out[2]).all() and torch.isfinite(lse[2]).all() and out[2].abs().sum() > 0


@pytest.mark.parametrize("rows, topk", [(0, 5), (12, 0)])
def test_an_empty_cache_or_an_empty_topk_gives_zeros_and_minus_infinity(rows, topk):
    query = torch.randn(2, 3, 576, generator=torch.Generator().manual_seed(6))
    kv_rows = torch.randn(rows, 576, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    indices = torch.arange(topk).repeat(2, 1)
    out, lse = sparse_mla_reference(query, kv_rows, indices, 0.1)
    assert torch.equal(out, torch.zeros(2, 3, 512, dtype=torch.float64)) and torch.isneginf(lse).all()


def test_a_slot_id_listed_twice_counts_twice():
    """Keys a (listed twice) and b: softmax weights 2 e^la : e^lb, LSE log(2 e^la + e^lb)."""
    query, kv_rows, _ = random_case(tokens=1, heads=2, rows=8, seed=8, query_dtype=torch.float32)
    a, b, scale = 5, 2, 0.04
    out, lse = sparse_mla_reference(query, kv_rows, torch.tensor([[a, b, a]]), scale)
    q = query[0].double()
    la, lb = q @ kv_rows[a] * scale, q @ kv_rows[b] * scale  # [H]
    wa, wb = 2 * torch.exp(la), torch.exp(lb)
    want = (wa[:, None] * kv_rows[a, :512] + wb[:, None] * kv_rows[b, :512]) / (wa + wb)[:, None]
    torch.testing.assert_close(out[0], want, **TIGHT)
    torch.testing.assert_close(lse[0], torch.log(wa + wb), **TIGHT)
    single, _ = sparse_mla_reference(query, kv_rows, torch.tensor([[a, b]]), scale)
    assert (out - single).abs().max() > 1e-3  # and counting it once would differ


def test_page_one_block_tables_agree_with_the_dense_reference():
    """A dense decode at page size 1 is a sparse one whose indices are each request's block table row:
    the table's junk past seq_len (-1 and ids past the cache, inputs.JUNK_PAGE_IDS) is masked."""
    problem = make_paged_problem([1, 17, 40, 3], q_len=1, heads=4, page_size=1, seed=9)
    dense_out, dense_lse = mla_decode_reference(
        problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, bmm1_scale=0.07
    )
    kv_rows = problem.kv_cache[:, 0]  # [pages, 576]: page size 1, one slot a page
    out, lse = sparse_mla_reference(problem.query[:, 0], kv_rows, problem.block_tables, 0.07)
    torch.testing.assert_close(out, dense_out[:, 0], **TIGHT)
    torch.testing.assert_close(lse, dense_lse[:, 0], **TIGHT)


def test_the_first_l_slots_of_a_contiguous_cache_agree_with_the_dense_reference():
    """One contiguous cache of L rows that every request's table names in order, request b reading its
    first seq_lens[b]: the sparse indices are 0..L-1, cut at topk_lens = seq_lens."""
    length, seq_lens = 50, torch.tensor([50, 1, 33, 12], dtype=torch.int32)
    gen = torch.Generator().manual_seed(10)
    kv_cache = torch.randn(length, 1, 576, generator=gen).bfloat16()  # [pages, page = 1, 576]
    query = torch.randn(4, 1, 8, 576, generator=gen).bfloat16()
    table = torch.arange(length, dtype=torch.int32).repeat(4, 1)
    dense_out, dense_lse = mla_decode_reference(query, kv_cache, table, seq_lens, bmm1_scale=0.04)
    out, lse = sparse_mla_reference(query[:, 0], kv_cache[:, 0], table, 0.04, topk_lens=seq_lens)
    torch.testing.assert_close(out, dense_out[:, 0], **TIGHT)
    torch.testing.assert_close(lse, dense_lse[:, 0], **TIGHT)


def test_chunking_over_tokens_changes_nothing(monkeypatch):
    query, kv_rows, indices = random_case(tokens=7, rows=25, topk=16, seed=11)
    whole = sparse_mla_reference(query, kv_rows, indices, 0.06)
    monkeypatch.setattr(reference_module, "SPARSE_GATHER_ELEMENTS", 2 * 16 * 576)  # two tokens a step
    chunked = sparse_mla_reference(query, kv_rows, indices, 0.06)
    for got, want in zip(chunked, whole):
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0.0)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(query=torch.ones(2, 3, 4, 576)), "query"),
        (dict(kv_rows=torch.ones(10, 512)), "kv_rows"),
        (dict(indices=torch.zeros(3, 4, dtype=torch.int64)), "indices"),
        (dict(indices=torch.zeros(2, 4)), "indices"),
        (dict(topk_lens=torch.ones(3, dtype=torch.int32)), "topk_lens"),
        (dict(v_dim=577), "v_dim"),
        (dict(v_dim=0), "v_dim"),
    ],
)
def test_refuses_inconsistent_shapes(change, message):
    args = dict(query=torch.ones(2, 3, 576), kv_rows=torch.ones(10, 576), indices=torch.zeros(2, 4, dtype=torch.int64))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        sparse_mla_reference(sm_scale=0.1, **args)
