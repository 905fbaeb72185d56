"""The split plan csrc/plan.cuh makes on the GPU, written again in plain Python from its rules, for
the GPU tests to compare the kernel's plan with (params.h's PlanLayout, int for int)."""

from __future__ import annotations

import torch

from mla_backend.kernel_constants import MAX_KV_SPLITS, MIN_TILES_PER_SPLIT, SPLITS_PER_MERGE_TILE, TOKENS_PER_TILE


def smallest_merge_bound(longest: int) -> int:
    t = 0
    while t * t * SPLITS_PER_MERGE_TILE < longest:
        t += 1
    return t


def expected_plan(lengths: list[int], pieces: int, max_len: int) -> list[int]:
    """The plan's ints as the layout lays them out, up to the split requests' list."""
    batch = len(lengths)
    tiles = [-(-min(max(n, 0), max_len) // TOKENS_PER_TILE) for n in lengths]
    total, longest = sum(tiles), max(tiles, default=0)
    target = max(MIN_TILES_PER_SPLIT, smallest_merge_bound(longest), -(-total // pieces))
    counts = [min(MAX_KV_SPLITS, max(1, -(-t // target))) for t in tiles]
    first_item, first_partial, items, merged = [], [], [], []
    partials = 0
    for b, count in enumerate(counts):
        first_item.append(len(items))
        first_partial.append(partials)
        items += [b] * count
        if count > 1:
            merged.append(b)
            partials += count
    assert len(items) <= batch + pieces and len(merged) <= min(batch, pieces) and partials <= 2 * pieces
    return [len(items), len(merged), *first_item, *counts, *first_partial, *items, *merged]


def plan_in_workspace(workspace: torch.Tensor, batch: int, pieces: int) -> list[int]:
    """The same ints read back from the workspace the last planned call used."""
    ints = workspace.view(torch.int32)
    n_items, n_merged = ints[:2].tolist()
    head = 2 + 3 * batch
    merged_at = head + batch + pieces
    return ints[:head].tolist() + ints[head : head + n_items].tolist() + ints[merged_at : merged_at + n_merged].tolist()
