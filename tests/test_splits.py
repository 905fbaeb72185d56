"""The split-KV schedule and the split plan's sizing: host arithmetic the kernel library owns
(csrc/schedule/), read through its ops on a machine without a GPU (the kernel_library fixture); the
plan itself is made on the GPU (tests/test_decode_gpu.py), its rules written again in plan_oracle.py."""

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_backend.config import MAX_KV_SPLITS
from mla_backend.kernel_constants import MAX_PLAN_PIECES, PLAN_MIN_BATCH, STEP_PLAN_MIN_BATCH
from mla_backend.launcher import (
    choose_num_splits,
    choose_plan_pieces,
    plan_ints,
    plan_partials_bytes,
    plan_workspace_bytes,
    schedule,
    workspace_bytes,
)
from mla_backend.step_plan import _check_plan_buffer

BIG = 1 << 40
library = pytest.mark.usefixtures("kernel_library")


@library
def test_full_waves_need_no_split():
    assert choose_num_splits(batch=264, rows=16, fp8=True, max_seq_len=16384, slots=264, workspace_capacity=BIG) == 1


@library
def test_one_request_spreads_over_the_gpu():
    assert choose_num_splits(1, 16, True, 32768, slots=264, workspace_capacity=BIG) in range(96, 160)


@library
def test_partial_wave_is_filled_not_overflowed():
    # 128 CTAs on 264 slots: 2 splits fill one wave; 3 would spill into a second.
    assert choose_num_splits(128, 16, True, 16384, slots=264, workspace_capacity=BIG) == 2


@library
def test_the_schedule_plans_large_batches_on_the_gpu_and_leaves_small_ones_to_the_host():
    # 128 requests of 16 FP8 rows, from PLAN_MIN_BATCH on: the GPU plans the call over one wave of the
    # 264 resident CTAs (a row block a request), one split a request until the plan cuts them.
    assert schedule(128, 16, True, 16384, 264, BIG) == (1, 264)
    # 31 requests, under PLAN_MIN_BATCH: the host's count. 31 CTAs of 512 tiles on 264 slots: 17 splits
    # run two waves of 30.1 + 2 tiles (65.1 tiles' time with the merge), under 8 splits' one wave of 64 + 2
    # (66.4, past 2% of it); 18 would need a third wave.
    assert schedule(31, 16, True, 16384, 264, BIG) == (17, 0)
    # The same batch planned once a step (from STEP_PLAN_MIN_BATCH, 4, on): one wave of pieces.
    assert schedule(31, 16, True, 16384, 264, BIG, step_plan=True) == (1, 264)
    # Three requests, under it: 3 CTAs on 264 slots, where 88 splits are the cheapest cut within one
    # wave and 79 the fewest within 2% of it.
    assert schedule(3, 16, True, 16384, 264, BIG, step_plan=True) == (79, 0)
    # No workspace: neither a plan nor a split.
    assert schedule(128, 16, True, 16384, 264, 0) == (1, 0)


@library
def test_short_sequences_are_not_split_below_128_tokens():
    assert choose_num_splits(1, 16, True, 300, slots=264, workspace_capacity=BIG) == 3


@library
def test_workspace_holds_fp32_partials_and_their_lse():
    """Written out: batch x splits x rows x (512 outputs + 1 LSE) x 4 bytes; one split needs none."""
    assert workspace_bytes(2, 32, 3) == 2 * 3 * 32 * (512 + 1) * 4
    assert workspace_bytes(7, 128, 1) == 0


@library
def test_workspace_bounds_the_split():
    need_for_4 = workspace_bytes(1, 128, 4)
    assert choose_num_splits(1, 128, True, 32768, slots=132, workspace_capacity=need_for_4) == 4
    assert choose_num_splits(1, 128, True, 32768, slots=132, workspace_capacity=0) == 1


