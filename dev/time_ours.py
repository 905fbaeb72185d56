"""Our decode time at a few FP8 shapes, one line each: one side of an A/B between two builds.

    python dev/time_ours.py            # the default shapes
    python dev/time_ours.py 16,128,16384 128,1,32768

CUDA-graph replay, median (bench.time_graph), page 64, q_len 1, the cache drawn in place on the GPU
and rotated past L2 as the benchmark does. gpu_session.sh's ab part alternates two builds with it.
"""

from __future__ import annotations

import math
import sys

import torch

from mla_backend.inputs import make_paged_problem
from mla_backend.tools.bench import L2_FLUSH_BYTES, ours, time_graph

SHAPES = [(16, 128, 16384), (16, 64, 16384), (16, 128, 4096), (16, 32, 16384), (16, 8, 16384), (128, 8, 16384)]
SHAPES += [(128, 1, 32768), (16, 1, 32768)]


def main(args: list[str]) -> int:
    shapes = [tuple(int(x) for x in a.split(",")) for a in args] or SHAPES
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    for heads, batch, seq in shapes:
        copies = max(1, min(32, math.ceil(L2_FLUSH_BYTES / (batch * seq * 576))))
        problems = [
            make_paged_problem([seq] * batch, 1, heads, 64, torch.float8_e4m3fn, "cuda", seed=s, extra_pages=0)
            for s in range(copies)
        ]
        micros = time_graph([ours(p, workspace) for p in problems])
        print(f"H{heads} B{batch} {seq // 1024}k {micros:.1f}", flush=True)
        del problems
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
