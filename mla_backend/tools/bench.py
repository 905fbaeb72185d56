"""`python -m mla_backend bench`: MLA decode time against the peers importable in this process.

CUDA-graph replay, median of warmed-up replays; small problems rotate over several KV copies so
that no timing comes from L2. Reports us, GB/s (q + KV + out bytes) and TFLOP/s
(2 * H * q_len * seq * (576 + 512)), writes a JSON and a PNG.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..decode import mla_decode
from ..inputs import make_paged_problem
from .peers import PEERS, SM_SCALE

L2_FLUSH_BYTES = 256 << 20
FULL_GRID = [(h, b, s) for h in (16, 128) for b in (1, 8, 64, 128) for s in (1024, 4096, 16384, 32768)]
QUICK_GRID = [(16, 128, 16384), (128, 64, 8192), (16, 1, 32768), (128, 1, 32768)]
# After a large free the GPU runs about 15% slower for about 2.5 ms per GiB freed (the driver's work on
# the freed memory; docs/performance.md, "Where the cache sits in GPU memory"), and capturing a graph
# empties the allocator's cache, so replays run this long before any is timed: 40 GiB freed.
WARMUP_S = 0.1


def copies_past_l2(kv_bytes: int) -> int:
    """KV copies a timed graph rotates over so that no call finds its cache in L2."""
    return max(1, min(32, math.ceil(L2_FLUSH_BYTES / kv_bytes)))


@dataclass
class Row:
    impl: str
    dtype: str
    heads: int
    batch: int
    seq: int
    q_len: int
    us: float | None
    gbps: float | None
    tflops: float | None
    note: str = ""


def time_graph(calls, replays: int = 15, warmup_s: float = WARMUP_S) -> float:
    """Median microseconds per call over graph replays of all ``calls``, after ``warmup_s`` of replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    warm_until, warmed = time.perf_counter() + warmup_s, 0
    while warmed < 3 or time.perf_counter() < warm_until:
        graph.replay()
        torch.cuda.synchronize()
        warmed += 1
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)


def ours(problem, workspace, step_plan: bool = True):
    """One decode call of ``problem``. With ``step_plan``, it reads the step's split plan made here,
    once and outside the timed calls, as the engines make it once a step for all layers and as
    FlashMLA's schedule is made (peers.flashmla); steps too small for one plan for themselves."""
    plan = problem.step_plan(workspace) if step_plan else None
    args = problem.decode_args(workspace)
    return lambda: mla_decode(*args, bmm1_scale=SM_SCALE, plan=plan)


def bench_shape(dtype, heads, batch, seq, q_len, workspace, page_size=64, peers=tuple(PEERS)) -> list[Row]:
    return bench_lengths(dtype, heads, [seq] * batch, q_len, workspace, page_size, peers)


def bench_lengths(dtype, heads, lengths, q_len, workspace, page_size=64, peers=tuple(PEERS)) -> list[Row]:
    """Ours and ``peers`` on one batch of context ``lengths`` (rows report its longest)."""
    elem = 1 if dtype == torch.float8_e4m3fn else 2
    batch, seq, tokens = len(lengths), max(lengths), sum(lengths)
    kv_bytes = tokens * 576 * elem
    problems = [
        make_paged_problem(lengths, q_len, heads, page_size, dtype, "cuda", seed=i, extra_pages=0)
        for i in range(copies_past_l2(kv_bytes))
    ]
    moved = kv_bytes + batch * q_len * heads * (576 * elem + 512 * 2)
    flops = 2 * heads * q_len * tokens * (576 + 512)
    name = "fp8" if elem == 1 else "bf16"
    rows = []
    impls = {"mla_backend": lambda p: ours(p, workspace)}
    impls.update({k: (lambda p, f=PEERS[k]: f(p, SM_SCALE)) for k in peers})
    for impl, make in impls.items():
        try:
            us = time_graph([make(p) for p in problems])
            rows.append(Row(impl, name, heads, batch, seq, q_len, us, moved / us / 1e3, flops / us / 1e6))
        except Exception as err:  # a peer missing or refusing the shape is reported, not fatal
            rows.append(
                Row(impl, name, heads, batch, seq, q_len, None, None, None, f"{type(err).__name__}: {err}"[:120])
            )
    del problems
    torch.cuda.empty_cache()
    return rows


def print_table(rows: list[Row]) -> None:
    by_key: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        by_key.setdefault((r.dtype, r.heads, r.batch, r.seq, r.q_len), {})[r.impl] = r
    print(
        f"{'dtype':5} {'H':>4} {'B':>4} {'seq':>6} {'q':>2} | {'ours us':>9} {'GB/s':>6} {'TF/s':>6} | "
        f"{'flashmla us':>11} {'x':>5} | {'triton us':>9} {'x':>5}"
    )
    for key, impls in by_key.items():
        mine = impls.get("mla_backend")

        def peer(name):
            r = impls.get(name)
            if r is None or r.us is None or mine is None or mine.us is None:
                return f"{'n/a':>11} {'':>5}" if name == "flashmla" else f"{'n/a':>9} {'':>5}"
            width = 11 if name == "flashmla" else 9
            return f"{r.us:>{width}.1f} {r.us / mine.us:>5.2f}"

        ours_cols = (
            f"{mine.us:>9.1f} {mine.gbps:>6.0f} {mine.tflops:>6.1f}"
            if mine and mine.us
            else f"{'fail':>9} {'':>6} {'':>6}"
        )
        print(
            f"{key[0]:5} {key[1]:>4} {key[2]:>4} {key[3]:>6} {key[4]:>2} | {ours_cols} | {peer('flashmla')} | "
            f"{peer('triton_mla')}"
        )
    print("x = peer time / our time (>1: we are faster)")


def plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, dtype in zip(axes, ("fp8", "bf16")):
        for impl in ("mla_backend", "flashmla", "triton_mla"):
            pts = [r for r in rows if r.impl == impl and r.dtype == dtype and r.us]
            ax.plot(range(len(pts)), [r.gbps for r in pts], marker="o", label=impl)
            ax.set_xticks(
                range(len(pts)), [f"H{r.heads} B{r.batch} {r.seq // 1024}k" for r in pts], rotation=90, fontsize=6
            )
        ax.set_title(f"MLA decode, {dtype} KV ({torch.cuda.get_device_name()})")
        ax.set_ylabel("GB/s (q + KV + out)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(quick: bool = False, out_prefix: str = "results/bench_decode", dtypes=("fp8", "bf16"), q_len: int = 1) -> int:
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU")
        return 2
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    rows: list[Row] = []
    for name in dtypes:
        dtype = torch.float8_e4m3fn if name == "fp8" else torch.bfloat16
        for heads, batch, seq in QUICK_GRID if quick else FULL_GRID:
            rows += bench_shape(dtype, heads, batch, seq, q_len, workspace)
            print(
                " ".join(f"{r.impl}={r.us and round(r.us, 1)}" for r in rows[-len(PEERS) - 1 :]),
                f"({name} H{heads} B{batch} seq{seq})",
                flush=True,
            )
    Path(out_prefix).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out_prefix}.json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": [asdict(r) for r in rows]}, f, indent=1)
    plot(rows, f"{out_prefix}.png")
    print_table(rows)
    return 0
