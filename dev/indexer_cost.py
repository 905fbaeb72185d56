"""Probe: what mla_backend's indexer scorer costs per layer and per DeepSeek-V3.2 decode step (61 sparse
layers), at 64 index heads of 128 over pages of 64: the Triton kernels (mla_backend.indexer_triton, what
a GPU runs) against the torch loops (mla_backend.indexer without Triton), in the same process.

Decode, as vLLM serves it under full CUDA graphs (timed by graph replay, median, each graph a run of calls
over caches past L2, so that no call pays a graph launch of its own): the captured torch
loop reads every block of the table, so its cost follows the table's width (max_model_len); the Triton
kernel reads each request's length on the device, so its cost follows the context. Prefill: ragged
logits of M causal query rows over N keys, eager (vLLM does not capture prefill), CUDA events.
No top-k here (vLLM's own kernel, the same with DeepGEMM). Run on a GPU from the checkout:
``PYTHONPATH=. python3 dev/indexer_cost.py [--triton-only]`` (no kernel library needed)."""

import contextlib
import math
import statistics
import sys

import torch

from mla_backend import indexer
from mla_backend.indexer import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits
from mla_backend.tools.bench import copies_past_l2, time_graph

HEADS, DIM, PAGE = 64, 128, 64
LAYERS = 61  # DeepSeek-V3.2's sparse layers
TRITON_ONLY = "--triton-only" in sys.argv  # Triton alone: the quick run
TOKEN_BYTES = DIM + 4


@contextlib.contextmanager
def torch_loops():
    """mla_backend.indexer as it runs without Triton."""
    served = indexer._triton_serves
    indexer._triton_serves = lambda *args, **kwargs: False
    try:
        yield
    finally:
        indexer._triton_serves = served


def decode_problem(batch: int, width: int):
    blocks = batch * width // PAGE
    cache = torch.randint(0, 120, (blocks, PAGE, 1, DIM + 4), dtype=torch.uint8, device="cuda")
    cache.view(blocks, -1)[:, PAGE * DIM :] = torch.rand(blocks, PAGE, device="cuda").view(torch.uint8).view(blocks, -1)
    q = torch.randn(batch, 1, HEADS, DIM, device="cuda").to(torch.float8_e4m3fn)
    weights = torch.rand(batch, HEADS, device="cuda")
    table = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
    return q, cache, weights, table


def decode_us(batch: int, context: int, width: int, use_torch: bool) -> float:
    """Per call, over one graph of as many calls (each its own cache) as keep the caches past L2: the
    cost of a layer's call inside vLLM's step graph, without a graph launch per call."""
    lens = torch.full((batch, 1), context, dtype=torch.int32, device="cuda")
    problems = [decode_problem(batch, width) for _ in range(copies_past_l2(batch * context * TOKEN_BYTES))]

    def call(q, cache, weights, table):
        return lambda: fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, None, width)

    with torch_loops() if use_torch else contextlib.nullcontext():
        return time_graph([call(*p) for p in problems], replays=7, warmup_s=0.2)


def prefill_us(rows: int, keys: int, use_torch: bool) -> float:
    q = torch.randn(rows, HEADS, DIM, device="cuda").to(torch.float8_e4m3fn)
    k = torch.randn(keys, DIM, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.rand(keys, device="cuda")
    weights = torch.rand(rows, HEADS, device="cuda")
    ends = torch.arange(keys - rows + 1, keys + 1, device="cuda", dtype=torch.int32)  # causal rows at the end
    starts = torch.zeros_like(ends)
    times = []
    with torch_loops() if use_torch else contextlib.nullcontext():
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fp8_fp4_mqa_logits((q, None), (k, scales), weights, starts, ends, clean_logits=False)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times[1:])


print(f"{torch.cuda.get_device_name()}: indexer scorer, {HEADS} heads x {DIM}, page {PAGE}", flush=True)
print("decode (graph replay)          | Triton us/layer  GB/s  ms/step | torch us/layer  ms/step | torch/Triton")
for batch, context, width in ((1, 4096, 4096), (8, 4096, 4096), (32, 4096, 4096), (32, 16384, 16384),
                              (8, 4096, 163840), (32, 32768, 163840)):  # fmt: skip
    ours = decode_us(batch, context, width, use_torch=False)
    loops = math.nan if TRITON_ONLY else decode_us(batch, context, width, use_torch=True)
    rate = batch * context * TOKEN_BYTES / ours / 1e3
    print(
        f"  B {batch:2d} ctx {context:6d} width {width:6d} | {ours:9.1f} {rate:6.0f} {ours * LAYERS / 1e3:7.2f}"
        f" | {loops:9.1f} {loops * LAYERS / 1e3:8.2f} | {loops / ours:6.1f}x",
        flush=True,
    )
print("prefill (eager)                | Triton us/layer | torch us/layer | torch/Triton")
for rows, keys in ((2048, 2048), (2048, 16384), (8192, 8192)):
    ours = prefill_us(rows, keys, use_torch=False)
    loops = math.nan if TRITON_ONLY else prefill_us(rows, keys, use_torch=True)
    print(f"  {rows:5d} rows x {keys:5d} keys   | {ours:12.1f} | {loops:12.1f} | {loops / ours:6.1f}x", flush=True)
