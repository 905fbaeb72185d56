"""Runs split over GPUs (tensor and decode context parallelism): every rank's float64 decode check,
and the greedy tokens against ours on one GPU, or against vLLM's PARALLEL_PEER at the same layout."""

from __future__ import annotations

from integration.judges.decode_verdict import judge_decode_check
from integration.judges.tokens import agreement, significantly_fewer_steps, steps_per_prompt

PARALLEL_PEER = "FLASHMLA"  # vLLM's backend run at the same layouts: how far a split moves its tokens


def judge_every_rank(result: dict) -> tuple[bool, list[str]]:
    """A run split over GPUs: forward_mqa against float64 on every rank (judge_decode_check), and
    every rank reporting."""
    check = result["decode_check"]
    ok, check_note = judge_decode_check(check, result["spec"])
    notes = [check_note]
    if check.get("ranks") != result["spec"]["tp"]:
        ok = False
        notes.append(f"{check.get('ranks')} ranks checked of {result['spec']['tp']}")
    return ok, notes


def judge_parallel(result: dict, single: dict, peer: dict, peer_single: dict) -> tuple[bool, list[str]]:
    """Ours split over GPUs, in two parts.

    forward_mqa on every rank against float64 (judge_decode_check; under DCP: each rank's partial
    output and the LSE the ranks merge). Greedy tokens against ours on one GPU under the tie rule;
    where vLLM's PARALLEL_PEER breaks that rule itself between the same two layouts (an FP8 cache:
    the split changes upstream rounding, which flips e4m3 roundings of new cache entries), ours must
    instead not stay with its one-GPU tokens significantly fewer steps than the peer stays with its
    own (significantly_fewer_steps: per prompt, paired)."""
    ok, notes = judge_every_rank(result)
    ours = agreement(result["tokens"], single["tokens"], single["gaps"])
    note = f"vs ours on one GPU: {ours['identical']}/{len(single['tokens'])} identical"
    if ours["ok"]:
        note += ", tie rule holds"
    elif "tokens" in peer and "tokens" in peer_single:
        theirs = agreement(peer["tokens"], peer_single["tokens"], peer_single["gaps"])
        ours_steps = steps_per_prompt(result["tokens"], single["tokens"])
        their_steps = steps_per_prompt(peer["tokens"], peer_single["tokens"])
        worse = significantly_fewer_steps(ours_steps, their_steps)
        ok &= not theirs["ok"] and not worse
        note += (
            f", tie rule broken {ours['failures']}; {sum(ours_steps)} steps agreed vs {sum(their_steps)} for "
            f"{PARALLEL_PEER} between the same layouts (which {'keeps' if theirs['ok'] else 'breaks'} the rule)"
            f"{': significantly fewer' if worse else ''}"
        )
    else:
        ok = False
        note += f", tie rule broken {ours['failures']}; no {PARALLEL_PEER} run to compare: {peer.get('error')}"
    notes.append(note)
    return ok, notes


def judge_flashmla_parallel(result: dict, peer: dict) -> tuple[bool, list[str]]:
    """FlashMLA's route split over GPUs: every rank's forward_mqa against float64 at FlashMLA's bar,
    and the tokens against vLLM's FLASHMLA at the same layout, which runs the same kernel with the
    same plan, under the tie rule."""
    ok, notes = judge_every_rank(result)
    if "tokens" not in peer:
        return False, [*notes, f"no {PARALLEL_PEER} run at this layout: {peer.get('error')}"]
    verdict = agreement(result["tokens"], peer["tokens"], peer["gaps"])
    ok &= verdict["ok"]
    notes.append(
        f"vs {PARALLEL_PEER} at the same layout: {verdict['identical']}/{len(peer['tokens'])} identical"
        + ("" if verdict["ok"] else f", tie rule broken {verdict['failures']}")
    )
    return ok, notes
