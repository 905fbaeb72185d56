"""Does where the benchmark draws its random inputs change our kernel's time? An A/B on a GPU.

    python dev/input_ab.py            # the bench's quick shapes, FP8, three alternating rounds

Each shape is timed (graph replay, median, bench.time_graph) on inputs drawn on the CPU and copied
over, and on inputs drawn on the GPU (what make_paged_problem does for CUDA devices), alternating,
together with vLLM's FlashMLA where importable as a control. Prints µs per round.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from mla_backend.inputs import make_paged_problem
from mla_backend.tools.bench import QUICK_GRID, copies_past_l2, ours, time_graph
from mla_backend.tools.peers import SM_SCALE, flashmla

ROUNDS = 3


def problems(heads: int, batch: int, seq: int, where: str) -> list:
    made = []
    for seed in range(copies_past_l2(batch * seq * 576)):
        p = make_paged_problem([seq] * batch, 1, heads, 64, torch.float8_e4m3fn, where, seed=seed, extra_pages=0)
        if where == "cpu":
            p = replace(
                p, query=p.query.cuda(), kv_cache=p.kv_cache.cuda(), block_tables=p.block_tables.cuda(),
                seq_lens=p.seq_lens.cuda(),
            )  # fmt: skip
        made.append(p)
    return made


def main() -> int:
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    print(f"{'shape':>18} | {'round':>5} | {'ours, cpu-drawn':>15} | {'ours, gpu-drawn':>15} | {'FlashMLA':>8}")
    for heads, batch, seq in QUICK_GRID:
        for round_ in range(ROUNDS):
            times = {}
            for where in ("cpu", "cuda"):
                made = problems(heads, batch, seq, where)
                times[where] = time_graph([ours(p, workspace) for p in made])
                if where == "cuda":
                    try:
                        times["flashmla"] = time_graph([flashmla(p, SM_SCALE) for p in made])
                    except Exception as err:  # FlashMLA missing: the A/B stands without its control
                        times["flashmla"] = float("nan")
                        print(f"FlashMLA unavailable: {err}")
                del made
                torch.cuda.empty_cache()
            print(
                f"{f'H{heads} B{batch} {seq // 1024}k':>18} | {round_:>5} | {times['cpu']:>15.1f} | "
                f"{times['cuda']:>15.1f} | {times['flashmla']:>8.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