@library
@settings(max_examples=300, deadline=None)
@given(
    batch=st.integers(1, 512),
    rows=st.integers(1, 1024),
    fp8=st.booleans(),
    max_seq_len=st.integers(0, 200_000),
    slots=st.integers(1, 600),
    capacity=st.integers(0, 1 << 32),
)
def test_split_choice_is_always_feasible(batch, rows, fp8, max_seq_len, slots, capacity):
    s = choose_num_splits(batch, rows, fp8, max_seq_len, slots, capacity)
    assert 1 <= s <= MAX_KV_SPLITS
    assert s == 1 or workspace_bytes(batch, rows, s) <= capacity
    assert s == 1 or max_seq_len > (s - 1) * 128  # no split shorter than 4 tiles of 32 tokens


@library
def test_the_plan_spreads_a_call_over_one_wave_of_each_row_block():
    # 128 FP8 rows run as four 32-row tiles: 264 resident CTAs give each row block 66.
    assert choose_plan_pieces(32, 128, True, slots=264, workspace_capacity=BIG) == 66
    assert choose_plan_pieces(32, 16, True, slots=264, workspace_capacity=BIG) == 264


@library
def test_smaller_batches_keep_the_host_split_count():
    assert choose_plan_pieces(31, 16, True, slots=264, workspace_capacity=BIG) == 0
    assert choose_plan_pieces(1, 128, True, slots=264, workspace_capacity=BIG) == 0


@library
def test_the_plan_workspace_holds_its_ints_then_partials_for_three_times_the_pieces():
    """Written out: 3 counters, 3 ints a request, an item per request and two per piece, the split
    requests (at most the batch), rounded to 256 bytes; then 3 x pieces x rows x (512 + 1) floats."""
    ints = 3 + 3 * 5 + (5 + 2 * 40) + 5
    assert plan_workspace_bytes(5, 32, 40) == -(-ints * 4 // 256) * 256 + 3 * 40 * 32 * 513 * 4
    ints = 3 + 3 * 500 + (500 + 2 * 40) + 60  # split requests: at most half the partials
    assert plan_workspace_bytes(500, 32, 40) == -(-ints * 4 // 256) * 256 + 3 * 40 * 32 * 513 * 4


@library
def test_the_plan_shrinks_to_the_workspace_and_is_left_out_without_one():
    fits_16 = plan_workspace_bytes(40, 128, 16)
    assert choose_plan_pieces(40, 128, True, slots=264, workspace_capacity=fits_16) == 16
    assert choose_plan_pieces(40, 128, True, slots=264, workspace_capacity=0) == 0
    assert choose_plan_pieces(0, 128, True, slots=264, workspace_capacity=BIG) == 0


@library
def test_a_step_plan_serves_small_batches_and_sizes_the_workspace_for_partials_alone():
    """A plan made once a step keeps its ints outside the workspace and has no kernel on each call's
    path, so it is made for batches of 4 to 31, which the in-call plan leaves to the host's count."""
    assert choose_plan_pieces(4, 16, True, slots=264, workspace_capacity=BIG, step_plan=True) == 264
    assert choose_plan_pieces(31, 128, True, slots=264, workspace_capacity=BIG, step_plan=True) == 66
    assert choose_plan_pieces(3, 16, True, slots=264, workspace_capacity=BIG, step_plan=True) == 0
    assert choose_plan_pieces(0, 16, True, slots=264, workspace_capacity=BIG, step_plan=True) == 0
    assert plan_partials_bytes(32, 40) == 3 * 40 * 32 * 513 * 4
    exact = plan_partials_bytes(128, 16)  # too small for the in-call plan's ints beside them
    assert choose_plan_pieces(40, 128, True, slots=264, workspace_capacity=exact, step_plan=True) == 16
    assert choose_plan_pieces(40, 128, True, slots=264, workspace_capacity=exact) == 8


@library
@settings(max_examples=300, deadline=None)
@given(
    batch=st.integers(0, 70000),
    rows=st.integers(1, 1024),
    fp8=st.booleans(),
    slots=st.integers(1, 2000),
    capacity=st.integers(0, 1 << 32),
    step_plan=st.booleans(),
)
def test_plan_pieces_always_fit(batch, rows, fp8, slots, capacity, step_plan):
    """Plans made in the call and once a step: only for batches past their threshold, within the
    piece bound, the workspace (the step plan's ints live outside it) and the grid's y bound."""
    pieces = choose_plan_pieces(batch, rows, fp8, slots, capacity, step_plan=step_plan)
    assert pieces == 0 or batch >= (STEP_PLAN_MIN_BATCH if step_plan else PLAN_MIN_BATCH)
    assert 0 <= pieces <= min(MAX_PLAN_PIECES, max(1, slots))
    need = plan_partials_bytes(rows, pieces) if step_plan else plan_workspace_bytes(batch, rows, pieces)
    assert pieces == 0 or need <= capacity
    assert pieces == 0 or batch + 2 * pieces <= 65535  # the decode grid's y spans the plan's items


@library
def test_no_plan_where_its_items_would_pass_the_grid_bound():
    assert choose_plan_pieces(65535, 16, True, slots=264, workspace_capacity=BIG) == 0


def plan_counts(lengths: list[int], pieces: int) -> list[int]:
    """The split count of each request in the GPU's plan, as tests/plan_oracle.py writes its rules."""
    from plan_oracle import counts_in, expected_plan

    return counts_in(expected_plan(lengths, pieces, 1 << 30), len(lengths))


def test_the_plan_keeps_an_equal_batch_that_fills_a_wave_whole():
    # 64 requests of 256 tiles over 66 CTAs: one wave uncut. A target of the batch's tiles over the
    # pieces (248) cut every request into 248 + 8 and ran a second wave.
    assert plan_counts([8192] * 64, 66) == [1] * 64


def test_the_plan_cuts_a_long_request_among_short_ones_into_many():
    counts = plan_counts([32768] + [1024] * 31, 396)
    assert counts[0] >= 64 and max(counts[1:]) <= 4


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 1 << 17), min_size=1, max_size=300),
    pieces=st.integers(1, 1200),
)
def test_the_plan_stays_within_its_layout(lengths, pieces):
    """Whatever the lengths, the plan's items, partials and split requests fit the layout the launcher
    sizes the workspace for (expected_plan asserts the bounds), and every request keeps 1..256 splits."""
    counts = plan_counts(lengths, pieces)
    assert all(1 <= c <= MAX_KV_SPLITS for c in counts)
    assert all(c == 1 for n, c in zip(lengths, counts) if n <= 32)  # one tile is never cut


