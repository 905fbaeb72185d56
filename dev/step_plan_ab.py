"""What a split plan made once per step saves each layer's call, on a GPU.

    python dev/step_plan_ab.py                       # the default shapes
    python dev/step_plan_ab.py 16,1,32768 16,one_long 20,64,8192,2   # heads,batch,seq[,q_len] or heads,mix

For each shape (FP8, page 64, graph replay, median, KV copies rotated past L2, as tools/bench.py times):
  call  a call as it plans itself (under launcher.PLAN_MIN_BATCH requests the host's split count,
        from it the GPU's plan made inside the call),
  step  a call reading a plan made once beforehand (step_plan.plan_decode): what each layer pays,
  plan  the plan alone: what the step pays once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mla_backend import MLABackendConfig, mla_decode
from mla_backend.inputs import make_paged_problem
from mla_backend.tools.bench import SM_SCALE, copies_past_l2, ours, time_graph

sys.path.insert(0, str(Path(__file__).parent))
import mixed_lengths  # noqa: E402  (dev/'s batches of unequal lengths)

CONFIG = MLABackendConfig.from_sources({"backend": "xqa"})
SHAPES = ["16,1,32768", "16,1,4096", "128,1,32768", "16,2,16384", "16,4,16384", "128,4,8192", "128,8,4096"]
SHAPES += ["16,8,16384", "16,16,8192", "8,16,8192,4", "20,16,8192,2"]
SHAPES += ["16,2,mix", "16,4,mix", "16,8,mix", "16,16,mix", "128,4,mix", "128,16,mix"]
SHAPES += ["16,32,16384", "128,64,8192", "16,128,16384", "16,64,8192,4", "20,64,8192,2", "8,64,8192,4"]
SHAPES += ["16,one_long", "128,one_long", "16,log_uniform", "128,log_uniform"]


def step_call(problem, workspace, plan):
    return lambda: mla_decode(*problem.decode_args(workspace), bmm1_scale=SM_SCALE, config=CONFIG, plan=plan)


def make_plan(problem, workspace):
    return problem.step_plan(workspace, CONFIG)


def main(args: list[str]) -> int:
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")  # vLLM's decode workspace
    print("shape | call us | step us | plan us | step / call", flush=True)
    for spec in args or SHAPES:
        heads, lengths, q_len = mixed_lengths.shape_of(spec.split(","))
        copies = copies_past_l2(sum(lengths) * 576)
        problems = [
            make_paged_problem(lengths, q_len, heads, 64, torch.float8_e4m3fn, "cuda", seed=i, extra_pages=0)
            for i in range(copies)
        ]
        plan = make_plan(problems[0], workspace)
        call = time_graph([ours(p, workspace, step_plan=False) for p in problems])
        step = time_graph([step_call(p, workspace, plan) for p in problems])
        planning = time_graph([lambda: make_plan(problems[0], workspace)] * 8)
        print(f"{spec} | {call:.1f} | {step:.1f} | {planning:.1f} | {step / call:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
