"""The end-to-end pass rules (integration/judges/, the parts of integration/run_e2e.py) on hand-made
token streams, and the engine plumbing's CPU-checkable parts (integration/engines/)."""

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the integration package, from the checkout
from absent_packages import absent_packages  # noqa: E402
from oracle import naive_decode_problem  # noqa: E402

from integration.judges.decode_check import MIN_VISIBLE_KEYS, DecodeCall, check_call, own_keys  # noqa: E402
from integration.judges.decode_verdict import MIN_CHECKED_CALLS, judge_decode_check  # noqa: E402
from integration.judges.parallel import judge_flashmla_parallel, judge_parallel  # noqa: E402
from integration.judges.speculation import judge_speculation  # noqa: E402
from integration.judges.tokens import (  # noqa: E402
    TIE_NATS,
    agreed_steps,
    agreement,
    agreement_before,
    closest_gaps,
    first_ties,
    significantly_fewer_steps,
    ties_with_repeats,
)
from integration.judges.vllm_run import judge, rule_calibration, runs_of  # noqa: E402
from integration.run_e2e import mtp_specs, parallel_specs  # noqa: E402
from integration.sparse_e2e import drafting_reference, peer_calibrated, peer_calibration  # noqa: E402
from mla_backend.inputs import make_paged_problem  # noqa: E402
from mla_backend.reference import ROW_ERROR_TOLERANCE  # noqa: E402

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


def test_a_near_tie_measured_by_either_reference_backend_is_a_tie():
    """Kimi-K2 at 64 heads, bf16: FLASH_ATTN_MLA measured 0.156 nats at the step where ours parted,
    TRITON_MLA 0.031 there; the step is a tie by the smaller gap, and only there."""
    first = [[1.0, 1.0, 0.156, 1.0], [1.0] * 4]
    second = [[1.0, 1.0, 0.031, 1.0], [1.0, 0.5, 1.0, 1.0]]
    gaps = closest_gaps(first, None, second)
    assert gaps == [[1.0, 1.0, 0.031, 1.0], [1.0, 0.5, 1.0, 1.0]]
    assert not agreement([[1, 2, 9, 9], [5, 6, 7, 8]], REF, first)["ok"]
    assert agreement([[1, 2, 9, 9], [5, 6, 7, 8]], REF, gaps)["ok"]
    assert not agreement([[1, 9, 9, 9], [5, 6, 7, 8]], REF, gaps)["ok"]  # one step before it: fails


def test_a_drafting_run_is_judged_with_vllms_plain_and_peer_runs_as_the_reference_again():
    """GLM-5 with MTP k=2 on the H200: FLASHMLA_SPARSE's drafting run measured 0.125 nats where its plain
    run measured 0.0; the step is a tie by the plain run's gap, and a step where the peer parts from the
    drafting reference is one too. A failed run (no tokens) is left out."""
    drafting = {"tokens": REF, "gaps": WIDE}
    plain = {"tokens": REF, "gaps": [[1.0, 1.0, 0.0, 1.0], [1.0] * 4]}
    peer = {"tokens": [[1, 2, 3, 4], [5, 7, 7, 8]], "gaps": WIDE}
    gaps, others = drafting_reference(drafting, plain, peer)
    assert agreement([[1, 2, 9, 9], [5, 6, 9, 8]], REF, gaps, *others)["ok"]
    assert not agreement([[1, 9, 9, 9], [5, 6, 7, 8]], REF, gaps, *others)["ok"]  # before the tie: fails
    alone = drafting_reference(drafting, {"error": "start-up failed"}, {})
    assert alone == (WIDE, [])
    assert not agreement([[1, 2, 9, 9], [5, 6, 7, 8]], REF, *alone[:1])["ok"]


def test_a_bf16_sparse_run_is_held_to_the_peers_steps_only_where_the_peer_breaks_the_rule():
    """GLM-5 on the H200: FLASH_ATTN_MLA_SPARSE parted from FLASHMLA_SPARSE at a 0.41-nat step; ours,
    parting before any tie, then passes by the steps it keeps, unless significantly fewer."""
    ref = {"tokens": [[1, 2, 3, 4]] * 4, "gaps": [[1.0] * 4] * 4}
    ours = [[1, 9, 9, 9], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]]
    verdict = agreement(ours, ref["tokens"], ref["gaps"])
    assert not verdict["ok"]
    breaking = peer_calibration(ref, {"tokens": [[1, 2, 3, 4], [1, 2, 9, 9], [1, 2, 3, 9], [1, 2, 3, 4]]})
    assert breaking == [4, 2, 3, 4]
    assert peer_calibrated(verdict, ours, ref["tokens"], breaking)
    keeping = peer_calibration(ref, {"tokens": ref["tokens"]})  # the peer holds the rule: the rule judges
    assert keeping is None
    assert not peer_calibrated(verdict, ours, ref["tokens"], keeping)
    worse = [[9] * 4, [1, 9, 9, 9], [9] * 4, [1, 9, 9, 9]]  # parts at once everywhere: significantly fewer
    assert not peer_calibrated(agreement(worse, ref["tokens"], ref["gaps"]), worse, ref["tokens"], breaking)


def test_closest_gaps_keeps_the_longer_run_and_needs_one_with_gaps():
    assert closest_gaps([[0.5, 0.2]], [[0.3]]) == [[0.3, 0.2]]
    with pytest.raises(ValueError, match="no reference run has gaps"):
        closest_gaps(None, None)


