"""Where a decode call's time goes, kernel by kernel: ours (decode, merge; the step's plan apart)
against FlashMLA (split-KV kernel, combine; its schedule apart). On a GPU.

    python dev/kernel_breakdown.py                   # the default shapes
    python dev/kernel_breakdown.py 16,128,16384 16,one_long 20,64,8192,2   # heads,batch,seq[,q_len] or heads,mix

Each side's calls (FP8, page 64, KV copies rotated past L2, as tools/bench.py times them) run eagerly
under torch.profiler; every kernel's device time is averaged over the calls. Ours reads the step's
plan made once beforehand (bench.ours), FlashMLA its schedule made once (peers.flashmla): what each
layer of an engine step pays. "merge" is our merge kernel and FlashMLA's combine kernel: the cost of
splitting a request's KV, which #32 asks to keep at or under FlashMLA's at 16 heads.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from mla_backend.inputs import make_paged_problem
from mla_backend.tools.bench import SM_SCALE, copies_past_l2, ours
from mla_backend.tools.peers import flashmla

sys.path.insert(0, str(Path(__file__).parent))
import mixed_lengths  # noqa: E402  (dev/'s batches of unequal lengths)

SHAPES = ["16,1,32768", "16,8,16384", "16,32,16384", "16,128,16384", "16,one_long", "16,log_uniform"]
SHAPES += ["16,64,8192,4", "20,64,8192,2", "8,64,8192,4", "128,8,4096", "128,64,8192"]
ROUNDS = 20


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    if "combine" in name or "merge" in name:
        return "merge"
    if "metadata" in name or "plan" in name:
        return "plan"
    return "main"


def kernel_us(calls) -> dict[str, float]:
    """Mean µs per call that each kind of kernel adds to the stream's critical path: a kernel's time
    counts from its start or the previous kernel's end, whichever is later, so a kernel launched early
    under programmatic dependent launch (ours and FlashMLA's merge) is not charged for its wait."""
    for call in calls:  # warm up: JIT, first touch, the descales
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ROUNDS):
            for call in calls:
                call()
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    total: dict[str, float] = defaultdict(float)
    previous_end = float("-inf")
    for event in kernels:
        begin, end = event.time_range.start, event.time_range.end
        total[kind_of(event.name)] += max(0.0, end - max(begin, previous_end))
        previous_end = max(previous_end, end)
    return {kind: us / (ROUNDS * len(calls)) for kind, us in total.items()}


def main(args: list[str]) -> int:
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")  # vLLM's decode workspace
    print(f"{torch.cuda.get_device_name()}; FP8, page 64; mean device µs per call over {ROUNDS} rounds")
    print("shape | ours main | ours merge | FlashMLA main | FlashMLA combine | merge / combine")
    for spec in args or SHAPES:
        heads, lengths, q_len = mixed_lengths.shape_of(spec.split(","))
        problems = [
            make_paged_problem(lengths, q_len, heads, 64, torch.float8_e4m3fn, "cuda", seed=i, extra_pages=0)
            for i in range(copies_past_l2(sum(lengths) * 576))
        ]
        mine = kernel_us([ours(p, workspace) for p in problems])
        theirs = kernel_us([flashmla(p, SM_SCALE) for p in problems])
        if set(mine) - {"main", "merge"} or set(theirs) - {"main", "merge"}:
            print(f"  {spec}: kernels besides main and merge: ours {sorted(mine)}, FlashMLA {sorted(theirs)}")
        merge, combine = mine.get("merge", 0.0), theirs.get("merge", 0.0)
        ratio = f"{merge / combine:.2f}" if combine else "-"
        print(
            f"{spec} | {mine.get('main', 0.0):.1f} | {merge:.1f} | {theirs.get('main', 0.0):.1f} | "
            f"{combine:.1f} | {ratio}",
            flush=True,
        )
        del problems
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
