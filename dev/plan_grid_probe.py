"""Why a step plan costs small batches with one long request more than the host's split count: the
same decode timed with the host's count, a forced count, and step plans over fewer pieces (fewer
idle CTAs in the planned grid). FP8, page 64, graph replay, median, KV copies past L2.

    python dev/plan_grid_probe.py
"""

from __future__ import annotations

import torch

from mla_backend import MLABackendConfig, mla_decode
from mla_backend.inputs import make_paged_problem
from mla_backend.kernel_constants import MAX_PLAN_PIECES
from mla_backend.launcher import DecodePlan, plan_ints, plan_partials_bytes
from mla_backend.tools.bench import SM_SCALE, copies_past_l2, time_graph

CASES = [(16, [32768]), (128, [32768]), (16, [32768, 1024]), (16, [4096])]


def timed(problems, workspace, config, plan=None) -> float:
    def call(p):
        return lambda: mla_decode(*p.decode_args(workspace), bmm1_scale=SM_SCALE, config=config, plan=plan)

    return time_graph([call(p) for p in problems])


def plan_over(problem, pieces: int) -> DecodePlan:
    from mla_backend.jit import ensure_loaded

    ensure_loaded(torch.cuda.current_device())
    batch, q_len, heads, _ = problem.query.shape
    ints = torch.zeros(plan_ints(batch, MAX_PLAN_PIECES), dtype=torch.int32, device="cuda")
    torch.ops.mla_backend.plan(problem.seq_lens, ints, problem.block_tables.shape[1], 64, pieces)
    return DecodePlan(ints, batch, q_len * heads, True, pieces, plan_partials_bytes(q_len * heads, pieces))


def main() -> int:
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    xqa = MLABackendConfig.from_sources({"backend": "xqa"})
    print("heads lengths | host | forced 114 | pieces 396 | 264 | 132 | 60", flush=True)
    for heads, lengths in CASES:
        problems = [
            make_paged_problem(lengths, 1, heads, 64, torch.float8_e4m3fn, "cuda", seed=i, extra_pages=0)
            for i in range(copies_past_l2(sum(lengths) * 576))
        ]
        row = [timed(problems, workspace, xqa)]
        row.append(timed(problems, workspace, xqa.model_copy(update={"num_kv_splits": 114})))
        for pieces in (396, 264, 132, 60):
            row.append(timed(problems, workspace, xqa, plan_over(problems[0], pieces)))
        print(f"{heads} {lengths} | " + " | ".join(f"{t:.1f}" for t in row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
