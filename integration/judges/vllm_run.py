"""A vLLM run of ours judged whole: its greedy tokens against vLLM's own backends (the tie rule, or
the calibrated rule where vLLM breaks it itself), the route it took, its float64 decode check and,
with speculative decoding, its speculation. ``refs`` are keyed by backend name + KV dtype, repeats
as ``key#2`` ... (integration/engines/vllm_references.py runs them)."""

from __future__ import annotations

from integration.judges.decode_verdict import judge_decode_check
from integration.judges.speculation import judge_speculation
from integration.judges.tokens import agreed_steps, agreement, closest_gaps
from integration.settings import PEERS, REFERENCES


def runs_of(refs: dict[str, dict], key: str) -> list[dict]:
    """Every run of one reference engine: ``key``, then its repeats ``key#2``, ``key#3``, ..."""
    return [refs[key]] + [refs[k] for k in sorted(refs) if k.startswith(key + "#")]


def mean_agreed_steps(tokens: list[list[int]], runs: list[dict]) -> float:
    return sum(agreed_steps(tokens, run["tokens"]) for run in runs) / len(runs)


def rule_calibration(refs: dict[str, dict], kv: str) -> dict:
    """Does vLLM's own second backend pass the tie rule against the reference, on this model, by the
    reference's gaps (and its repeats) alone?

    With an FP8 cache it need not: a tiny difference upstream flips the e4m3 rounding of new cache
    entries, and those 6% steps grow. Nor, with either cache, on a model whose router turns a last-bit
    difference into another expert (LongCat-Flash's small checkpoint: vLLM's two bf16 backends part
    at gaps well over TIE_NATS). Where vLLM fails its own rule, ours must instead stay with the
    reference at least as many greedy steps as vLLM's second backend does (averaged over the
    reference's runs when it ran more than once: FLASHMLA+spec does not repeat itself exactly)."""
    peer, ref_runs = refs[PEERS[kv][0] + kv], runs_of(refs, PEERS[kv][1] + kv)
    repeats = [run["tokens"] for run in ref_runs[1:]]
    gaps = closest_gaps(*(run.get("gaps") for run in ref_runs))  # the peer's own gaps left out: it is judged
    return {
        "peer": PEERS[kv][0],
        "ref": PEERS[kv][1],
        "rule_holds": agreement(peer["tokens"], ref_runs[0]["tokens"], gaps, *repeats)["ok"],
        "peer_agreed_steps": mean_agreed_steps(peer["tokens"], ref_runs),
    }


def judge(result: dict, refs: dict[str, dict], expect_route: str) -> tuple[bool, list[str]]:
    """Tokens vs the references (tie rule, or the calibrated fallback rule); forward_mqa vs float64;
    the expected route; and, with speculative decoding, calls with 1 + k query tokens. ``refs`` ran
    with the same speculative config as ``result``."""
    notes, ok = [], True
    kv = result["spec"]["kv_cache_dtype"]
    if expect_route == "fallback":  # vLLM's Triton MLA kernel through our plumbing: judged against TRITON_MLA
        triton = refs["TRITON_MLA" + kv]
        verdict = agreement(result["tokens"], triton["tokens"], triton["gaps"])
        result.setdefault("agreement", {})["TRITON_MLA"] = verdict
        ok &= verdict["ok"]
        notes.append(
            f"TRITON_MLA: {verdict['identical']}/{len(result['tokens'])} identical"
            + ("" if verdict["ok"] else f", tie rule broken {verdict['failures']}")
        )
        return finish_judging(result, expect_route, ok, notes)
    calibration = rule_calibration(refs, kv)
    for ref_name in REFERENCES[kv]:
        ref, *repeats = runs_of(refs, ref_name + kv)
        others = [refs[name + kv] for name in REFERENCES[kv] if name != ref_name]
        gaps = closest_gaps(*(run.get("gaps") for run in (ref, *repeats, *others)))
        tied = [run["tokens"] for run in (*others, *repeats)]
        verdict = agreement(result["tokens"], ref["tokens"], gaps, *tied)
        verdict["agreed_steps"] = mean_agreed_steps(result["tokens"], [ref, *repeats])
        result.setdefault("agreement", {})[ref_name] = verdict
        note = f"{ref_name}: {verdict['identical']}/{len(result['tokens'])} identical"
        if calibration["rule_holds"] or ref_name not in (calibration["ref"], calibration["peer"]):
            ok &= verdict["ok"]
            note += "" if verdict["ok"] else f", tie rule broken {verdict['failures']}"
        else:  # held to the steps vLLM's pair agree on (ref and peer: both references where two ran)
            partner = calibration["peer"] if ref_name == calibration["ref"] else calibration["ref"]
            ok &= verdict["ok"] or verdict["agreed_steps"] >= calibration["peer_agreed_steps"]
            note += (
                f", {verdict['agreed_steps']:g} steps agreed vs {calibration['peer_agreed_steps']:g} for vLLM's "
                f"{partner} (which breaks the tie rule itself)"
            )
        notes.append(note)
    return finish_judging(result, expect_route, ok, notes)


def finish_judging(result: dict, expect_route: str, ok: bool, notes: list[str]) -> tuple[bool, list[str]]:
    """The parts every run is judged on: the route, forward_mqa vs float64, speculation."""
    if result["routes"] != [expect_route]:
        ok = False
        notes.append(f"route {result['routes']} != {expect_route}")
    check_ok, check_note = judge_decode_check(result["decode_check"], result["spec"])
    ok &= check_ok
    notes.append(check_note)
    if result["spec"]["spec_tokens"]:
        spec_ok, spec_note = judge_speculation(result)
        ok &= spec_ok
        notes.append(spec_note)
    return ok, notes


def non_speculative_note(result: dict, plain_refs: dict[str, dict], kv: str) -> str:
    """How far a speculative run's greedy tokens follow the first reference decoding without
    speculation (reported; verification changes every layer's numerics, so this is not the rule)."""
    name = REFERENCES[kv][0]
    plain = plain_refs.get(name + kv)
    if plain is None:
        return "no non-speculative reference"
    verdict = agreement(result["tokens"], plain["tokens"], plain["gaps"])
    return (
        f"vs {name} without speculation: {verdict['identical']}/{len(plain['tokens'])} identical, "
        f"tie rule {'holds' if verdict['ok'] else 'broken'}"
    )
