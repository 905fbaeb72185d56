"""`python -m mla_backend bench --route-table`: the table `auto` routes decode by on SM90.

Per shape class (KV dtype, heads, query tokens per request; page 64), the bundled kernels against
vLLM's FlashMLA over a batch x context grid of equal lengths and over batches of unequal lengths as
a server holds them (MIXES), in one process (CUDA-graph replay, median, KV beyond L2:
bench.bench_lengths), and FlashMLA's output and LSE checked against the float64 reference on the
(dequantised) inputs, within FlashMLA's own bar (flashmla.ROW_ERROR_TOLERANCE). speedup = geometric
mean over the grid and the mixes of our time / FlashMLA's. Each side's per-step work is made once,
outside the timed calls, as an engine makes it once a step for all layers: our step plan
(bench.ours) and FlashMLA's schedule. ``--write`` stores the table as the
installed package's mla_backend/vllm/sm90_routes.json.
"""

from __future__ import annotations

import datetime
import json
import math
import random
from pathlib import Path

import torch

from .. import sm90_table
from ..inputs import make_paged_problem
from ..reference import LSE_ABS_TOLERANCE, LSE_REL_TOLERANCE, mla_decode_reference
from ..vllm import flashmla as vllm_flashmla
from .bench import bench_lengths
from .peers import SM_SCALE, flashmla

HEADS = (16, 32, 64, 128)
Q_LENS = (1, 2, 4)
BATCHES = (1, 8, 32, 128)
CONTEXTS = (4096, 16384)
# Batches of unequal lengths as a server holds them: one long request among short ones (at 32
# requests, and at 16, where the step's plan serves a batch the GPU's in-call plan does not), and
# lengths drawn log-uniform from 512 to 16k (one seeded generator for all 32).
_LENGTHS = random.Random(0)
MIXES = {
    "1 x 16k + 31 x 1k": [16384] + [1024] * 31,
    "1 x 16k + 15 x 1k": [16384] + [1024] * 15,
    "32 log-uniform 512..16k": [int(2 ** _LENGTHS.uniform(9, 14)) for _ in range(32)],
}
CHECK_LENGTHS = [300, 1500, 4000]  # every query row sees hundreds of keys
DTYPES = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}
FLASHMLA_BAR = vllm_flashmla.ROW_ERROR_TOLERANCE


def flashmla_errors(dtype: torch.dtype, heads: int, q_len: int) -> tuple[float, float]:
    """(worst row's relative L2 error, worst LSE excess over its tolerance) of FlashMLA vs float64."""
    problem = make_paged_problem(CHECK_LENGTHS, q_len, heads, 64, dtype, "cuda", seed=7)
    out, lse = flashmla(problem, SM_SCALE)()
    want, want_lse = mla_decode_reference(
        problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, SM_SCALE
    )
    got = out.view(want.shape).double()
    row_error = ((got - want).norm(dim=-1) / want.norm(dim=-1)).max().item()
    got_lse = lse.view(want_lse.shape).double()
    lse_excess = ((got_lse - want_lse).abs() - LSE_REL_TOLERANCE * want_lse.abs()).max().item()
    return row_error, lse_excess


def ours_and_flashmla(dtype: torch.dtype, heads: int, lengths: list[int], q_len: int, workspace) -> tuple:
    """(our µs, FlashMLA's µs) on one batch of context ``lengths``; None for a side that refused it."""
    rows = {r.impl: r.us for r in bench_lengths(dtype, heads, lengths, q_len, workspace, peers=("flashmla",))}
    return rows.get("mla_backend"), rows.get("flashmla")


def measure_class(kv: str, heads: int, q_len: int, workspace: torch.Tensor) -> dict:
    dtype = DTYPES[kv]
    row_error, lse_excess = flashmla_errors(dtype, heads, q_len)
    times = [
        [batch, context, *ours_and_flashmla(dtype, heads, [context] * batch, q_len, workspace)]
        for batch in BATCHES
        for context in CONTEXTS
    ]
    mixed_times = [[name, *ours_and_flashmla(dtype, heads, mix, q_len, workspace)] for name, mix in MIXES.items()]
    # A refused shape counts against FlashMLA.
    ratios = [ours / theirs if ours and theirs else 0.0 for *_, ours, theirs in times + mixed_times]
    speedup = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if all(ratios) else 0.0
    return dict(
        kv=kv,
        heads=heads,
        q_len=q_len,
        speedup=round(speedup, 3),
        flashmla_correct=row_error <= FLASHMLA_BAR[dtype] and lse_excess <= LSE_ABS_TOLERANCE,
        flashmla_row_error=row_error,
        flashmla_lse_excess=lse_excess,
        times_us=times,
        mixed_us=mixed_times,
    )


def main(out_prefix: str, write: bool = False) -> int:
    if not torch.cuda.is_available():
        print("the route table needs a CUDA GPU")
        return 2
    ok, why = vllm_flashmla.available()
    if not ok:
        print(f"vLLM's FlashMLA is not available here: {why}")
        return 2
    import vllm

    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    entries = []
    for kv in DTYPES:
        for heads in HEADS:
            for q_len in Q_LENS:
                entry = measure_class(kv, heads, q_len, workspace)
                entries.append(entry)
                print(
                    f"{kv:4} H{heads:<4} q{q_len}  FlashMLA speedup {entry['speedup']:5.2f}  "
                    f"correct {entry['flashmla_correct']} (row {entry['flashmla_row_error']:.1e}, "
                    f"LSE excess {entry['flashmla_lse_excess']:.1e})",
                    flush=True,
                )
    table = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        vllm=vllm.__version__,
        grid=dict(batches=BATCHES, contexts=CONTEXTS, page_size=64, mixes=MIXES),
        entries=entries,
    )
    text = json.dumps(table, indent=1) + "\n"
    Path(out_prefix).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out_prefix}_routes.json").write_text(text)
    if write:
        sm90_table.ROUTE_TABLE.write_text(text)
        print(f"wrote {sm90_table.ROUTE_TABLE}")
    print_routes(table)
    return 0


def print_routes(table: dict) -> None:
    print(f"\n== auto on SM90: FlashMLA where faster ({table['device']}, vLLM {table['vllm']}) ==")
    print(f"{'kv':4} {'H':>4} {'q':>2} | {'ours/FlashMLA':>13} | {'FlashMLA correct':>16} | route")
    for e in table["entries"]:
        route = "FlashMLA" if sm90_table.routes_to_flashmla(e) else "ours"
        correct = str(e["flashmla_correct"])
        print(f"{e['kv']:4} {e['heads']:>4} {e['q_len']:>2} | {e['speedup']:>13.2f} | {correct:>16} | {route}")
