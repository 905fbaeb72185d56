"""The float64 reference against the independent oracle (tests/oracle.py)."""

import math

import pytest
import torch
from oracle import naive_decode_problem

from mla_backend import mla_decode_reference
from mla_backend.inputs import make_paged_problem


@pytest.mark.parametrize("q_len", [1, 2, 3, 4])
@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
def test_reference_matches_naive_loop(q_len, page_size):
    lengths = [q_len, 1 + q_len * 7, page_size + 3, 2 * page_size + 1][: 3 if page_size == 128 else 4]
    problem = make_paged_problem(lengths, q_len, heads=2, page_size=page_size, seed=page_size + q_len)
    bmm1, bmm2 = 0.07, 1.7
    out, lse = mla_decode_reference(problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, bmm1, bmm2)
    want_out, want_lse = naive_decode_problem(problem, bmm1, bmm2)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)


def test_reference_fp8_is_computed_on_dequantised_values():
    problem = make_paged_problem([40, 9], 2, heads=3, page_size=16, dtype=torch.float8_e4m3fn, seed=5)
    out, lse = mla_decode_reference(problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, 0.05, 1.0)
    want_out, want_lse = naive_decode_problem(problem, 0.05, 1.0)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)


def test_reference_seq_len_zero_gives_zeros_and_minus_inf():
    problem = make_paged_problem([0, 5, 0], 2, heads=4, page_size=16, seed=1)
    out, lse = mla_decode_reference(problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, 0.1, 1.0)
    assert not torch.isnan(out).any()
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.isneginf(lse[0]).all() and torch.isneginf(lse[2]).all()
    assert torch.isfinite(lse[1]).all()


def test_reference_causal_rows_see_growing_prefixes():
    """Token 0 of a q_len=3 request with seq_len=3 sees one key: its output is that key's V."""
    problem = make_paged_problem([3], 3, heads=1, page_size=16, seed=2)
    out, lse = mla_decode_reference(problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, 0.3, 2.0)
    first_key = problem.kv_cache[int(problem.block_tables[0, 0]), 0].double()
    torch.testing.assert_close(out[0, 0, 0], first_key[:512] * 2.0)
    logit = float(problem.query[0, 0, 0].double() @ first_key) * 0.3
    assert math.isclose(float(lse[0, 0, 0]), logit, rel_tol=1e-12, abs_tol=1e-12)
