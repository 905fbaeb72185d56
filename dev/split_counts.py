"""How many KV splits ours and FlashMLA make at the merge table's shapes (docs/performance.md), and the
partials each side writes for its merge to read: a CPU calculation, no GPU (the host's count is the
kernel library's: the sm_90a library is loaded, built into the cache first if none is there).

    python dev/split_counts.py [--sms 132]

Ours: the GPU plan's rules (tests/plan_oracle.py, batches of PLAN_MIN_BATCH or more, or of
STEP_PLAN_MIN_BATCH or more when the engine plans once per step) or the host's count
(launcher.choose_num_splits, smaller batches), with
the H100's resident CTAs of each tile (16 rows: 3 a SM, 32 rows: 2). FlashMLA: its dense decode
scheduler as its get_decoding_sched_meta kernel states the rules (64-token blocks, a fixed charge of 5
blocks a split, one part per SM / (KV heads x ceil(rows / 64)), each part given an equal share of the
batch's blocks in request order), written again here from those rules.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "dev")]

import torch  # noqa: E402
from mixed_lengths import mixes  # noqa: E402
from plan_oracle import choose_target, request_splits  # noqa: E402

from mla_backend.jit import build_cached  # noqa: E402
from mla_backend.kernel_constants import (  # noqa: E402
    LATENT_DIM,
    PLAN_MIN_BATCH,
    STEP_PLAN_MIN_BATCH,
    TOKENS_PER_TILE,
)
from mla_backend.launcher import choose_num_splits  # noqa: E402

FLASHMLA_BLOCK, FLASHMLA_SPLIT_CHARGE = 64, 5


def flashmla_splits(lengths: list[int], sms: int, rows: int) -> list[int]:
    """Splits per request of FlashMLA's schedule: parts take equal shares of blocks + charges in order."""
    parts = max(sms // math.ceil(rows / 64), 1)
    blocks = [max(1, math.ceil(n / FLASHMLA_BLOCK)) for n in lengths]
    payload = math.ceil(sum(b + FLASHMLA_SPLIT_CHARGE for b in blocks) / parts) + FLASHMLA_SPLIT_CHARGE
    splits, request, done, pieces = [0] * len(lengths), 0, 0, 0
    for _ in range(parts):
        room = payload
        while request < len(lengths):
            left = blocks[request] - done
            if room < left + FLASHMLA_SPLIT_CHARGE:
                if room > FLASHMLA_SPLIT_CHARGE:
                    done, pieces = done + room - FLASHMLA_SPLIT_CHARGE, pieces + 1
                break
            splits[request] = pieces + 1
            room -= left + FLASHMLA_SPLIT_CHARGE
            request, done, pieces = request + 1, 0, 0
    assert request == len(lengths)
    return splits


def our_splits(lengths: list[int], sms: int, rows: int, step_plan: bool) -> list[int]:
    tile_rows, per_sm = (16, 3) if rows <= 16 else (32, 2)
    pieces = sms * per_sm // math.ceil(rows / tile_rows)
    if len(lengths) >= PLAN_MIN_BATCH or (step_plan and len(lengths) >= STEP_PLAN_MIN_BATCH):
        tiles = [math.ceil(n / TOKENS_PER_TILE) for n in lengths]
        target = choose_target(tiles, pieces)
        return [request_splits(t, target) for t in tiles]
    count = choose_num_splits(len(lengths), rows, True, max(lengths), sms * per_sm, 1 << 40)
    return [count] * len(lengths)


def partial_megabytes(splits: list[int], rows: int, bytes_per_value: int) -> float:
    """MB of partials (output rows and LSE) the split requests write for the merge to read."""
    return sum(s * rows * (LATENT_DIM + 1) * bytes_per_value for s in splits if s > 1) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sms", type=int, default=132)
    sms = parser.parse_args().sms
    torch.ops.load_library(str(build_cached("sm_90a")[0]))
    mixed = mixes()
    shapes = {
        "16 x 1 x 32k": (16, [32768]),
        "16 x 8 x 16k": (16, [16384] * 8),
        "16 x 32 x 16k": (16, [16384] * 32),
        "16 x 128 x 16k": (16, [16384] * 128),
        "16, 1 x 32k + 31 x 1k": (16, mixed["one_long"]),
        "16, 64 log-uniform 512..32k": (16, mixed["log_uniform"]),
        "16 x 64 x 8k, q_len 4": (64, [8192] * 64),
        "20 x 64 x 8k, q_len 2": (40, [8192] * 64),
        "8 x 64 x 8k, q_len 4": (32, [8192] * 64),
    }
    print("shape (rows) | ours, in the call | ours, the step's plan | FlashMLA | partials MB: ours (f16) / FlashMLA")
    for name, (rows, lengths) in shapes.items():
        call, step = our_splits(lengths, sms, rows, False), our_splits(lengths, sms, rows, True)
        theirs = flashmla_splits(lengths, sms, rows)
        megabytes = f"{partial_megabytes(step, rows, 2):.1f} / {partial_megabytes(theirs, rows, 4):.1f}"

        def describe(s: list[int]) -> str:
            return f"{sum(s)} ({sum(s) / len(s):.1f} a request, at most {max(s)})"

        print(f"{name} ({rows}) | {describe(call)} | {describe(step)} | {describe(theirs)} | {megabytes}")


if __name__ == "__main__":
    main()
