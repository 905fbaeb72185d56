"""The split plan csrc/plan/plan_kernel.cuh makes on the GPU, written again in plain Python from its
rules, for the GPU tests to compare the kernel's plan with (csrc/schedule/plan_layout.h's PlanLayout,
int for int)."""

from __future__ import annotations

import torch

from mla_backend.kernel_constants import (
    FEW_SPLITS_MAX,
    FIXED_TILES_PER_CTA,
    MAX_KV_SPLITS,
    MIN_TILES_PER_SPLIT,
    PLAN_CUT_WAVES,
    SPLITS_PER_MERGE_TILE,
    TOKENS_PER_TILE,
)


def split_candidates() -> list[int]:
    """The longest request's split counts the plan weighs: every count to 32, then steps of k // 16."""
    ks, k = [], 1
    while k <= MAX_KV_SPLITS:
        ks.append(k)
        k += max(1, k // 16)
    return ks


def split_length(longest: int, k: int) -> int:
    """Tiles a split of the longest request cut into k: at least one (a batch of empties has none)."""
    return max(1, -(-longest // k))


def request_splits(tiles: int, target: int) -> int:
    """The splits of a request of ``tiles`` tiles at ``target`` tiles a split."""
    return min(MAX_KV_SPLITS, max(1, -(-tiles // target)))


def split_cost(tiles: list[int], pieces: int, k: int) -> int | None:
    """Cutting the longest request into k: splits of at most ceil(longest / k) tiles dealt to the pieces
    in waves (enough for the work with each split's fixed cost, and one per pieces splits longer than
    half a wave), plus the longest request's merge; in twentieths of a tile. None where the plan would
    not fit the layout's bounds."""
    total, target, batch = sum(tiles), split_length(max(tiles), k), len(tiles)
    size = target + FIXED_TILES_PER_CTA
    counts = [request_splits(t, target) for t in tiles]
    items, cut = sum(counts), [n for n in counts if n > 1]
    if items > batch + PLAN_CUT_WAVES * pieces or sum(cut) > (PLAN_CUT_WAVES + 1) * pieces:
        return None  # past the layout's bounds (split requests hold two partials or more: within them too)
    long_items = sum(n for t, n in zip(tiles, counts) if n > 1 or 2 * (t + FIXED_TILES_PER_CTA) > size)
    waves = max(1, -(-(total + FIXED_TILES_PER_CTA * items) // (pieces * size)), -(-long_items // pieces))
    return waves * size * SPLITS_PER_MERGE_TILE + (k if k > 1 else 0)


def choose_target(tiles: list[int], pieces: int) -> int:
    """ceil(longest / k) for the fewest splits k within 2% of the least cost."""
    longest = max(tiles)
    most = max(1, min(MAX_KV_SPLITS, longest // MIN_TILES_PER_SPLIT))
    costs = {k: split_cost(tiles, pieces, k) for k in split_candidates() if k <= most}
    best = min(c for c in costs.values() if c is not None)
    k = min(k for k, c in costs.items() if c is not None and c * 50 <= best * 51)
    return split_length(longest, k)


def expected_plan(lengths: list[int], pieces: int, max_len: int) -> list[int]:
    """The plan's ints as the layout lays them out, up to the split requests' list."""
    batch = len(lengths)
    tiles = [-(-min(max(n, 0), max_len) // TOKENS_PER_TILE) for n in lengths]
    target = choose_target(tiles, pieces)
    counts = [request_splits(t, target) for t in tiles]
    first_item, first_partial, items, few, many = [], [], [], [], []
    partials = 0
    for b, count in enumerate(counts):
        first_item.append(len(items))
        first_partial.append(partials)
        items += [b] * count
        if count > 1:
            (few if count <= FEW_SPLITS_MAX else many).append(b)
            partials += count
    assert len(items) <= batch + PLAN_CUT_WAVES * pieces and partials <= (PLAN_CUT_WAVES + 1) * pieces
    return [len(items), len(few), len(many), *first_item, *counts, *first_partial, *items, *few, *many]


def counts_in(plan: list[int], batch: int) -> list[int]:
    """The split count of each request, from a plan's ints as the layout lays them out."""
    return plan[3 + batch : 3 + 2 * batch]


def plan_in_workspace(workspace: torch.Tensor, batch: int, pieces: int) -> list[int]:
    """The same ints read back from the workspace the last planned call used (the list of requests cut
    into many splits runs backwards from the end of the layout)."""
    ints = workspace.view(torch.int32)
    n_items, n_few, n_many = ints[:3].tolist()
    head = 3 + 3 * batch
    merged_at = head + batch + PLAN_CUT_WAVES * pieces
    end = merged_at + min(batch, (PLAN_CUT_WAVES + 1) * pieces // 2)
    many = ints[end - n_many : end].flip(0).tolist()
    return (
        ints[:head].tolist()
        + ints[head : head + n_items].tolist()
        + ints[merged_at : merged_at + n_few].tolist()
        + many
    )


def launcher_pieces(problem, workspace_bytes: int, step_plan: bool = False) -> int:
    """The pieces the launcher plans ``problem`` (a PagedProblem) over with ``workspace_bytes`` of
    workspace, in a call or as a step's plan (the resident CTAs of this GPU: CUDA only)."""
    from mla_backend.launcher import choose_plan_pieces, resident_slots, tile_shape

    batch, q_len, heads, _ = problem.query.shape
    fp8 = problem.query.dtype == torch.float8_e4m3fn
    slots = resident_slots(torch.cuda.current_device(), fp8, *tile_shape(q_len * heads, fp8))
    return choose_plan_pieces(batch, q_len * heads, fp8, slots, workspace_bytes, step_plan=step_plan)


def assert_plan_is_the_oracles(plan_memory: torch.Tensor, problem, pieces: int) -> list[int]:
    """The plan in ``plan_memory`` (a planned call's workspace, or a step plan's ints) for ``problem``
    over ``pieces``, int for int against expected_plan; the split count of each request."""
    lengths = problem.seq_lens.tolist()
    max_len = problem.block_tables.shape[1] * problem.kv_cache.shape[-2]
    got, want = plan_in_workspace(plan_memory, len(lengths), pieces), expected_plan(lengths, pieces, max_len)
    first_difference = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert got == want, f"the plan differs from the oracle's from int {first_difference}"
    return counts_in(want, len(lengths))