def test_agreed_steps_counts_the_common_prefix_of_each_prompt():
    assert agreed_steps([[1, 2, 9, 9], [5, 6, 7, 8]], REF) == 2 + 4


def test_first_ties_stop_at_the_first_low_gap_or_the_first_step_a_repeat_parts():
    gaps = [[1.0, 1.0, TIE_NATS / 2, 1.0], [1.0] * 4]
    repeat = [[1, 2, 3, 4], [5, 6, 7, 9]]  # the reference again parts from itself at prompt 1, step 3
    assert first_ties(REF, gaps, repeat) == [2, 3] and first_ties(REF, WIDE) == [4, 4]


def test_a_served_repeat_of_one_prompt_brings_that_prompt_s_tie_forward_and_no_other():
    """Repeats come as (prompt, tokens), any number per prompt: the reference's backend answering
    copies of a prompt under a server. Ours parting at step 1 of prompt 1 passes once a repeat of
    prompt 1 parts there or earlier, not where one parts later or on another prompt."""
    ours = [[1, 2, 3, 4], [5, 9, 9, 9]]
    ties = first_ties(REF, WIDE)
    assert not agreement_before(ours, REF, ties)["ok"]
    later, other = (1, [5, 6, 0, 0]), (0, [1, 0, 0, 0])
    assert ties_with_repeats(REF, ties, [later, other, (1, REF[1])]) == [1, 2]
    assert not agreement_before(ours, REF, ties_with_repeats(REF, ties, [later, other]))["ok"]
    assert agreement_before(ours, REF, ties_with_repeats(REF, ties, [later, (1, [5, 0, 0, 0])]))["ok"]
    assert agreement_before(ours, REF, ties) == agreement(ours, REF, WIDE)


def test_a_step_where_a_repeated_reference_run_differs_is_a_tie():
    repeat = [[1, 2, 3, 4], [5, 6, 9, 9]]  # the same reference engine, run again, leaves itself at step 2
    ours = [[1, 2, 3, 4], [5, 6, 8, 8]]
    assert not agreement(ours, REF, WIDE)["ok"]
    assert agreement(ours, REF, WIDE, repeat)["ok"]
    assert not agreement([[1, 2, 3, 4], [5, 8, 8, 8]], REF, WIDE, repeat)["ok"]  # earlier than that: fails


def test_calibration_averages_over_the_reference_runs():
    run = lambda tokens: {"tokens": tokens, "gaps": WIDE}  # noqa: E731
    refs = {
        "FLASHMLAfp8": run(REF),
        "FLASHMLAfp8#2": run([[1, 2, 3, 4], [5, 6, 0, 0]]),
        "TRITON_MLAfp8": run([[1, 2, 3, 4], [5, 6, 0, 0]]),
    }
    assert [r["tokens"] for r in runs_of(refs, "FLASHMLAfp8")] == [REF, [[1, 2, 3, 4], [5, 6, 0, 0]]]
    calibration = rule_calibration(refs, "fp8")
    assert calibration["peer_agreed_steps"] == (6 + 8) / 2
    assert calibration["rule_holds"]  # the peer leaves run 1 exactly where run 2 does: undecided


FLASH_3 = [[1, 2, 3, 4], [5, 9, 9, 9], [7, 7, 7, 7]]
TRITON_3 = [[1, 2, 3, 4], [5, 6, 7, 8], [7, 8, 8, 8]]  # with FLASH_3: 4 + 1 + 1 = 6 steps, parting at wide gaps


@pytest.mark.parametrize(
    "ours, ok",
    [
        (FLASH_3, True),  # the tie rule holds: one reference exactly, the other up to their parting
        ([[1, 2, 3, 9], [5, 9, 9, 9], [7, 8, 8, 8]], True),  # rule broken at prompt 0, 8 steps with each
        ([[1, 9, 9, 9], [5, 6, 9, 9], [7, 9, 9, 9]], False),  # rule broken, 3 and 4 steps: fewer than 6
    ],
    ids=["rule", "steps", "neither"],
)
def test_with_two_references_that_break_the_rule_between_them_ours_is_held_to_their_steps(ours, ok):
    """bf16: vLLM's two backends part at wide gaps (a router turning a last-bit difference into another
    expert), so ours must stay with each as many steps as they stay with each other."""
    wide = [[1.0] * 4] * 3
    refs = {
        "FLASH_ATTN_MLAauto": {"tokens": FLASH_3, "gaps": wide},
        "TRITON_MLAauto": {"tokens": TRITON_3, "gaps": wide},
    }
    assert not rule_calibration(refs, "auto")["rule_holds"]
    result = {
        "spec": {**SPEC, "kv_cache_dtype": "auto"},
        "tokens": ours,
        "routes": ["bundled"],
        "decode_check": summary(),
    }
    verdict, notes = judge(result, refs, "bundled")
    assert verdict == ok, notes
    assert all("steps agreed vs 6 for vLLM's" in note for note in notes[:2])


def test_with_two_references_that_keep_the_rule_the_tie_rule_alone_judges():
    refs = {"FLASH_ATTN_MLAauto": {"tokens": REF, "gaps": WIDE}, "TRITON_MLAauto": {"tokens": REF, "gaps": WIDE}}
    result = {"spec": {**SPEC, "kv_cache_dtype": "auto"}, "routes": ["bundled"], "decode_check": summary()}
    assert judge({**result, "tokens": REF}, refs, "bundled")[0]
    assert not judge({**result, "tokens": [[1, 2, 3, 4], [5, 6, 7, 9]]}, refs, "bundled")[0]


