"""Verdicts on an engine run's float64 decode check: the summary of every checked call
(integration/engines/vllm_decode_checker.py's DecodeChecker.summary, or the merged ranks' summaries;
the SGLang check's summary), judged for coverage and tolerance; and the selftest's verdict (a check
on corrupted outputs must fail)."""

from __future__ import annotations

import torch

from integration.judges.decode_check import MIN_VISIBLE_KEYS
from mla_backend.reference import ROW_ERROR_TOLERANCE

MIN_CHECKED_CALLS = 4  # forward_mqa calls recomputed in float64 per engine run


def judge_decode_check(check: dict, spec: dict) -> tuple[bool, str]:
    """forward_mqa vs float64 on real decode calls: enough of them, on every MLA layer that decoded
    (a family's count: LongCat's two a block, Kimi-Linear's hybrid one of two layers, a drafter's
    after the target's), through graph replays when graphs are on, within the row tolerance; our
    backend's LSE too."""
    worst = max(check["max_rel_error"].values(), default=None)
    wanted = {
        "calls": MIN_CHECKED_CALLS,
        "layers": 1,
        "graph calls": 1 if spec["graphs"] else 0,
        "LSE calls": 1 if spec["backend"] == "CUSTOM" else 0,
    }
    have = {
        "calls": check["checked_calls"],
        "layers": len(check["checked_layers"]),
        "graph calls": check["checked_graph_calls"],
        "LSE calls": check["lse_checked_calls"],
    }
    short = [f"{name} {have[name]} < {n}" for name, n in wanted.items() if have[name] < n]
    unchecked = sorted(set(check["calls_by_layer"]) - set(check["checked_layers"]))
    if unchecked:
        short.append(f"layers that decoded unchecked: {unchecked}")
    if short or check["check_problems"] or worst is None:
        return False, f"forward_mqa not checked enough: {short} {check['check_problems']}"
    ok = worst <= check["tolerance"] and check["lse_ok"]
    lse = (
        f", LSE max err {check['max_lse_error']:.1e}{'' if check['lse_ok'] else ' OVER'}"
        if check["max_lse_error"] is not None
        else ""
    )
    return ok, (
        f"forward_mqa max rel err {worst:.1e} (tol {check['tolerance']:.0e}; {have['calls']} calls, "
        f"{have['graph calls']} replayed, {check['checked_rows']} rows of >= {MIN_VISIBLE_KEYS} keys){lse}"
    )


def judge_selftest(check: dict, spec: dict) -> tuple[bool, str]:
    """The forward_mqa check on corrupted outputs (settings.SELFTEST_CORRUPTION): it must check enough
    calls and fail them all. True where it caught the corruption."""
    passed, note = judge_decode_check(check, spec)
    worst = max(check["max_rel_error"].values(), default=0.0)
    caught = not passed and worst > check["tolerance"] and not check["lse_ok"] and check["checked_calls"] > 0
    return caught, f"check {'failed, as it must' if caught else 'DID NOT CATCH the corruption'}: {note}"


def judge_sglang_check(summary: dict, fp8: bool) -> tuple[bool, str]:
    """The SGLang check's summary (integration/engines/sglang_decode_check.py): rows were checked and
    the worst is within the kernel's tolerance."""
    tolerance = ROW_ERROR_TOLERANCE[torch.float8_e4m3fn if fp8 else torch.bfloat16]
    ok = summary["rows"] > 0 and summary["max_rel_err"] <= tolerance
    note = (
        f"max rel err {summary['max_rel_err']:.1e} (tol {tolerance:.0e}; {summary['calls']} calls, "
        f"{summary['rows']} rows of >= {MIN_VISIBLE_KEYS} keys)"
    )
    return ok, note
