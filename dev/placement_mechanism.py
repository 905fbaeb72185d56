"""Why a decode gets slower once its KV cache sits a few GiB further on in GPU memory. On a GPU.

    python dev/placement_mechanism.py

docs/performance.md ("Where the cache sits in GPU memory") saw 16 heads x 128 x 16k step up by 15-17%
once the cache starts 4 GiB on (FlashMLA: 8 GiB), while the same pages scattered over one large pool
did not. This sets the candidate mechanisms apart on one FP8 problem placed at each offset:

  ours, FlashMLA      the two kernels, pages of each request in random order (make_paged_problem's)
  ours, pages in order  the same cache with each request's pages consecutive: access order
  copy                torch's copy of the whole cache: a kernel that streams it front to back
  gather              torch's index_select of the pages in the block table's order (41 KB pieces at
                      random over the cache): random pages with no attention math

If the copy slows with the offset, the memory behind those addresses is slower for anyone; if only the
random-page readers do, it is address translation (pages touched at random need more of the TLB).
Graph replay, median; GB/s counts the cache's bytes each side reads (copy and gather write as many).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from mla_backend.inputs import make_paged_problem
from mla_backend.tools.bench import ours, time_graph
from mla_backend.tools.peers import SM_SCALE, flashmla

HEADS, BATCH, SEQ = 16, 128, 16384
OFFSETS_GIB = (0, 2, 4, 8, 32)


def used_pages(problem) -> torch.Tensor:
    """Which block-table entries hold a request's pages (the rest are junk past its length)."""
    pages = (problem.seq_lens + 63) // 64
    return torch.arange(problem.block_tables.shape[1], device=pages.device)[None, :] < pages[:, None]


def in_order(problem):
    """The same problem with request r's pages consecutive in the cache (page ids renumbered)."""
    used = used_pages(problem)
    order = problem.block_tables[used].long()  # request by request, position by position
    kv = problem.kv_cache.clone()
    kv[: order.numel()] = problem.kv_cache[order]
    renumbered = problem.block_tables.clone()
    renumbered[used] = torch.arange(order.numel(), dtype=renumbered.dtype)
    return replace(problem, kv_cache=kv, block_tables=renumbered)


def times_at(problem, workspace) -> list[float]:
    """Ours, FlashMLA, the cache's copy and its gather in the block table's page order, in µs."""
    pages = problem.block_tables[used_pages(problem)].long()
    flat = problem.kv_cache.view(problem.kv_cache.shape[0], -1)
    out = torch.empty_like(flat)
    return [
        time_graph([ours(problem, workspace)]),
        time_graph([flashmla(problem, SM_SCALE)]),
        time_graph([lambda: out.copy_(flat)]),
        time_graph([lambda: torch.index_select(flat, 0, pages, out=out)]),
    ]


def placed_at(problem, gib: int):
    held = torch.empty(gib << 30, dtype=torch.uint8, device="cuda") if gib else None
    placed = replace(
        problem, query=problem.query.cuda(), kv_cache=problem.kv_cache.cuda(),
        block_tables=problem.block_tables.cuda(), seq_lens=problem.seq_lens.cuda(),
    )  # fmt: skip
    del held  # returned; graph capture empties the allocator's cache, so only the address moves
    return placed


def main() -> int:
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    random_pages = make_paged_problem([SEQ] * BATCH, 1, HEADS, 64, torch.float8_e4m3fn, "cpu", extra_pages=0)
    ordered_pages = in_order(random_pages)
    nbytes = random_pages.kv_cache.nbytes
    print(f"H{HEADS} B{BATCH} {SEQ // 1024}k FP8, {nbytes / 1e9:.2f} GB of cache; µs (GB/s)")
    print(f"{'offset':>7} | {'ours':>14} | {'FlashMLA':>14} | {'ours, in order':>14} | {'copy':>14} | {'gather':>14}")
    for gib in OFFSETS_GIB:
        problem = placed_at(random_pages, gib)
        start = problem.kv_cache.data_ptr()
        times = times_at(problem, workspace)
        del problem
        torch.cuda.empty_cache()
        ordered = placed_at(ordered_pages, gib)
        times.insert(2, time_graph([ours(ordered, workspace)]))
        del ordered
        torch.cuda.empty_cache()
        cells = " | ".join(f"{us:6.1f} ({nbytes / us / 1e3:5.0f})" for us in times)
        print(f"{gib:>3} GiB | {cells}   cache at {start / 2**30:.1f} GiB of the address space", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