# --- the forward_mqa check (integration/judges/decode_check.py) ------------------------------------


def recorded_call(lengths, q_len=2, heads=4, damage=None, with_lse=True):
    """A forward_mqa call as the checker records it, with the oracle's outputs, optionally damaged."""
    problem = make_paged_problem(lengths, q_len, heads, page_size=16, seed=21)
    out, lse = naive_decode_problem(problem, 0.06, 1.5)
    out, lse = out.to(torch.bfloat16), lse.float()
    if damage == "scale":
        out = out * 1.05
    elif damage == "one row":
        out[0, -1, 1] = out[0, -1, 2]
    elif damage == "lse":
        lse = lse + 0.5
    tokens = len(lengths) * q_len
    return DecodeCall(
        layer="model.layers.0.self_attn",
        query=problem.query.reshape(tokens, heads, 576),
        kv_cache=problem.kv_cache,
        block_table=problem.block_tables,
        seq_lens=problem.seq_lens,
        num_decodes=len(lengths),
        q_len=q_len,
        bmm1=0.06,
        bmm2=1.5,
        out=out.reshape(tokens, heads, 512),
        lse=lse.reshape(tokens, heads) if with_lse else None,
    )


def test_check_call_passes_the_right_result_and_counts_rows_with_enough_keys():
    result = check_call(recorded_call([40, 16, 3]))
    # request 0: both tokens see >= 16 keys; request 1: only token 1 (16 keys; token 0 sees 15); request 2: none
    assert result.rows == (2 + 1) * 4
    assert result.out_error < 1e-2 and result.lse_ok and result.lse_error < 1e-5


@pytest.mark.parametrize("damage", ["scale", "one row"])
def test_check_call_catches_a_wrong_output(damage):
    assert check_call(recorded_call([40, 33], damage=damage)).out_error > ROW_ERROR_TOLERANCE[torch.float8_e4m3fn]


def test_check_call_catches_a_wrong_lse():
    assert not check_call(recorded_call([40, 33], damage="lse")).lse_ok


