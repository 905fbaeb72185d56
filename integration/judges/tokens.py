"""The tie rule on greedy tokens, and the token comparisons it rests on.

Two correct backends' greedy tokens part where two logits nearly tie. So ours must agree with a
reference up to the reference's first tie: a step where its top-2 logprob gap is below TIE_NATS (the
smallest gap vLLM's backends measured there, where several ran: closest_gaps), or where vLLM
disagrees with itself there (a second backend, or the same backend run again, differs).
"""

from __future__ import annotations

import math
import statistics

TIE_NATS = 0.1


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first step where two token streams differ; a stream that stops early differs where it stops."""
    step = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if step is None and len(a) != len(b):
        return min(len(a), len(b))
    return step


def closest_gaps(*runs_gaps: list[list[float]] | None) -> list[list[float]]:
    """Per prompt and step, the smallest top-2 gap any of the reference runs measured (runs without
    gaps skipped). Two correct backends measure one step's gap differently (bf16 logits: 0.156 nats
    by FLASH_ATTN_MLA where TRITON_MLA measured 0.031, Kimi-K2 at 64 heads), so where one of vLLM's
    own backends sees a near tie, the step is one. Past the first step where two runs' tokens part,
    the rule already counts a tie, so what their gaps hold there does not matter."""
    measured = [gaps for gaps in runs_gaps if gaps is not None]
    if not measured:
        raise ValueError("no reference run has gaps")
    closest = []
    for prompt in zip(*measured, strict=True):
        steps = max(len(g) for g in prompt)
        closest.append([min(g[k] for g in prompt if k < len(g)) for k in range(steps)])
    return closest


def agreement(
    ours: list[list[int]], ref: list[list[int]], ref_gaps: list[list[float]], *others: list[list[int]]
) -> dict:
    """Per prompt: the first step where tokens differ and the first tie of the reference: a top-2
    gap below TIE_NATS, or a step where the reference and another run of vLLM's (its second
    backend, or the same backend run again) differ: vLLM itself is undecided there."""
    return agreement_before(ours, ref, first_ties(ref, ref_gaps, *others))


def agreement_before(ours: list[list[int]], ref: list[list[int]], ties: list[int]) -> dict:
    """agreement's verdict with the reference's first ties given per prompt (``ties``)."""
    if len(ours) != len(ref):
        raise ValueError(f"{len(ours)} outputs for {len(ref)} reference prompts")
    divergent, failures = [], []
    for i, (a, b, first_tie) in enumerate(zip(ours, ref, ties, strict=True)):
        differ = first_difference(a, b)
        if differ is None:
            continue
        divergent.append((i, differ, first_tie))
        if differ < first_tie:
            failures.append((i, differ, first_tie))
    return {"identical": len(ours) - len(divergent), "divergent": divergent, "failures": failures, "ok": not failures}


def first_ties(ref: list[list[int]], ref_gaps: list[list[float]], *others: list[list[int]]) -> list[int]:
    """Per prompt, the reference's first tie (agreement's): its first top-2 gap below TIE_NATS, or the
    first step where another run of the reference parts from it; its length where there is none."""
    gap_ties = [next((k for k, gap in enumerate(gaps) if gap < TIE_NATS), len(b)) for b, gaps in zip(ref, ref_gaps)]
    return ties_with_repeats(ref, gap_ties, [(i, other[i]) for other in others for i in range(len(ref))])


def ties_with_repeats(ref: list[list[int]], ties: list[int], repeats: list[tuple[int, list[int]]]) -> list[int]:
    """``ties`` brought forward to the first step where a repeat of a prompt (its index, its tokens:
    the reference's backend answering the same prompt again, one answer of many) parts from the
    reference: the engine is undecided there."""
    ties = list(ties)
    for prompt, tokens in repeats:
        parts = first_difference(ref[prompt], tokens)
        if parts is not None:
            ties[prompt] = min(ties[prompt], parts)
    return ties


def steps_per_prompt(ours: list[list[int]], ref: list[list[int]]) -> list[int]:
    """Per prompt, the greedy steps before the first difference (all of them where none)."""
    return [len(b) if (k := first_difference(a, b)) is None else k for a, b in zip(ours, ref)]


def agreed_steps(ours: list[list[int]], ref: list[list[int]]) -> int:
    return sum(steps_per_prompt(ours, ref))


def significantly_fewer_steps(ours: list[int], peer: list[int], z: float = 2.0) -> bool:
    """Whether ours stays with its reference fewer steps than the peer with its own, beyond chance:
    the mean per-prompt difference below -z standard errors. (A plain "ours >= peer" would fail half
    the time for two backends of equal quality: FP8 divergence points are noisy.)"""
    diffs = [a - b for a, b in zip(ours, peer, strict=True)]
    mean = statistics.fmean(diffs)
    spread = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return mean < 0 and mean < -z * spread


def calibrated_agreement(
    ours: list[list[int]],
    ref: list[list[int]],
    ref_gaps: list[list[float]],
    peer: list[list[int]],
    *repeats: list[list[int]],
) -> dict:
    """The tie rule against ``ref`` (``repeats``: the reference run again another way, whose
    disagreements with it are ties too); where the engine's own second backend (``peer``) breaks it
    (FP8: one e4m3 rounding of a new cache entry that flips grows into a different token), ours also
    passes by staying with ``ref`` at least as many greedy steps as the peer."""
    verdict = agreement(ours, ref, ref_gaps, *repeats)
    verdict["rule_holds"] = agreement(peer, ref, ref_gaps, *repeats)["ok"]
    verdict["agreed_steps"], verdict["peer_agreed_steps"] = agreed_steps(ours, ref), agreed_steps(peer, ref)
    if not verdict["rule_holds"]:
        verdict["ok"] = verdict["ok"] or verdict["agreed_steps"] >= verdict["peer_agreed_steps"]
    return verdict