def test_the_formulas_are_read_from_a_loaded_library_only(monkeypatch):
    monkeypatch.setattr(torch.ops, "mla_backend", types.SimpleNamespace())  # a process with no library
    with pytest.raises(RuntimeError, match="plan_ints is the kernel library's, and no library is loaded"):
        plan_ints(3, 8)


@library
def test_python_takes_the_plans_size_from_the_library(monkeypatch):
    """The step plan's buffer check asks the library: exactly plan_ints passes, one int less fails, and
    a library that counted one more would fail the same buffer (the library's side alone decides)."""
    need = plan_ints(3, MAX_PLAN_PIECES)
    assert need == torch.ops.mla_backend.plan_ints(3, MAX_PLAN_PIECES)
    _check_plan_buffer(torch.zeros(need, dtype=torch.int32), 3)
    with pytest.raises(ValueError, match=f"buffer holds {need - 1} ints, a plan of 3 requests may need {need}"):
        _check_plan_buffer(torch.zeros(need - 1, dtype=torch.int32), 3)
    monkeypatch.setattr(torch.ops.mla_backend, "plan_ints", lambda batch, pieces: need + 1)
    with pytest.raises(ValueError, match=f"may need {need + 1}"):
        _check_plan_buffer(torch.zeros(need, dtype=torch.int32), 3)


@library
def test_the_schedule_ops_refuse_arguments_outside_their_formulas():
    ops = torch.ops.mla_backend
    with pytest.raises(RuntimeError, match="memory-safety invariant: rows .* must be 1..1024"):
        ops.schedule(4, 0, True, 100, 264, BIG, False)
    with pytest.raises(RuntimeError, match="memory-safety invariant: slots .* must be 1"):
        ops.num_splits(4, 16, True, 100, 0, BIG)
    with pytest.raises(RuntimeError, match="memory-safety invariant: plan_pieces must be 0..4096"):
        ops.plan_ints(4, 4097)
