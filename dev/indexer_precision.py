"""Probe: the indexer kernels' error against float64 and their time, with the tensor cores' dot on e4m3
operands (SM90 accumulates FP8 products with fewer bits than fp32) and on the same values widened to
bf16 (exact products, fp32 sums), at DeepSeek-V3.2's shape (64 heads x 128, pages of 64).

Error per decode row: the worst |ours - float64| over the row's positions, as a fraction of the row's
largest |logit| (what integration/judges/sparse_check.py's tie bound is relative to); and how many of
the row's top-2048 positions differ from float64's. Run on a GPU from the checkout:
``PYTHONPATH=.:tests python3 dev/indexer_precision.py``."""

import torch
from indexer_cases import away_from_zero, quantize_tokens, reference_paged64, write_cache

from mla_backend import indexer, indexer_triton
from mla_backend.tools.bench import time_graph

HEADS, DIM, PAGE, TOPK = 64, 128, 64, 2048


def case(batch: int, context: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    blocks = batch * context // PAGE
    cache = torch.zeros(blocks, PAGE, 1, DIM + 4, dtype=torch.uint8)
    table = torch.randperm(blocks, generator=gen).view(batch, -1).to(torch.int32)
    values, scales = quantize_tokens(torch.randn(batch * context, DIM, generator=gen))
    positions = torch.arange(context).repeat(batch)
    requests = torch.arange(batch).repeat_interleave(context)
    write_cache(cache, values, scales, table[requests, positions // PAGE].long() * PAGE + positions % PAGE)
    q_values, _ = quantize_tokens(torch.randn(batch * HEADS, DIM, generator=gen))
    q = q_values.view(batch, 1, HEADS, DIM)
    weights = away_from_zero(gen, batch, HEADS, scale=HEADS**-0.5)
    lens = torch.full((batch, 1), context, dtype=torch.int32)
    return [t.cuda() for t in (q, cache, weights, lens, table)]


print(f"{torch.cuda.get_device_name()}: indexer kernels, {HEADS} heads x {DIM}, page {PAGE}")
print("operands | worst error / row max |logit| | top-2048 positions differing (of B x 2048) | us B32 ctx16k")
for operands in ("e4m3", "bf16"):
    indexer_triton.DOT_OPERANDS = operands
    q, cache, weights, lens, table = case(8, 8192)
    got = indexer.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, None, 8192, True)
    want = reference_paged64(q, cache, weights, lens, table, 8192)
    error = ((got.double() - want).abs().amax(dim=1) / want.abs().amax(dim=1)).max().item()
    ours, exact = got.topk(TOPK).indices, want.topk(TOPK).indices
    differing = sum(len(set(a.tolist()) ^ set(b.tolist())) // 2 for a, b in zip(ours, exact))
    q, cache, weights, lens, table = case(32, 16384, seed=1)
    us = time_graph([lambda: indexer.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, None, 16384)])
    print(f"{operands:8s} | {error:.2e} | {differing} | {us:.1f}", flush=True)
