"""Sparse MLA decode on CPU: the own op and FlashInfer's name (``sparse_mla_top_k``) run the float64
reference on CPU tensors with each API's conventions, and every bad input is refused by name before
anything runs."""

from __future__ import annotations

import math

import pytest
import torch

from mla_backend import sparse_mla_decode, trtllm_batch_decode_with_kv_cache_mla
from mla_backend.reference import sparse_mla_reference
from mla_backend.sparse_problems import make_sparse_case

WORKSPACE = torch.empty(0, dtype=torch.uint8)


def case(kind="pow2_fp32", tokens=6, heads=8, topk=64, **kw):
    return make_sparse_case(tokens, heads, topk, kind, "cpu", seed=tokens + heads + topk, **kw)


def test_own_op_is_the_reference_with_natural_lse_and_empty_rows():
    c = case(invalid="all_some_tokens")
    out, lse = sparse_mla_decode(c.query, c.kv_cache, c.indices, c.sm_scale, return_lse=True)
    want, want_lse = sparse_mla_reference(c.query, c.kv_rows, c.indices, c.sm_scale)
    assert out.dtype == torch.bfloat16 and out.shape == (6, 8, 512)
    torch.testing.assert_close(out.double(), want, atol=4e-3, rtol=1e-2)
    assert torch.isneginf(lse[::3]).all() and torch.all(out[::3] == 0)
    torch.testing.assert_close(lse.double(), want_lse)


def test_own_op_takes_batch_and_q_len_leading_dims_and_fills_buffers_in_place():
    c = case(tokens=6)
    query, indices = c.query.view(3, 2, 8, 576), c.indices.view(3, 2, -1)
    out = torch.empty(3, 2, 8, 512, dtype=torch.bfloat16)
    lse = torch.empty(3, 2, 8)
    got_out, got_lse = sparse_mla_decode(query, c.kv_cache, indices, c.sm_scale, out=out, lse=lse, return_lse=True)
    assert got_out is out and got_lse is lse
    flat = sparse_mla_decode(c.query, c.kv_cache, c.indices, c.sm_scale)
    assert torch.equal(out.view(6, 8, 512), flat)


def test_flashinfer_name_reads_lists_as_flashinfer_does():
    """[B, q_len, K] lists, per-token lengths in seq_lens, base-2 LSE, -1e30 for an empty row."""
    c = case(tokens=4, random_lens=True)
    c.topk_lens[0] = 0
    query = c.query.view(2, 2, 8, 576)
    out, lse = trtllm_batch_decode_with_kv_cache_mla(
        query, c.kv_cache, WORKSPACE, 128, 512, 64, c.indices.view(2, 2, 64), c.topk_lens.view(2, 2), 0,
        sparse_mla_top_k=64, bmm1_scale=c.sm_scale, kv_scale_format="pow2_fp32", return_lse=True,
    )  # fmt: skip
    want, want_lse = sparse_mla_reference(c.query, c.kv_rows, c.indices, c.sm_scale, topk_lens=c.topk_lens)
    torch.testing.assert_close(out.view(4, 8, 512).double(), want, atol=4e-3, rtol=1e-2)
    assert torch.all(lse.view(4, 8)[0] == -1e30)
    torch.testing.assert_close(lse.view(4, 8)[1:].double(), want_lse[1:] / math.log(2))


def test_flashinfer_name_drops_per_request_lengths_at_q_len_2_and_takes_top_k_lens():
    c = case(tokens=4, random_lens=True, poison=False)  # whole lists are read: no NaN rows
    query, lists = c.query.view(2, 2, 8, 576), c.indices.view(2, 2, 64)
    args = (query, c.kv_cache, WORKSPACE, 128, 512, 64, lists)
    whole = trtllm_batch_decode_with_kv_cache_mla(*args, None, 0, sparse_mla_top_k=64, bmm1_scale=c.sm_scale)
    dropped = trtllm_batch_decode_with_kv_cache_mla(
        *args, torch.tensor([5, 7], dtype=torch.int32), 0, sparse_mla_top_k=64, bmm1_scale=c.sm_scale
    )
    assert torch.equal(whole, dropped)
    by_lens = trtllm_batch_decode_with_kv_cache_mla(
        *args, None, 0, sparse_mla_top_k=64, bmm1_scale=c.sm_scale, sparse_mla_top_k_lens=c.topk_lens
    )
    want, _ = sparse_mla_reference(c.query, c.kv_rows, c.indices, c.sm_scale, topk_lens=c.topk_lens)
    torch.testing.assert_close(by_lens.view(4, 8, 512).double(), want, atol=4e-3, rtol=1e-2)


