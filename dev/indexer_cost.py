"""Probe: what mla_backend's indexer scorer (mla_backend.indexer, torch; vLLM uses it where DeepGEMM
cannot score) costs per layer and per DeepSeek-V3.2 decode step (61 sparse layers), at 64 index heads of
128 over pages of 64.

Decode, as vLLM serves it under full CUDA graphs: the captured scorer reads every block of the table,
so its cost follows the table width (max_model_len), not the context; timed by graph replay (median).
Prefill: ragged logits of M query rows over N keys, eager (vLLM does not capture prefill), CUDA events.
No top-k here (vLLM's own kernel, the same with DeepGEMM). Run on a GPU from the checkout:
``PYTHONPATH=. python3 dev/indexer_cost.py`` (pure torch: no kernel library needed)."""

import statistics

import torch

from mla_backend.indexer import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits
from mla_backend.tools.bench import time_graph

HEADS, DIM, PAGE = 64, 128, 64
LAYERS = 61  # DeepSeek-V3.2's sparse layers


def decode_us(batch: int, width: int) -> float:
    blocks = batch * width // PAGE
    cache = torch.randint(0, 120, (blocks, PAGE, 1, DIM + 4), dtype=torch.uint8, device="cuda")
    cache.view(blocks, -1)[:, PAGE * DIM :] = torch.rand(blocks, PAGE, device="cuda").view(torch.uint8).view(blocks, -1)
    q = torch.randn(batch, 1, HEADS, DIM, device="cuda").to(torch.float8_e4m3fn)
    weights = torch.rand(batch, HEADS, device="cuda")
    lens = torch.full((batch, 1), width, dtype=torch.int32, device="cuda")
    table = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
    schedule = torch.empty(1, dtype=torch.int32, device="cuda")
    return time_graph([lambda: fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, schedule, width)],
                      replays=7, warmup_s=0.2)  # fmt: skip


def prefill_us(rows: int, keys: int) -> float:
    q = torch.randn(rows, HEADS, DIM, device="cuda").to(torch.float8_e4m3fn)
    k = torch.randn(keys, DIM, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.rand(keys, device="cuda")
    weights = torch.rand(rows, HEADS, device="cuda")
    ends = torch.arange(keys - rows + 1, keys + 1, device="cuda", dtype=torch.int32)  # causal rows at the end
    starts = torch.zeros_like(ends)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fp8_fp4_mqa_logits((q, None), (k, scales), weights, starts, ends, clean_logits=False)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times[1:])


print(f"{torch.cuda.get_device_name()}: indexer scorer, {HEADS} heads x {DIM}, page {PAGE}", flush=True)
print("decode (graph replay; table width = max_model_len) | us per layer | ms per step (x61)", flush=True)
for width in (4096, 16384):
    for batch in (1, 8, 32):
        us = decode_us(batch, width)
        print(f"  B {batch:3d} width {width:6d} | {us:10.1f} | {us * LAYERS / 1e3:8.2f}", flush=True)
print("prefill (eager) | us per layer", flush=True)
for rows, keys in ((2048, 2048), (2048, 16384)):
    print(f"  {rows} rows x {keys} keys | {prefill_us(rows, keys):10.1f}", flush=True)
