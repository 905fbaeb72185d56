"""How much does a batch of unequal context lengths cost us against FlashMLA? On a GPU.

    python dev/mixed_lengths.py

Ours plans its split-KV on the host from the batch's longest request (every request gets the same
number of splits); FlashMLA's metadata kernel balances the batch's real lengths over the SMs. Each
mixed batch is timed next to a batch of equal lengths holding the same number of tokens, so the
ratio mixed / equal says what the imbalance costs each kernel. FP8, page 64, graph replay, median,
KV copies rotated past L2 (tools/bench.py's bench_lengths).
"""

from __future__ import annotations

import random

import torch

from mla_backend.tools.bench import bench_lengths


def mixes() -> dict[str, list[int]]:
    """Named batches of context lengths: a long request among short ones, a few long among many
    short, and 64 lengths drawn log-uniform from 512 to 32k (seeded)."""
    rng = random.Random(0)
    drawn = [int(2 ** rng.uniform(9, 15)) for _ in range(64)]
    return {
        "one_long": [32768] + [1024] * 31,  # 1 x 32k + 31 x 1k
        "four_long": [16384] * 4 + [1024] * 60,  # 4 x 16k + 60 x 1k
        "log_uniform": drawn,  # 64 lengths log-uniform in 512..32k
    }


def shape_of(fields: list[str]) -> tuple[int, list[int], int]:
    """(heads, lengths, q_len) of a shape given on a dev script's command line: heads,batch,seq[,q_len],
    heads,batch,mix (one 32k request, the rest 1k) or heads,<one of mixes()>."""
    heads = int(fields[0])
    if len(fields) == 2:
        return heads, mixes()[fields[1]], 1
    batch = int(fields[1])
    if fields[2] == "mix":
        return heads, [32768] + [1024] * (batch - 1), 1
    return heads, [int(fields[2])] * batch, int(fields[3]) if len(fields) > 3 else 1


def equal_counterpart(lengths: list[int]) -> list[int]:
    """As many requests, each of the mean length: the same tokens, no imbalance."""
    return [max(1, round(sum(lengths) / len(lengths)))] * len(lengths)


def time_both(lengths: list[int], heads: int, workspace: torch.Tensor) -> tuple[float, float]:
    """(ours, FlashMLA) µs on one batch of ``lengths``."""
    rows = {r.impl: r for r in bench_lengths(torch.float8_e4m3fn, heads, lengths, 1, workspace, peers=("flashmla",))}
    for row in rows.values():
        if row.us is None:
            raise RuntimeError(f"{row.impl} failed: {row.note}")
    return rows["mla_backend"].us, rows["flashmla"].us


def main() -> None:
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"{torch.cuda.get_device_name()}; FP8, page 64, q_len 1; median µs of graph replays")
    print("heads | batch | ours mixed / equal | FlashMLA mixed / equal | ours / FlashMLA (mixed)")
    for heads in (16, 128):
        for name, lengths in mixes().items():
            mixed = time_both(lengths, heads, workspace)
            equal = time_both(equal_counterpart(lengths), heads, workspace)
            ours_cell = f"{mixed[0]:.1f} / {equal[0]:.1f} = {mixed[0] / equal[0]:.2f}"
            peer_cell = f"{mixed[1]:.1f} / {equal[1]:.1f} = {mixed[1] / equal[1]:.2f}"
            print(f"{heads} | {name} ({sum(lengths)} tokens) | {ours_cell} | {peer_cell} | {mixed[0] / mixed[1]:.2f}")


if __name__ == "__main__":
    main()