def test_bf16_rows_and_every_cache_shape():
    c = case("bf16")
    want, _ = sparse_mla_reference(c.query, c.kv_rows, c.indices, c.sm_scale)
    for cache in (c.kv_cache, c.kv_cache.view(-1, 576), c.kv_cache.unsqueeze(1)):
        out = sparse_mla_decode(c.query, cache, c.indices, c.sm_scale)
        torch.testing.assert_close(out.double(), want, atol=4e-3, rtol=1e-2)


BAD_SPARSE_INPUTS = [
    ("fp16 query", lambda c: dict(query=c.query.half()), TypeError, "bf16 query"),
    ("query width", lambda c: dict(query=c.query[..., :512]), ValueError, "576"),
    ("129 heads", lambda c: dict(query=torch.zeros(6, 129, 576, dtype=torch.bfloat16)), ValueError, "heads"),
    ("e4m3 cache", lambda c: dict(kv_cache=torch.zeros(64, 64, 576, dtype=torch.float8_e4m3fn)), TypeError, "e4m3"),
    ("cache width", lambda c: dict(kv_cache=c.kv_cache[..., :600]), ValueError, "656"),
    ("int64 ids", lambda c: dict(indices=c.indices.long()), TypeError, "int32"),
    ("ids rows", lambda c: dict(indices=c.indices[:5]), ValueError, "one list a query token"),
    ("lens dtype", lambda c: dict(topk_lens=torch.zeros(6, dtype=torch.int64)), TypeError, "int32"),
    ("lens count", lambda c: dict(topk_lens=torch.zeros(5, dtype=torch.int32)), ValueError, "one length"),
    ("lens value", lambda c: dict(topk_lens=torch.full((6,), 65, dtype=torch.int32)), ValueError, "outside 0..64"),
    ("id below -1", lambda c: dict(indices=c.indices.clone().fill_(-2)), ValueError, "entries are -1"),
    ("id past cache", lambda c: dict(indices=c.indices.clone().fill_(1 << 20)), ValueError, "entries are -1"),
    ("scale type", lambda c: dict(sm_scale="0.1"), TypeError, "sm_scale"),
    ("out dtype", lambda c: dict(out=torch.empty(6, 8, 512)), TypeError, "out must be bf16"),
]


@pytest.mark.parametrize("name, change, error, message", BAD_SPARSE_INPUTS, ids=[b[0] for b in BAD_SPARSE_INPUTS])
def test_bad_sparse_input_is_refused_by_name(name, change, error, message):
    c = case()
    args = dict(query=c.query, kv_cache=c.kv_cache, indices=c.indices, sm_scale=c.sm_scale, topk_lens=None, out=None)
    args.update(change(c))
    with pytest.raises(error, match=message):
        sparse_mla_decode(
            args["query"], args["kv_cache"], args["indices"], args["sm_scale"], topk_lens=args["topk_lens"],
            out=args["out"],
        )  # fmt: skip


@pytest.mark.parametrize(
    "keywords, message",
    [
        (dict(bmm2_scale=0.5), "bmm2_scale must be 1.0"),
        (dict(sparse_mla_top_k=32), r"block_tables must be the index lists"),
        (dict(backend="trtllm-gen"), "backend"),
        (dict(kv_scale_format="ue8m0"), "kv_scale_format"),
        (dict(sparse_mla_top_k=-1), "sparse_mla_top_k"),
    ],
)
def test_flashinfer_sparse_refusals(keywords, message):
    c = case(tokens=4)
    kwargs = dict(sparse_mla_top_k=64, bmm1_scale=c.sm_scale) | keywords
    with pytest.raises(ValueError, match=message):
        trtllm_batch_decode_with_kv_cache_mla(
            c.query.view(2, 2, 8, 576), c.kv_cache, WORKSPACE, 128, 512, 64, c.indices.view(2, 2, 64), None, 0, **kwargs
        )


def test_top_k_lens_without_sparse_is_refused():
    c = case(tokens=4)
    with pytest.raises(ValueError, match="sparse_mla_top_k_lens"):
        trtllm_batch_decode_with_kv_cache_mla(
            c.query.view(2, 2, 8, 576), c.kv_cache, WORKSPACE, 128, 512, 64, c.indices.view(2, 2, 64), None, 0,
            sparse_mla_top_k_lens=c.topk_lens if c.topk_lens is not None else torch.ones(4, dtype=torch.int32),
        )  # fmt: skip
