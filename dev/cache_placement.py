"""Does where the KV cache sits in GPU memory change the decode time? Ours and FlashMLA, on a GPU.

    python dev/cache_placement.py

The same FP8 problem (values drawn once on the CPU) is placed three ways: in a fresh allocation
(what the benchmark measures), after N GiB that another allocation held and gave back (so the cache
starts N GiB further on), and page by page at random over a vLLM-like pool of N GiB. Both kernels
are timed on each placement (graph replay, median); the ratio is FlashMLA's time over ours.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from mla_backend.inputs import make_paged_problem
from mla_backend.tools.bench import ours, time_graph
from mla_backend.tools.peers import SM_SCALE, flashmla

SHAPES = [(16, 128, 16384), (16, 64, 16384), (128, 64, 8192)]
OFFSETS_GIB = (0, 1, 2, 4, 8, 16, 32)
POOLS_GIB = (8, 40)


def on_gpu(problem):
    return replace(
        problem, query=problem.query.cuda(), kv_cache=problem.kv_cache.cuda(),
        block_tables=problem.block_tables.cuda(), seq_lens=problem.seq_lens.cuda(),
    )  # fmt: skip


def offset_by(problem, gib: int):
    held = torch.empty(gib << 30, dtype=torch.uint8, device="cuda") if gib else None
    placed = on_gpu(problem)
    del held  # returned; graph capture empties the allocator's cache, so only the address moves
    return placed


def scattered_over_pool(problem, gib: int):
    """The problem's pages at random places of one large cache tensor, as vLLM allocates it."""
    page_shape = tuple(problem.kv_cache.shape[1:])
    pool_pages = (gib << 30) // problem.kv_cache[0].nbytes
    pool = torch.empty((pool_pages, *page_shape), dtype=problem.kv_cache.dtype, device="cuda")
    where = torch.randperm(pool_pages)[: problem.kv_cache.shape[0]]
    pool.view(torch.uint8)[where.cuda()] = problem.kv_cache.cuda().view(torch.uint8)
    table = problem.block_tables.clone()
    used = (table >= 0) & (table < problem.kv_cache.shape[0])
    table[used] = where[table[used].long()].to(torch.int32)
    table[~used] = -1
    return replace(on_gpu(problem), kv_cache=pool, block_tables=table.cuda())


def main() -> int:
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    print(f"{'shape':>14} | {'placement':>28} | {'ours µs':>8} | {'FlashMLA µs':>11} | {'ratio':>5}")
    for heads, batch, seq in SHAPES:
        problem = make_paged_problem([seq] * batch, 1, heads, 64, torch.float8_e4m3fn, "cpu", extra_pages=0)
        placements = [(f"{gib} GiB further on", offset_by, gib) for gib in OFFSETS_GIB]
        placements += [(f"scattered over {gib} GiB", scattered_over_pool, gib) for gib in POOLS_GIB]
        for name, place, gib in placements:
            placed = place(problem, gib)
            mine = time_graph([ours(placed, workspace)])
            theirs = time_graph([flashmla(placed, SM_SCALE)])
            shape = f"H{heads} B{batch} {seq // 1024}k"
            print(f"{shape:>14} | {name:>28} | {mine:8.1f} | {theirs:11.1f} | {theirs / mine:5.2f}", flush=True)
            del placed
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
