"""mla_backend.indexer_triton (the indexer's logits as Triton kernels) run by Triton's interpreter on CPU,
against the float64 loops of indexer_cases.py, through the public functions of mla_backend.indexer as
vLLM calls them: decode rows of one and several draft tokens (both context_lens forms), rows that share
a program with rows of other lengths, ragged prefill ranges in both column layouts, DeepGEMM's
clean_logits contract (unwritten past a row's reach only when False), a wrong table entry or scale
caught, and no host read of a length (what lets a captured CUDA graph serve every step); each case with
the tiles both ways round (KEYS_MAJOR).

Run by test_indexer_triton.py in a child with ``TRITON_INTERPRET=1`` (not collected on its own)."""

import math
import os

import pytest
import torch
from indexer_cases import (
    DIM,
    ENDS,
    LENS,
    STARTS,
    assert_logits_match,
    causal_ends,
    naive_paged,
    naive_ragged,
    paged_case,
    ragged_case,
)

from mla_backend import indexer as ix

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run with TRITON_INTERPRET=1 set before triton is imported (test_indexer_triton.py does)")
from mla_backend import indexer_triton as triton_kernels

PAGE = 16  # the kernels' smallest page (a tensor-core step); vLLM's index cache uses 64


@pytest.fixture(autouse=True, params=[False, True], ids=["rows-major", "keys-major"])
def on_the_interpreter(monkeypatch, request):
    """mla_backend.indexer sends CPU tensors to its torch loops; here they go to the Triton kernels
    (interpreted), and unwritten logits read NaN. Every case runs with both tile orientations."""
    monkeypatch.setattr(triton_kernels, "KEYS_MAJOR", request.param)
    monkeypatch.setattr(ix, "_triton_serves", lambda q, heads, dim, page=64: triton_kernels.serves(heads, dim, page))
    monkeypatch.setattr(
        triton_kernels, "_empty_like_full", lambda shape, value, dtype, device: torch.full(shape, math.nan, dtype=dtype)
    )


def reached(ends, next_n, width):
    """[rows, width]: the positions a decode row's program writes, every block up to its group's end."""
    ends = torch.as_tensor(ends).view(-1, next_n)
    blocks = -(-ends.amax(dim=1, keepdim=True) // PAGE)
    return (torch.arange(width) < (blocks * PAGE).expand(-1, next_n).reshape(-1, 1)).expand(-1, width)


@pytest.mark.parametrize("heads", [8, 32])
@pytest.mark.parametrize("next_n", [1, 3])
@pytest.mark.parametrize("two_d", [False, True])
@pytest.mark.parametrize("clean_logits", [False, True])
def test_paged_kernel_matches_the_float64_loop(heads, next_n, two_d, clean_logits):
    lens = [37, 1, 0, 16, 70]
    q, cache, weights, table = paged_case(next_n + heads, lens, next_n, block_size=PAGE, heads=heads)
    ends = [[n] * next_n for n in lens] if two_d else causal_ends(lens, next_n)
    context_lens = torch.tensor(ends if two_d else lens, dtype=torch.int32)
    width = 80
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, width, clean_logits)
    want = naive_paged(q, cache, weights, ends, table, width)
    inside = torch.isfinite(want)
    assert_logits_match(got[inside].view(1, -1), want[inside].view(1, -1))
    outside = ~inside & (reached(ends, next_n, width) | clean_logits)
    assert torch.isneginf(got[outside]).all()
    assert torch.isnan(got[~inside & ~outside]).all()  # left as DeepGEMM leaves them (clean_logits False)
    assert got[inside].std() > 0


def test_paged_rows_past_the_table_s_reach_and_max_context_len_are_cut():
    """A length past the table's blocks scores up to the table's last position; past max_context_len,
    up to that."""
    q, cache, weights, table = paged_case(3, [40, 9], 1, block_size=PAGE)
    context_lens = torch.tensor([50, 9], dtype=torch.int32)
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table[:, :2], None, 40, True)
    assert_logits_match(got, naive_paged(q, cache, weights, [[32], [9]], table, 40))
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 24, True)
    assert_logits_match(got, naive_paged(q, cache, weights, [[24], [9]], table, 24))


@pytest.mark.parametrize("max_seqlen_k", [0, 28])
@pytest.mark.parametrize("heads", [8, 64])
def test_ragged_kernel_matches_the_float64_loop(max_seqlen_k, heads):
    q, k, k_scale, weights = ragged_case(heads + max_seqlen_k, heads=heads)
    got = ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, STARTS, ENDS, max_seqlen_k=max_seqlen_k)
    assert_logits_match(got, naive_ragged(q, k, k_scale, weights, STARTS, ENDS, width=max_seqlen_k or None))


def test_ragged_kernel_over_several_programs_and_key_blocks():
    """40 rows of two requests (several programs of rows) over 150 keys (three key blocks, split)."""
    q, k, k_scale, weights = ragged_case(5, rows=40, n=150)
    starts = torch.tensor([0] * 25 + [90] * 15, dtype=torch.int32)
    ends = torch.cat([torch.arange(66, 91), torch.arange(136, 151)]).to(torch.int32)
    got = ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, starts, ends)
    assert_logits_match(got, naive_ragged(q, k, k_scale, weights, starts, ends))


@pytest.mark.parametrize("corruption", ["scale", "block_table"])
def test_a_corrupted_scale_or_table_entry_fails_the_comparison(corruption):
    lens = [37, 20]
    q, cache, weights, table = paged_case(23, lens, 1, block_size=PAGE)
    want = naive_paged(q, cache, weights, causal_ends(lens, 1), table, 40)
    flat = cache.view(cache.shape[0], -1)
    if corruption == "scale":
        flat[int(table[0, 1]), PAGE * DIM + 12 : PAGE * DIM + 16] = torch.tensor([3.0]).view(torch.uint8)
    else:
        table[0, 0], table[0, 1] = table[0, 1].clone(), table[0, 0].clone()
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, torch.tensor(lens), table, None, 40, True)
    with pytest.raises(AssertionError):
        assert_logits_match(got, want)


def test_paged_reads_no_length_on_the_host(monkeypatch):
    """Lengths are read by the kernel: no tensor reaches the host on the way (as under graph capture,
    where vLLM captures each uniform decode batch once and replays it at every length)."""
    q, cache, weights, table = paged_case(29, LENS, 2, block_size=PAGE)
    context_lens = torch.tensor(LENS, dtype=torch.int32)
    eager = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 40, True)
    with monkeypatch.context() as patch:
        for host_read in ("__int__", "__index__", "__bool__", "item", "tolist"):
            patch.setattr(torch.Tensor, host_read, lambda *a: pytest.fail("a host read of a tensor"))
        launches = []
        kernel = triton_kernels._kernel
        patch.setattr(triton_kernels, "_kernel", lambda fn, device: launches.append(fn) or kernel(fn, device))
        got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, 40, True)
    assert launches == [triton_kernels._paged_logits_kernel]
    assert torch.equal(got, eager)


def test_shapes_the_kernels_do_not_take_stay_on_torch():
    assert triton_kernels.serves(64, 128, 64) and triton_kernels.serves(32, 128, 64)
    assert not triton_kernels.serves(48, 128, 64)  # heads not a power of two
    assert not triton_kernels.serves(64, 128, 8)  # a page below one tensor-core step
