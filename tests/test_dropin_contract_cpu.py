"""FlashInfer's buffer and LSE conventions on every path each of its names takes (CPU tensors, the
float64 reference path): a caller's ``out`` and ``lse`` come back as the same objects, filled; the LSE
is in the path's default base (base 2 for fixed-length queries, base e where FlashInfer's CuTe DSL
kernel serves: packed variable-length queries and DCP) or the one ``return_lse_base`` asks for; a
row that sees no key gives zeros and an LSE of -inf. Paths: fixed, split inputs, packed
variable-length, DCP; names: batch_mla_paged_attention, trtllm_batch_decode_with_kv_cache_mla and
xqa_batch_decode_with_kv_cache_mla (which has no LSE)."""

import math

import pytest
import torch
from oracle import assert_rounded_from, naive_decode

from mla_backend import (
    batch_mla_paged_attention,
    trtllm_batch_decode_with_kv_cache_mla,
    xqa_batch_decode_with_kv_cache_mla,
)
from mla_backend.inputs import make_paged_problem

BMM1, BMM2 = 0.06, 1.5
LN2 = math.log(2.0)
PATHS = {"fixed": "base2", "split": "base2", "packed": "basee", "dcp": "basee"}


@pytest.fixture(params=[torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def problem(request):
    # Request 1 sees no key at all, request 3's first query token none either (one key, two tokens).
    return make_paged_problem([37, 0, 64, 1], q_len=2, heads=4, page_size=16, dtype=request.param, seed=5)


def path_arguments(problem, path: str) -> tuple[dict, tuple, tuple]:
    """(the path's keywords, the shape of its out, the shape of its LSE)."""
    batch, q_len, heads, _ = problem.query.shape
    q, kv = problem.query, problem.kv_cache
    common = dict(block_tables=problem.block_tables, seq_lens=problem.seq_lens, max_seq_len=problem.max_seq_len)
    if path == "packed":  # every request 2 tokens, packed [B * 2, H, 576]: the fixed problem's rows
        cum = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32)
        packed = dict(query=q.reshape(batch * q_len, heads, 576), kv_cache=kv, cum_seq_lens_q=cum, max_q_len=q_len)
        return {**common, **packed}, (batch * q_len, heads, 512), (batch * q_len, heads)
    fixed = (batch, q_len, heads, 512), (batch, q_len, heads)
    if path == "split":
        split = dict(query=(q[..., :512], q[..., 512:]), kv_cache=(kv[..., :512].clone(), kv[..., 512:].clone()))
        return {**common, **split}, *fixed
    if path == "dcp":  # one rank of one: every key is local, the causal bound is the request's length
        dcp = dict(enable_dcp=True, cp_world=1, cp_rank=0, causal_seqlens_kv_global=problem.seq_lens.clone())
        return {**common, "query": q, "kv_cache": kv, **dcp}, *fixed
    return {**common, "query": q, "kv_cache": kv}, *fixed


def call(name: str, arguments: dict, **extra):
    arguments = {**arguments, **extra}
    query, kv = arguments.pop("query"), arguments.pop("kv_cache")
    shared = dict(workspace_buffer=None, qk_nope_head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64)
    scales = dict(bmm1_scale=BMM1, bmm2_scale=BMM2)
    if name == "batch_mla_paged_attention":  # keyword-only; its split forms have names of their own
        pairs = dict(query=query, kv_cache=kv)
        if isinstance(query, tuple):
            pairs = dict(q_nope=query[0], q_pe=query[1], ckv_cache=kv[0], kpe_cache=kv[1])
        return batch_mla_paged_attention(**pairs, **shared, **scales, **arguments)
    if name == "trtllm_batch_decode_with_kv_cache_mla":
        return trtllm_batch_decode_with_kv_cache_mla(query, kv, **shared, **scales, **arguments)
    return xqa_batch_decode_with_kv_cache_mla(query, kv, **shared, **scales, **arguments)


def natural(lse: torch.Tensor, base: str) -> torch.Tensor:
    return lse if base == "basee" else (lse.double() * LN2).float()


def assert_matches_oracle(problem, out, lse, base: str) -> None:
    want_out, want_lse = naive_decode(
        problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, BMM1, BMM2
    )
    assert_rounded_from(out, None if lse is None else natural(lse, base), want_out, want_lse)
    rows = out.reshape(*problem.query.shape[:3], 512)
    assert not rows[1].any() and not rows[3, 0].any(), "rows that see no key must be zeros"
    if lse is not None:
        grid = lse.reshape(problem.query.shape[:3])
        assert torch.isneginf(grid[1]).all() and torch.isneginf(grid[3, 0]).all(), "no key: an LSE of -inf"


@pytest.mark.parametrize("name", ["batch_mla_paged_attention", "trtllm_batch_decode_with_kv_cache_mla"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("asked_base", [None, "base2", "basee"])
def test_out_and_lse_buffers_come_back_as_given_in_the_paths_base(problem, name, path, asked_base):
    arguments, out_shape, lse_shape = path_arguments(problem, path)
    out = torch.full(out_shape, float("nan"), dtype=torch.bfloat16)
    lse = torch.full(lse_shape, float("nan"))
    got_out, got_lse = call(name, arguments, out=out, lse=lse, return_lse=True, return_lse_base=asked_base)
    assert got_out is out and got_lse is lse
    assert_matches_oracle(problem, out, lse, asked_base or PATHS[path])
    # Without buffers: new tensors, the same values.
    fresh_out, fresh_lse = call(name, arguments, return_lse=True, return_lse_base=asked_base)
    assert fresh_out is not out and torch.equal(fresh_out, out) and torch.equal(fresh_lse.view(lse_shape), lse)


@pytest.mark.parametrize("name", ["batch_mla_paged_attention", "trtllm_batch_decode_with_kv_cache_mla"])
@pytest.mark.parametrize("path", ["fixed", "split", "packed"])
def test_an_lse_buffer_is_filled_when_only_out_is_returned(problem, name, path):
    """FlashInfer fills a given ``lse`` even with return_lse=False (DCP needs return_lse=True)."""
    arguments, out_shape, lse_shape = path_arguments(problem, path)
    lse = torch.full(lse_shape, float("nan"))
    out = call(name, arguments, lse=lse, return_lse=False)
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == out_shape
    assert_matches_oracle(problem, out, lse, PATHS[path])


@pytest.mark.parametrize("path", ["fixed", "split"])
def test_xqa_fills_and_returns_the_callers_out(problem, path):
    arguments, out_shape, _ = path_arguments(problem, path)
    out = torch.full(out_shape, float("nan"), dtype=torch.bfloat16)
    assert call("xqa_batch_decode_with_kv_cache_mla", arguments, out=out) is out
    assert_matches_oracle(problem, out, None, "basee")
