"""Verdicts on data-parallel attention (integration/dp_e2e.py): each rank decodes its own requests with
all query heads, so each rank's float64 decode check is judged whole, as one GPU's is; a rank that
checked nothing (no requests reached it, or its check never ran) fails the run."""

from __future__ import annotations

from collections.abc import Callable

from integration.judges.decode_verdict import judge_decode_check, judge_selftest


def each_rank(ranks: dict[int, dict], dp: int, judge: Callable[[dict], tuple[bool, str]]) -> tuple[bool, str]:
    """``judge`` on each of the ``dp`` ranks' summaries; True where every rank passed it. A rank
    without a summary, or a summary of a rank beyond ``dp``, fails."""
    ok, notes = True, []
    for rank in range(dp):
        if rank not in ranks:
            ok = False
            notes.append(f"rank {rank}: checked nothing (no summary)")
            continue
        rank_ok, note = judge(ranks[rank])
        ok &= rank_ok
        notes.append(f"rank {rank}: {note}")
    strays = sorted(set(ranks) - set(range(dp)))
    if strays:
        ok = False
        notes.append(f"summaries of ranks {strays} beyond the {dp} data-parallel ranks")
    return ok, "; ".join(notes)


def judge_every_dp_rank(ranks: dict[int, dict], spec: dict, dp: int) -> tuple[bool, str]:
    """judge_decode_check on each of the ``dp`` ranks' own summaries (vllm_dp.rank_summaries)."""
    return each_rank(ranks, dp, lambda summary: judge_decode_check(summary, spec))


def judge_selftest_every_dp_rank(ranks: dict[int, dict], spec: dict, dp: int) -> tuple[bool, str]:
    """Outputs corrupted on every rank (settings.SELFTEST_CORRUPTION): each rank's check must catch it
    (judge_selftest). True where all ``dp`` ranks did."""
    return each_rank(ranks, dp, lambda summary: judge_selftest(summary, spec))
