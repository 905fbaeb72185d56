"""The end-to-end pass rules (integration/run_e2e.py) on hand-made token streams."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from run_e2e import TIE_NATS, agreed_steps, agreement  # noqa: E402

REF = [[1, 2, 3, 4], [5, 6, 7, 8]]
WIDE = [[1.0] * 4, [1.0] * 4]


def test_divergence_before_any_tie_fails():
    verdict = agreement([[1, 2, 9, 9], [5, 6, 7, 8]], REF, WIDE)
    assert verdict["failures"] == [(0, 2, 4)] and not verdict["ok"] and verdict["identical"] == 1


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
