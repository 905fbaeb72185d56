"""The indexer's Triton kernels on the GPU at the models' shapes (DeepSeek-V3.2: 64 index heads, GLM-5:
32; 128 dims, pages of 64) against float64 on fresh random caches: decode with one and several draft
tokens, a CUDA graph captured at short lengths and replayed at long ones (lengths read on the device),
prefill over ragged causal ranges, the top-k the logits pick, and a corrupted scale caught.

The tensor cores accumulate the e4m3 products in fp32 (on SM90 with fewer mantissa bits than fp32 keeps
between steps), so logits are held to a bound relative to each logit's magnitude, sum_h |w| (|q| . |k|)
scale: the size of the terms the kernel adds.

The kernels loop over lengths they read on the device: every launch is waited on under the watchdog
(a hang exits the run; gpu_watchdog.py)."""

import math

import pytest
import torch
from gpu_watchdog import finish_or_die
from graph_capture import capture
from indexer_cases import FP8, away_from_zero, quantize_tokens, reference_paged64, write_cache

from mla_backend import indexer as ix

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DIM, PAGE = 128, 64
RELATIVE_BOUND = 2e-4  # of the logit's magnitude (e4m3 dots; the same values widened to bf16 stay near 1e-7)


def decode_case(seed, lens, next_n, heads, spare_blocks=3):
    """Requests of ``lens`` tokens in shuffled pages of a cache of random bytes; the table's entries
    past each request are junk page ids."""
    gen = torch.Generator().manual_seed(seed)
    width_blocks = max(-(-n // PAGE) for n in lens) + spare_blocks
    num_blocks = len(lens) * width_blocks + 8
    cache = torch.randint(0, 256, (num_blocks, PAGE, 1, DIM + 4), generator=gen, dtype=torch.uint8)
    table = torch.randperm(num_blocks, generator=gen)[: len(lens) * width_blocks].view(len(lens), -1)
    for b, n in enumerate(lens):
        values, scales = quantize_tokens(away_from_zero(gen, max(n, 1), DIM))
        positions = torch.arange(n)
        write_cache(cache, values[:n], scales[:n], table[b, positions // PAGE] * PAGE + positions % PAGE)
        table[b, -(-n // PAGE) :] = torch.randint(0, num_blocks, (width_blocks - -(-n // PAGE),), generator=gen)
    q = away_from_zero(gen, len(lens), next_n, heads, DIM, scale=50.0).to(FP8)
    weights = away_from_zero(gen, len(lens) * next_n, heads, scale=1e-2)
    return [t.cuda() for t in (q, cache, weights, table.to(torch.int32))]


def magnitude(q, cache, weights, ends, table, width):
    """sum_h |w_h| (|q_h| . |k|) scale per logit: reference_paged64 on absolute values."""
    abs_q = q.float().abs().to(FP8)  # |e4m3| is e4m3
    flat = cache.view(cache.shape[0], -1).clone()
    values = flat[:, : PAGE * DIM].view(FP8).float().abs().to(FP8)
    flat[:, : PAGE * DIM] = values.view(torch.uint8)
    return reference_paged64(abs_q, flat.view(cache.shape), weights.abs(), ends, table, width)


def assert_close_to_float64(got, want, size):
    inside = torch.isfinite(want)
    assert torch.isfinite(got[inside]).all()
    error = ((got[inside].double() - want[inside]).abs() / size[inside].clamp(min=1e-30)).max().item()
    assert error <= RELATIVE_BOUND, f"worst error {error:.2e} of the logit's magnitude"
    assert got[inside].std() > 0
    return error


@pytest.mark.parametrize("heads", [64, 32])
@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_decode_logits_match_float64(heads, next_n):
    lens = [1, 63, 64, 65, 2000, 4097, 0, 777]
    q, cache, weights, table = decode_case(heads + next_n, lens, next_n, heads)
    context_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")[:, None].expand(-1, next_n).contiguous()
    width = table.shape[1] * PAGE
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context_lens, table, None, width, True)
    finish_or_die(f"paged logits, {heads} heads, next_n {next_n}")
    want = reference_paged64(q, cache, weights, context_lens, table, width)
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    assert_close_to_float64(got, want, magnitude(q, cache, weights, context_lens, table, width))


def test_a_graph_captured_at_short_lengths_replays_long_ones():
    """vLLM captures a decode batch once; each replay must score the lengths of that step."""
    heads, next_n = 64, 2
    q, cache, weights, table = decode_case(5, [3000, 4100, 900], next_n, heads)
    lens = torch.tensor([[10, 11], [64, 65], [1, 2]], dtype=torch.int32, device="cuda")
    width = table.shape[1] * PAGE
    graph, out = capture(lambda: ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, None, width, True))
    lens.copy_(torch.tensor([[2999, 3000], [4099, 4100], [899, 900]], dtype=torch.int32))
    out.fill_(math.nan)
    graph.replay()
    finish_or_die("paged logits, graph replayed at longer lengths")
    want = reference_paged64(q, cache, weights, lens, table, width)
    assert torch.equal(torch.isneginf(out), torch.isneginf(want))
    assert_close_to_float64(out, want, magnitude(q, cache, weights, lens, table, width))


def test_the_logits_top_2048_is_float64_s_but_for_near_ties():
    heads = 64
    q, cache, weights, table = decode_case(7, [6000, 2500], 1, heads)
    lens = torch.tensor([[6000], [2500]], dtype=torch.int32, device="cuda")
    width = table.shape[1] * PAGE
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, None, width, True)
    want = reference_paged64(q, cache, weights, lens, table, width)
    size = magnitude(q, cache, weights, lens, table, width)
    for row in range(2):
        k = min(2048, int(lens[row, 0]))
        ours = set(got[row].topk(k).indices.tolist())
        exact = want[row].topk(k)
        kth = exact.values[-1].item()
        for position in ours.symmetric_difference(exact.indices.tolist()):  # swapped only across the k-th value
            assert abs(want[row, position].item() - kth) <= 2 * RELATIVE_BOUND * size[row, position].item()


def test_a_corrupted_scale_fails_the_comparison():
    q, cache, weights, table = decode_case(9, [300], 1, 64)
    lens = torch.tensor([[300]], dtype=torch.int32, device="cuda")
    want = reference_paged64(q, cache, weights, lens, table, 320)
    size = magnitude(q, cache, weights, lens, table, 320)
    cache.view(cache.shape[0], -1)[int(table[0, 2]), PAGE * DIM + 40 : PAGE * DIM + 44] = torch.tensor(
        [7.0], device="cuda"
    ).view(torch.uint8)
    got = ix.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, None, 320, True)
    with pytest.raises(AssertionError, match="worst error"):
        assert_close_to_float64(got, want, size)


@pytest.mark.parametrize("heads", [64, 32])
@pytest.mark.parametrize("max_seqlen_k", [0, 1500])
def test_prefill_logits_match_float64(heads, max_seqlen_k):
    """Two requests' causal rows over one ragged K (the second request's keys after the first's)."""
    gen = torch.Generator().manual_seed(heads + max_seqlen_k)
    first, second = 1300, 2100
    k, k_scale = quantize_tokens(away_from_zero(gen, first + second, DIM))
    rows = 257
    q = away_from_zero(gen, rows, heads, DIM, scale=50.0).to(FP8)
    weights = away_from_zero(gen, rows, heads, scale=1e-2)
    starts = torch.tensor([0] * 100 + [first] * (rows - 100), dtype=torch.int32)
    total = first + second
    ends = torch.cat([torch.arange(first - 99, first + 1), torch.arange(total - rows + 101, total + 1)])
    q, k, k_scale, weights, starts, ends = (t.cuda() for t in (q, k, k_scale, weights, starts, ends.int()))
    got = ix.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, starts, ends, max_seqlen_k=max_seqlen_k)
    finish_or_die(f"ragged logits, {heads} heads")
    dots = torch.einsum("thd,sd->ths", q.double(), k.double())
    want = (dots.relu() * weights.double()[..., None]).sum(1) * k_scale.double()
    size = (torch.einsum("thd,sd->ths", q.double().abs(), k.double().abs()) * weights.double().abs()[..., None]).sum(1)
    size = size * k_scale.double()
    positions = torch.arange(first + second, device="cuda")
    inside = (positions >= starts[:, None]) & (positions < ends[:, None])
    want = torch.where(inside, want, -math.inf)
    if max_seqlen_k:  # column j of row t is position start[t] + j
        columns = (torch.arange(max_seqlen_k, device="cuda") + starts[:, None]).clamp(max=first + second - 1)
        valid = torch.arange(max_seqlen_k, device="cuda") < (ends - starts)[:, None]
        want = torch.where(valid, want.gather(1, columns), -math.inf)
        size = size.gather(1, columns)
    assert got.shape == want.shape
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    assert_close_to_float64(got, want, size)
