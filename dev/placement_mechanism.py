"""Why a decode gets slower once its KV cache sits a few GiB further on in GPU memory. On a GPU.

    python dev/placement_mechanism.py

docs/performance.md ("Where the cache sits in GPU memory") saw 16 heads x 128 x 16k step up by 15-17%
once the cache starts 4 GiB on (FlashMLA: 8 GiB), while the same pages scattered over one large pool
did not. Here one FP8 cache is placed four ways: N GiB into one pool allocation; as an allocation of
its own made while N GiB were held by another, freed before the timing (the earlier table's way) or
kept through it; and at the start of a pool allocated while N GiB were held (vLLM's: its pool comes
after the weights). Each placement is read five ways, so that the candidate mechanisms part:

  ours, FlashMLA        the two kernels, pages of each request at random over the cache
  ours, pages in order  the same cache with each request's pages consecutive: access order
  copy                  torch's copy of the whole cache: a kernel that streams it front to back
  gather                torch's index_select of the pages in the block table's order (41 KB pieces
                        at random over the cache): random pages with no attention math

Each kind of reader is timed by bench.time_graph, which replays for bench.WARMUP_S before timing; the
last line times ours with no such wait, again and again from the moment 32 GiB are freed. What it
showed on an H100 (docs/performance.md): no placement is slower; for about 2.5 ms per GiB freed the
GPU is, which the benchmark's warm-up now outlasts.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from mla_backend.inputs import make_paged_problem
from mla_backend.tools.bench import ours, time_graph
from mla_backend.tools.peers import SM_SCALE, flashmla

HEADS, BATCH, SEQ = 16, 128, 16384
OFFSETS_GIB = (0, 1, 2, 3, 4, 6, 8, 16, 32)


def used_pages(problem) -> torch.Tensor:
    """Which block-table entries hold a request's pages (the rest are junk past its length)."""
    pages = (problem.seq_lens + 63) // 64
    return torch.arange(problem.block_tables.shape[1], device=pages.device)[None, :] < pages[:, None]


def in_order(problem):
    """The same cache read with request r's pages consecutive (the block table renumbered)."""
    used = used_pages(problem)
    table = problem.block_tables.clone()
    table[used] = torch.arange(int(used.sum()), dtype=table.dtype, device=table.device)
    return replace(problem, block_tables=table)


def on_gpu(problem, cache: torch.Tensor):
    """The problem on the GPU with ``cache`` (on the GPU already) as its KV cache."""
    return replace(
        problem, query=problem.query.cuda(), kv_cache=cache,
        block_tables=problem.block_tables.cuda(), seq_lens=problem.seq_lens.cuda(),
    )  # fmt: skip


def cache_in(pool: torch.Tensor, start: int, problem) -> torch.Tensor:
    """The problem's cache copied into ``pool`` from byte ``start`` on."""
    cache = pool[start : start + problem.kv_cache.nbytes].view(problem.kv_cache.dtype).view(problem.kv_cache.shape)
    return cache.copy_(problem.kv_cache)


def placed_at(problem, gib: int):
    """The problem on the GPU, its cache ``gib`` GiB into a pool allocation that holds it at the end."""
    pool = torch.empty((gib << 30) + problem.kv_cache.nbytes, dtype=torch.uint8, device="cuda")
    return on_gpu(problem, cache_in(pool, gib << 30, problem)), None


def while_held(gib: int, place, keep: bool = False):
    """``place()`` run while ``gib`` GiB are held by another allocation, which is freed before the timing
    (the earlier placement table's way) or, with ``keep``, returned to be held through it."""
    held = torch.empty(gib << 30, dtype=torch.uint8, device="cuda") if gib else None
    placed = place()
    if not keep:
        held = None
    torch.cuda.empty_cache()
    return placed, held


def placements(problem) -> dict:
    """Each placement's way to put the problem on the GPU at N GiB: (problem, what to hold while timed)."""
    pooled = problem.kv_cache.nbytes + (4 << 30)  # vLLM's pool, 4 GiB larger than this cache
    return {
        "in a pool": lambda gib: placed_at(problem, gib),
        "after": lambda gib: while_held(gib, lambda: on_gpu(problem, problem.kv_cache.cuda())),
        "held kept": lambda gib: while_held(gib, lambda: on_gpu(problem, problem.kv_cache.cuda()), keep=True),
        "pool after": lambda gib: while_held(
            gib, lambda: on_gpu(problem, cache_in(torch.empty(pooled, dtype=torch.uint8, device="cuda"), 0, problem))
        ),
    }


def times_at(problem, workspace) -> list[float]:
    """Ours, FlashMLA, ours on in-order pages, the cache's copy and its page gather, in µs."""
    pages = problem.block_tables[used_pages(problem)].long()
    flat = problem.kv_cache.view(problem.kv_cache.shape[0], -1)
    out = torch.empty_like(flat)
    return [
        time_graph([ours(problem, workspace)]),
        time_graph([flashmla(problem, SM_SCALE)]),
        time_graph([ours(in_order(problem), workspace)]),
        time_graph([lambda: out.copy_(flat)]),
        time_graph([lambda: torch.index_select(flat, 0, pages, out=out)]),
    ]


def time_course(problem, workspace, gib: int = 32, rounds: int = 12) -> None:
    """Ours timed again and again from the moment ``gib`` GiB are freed: whether the slowdown is the
    placement (it stays) or something the free set going (it fades)."""
    placed, _ = placed_at(problem, 0)
    call = ours(placed, workspace)
    baseline = time_graph([call])
    held = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del held
    torch.cuda.empty_cache()
    freed = time.perf_counter()
    course = []
    for _ in range(rounds):
        us = time_graph([call], warmup_s=0)
        course.append(f"{(time.perf_counter() - freed) * 1e3:.0f} ms: {us:.1f}")
    print(f"ours, {baseline:.1f} µs before freeing {gib} GiB; after it: " + ", ".join(course), flush=True)


def main() -> int:
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    problem = make_paged_problem([SEQ] * BATCH, 1, HEADS, 64, torch.float8_e4m3fn, "cpu", extra_pages=0)
    nbytes = problem.kv_cache.nbytes
    print(f"H{HEADS} B{BATCH} {SEQ // 1024}k FP8, {nbytes / 1e9:.2f} GB of cache; µs (GB/s)")
    columns = ("ours", "FlashMLA", "ours, in order", "copy", "gather")
    print(f"{'placement':>17} | " + " | ".join(f"{c:>14}" for c in columns) + " | virtual address")
    for how, place in placements(problem).items():
        for gib in OFFSETS_GIB:
            placed, held = place(gib)
            address = placed.kv_cache.data_ptr() / 2**30
            cells = " | ".join(f"{us:6.1f} ({nbytes / us / 1e3:5.0f})" for us in times_at(placed, workspace))
            print(f"{how:>10} {gib:>2} GiB | {cells} | at {address:.1f} GiB", flush=True)
            del placed, held
            torch.cuda.empty_cache()
    time_course(problem, workspace)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