def rewrite_own_rows(call: DecodeCall) -> None:
    """What a drafter's later draft steps do within the engine step: new values in the rows its
    rejected tokens held (every new token after the first of each request)."""
    cache, page = call.kv_cache, call.kv_cache.shape[1]
    generator = torch.Generator(device=cache.device).manual_seed(5)
    for request, seq_len in enumerate(call.seq_lens[: call.num_decodes].tolist()):
        for position in range(seq_len - call.q_len + 1, seq_len):
            page_id = int(call.block_table[request, position // page])
            fresh = torch.randn(cache.shape[-1], generator=generator, device=cache.device)
            cache[page_id, position % page] = fresh.to(cache.dtype)


def test_a_call_is_judged_on_its_own_rows_as_they_were_when_it_ran():
    call = recorded_call([40, 33], q_len=4)
    call.own_keys = own_keys(call.kv_cache, call.block_table, call.seq_lens, call.q_len)
    rewrite_own_rows(call)
    assert check_call(call).out_error < 1e-2 and check_call(call).lse_ok
    call.own_keys = None  # read from the live cache, the rewritten rows make the right result look wrong
    assert check_call(call).out_error > ROW_ERROR_TOLERANCE[torch.float8_e4m3fn]


def test_own_keys_copy_the_new_tokens_rows_and_skip_positions_before_the_start():
    call = recorded_call([40, 2], q_len=4)
    keys = own_keys(call.kv_cache, call.block_table, call.seq_lens, call.q_len)
    page = call.kv_cache.shape[1]
    block = int(call.block_table[0, 39 // page])
    assert torch.equal(keys[0, 3], call.kv_cache[block, 39 % page])
    call.own_keys = keys  # request 1 (2 keys, 4 new tokens) has positions before its start: left alone
    result = check_call(call)
    assert result.rows == 4 * 4 and result.out_error < 1e-2


def test_rows_with_few_keys_are_not_counted_as_checked():
    """With one key any kernel returns that key's V exactly: such rows prove nothing."""
    result = check_call(recorded_call([MIN_VISIBLE_KEYS - 1, 2], q_len=1, damage="scale"))
    assert result.rows == 0


def summary(**changes):
    base = {
        "q_lens": {1: 40},
        "graph_calls": 30,
        "checked_calls": 8,
        "checked_graph_calls": 6,
        "calls_by_layer": {"layer0": 20, "layer1": 20},
        "checked_layers": ["layer0", "layer1"],
        "checked_rows": 400,
        "max_rel_error": {1: 3e-3},
        "tolerance": 2e-2,
        "lse_checked_calls": 8,
        "lse_ok": True,
        "max_lse_error": 1e-4,
        "check_problems": [],
    }
    return {**base, **changes}


SPEC = {"backend": "CUSTOM", "graphs": True, "spec_tokens": 0, "kv_cache_dtype": "fp8"}


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"max_rel_error": {1: 5e-2}},
        {"lse_ok": False},
        {"checked_graph_calls": 0},
        {"checked_calls": MIN_CHECKED_CALLS - 1},
        {"checked_layers": ["layer0"]},
        {"checked_layers": [], "calls_by_layer": {}},
        {"lse_checked_calls": 0},
        {"check_problems": ["RuntimeError('x')"]},
        {"max_rel_error": {}},
    ],
    ids=lambda c: ",".join(c) or "good",
)
def test_the_decode_check_verdict_fails_on_each_shortfall(change):
    ok, note = judge_decode_check(summary(**change), SPEC)
    assert ok == (not change), note


def test_eager_runs_need_no_replays_and_vllm_backends_no_lse():
    assert judge_decode_check(summary(checked_graph_calls=0), {**SPEC, "graphs": False})[0]
    assert judge_decode_check(summary(lse_checked_calls=0, max_lse_error=None), {**SPEC, "backend": "FLASHMLA"})[0]


@pytest.mark.parametrize(
    "q_lens, drafts, ok", [({1: 5, 4: 30}, 12, True), ({1: 35}, 12, False), ({1: 5, 4: 30}, 0, False)]
)
def test_speculation_needs_real_calls_with_1_plus_k_tokens_and_drafts(q_lens, drafts, ok):
    result = {
        "spec": {**SPEC, "spec_tokens": 3, "spec_method": "ngram"},
        "decode_check": summary(q_lens=q_lens),
        "spec_decode": {"num_drafts": drafts, "num_draft_tokens": 3 * drafts, "num_accepted_tokens": drafts},
    }
    assert judge_speculation(result)[0] == ok


TARGET = "model.layers.{}.self_attn.attn"


@pytest.mark.parametrize(
    "by_layer, k, ok",
    [
        ({TARGET.format(0): 30, TARGET.format(1): 30, TARGET.format(2): 40}, 3, True),  # the MTP layer on ours
        ({TARGET.format(0): 30, TARGET.format(1): 30}, 3, False),  # vLLM ran the drafter on a backend of its own
        ({TARGET.format(0): 30, TARGET.format(1): 30}, 1, True),  # k = 1: no draft step is a decode
    ],
    ids=["drafter-on-ours", "drafter-elsewhere", "one-draft-token"],
)
def test_an_mla_drafter_decodes_its_draft_steps_on_ours(by_layer, k, ok):
    """A drafter with MLA layers (vLLM numbers them after the target's two here) runs on ours only
    where the speculative config names our backend: its calls must be seen, or the run fails."""
    result = {
        "spec": {**SPEC, "spec_tokens": k, "spec_method": "deepseek_mtp"},
        "decode_check": summary(q_lens={1: 40, k + 1: 60}, calls_by_layer=by_layer),
        "spec_decode": {"num_drafts": 12},
        "target_layers": 2,
    }
    verdict, note = judge_speculation(result)
    assert verdict == ok and "the drafter's own calls" in note


def test_fallback_runs_are_judged_against_triton_mla_not_a_peer_of_it():
    run = lambda tokens: {"tokens": tokens, "gaps": WIDE}  # noqa: E731
    refs = {"FLASHMLAfp8": run(REF), "TRITON_MLAfp8": run([[1, 2, 3, 4], [5, 6, 0, 0]])}
    spec = {**SPEC, "graphs": False}
    result = {
        "spec": spec,
        "tokens": [[1, 2, 3, 4], [5, 6, 0, 0]],
        "routes": ["fallback"],
        "decode_check": summary(checked_graph_calls=0),
    }
    assert judge(result, refs, "fallback")[0]
    result["tokens"] = REF  # what FLASHMLA says, but not what the Triton kernel says
    assert not judge(result, refs, "fallback")[0]


@pytest.mark.parametrize("routes", [["bundled"], ["fallback", "bundled"], []])
def test_a_run_served_by_another_route_fails_whatever_its_tokens(routes):
    """Right tokens from the wrong kernel (or from no call of ours) prove nothing about the expected one."""
    run = lambda tokens: {"tokens": tokens, "gaps": WIDE}  # noqa: E731
    refs = {"FLASHMLAfp8": run(REF), "TRITON_MLAfp8": run(REF)}
    result = {"spec": {**SPEC, "graphs": False}, "tokens": REF, "decode_check": summary(checked_graph_calls=0)}
    assert judge({**result, "routes": ["fallback"]}, refs, "fallback")[0]
    ok, notes = judge({**result, "routes": routes}, refs, "fallback")
    assert not ok and f"route {routes} != fallback" in notes


TP2 = {**SPEC, "tp": 2}


def parallel_run(tokens, **check_changes):
    return {"spec": TP2, "tokens": tokens, "decode_check": summary(**{"ranks": 2, **check_changes})}


def test_parallel_runs_follow_ours_on_one_gpu_up_to_its_first_tie():
    single = {"tokens": REF, "gaps": [[1.0, 1.0, 0.05, 1.0], [1.0] * 4]}
    peer = {"tokens": REF}  # the peer keeps the rule between its layouts: ours must too
    assert judge_parallel(parallel_run([[1, 2, 3, 0], [5, 6, 7, 8]]), single, peer, single)[0]  # at a tie
    assert not judge_parallel(parallel_run([[1, 2, 3, 4], [5, 0, 7, 8]]), single, peer, single)[0]  # before any tie


def test_where_the_peer_breaks_the_tie_rule_across_layouts_ours_must_not_agree_significantly_less():
    single = {"tokens": [[1, 2, 3, 4]] * 6, "gaps": [[1.0] * 4] * 6}
    diverging_at = lambda steps: [[1, 2, 3, 4][:k] + [0] * (4 - k) for k in steps]  # noqa: E731
    peer = {"tokens": diverging_at([2, 3, 2, 3, 2, 3])}
    # a step fewer on some prompts and more on others: within chance
    assert judge_parallel(parallel_run(diverging_at([3, 2, 2, 3, 3, 2])), single, peer, single)[0]
    # a step or more fewer on every prompt: significantly fewer
    assert not judge_parallel(parallel_run(diverging_at([1, 2, 1, 2, 1, 1])), single, peer, single)[0]
    assert not judge_parallel(parallel_run(diverging_at([1] * 6)), single, {"error": "boom"}, single)[0]  # no peer


@pytest.mark.parametrize(
    "tokens, change, peer, ok",
    [
        (REF, {}, {"tokens": REF, "gaps": WIDE}, True),
        ([[1, 2, 3, 0], [5, 6, 7, 8]], {}, {"tokens": REF, "gaps": [[1.0, 1.0, 1.0, 0.05], [1.0] * 4]}, True),
        ([[1, 2, 0, 4], [5, 6, 7, 8]], {}, {"tokens": REF, "gaps": WIDE}, False),  # before any tie
        (REF, {"ranks": 1}, {"tokens": REF, "gaps": WIDE}, False),
        (REF, {"max_rel_error": {1: 6e-2}, "tolerance": 5e-2}, {"tokens": REF, "gaps": WIDE}, False),
        (REF, {}, {"error": "boom"}, False),
    ],
    ids=["identical", "at a tie", "before a tie", "one rank", "over the bar", "no peer"],
)
def test_flashmla_route_split_over_gpus_follows_flashmla_at_the_same_layout(tokens, change, peer, ok):
    assert judge_flashmla_parallel(parallel_run(tokens, **change), peer)[0] == ok


def test_significantly_fewer_steps_is_a_paired_test():
    assert not significantly_fewer_steps([10, 20, 30], [10, 20, 30])
    assert not significantly_fewer_steps([9, 25, 28], [10, 20, 30])  # mixed: chance
    assert significantly_fewer_steps([8, 18, 28], [10, 20, 30])  # two fewer on every prompt
    assert not significantly_fewer_steps([12, 22, 32], [10, 20, 30])


@pytest.mark.parametrize("change", [{"ranks": 1}, {"max_rel_error": {1: 5e-2}}, {"lse_ok": False}])
def test_parallel_runs_fail_on_any_rank_s_kernel_check(change):
    single = {"tokens": REF, "gaps": WIDE}
    run = parallel_run(REF)
    run["decode_check"].update(change)
    assert judge_parallel(parallel_run(REF), single, single, single)[0]
    assert not judge_parallel(run, single, single, single)[0]


def test_the_ranks_summaries_merge_into_one_with_the_worst_errors(tmp_path):
    from integration.engines.vllm_worker_check import merged_summary

    ranks = [
        summary(q_lens={"1": 10}, max_rel_error={"1": 2e-3}, checked_layers=["a"], max_lse_error=1e-4),
        summary(q_lens={"1": 12}, max_rel_error={"1": 4e-3}, checked_layers=["b"], lse_ok=False, max_lse_error=None),
    ]
    ranks[0]["routes"], ranks[1]["routes"] = ["flashmla"], ["bundled"]
    for rank, part in enumerate(ranks):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(part))
    merged = merged_summary(tmp_path)
    assert merged["ranks"] == 2 and merged["q_lens"] == {"1": 22} and merged["max_rel_error"] == {"1": 4e-3}
    assert merged["checked_layers"] == ["a", "b"] and merged["checked_calls"] == 16 and not merged["lse_ok"]
    assert merged["max_lse_error"] == 1e-4 and merged_summary(tmp_path / "none")["ranks"] == 0
    assert merged["routes"] == ["bundled", "flashmla"]  # ranks that chose differently cannot pass as one route


