"""Our decode time at a few shapes (FP8 unless --kv=bf16), one line each: one side of an A/B between two builds.

    python dev/time_ours.py            # the default shapes
    python dev/time_ours.py 16,128,16384 128,1,32768 16,64,8192,4   # heads,batch,seq[,q_len]
    python dev/time_ours.py 16,1,4096,1,163840   # ... planned for 163840 tokens: a vLLM graph replayed
    python dev/time_ours.py 16,one_long 128,log_uniform   # heads,mix: dev/mixed_lengths.py's batches
    python dev/time_ours.py --kv=bf16 16,128,16384         # a BF16 cache (FP8 unless said)

A fifth field plans (max_seq_len) and pages the call for that many tokens while every request holds
seq: what a graph vLLM captured at max_model_len does when replayed with shorter contexts.

The benchmark's measurement of ours alone (bench.bench_shape: CUDA-graph replay, median, page 64,
KV rotated past L2); q_len 1 unless given (the MTP shapes: 16 heads x 4, GLM's 20 heads x 2).
gpu_session.sh's ab part alternates two builds with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mla_backend.inputs import make_paged_problem
from mla_backend.kernel_constants import TILE_SHAPES
from mla_backend.tools.bench import bench_lengths, bench_shape, copies_past_l2, ours, time_graph

sys.path.insert(0, str(Path(__file__).parent))
import mixed_lengths  # noqa: E402  (dev/'s batches of unequal lengths)

SHAPES = [(16, 128, 16384), (16, 64, 16384), (16, 128, 4096), (16, 32, 16384), (16, 8, 16384), (128, 8, 16384)]
SHAPES += [(128, 1, 32768), (16, 1, 32768)]
SHAPES += [(16, 64, 8192, 4), (20, 64, 8192, 2), (8, 64, 8192, 4)]


def main(args: list[str]) -> int:
    mixes = mixed_lengths.mixes()
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    dtype = torch.bfloat16 if "--kv=bf16" in args else torch.float8_e4m3fn
    args = [a for a in args if not a.startswith("--kv=")]
    for fields in [a.split(",") for a in args] or SHAPES:
        if not str(fields[1]).isdigit():  # heads,mix
            heads, mix = fields
            (row,) = bench_lengths(dtype, int(heads), mixes[mix], 1, workspace, peers=())
            print(f"H{heads} {mix} q1 {row.us:.1f}" if row.us is not None else f"H{heads} {mix} failed: {row.note}")
            continue
        heads, batch, seq, *rest = (int(x) for x in fields)
        q = rest[0] if rest else 1
        if len(rest) > 1:
            us, planned = time_planned(heads, batch, seq, q, rest[1], workspace, dtype), f" planned {rest[1] // 1024}k"
            timed = f"{us:.1f}"
        else:
            (row,) = bench_shape(dtype, heads, batch, seq, q, workspace, peers=())
            timed, planned = (f"{row.us:.1f}" if row.us is not None else f"failed: {row.note}"), ""
        print(f"H{heads} B{batch} {seq // 1024}k q{q}{planned} {timed}", flush=True)
    # CTAs an SM held per tile of the dtype (a build with dev/profiles/sm120_on_sm90.h shows SM120's one); the runs
    # loaded the library.
    fp8 = dtype == torch.float8_e4m3fn
    resident = [
        f"{16 * t.row_groups * t.fragments} rows {torch.ops.mla_backend.ctas_per_sm(fp8, t.row_groups, t.fragments, 0)}"
        for t in TILE_SHAPES
        if t.fp8 == fp8
    ]
    print("FP8" if fp8 else "BF16", "CTAs per SM:", ", ".join(resident), flush=True)
    return 0


def time_planned(
    heads: int, batch: int, seq: int, q_len: int, plan: int, workspace: torch.Tensor, dtype: torch.dtype
) -> float:
    """Graph-replay time of requests of ``seq`` tokens in a call planned and paged for ``plan``."""
    problems = []
    for i in range(copies_past_l2(batch * seq * 576 * dtype.itemsize)):
        problem = make_paged_problem([plan] * batch, q_len, heads, 64, dtype, "cuda", seed=i)
        problem.seq_lens.fill_(seq)
        problems.append(problem)
    return time_graph([ours(p, workspace) for p in problems])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
