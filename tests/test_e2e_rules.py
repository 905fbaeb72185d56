"""The end-to-end pass rules (integration/run_e2e.py) on hand-made token streams."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from run_e2e import TIE_NATS, agreed_steps, agreement, rule_calibration, runs_of  # noqa: E402

REF = [[1, 2, 3, 4], [5, 6, 7, 8]]
WIDE = [[1.0] * 4, [1.0] * 4]


def test_divergence_before_any_tie_fails():
    verdict = agreement([[1, 2, 9, 9], [5, 6, 7, 8]], REF, WIDE)
    assert verdict["failures"] == [(0, 2, 4)] and not verdict["ok"] and verdict["identical"] == 1


def test_an_empty_or_short_output_is_a_divergence_where_it_stops():
    for short in ([], [1, 2]):
        verdict = agreement([short, [5, 6, 7, 8]], REF, WIDE)
        assert verdict["failures"] == [(0, len(short), 4)] and not verdict["ok"]
    assert agreed_steps([[1, 2], [5, 6, 7, 8]], REF) == 6


def test_a_missing_prompt_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="1 outputs for 2 reference prompts"):
        agreement([[1, 2, 3, 4]], REF, WIDE)


def test_divergence_at_a_near_tie_of_the_reference_passes():
    gaps = [[1.0, 1.0, TIE_NATS / 2, 1.0], [1.0] * 4]
    assert agreement([[1, 2, 9, 9], [5, 6, 7, 8]], REF, gaps)["ok"]
    # the same divergence one step earlier than the near tie fails
    assert not agreement([[1, 9, 9, 9], [5, 6, 7, 8]], REF, gaps)["ok"]


def test_a_step_where_the_two_references_differ_is_a_tie():
    second = [[1, 2, 7, 7], [5, 6, 7, 8]]  # vLLM's second backend leaves the first at step 2
    assert agreement([[1, 2, 9, 9], [5, 6, 7, 8]], REF, WIDE, second)["ok"]
    assert not agreement([[1, 9, 9, 9], [5, 6, 7, 8]], REF, WIDE, second)["ok"]
    assert not agreement([[5, 6, 7, 8], [5, 6, 9, 8]], REF, WIDE, REF)["ok"]  # references agree: no tie


def test_agreed_steps_counts_the_common_prefix_of_each_prompt():
    assert agreed_steps([[1, 2, 9, 9], [5, 6, 7, 8]], REF) == 2 + 4


def test_a_step_where_a_repeated_reference_run_differs_is_a_tie():
    repeat = [[1, 2, 3, 4], [5, 6, 9, 9]]  # the same reference engine, run again, leaves itself at step 2
    ours = [[1, 2, 3, 4], [5, 6, 8, 8]]
    assert not agreement(ours, REF, WIDE)["ok"]
    assert agreement(ours, REF, WIDE, repeat)["ok"]
    assert not agreement([[1, 2, 3, 4], [5, 8, 8, 8]], REF, WIDE, repeat)["ok"]  # earlier than that: fails


def test_calibration_averages_over_the_reference_runs():
    run = lambda tokens: {"tokens": tokens, "gaps": WIDE}  # noqa: E731
    refs = {"FLASHMLAfp8": run(REF), "FLASHMLAfp8#2": run([[1, 2, 3, 4], [5, 6, 0, 0]]),
            "TRITON_MLAfp8": run([[1, 2, 3, 4], [5, 6, 0, 0]])}
    assert [r["tokens"] for r in runs_of(refs, "FLASHMLAfp8")] == [REF, [[1, 2, 3, 4], [5, 6, 0, 0]]]
    calibration = rule_calibration(refs, "fp8")
    assert calibration["peer_agreed_steps"] == (6 + 8) / 2
    assert calibration["rule_holds"]  # the peer leaves run 1 exactly where run 2 does: undecided