@pytest.mark.vllm
def test_the_worker_check_is_a_vllm_plugin_that_wraps_the_model_runner_only_when_asked(tmp_path, monkeypatch):
    """vLLM loads every ``vllm.general_plugins`` entry point in each of its processes: the test-only
    one is found on PYTHONPATH, and install() wraps the worker's model runner only with ENV set."""
    import importlib.metadata

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from integration.engines import vllm_worker_check as check

    monkeypatch.syspath_prepend(str(check.plugin_dir(tmp_path / "plugin")))
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    found = [e for e in plugins if e.value == "integration.engines.vllm_worker_check:install"]
    assert len(found) == 1
    originals = GPUModelRunner.load_model, GPUModelRunner.execute_model
    monkeypatch.delenv(check.ENV, raising=False)
    found[0].load()()
    assert (GPUModelRunner.load_model, GPUModelRunner.execute_model) == originals
    monkeypatch.setenv(check.ENV, json.dumps({"backend": "CUSTOM", "kv": "fp8", "dir": str(tmp_path)}))
    for name, original in zip(("load_model", "execute_model"), originals):
        monkeypatch.setattr(GPUModelRunner, name, original)
    monkeypatch.setattr(GPUModelRunner, "_mla_worker_check", False, raising=False)
    found[0].load()()
    assert GPUModelRunner.load_model is not originals[0] and GPUModelRunner.execute_model is not originals[1]


@pytest.mark.vllm
def test_every_engine_of_the_matrix_is_valid_engine_arguments_for_vllm():
    """The LLM(...) keywords of each kind of run, MTP and parallel ones included, are fields vLLM's
    EngineArgs knows (a misspelt or renamed one is a TypeError here, not on the GPU)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    from integration.engines.vllm_spec import engine_kwargs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    for spec in [*mtp_specs(), *parallel_specs()]:
        kwargs = engine_kwargs(spec, "/nonexistent", 2048, 0.2)
        assert set(kwargs) <= fields, set(kwargs) - fields
    mtp = engine_kwargs(mtp_specs()[0], "/m", 2048, 0.2)["speculative_config"]
    # vLLM picks the drafter's backend itself unless it is named: the MTP layer decodes as the target's do
    assert mtp == {"method": "deepseek_mtp", "num_speculative_tokens": 1, "attention_backend": mtp_specs()[0].backend}
    dcp = engine_kwargs(parallel_specs()[1], "/m", 2048, 0.2)
    assert (dcp["tensor_parallel_size"], dcp["decode_context_parallel_size"]) == (2, 2)


@pytest.mark.vllm
def test_the_serving_check_starts_vllm_serve_with_the_offline_engines_settings():
    """integration/serve_check.py: every flag names an EngineArgs field (or the server's port), and
    the values are the offline engine's, so greedy tokens can be compared."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    from integration.engines.vllm_spec import EngineSpec, engine_kwargs
    from integration.serve_check import serve_command

    spec = EngineSpec("CUSTOM", "fp8", 64, True)
    command = serve_command(spec, "/m", 8123, {"backend": "nope"})
    assert command[2:5] == ["vllm.entrypoints.cli.main", "serve", "/m"]
    flags, values = {}, iter(command[5:])
    for flag in values:
        name = flag.removeprefix("--").replace("-", "_")
        flags[name] = True if name in ("skip_tokenizer_init", "no_enable_prefix_caching") else next(values)
    fields = {f.name for f in dataclasses.fields(EngineArgs)} | {"port", "no_enable_prefix_caching"}
    assert set(flags) <= fields, set(flags) - fields
    offline = engine_kwargs(spec, "/m", 2048, 0.3)
    for name in ("attention_backend", "kv_cache_dtype", "dtype"):
        assert flags[name] == offline[name]
    assert int(flags["block_size"]) == offline["block_size"] and not offline["enable_prefix_caching"]
    assert json.loads(flags["compilation_config"]) == offline["compilation_config"]
    assert json.loads(flags["additional_config"]) == {"mla_backend": {"backend": "nope"}}


@pytest.mark.vllm
def test_the_worker_check_starts_after_the_model_loads_arms_on_the_first_step_and_reports_each_step(
    tmp_path, monkeypatch
):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from integration.engines import vllm_worker_check as check

    events = []

    class Checker:
        armed = False

        def arm(self):
            self.armed = True
            events.append("arm")

        def after_step(self):
            events.append("check")

        def summary(self):
            return {"steps": events.count("step"), "routes": ["flashmla"]}

    monkeypatch.setattr(GPUModelRunner, "load_model", lambda runner: events.append("load"))
    monkeypatch.setattr(GPUModelRunner, "execute_model", lambda runner: events.append("step"))
    monkeypatch.setattr(GPUModelRunner, "_mla_worker_check", False, raising=False)
    monkeypatch.setattr(check, "start_checker", lambda settings: events.append("start") or Checker())
    monkeypatch.setenv(check.ENV, json.dumps({"backend": "CUSTOM", "kv": "fp8", "dir": str(tmp_path)}))
    check.install()
    runner = object.__new__(GPUModelRunner)
    runner.load_model()
    runner.execute_model()
    runner.execute_model()
    assert events == ["load", "start", "arm", "step", "check", "step", "check"]
    assert json.loads((tmp_path / "rank0.json").read_text()) == {"steps": 2, "routes": ["flashmla"]}


def entry_points_seen_by_a_spawned_process(_=None) -> list[str]:
    import importlib.metadata

    return [e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")]


def test_workers_that_vllm_spawns_find_the_worker_check(monkeypatch):
    """vLLM spawns its TP/DCP workers; a spawned process takes its parent's sys.path, so the plugin
    directory must be there, not only on PYTHONPATH."""
    import multiprocessing

    from integration.engines.vllm_engine import check_in_workers
    from integration.engines.vllm_spec import EngineSpec
    from integration.engines.vllm_worker_check import ENV

    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in (ENV, "PYTHONPATH", "VLLM_WORKER_MULTIPROC_METHOD"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    directory = check_in_workers(EngineSpec("CUSTOM", "fp8", tp=2), corrupt=None)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        seen = pool.apply(entry_points_seen_by_a_spawned_process)
    assert "integration.engines.vllm_worker_check:install" in seen
    assert json.loads(os.environ[ENV])["dir"] == str(directory)


@pytest.mark.vllm
def test_the_real_dimension_checkpoint_is_a_generative_deepseek_v3_to_vllm(tmp_path):
    """integration/models/real_dims.py's config-only checkpoint: vLLM must serve it as a causal LM (taken
    for a pooling model, it would run without full CUDA graphs and refuse FULL_DECODE_ONLY)."""
    from vllm.config import ModelConfig

    from integration.models.real_dims import save_config

    config = ModelConfig(model=save_config(tmp_path / "h16", 16), skip_tokenizer_init=True, dtype="bfloat16")
    assert config.runner_type == "generate" and config.architectures == ["DeepseekV3ForCausalLM"]
    assert config.hf_config.num_attention_heads == 16 and config.hf_config.kv_lora_rank == 512


def test_an_isolated_engine_process_applies_the_parents_patches_first(monkeypatch):
    """zoo_e2e's isolated engines (its default): the spawned engine process calls each SETUP_ENV target
    before building the engine."""
    from integration.engines import vllm_engine

    order = []
    monkeypatch.setattr(vllm_engine, "run_engine", lambda *a, **k: order.append("engine") or {"ran": a})
    monkeypatch.setitem(sys.modules, "zoo_patch_probe", type(sys)("zoo_patch_probe"))
    sys.modules["zoo_patch_probe"].patch = lambda: order.append("patch")
    monkeypatch.setenv(vllm_engine.SETUP_ENV, "zoo_patch_probe:patch")
    assert vllm_engine._set_up_then_run("spec") == {"ran": ("spec",)}
    assert order == ["patch", "engine"]


def test_sglang_decode_throughput_leaves_the_prefill_out():
    """Decode tokens/s as under vLLM: a run of n new tokens minus a run of one, so a long prefill
    (here 50 ms against 1 ms a decode step) does not count."""
    from integration.engines import sglang_engine

    class Engine:
        def __init__(self):
            self.calls = []

        def generate(self, input_ids, sampling_params):
            self.calls.append(sampling_params["max_new_tokens"])
            time.sleep(0.05 + 0.001 * sampling_params["max_new_tokens"])

    engine = Engine()
    rate = sglang_engine.decode_throughput(engine, [[1, 2]] * 4, 33)
    assert engine.calls == [1, 33] * 4  # a warm-up pair, then three
    # 4 requests x 32 steps in 32 ms: 4000 tok/s (sleeps overshoot either run); with the prefill, 1600
    assert 0.75 * 4000 < rate < 1.25 * 4000


def test_sglang_engines_get_the_stand_ins_only_where_their_packages_are_absent(monkeypatch):
    """integration/sglang_e2e.py on the lent GPU's image (no FlashInfer, no DeepGEMM): each engine process
    gets the stand-in packages, whose names import and raise or are missing if used (DeepGEMM's SM count,
    which a sparse model's indexer asks for when it is built, aside); where a package is installed, its
    stand-in stays off the path."""
    import subprocess

    from integration.engines import sglang_engine

    stand_in = sglang_engine.STAND_INS
    absent_packages(monkeypatch, absent=(), present=("flashinfer", "deep_gemm"))
    assert sglang_engine.stand_in_env({"PYTHONPATH": "/elsewhere"}) == {}
    absent_packages(monkeypatch, absent=("deep_gemm",), present=("flashinfer",))
    assert sglang_engine.stand_in_env({"PYTHONPATH": "/elsewhere"}) == {
        "PYTHONPATH": os.pathsep.join([str(stand_in / "deep_gemm"), "/elsewhere"]),
        "SGLANG_ENABLE_JIT_DEEPGEMM": "false",
    }
    absent_packages(monkeypatch)
    env = sglang_engine.stand_in_env({"PYTHONPATH": "/elsewhere"})
    assert env["SGLANG_IS_FLASHINFER_AVAILABLE"] == env["SGLANG_ENABLE_JIT_DEEPGEMM"] == "false"
    stand_ins = [str(stand_in / "flashinfer"), str(stand_in / "deep_gemm")]
    assert env["PYTHONPATH"].split(os.pathsep) == [*stand_ins, "/elsewhere"]
    probe = (
        "from flashinfer import bmm_fp8\n"
        "from flashinfer.sampling import min_p_sampling_from_probs, top_k_top_p_sampling_from_probs\n"
        "for f in (bmm_fp8, min_p_sampling_from_probs, top_k_top_p_sampling_from_probs):\n"
        "    try:\n        f()\n    except RuntimeError as e:\n        assert 'not installed' in str(e)\n"
        "    else:\n        raise SystemExit('called')\n"
        "import deep_gemm\n"
        "assert callable(deep_gemm.get_num_sms) and not hasattr(deep_gemm, 'fp8_mqa_logits')\n"
        "import flashinfer; print(flashinfer.__file__); print(deep_gemm.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.split()
    assert printed[0].startswith(str(stand_in / "flashinfer")) and printed[1].startswith(str(stand_in / "deep_gemm"))


def test_a_checked_sglang_engine_keeps_both_its_plugin_and_the_stand_ins(monkeypatch, tmp_path):
    """The checked engine's PYTHONPATH (its test-only entry point) and the stand-ins' must all reach the
    process: on the lent GPU a merge that kept one of them stopped every checked engine at import."""
    from integration.engines import sglang_decode_check, sglang_engine

    absent_packages(monkeypatch)
    monkeypatch.setenv("PYTHONPATH", "/installed")
    extra = sglang_decode_check.plugin_env(tmp_path / "plugin", 1.0, tmp_path / "summary.json")
    env = sglang_engine.engine_env(extra)
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(sglang_engine.STAND_INS / "flashinfer"),
        str(sglang_engine.STAND_INS / "deep_gemm"),
        str(tmp_path / "plugin"),
        "/installed",
    ]
    assert env[sglang_decode_check.ENV] == extra[sglang_decode_check.ENV]
    assert env["SGLANG_IS_FLASHINFER_AVAILABLE"] == "false"


def test_the_calibrated_rule_applies_the_tie_rule_unless_the_peer_breaks_it():
    from integration.judges.tokens import calibrated_agreement

    ref, gaps = [[1, 2, 3, 4], [5, 6, 7, 8]], [[1.0] * 4, [1.0] * 4]
    early = [[1, 9, 9, 9], [5, 6, 7, 8]]  # leaves the reference at step 1, where it is decided
    # The peer keeps the rule (it leaves the reference only at ties): the tie rule judges ours, even
    # where ours agrees more steps than the peer.
    tied_gaps = [[1.0, 1.0, 0.01, 1.0], [0.01, 1.0, 1.0, 1.0]]
    at_ties = [[1, 2, 0, 0], [0, 0, 0, 0]]
    held = calibrated_agreement(early, ref, tied_gaps, peer=at_ties)
    assert held["rule_holds"] and held["agreed_steps"] > held["peer_agreed_steps"]
    assert not held["ok"] and held["failures"] == [(0, 1, 2)]
    # The peer breaks it (2 + 2 steps agreed): ours must agree at least as many steps.
    peer = [[1, 2, 0, 0], [5, 6, 0, 0]]
    longer = calibrated_agreement(early, ref, gaps, peer)  # 1 + 4 steps
    assert not longer["rule_holds"] and longer["ok"] and (longer["agreed_steps"], longer["peer_agreed_steps"]) == (5, 4)
    shorter = calibrated_agreement([[0, 0, 0, 0], [5, 6, 7, 0]], ref, gaps, peer)  # 0 + 3 steps
    assert not shorter["rule_holds"] and not shorter["ok"]
    # Ours keeps the tie rule itself (it leaves the reference only at a tie): that passes, however few
    # steps it agrees where the peer broke the rule.
    tie_at_1 = [[1.0, 0.01, 1.0, 1.0], [1.0, 0.01, 1.0, 1.0]]
    at_tie = calibrated_agreement([[1, 0, 0, 0], [5, 0, 0, 0]], ref, tie_at_1, peer=[[9, 9, 9, 9], [5, 6, 7, 8]])
    assert not at_tie["rule_holds"] and at_tie["ok"] and not at_tie["failures"]
    assert (at_tie["agreed_steps"], at_tie["peer_agreed_steps"]) == (2, 4)
    # The reference run again another way (SGLang's FP8 reference without graphs) parts from it at step
    # 1: a tie there, so ours leaving the reference at step 1 keeps the rule.
    early_ref, decided = [[1, 2, 3, 4], [5, 6, 7, 8]], [[1.0] * 4, [1.0] * 4]
    leaves = [[1, 9, 9, 9], [5, 6, 7, 8]]
    assert not calibrated_agreement(leaves, early_ref, decided, early_ref)["ok"]
    repeat = [[1, 0, 0, 0], [5, 6, 7, 8]]
    with_repeat = calibrated_agreement(leaves, early_ref, decided, early_ref, repeat)
    assert with_repeat["ok"] and with_repeat["rule_holds"] and not with_repeat["failures"]


def narrow_latent_call(rank: int, damage: float = 1.0) -> DecodeCall:
    """A call on a latent of ``rank`` + 64 (Mistral Small 4: 256 + 64, decoded by vLLM's Triton MLA
    through our fallback), its outputs from a float64 softmax written out here, optionally scaled."""
    lengths, q_len, heads, page, scale = [40, 33], 2, 4, 16, 0.06
    generator = torch.Generator().manual_seed(3)
    pages = -(-max(lengths) // page)
    cache = torch.randn(len(lengths) * pages, page, rank + 64, generator=generator).to(torch.bfloat16)
    table = torch.arange(len(lengths) * pages, dtype=torch.int32).view(len(lengths), pages)
    query = torch.randn(len(lengths) * q_len, heads, rank + 64, generator=generator).to(torch.bfloat16)
    out = torch.empty(len(lengths) * q_len, heads, rank, dtype=torch.float64)
    lse = torch.empty(len(lengths) * q_len, heads, dtype=torch.float64)
    for request, length in enumerate(lengths):
        keys = cache[table[request]].reshape(-1, rank + 64)[:length].double()
        for token in range(q_len):
            row = request * q_len + token
            logits = query[row].double() @ keys[: length - q_len + token + 1].T * scale
            lse[row] = torch.logsumexp(logits, dim=-1)
            out[row] = torch.softmax(logits, dim=-1) @ keys[: logits.shape[-1], :rank]
    return DecodeCall(
        layer="model.layers.0.self_attn",
        query=query,
        kv_cache=cache,
        block_table=table,
        seq_lens=torch.tensor(lengths, dtype=torch.int32),
        num_decodes=len(lengths),
        q_len=q_len,
        bmm1=scale,
        bmm2=1.0,
        out=(out * damage).to(torch.bfloat16),
        lse=lse.float(),
    )


def test_check_call_recomputes_a_narrower_latent_at_the_output_s_width():
    assert check_call(narrow_latent_call(256)).out_error < 1e-2 and check_call(narrow_latent_call(256)).lse_ok
    assert check_call(narrow_latent_call(256, damage=1.05)).out_error > ROW_ERROR_TOLERANCE[torch.float8_e4m3fn]
