"""End-to-end check of the vLLM plugin on a GPU: a small seeded DeepSeek-V3 through vLLM with
--attention-backend CUSTOM against vLLM's own MLA backends.

    python integration/run_e2e.py --heads 16 --parts correctness,spec,mtp,fallback,selftest,throughput --out results/

Pass rules; exit status 1 if any run fails them:
- Tokens: greedy tokens agree with the reference up to the first tie of the reference: a step
  where its top-2 logprob gap is below 0.1 nats, or where vLLM disagrees with itself (its two bf16
  references differ, or a reference engine run again with --reference-runs N differs). With an FP8
  cache, where vLLM's own second backend breaks that rule, ours must instead agree for at least as
  many steps as that backend does (rule_calibration).
- forward_mqa: real decode calls (after start-up; in graph mode, the replayed ones, see
  decode_check.py), on every layer, recomputed in float64 on the real cache: every output row that
  sees >= 16 keys within the kernel tolerance, and our LSE as well.
- Speculative runs decode with n-gram drafts, ours and the references alike (the verification's
  1 + k query tokens change every layer's numerics), on prompts that make every request draft at
  every step (make_spec_prompts); real decode calls carry 1 + k query tokens and vLLM reports drafts.
- MTP runs (--parts mtp) draft with DeepSeek-V3's own drafter, the checkpoint's MTP layer
  (speculative method deepseek_mtp, k = 1 and 3; its attention runs on our backend too), on a seeded
  checkpoint that holds one (tiny_model.add_mtp_layers); judged as the speculative runs are, against
  the references run with the same drafter and k, and reported against non-speculative greedy.
- Parallel runs (--parts parallel, two GPUs): ours with tensor parallelism 2, and with decode context
  parallelism 2 on top (vLLM merges our per-rank LSE), against ours on one GPU, whose forward_mqa
  is checked in float64 in the same run: greedy tokens agree up to its first tie. The workers run
  in processes of their own, out of the forward_mqa check's reach.
- Engine-best runs (--parts enginebest): `auto` at page 64 with CUDA graphs, fp8 and bf16 caches; on
  SM90 the route is the one the installed table (mla_backend/vllm/sm90_routes.json) picks, vLLM's
  FlashMLA where it is faster, its outputs checked in float64 as ours are. The other parts pin
  page-64 engines to our kernels (backend xqa). --parts enginebest_parallel (two GPUs) does the same
  with TP 2 and DCP 2, each rank's route and forward_mqa checked; where FlashMLA serves, the
  tokens are judged against vLLM's FLASHMLA at the same layout (the same kernel and plan: identical
  up to its first tie), else as the parallel runs are.
- Fallback runs (device_capability 8.0) are served by vLLM's Triton MLA kernel through our backend
  and judged against TRITON_MLA.
- Selftest: our engine with its outputs scaled by 1.05 and LSE shifted by 0.5 must fail the
  forward_mqa check, in graph and in eager mode.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_check import MIN_VISIBLE_KEYS  # noqa: E402
from engine import EngineSpec, decode_tokens_per_s, run_engine, run_engine_isolated  # noqa: E402

from mla_backend.tools.tiny_model import TINY_DEFAULTS, save_tiny_deepseek_v3  # noqa: E402

TIE_NATS = 0.1
RANDOM_PROMPT_LENGTHS = [1, 5, 33, 100, 257, 511, 780, 1000]
REPEATED_PROMPT_LENGTHS = [64, 200, 400, 900]  # a repeated 12-token motif: n-gram drafts find matches
# Per KV dtype: the references the tie rule is applied against, then a second vLLM backend that
# calibrates the rule (does vLLM agree with itself under it on this model?).
REFERENCES = {"fp8": ["FLASHMLA"], "auto": ["FLASH_ATTN_MLA", "TRITON_MLA"]}
PEERS = {"fp8": ("TRITON_MLA", "FLASHMLA"), "auto": ("TRITON_MLA", "FLASH_ATTN_MLA")}
SPEC_TOKENS = 3
MTP_TOKENS = (1, 3)
SPEC_MAX_MODEL_LEN = 4096  # the speculative prompts are the whole 2048-token vocabulary
MIN_CHECKED_CALLS = 4  # forward_mqa calls recomputed in float64 per engine run
MODEL_LAYERS = TINY_DEFAULTS["num_hidden_layers"]  # every decoder layer of the seeded checkpoint is checked
SELFTEST_CORRUPTION = 1.05  # outputs x 1.05 and LSE + 0.5: the check must fail


def make_spec_prompts(seed: int = 0, vocab: int = 2048, count: int = 12) -> list[list[int]]:
    """Each prompt holds every token of the vocabulary once, so the n-gram proposer finds the last
    token somewhere in it at every step and drafts k tokens for every request: the verification
    batches are uniform (1 + k tokens each) and reach forward_mqa. With random prompts most steps
    mix requests with and without drafts, and vLLM sends such batches' drafts to the prefill path."""
    generator = torch.Generator().manual_seed(1000 + seed)
    return [torch.randperm(vocab, generator=generator).tolist() for _ in range(count)]


def make_prompts(seed: int = 0, vocab: int = 2048) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in RANDOM_PROMPT_LENGTHS]
    for n in REPEATED_PROMPT_LENGTHS:
        motif = torch.randint(0, vocab, (12,), generator=generator).tolist()
        prompts.append((motif * (n // 12 + 1))[:n])
    return prompts


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first step where two token streams differ; a stream that stops early differs where it stops."""
    step = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if step is None and len(a) != len(b):
        return min(len(a), len(b))
    return step


def agreement(
    ours: list[list[int]], ref: list[list[int]], ref_gaps: list[list[float]], *others: list[list[int]]
) -> dict:
    """Per prompt: the first step where tokens differ and the first tie of the reference: a top-2
    gap below TIE_NATS, or a step where the reference and another run of vLLM's (its second
    backend, or the same backend run again) differ: vLLM itself is undecided there."""
    if len(ours) != len(ref):
        raise ValueError(f"{len(ours)} outputs for {len(ref)} reference prompts")
    divergent, failures = [], []
    for i, (a, b) in enumerate(zip(ours, ref)):
        differ = first_difference(a, b)
        if differ is None:
            continue
        first_tie = next((k for k, gap in enumerate(ref_gaps[i]) if gap < TIE_NATS), len(b))
        for other in others:
            undecided = first_difference(b, other[i])
            first_tie = min(first_tie, len(b) if undecided is None else undecided)
        divergent.append((i, differ, first_tie))
        if differ < first_tie:
            failures.append((i, differ, first_tie))
    return {"identical": len(ours) - len(divergent), "divergent": divergent, "failures": failures, "ok": not failures}


def ours_at(block_size: int) -> dict:
    """additional_config that keeps decode on our kernels: at page 64 on SM90, `auto` may hand it
    to vLLM's FlashMLA (the engine-best route, judged by its own part)."""
    return {"backend": "xqa"} if block_size == 64 else {}


def correctness_specs() -> list[EngineSpec]:
    return [
        EngineSpec("CUSTOM", kv, block, graphs, mla_backend=ours_at(block))
        for kv in ("fp8", "auto")
        for block in (16, 64)
        for graphs in (True, False)
    ]


def engine_best_specs() -> list[EngineSpec]:
    """`auto` at page 64 with CUDA graphs: on SM90 the route the installed table picks."""
    return [EngineSpec("CUSTOM", kv, 64, True) for kv in ("fp8", "auto")]


def engine_best_parallel_specs() -> list[EngineSpec]:
    """`auto` with TP 2 and DCP 2: the shape class is the heads each rank decodes, gathered over DCP.
    (TP alone gives each rank a one-GPU engine with fewer heads: the enginebest part's case.)"""
    return [EngineSpec("CUSTOM", kv, 64, True, tp=2, dcp=2) for kv in ("fp8", "auto")]


def expected_engine_best_route(spec: EngineSpec, heads: int) -> str:
    """ "flashmla" where the installed route table hands this engine's decode to FlashMLA, else "bundled"."""
    from mla_backend.config import MLABackendConfig, resolve_backend
    from mla_backend.vllm import engine_best

    capability = torch.cuda.get_device_capability()
    config = MLABackendConfig(**spec.mla_backend)
    shape = engine_best.ShapeClass(
        heads // spec.tp * spec.dcp,  # each rank's heads, gathered over DCP
        1 + spec.spec_tokens,
        spec.block_size,
        spec.kv_cache_dtype == "fp8",
        spec.dcp,
    )
    best = engine_best.choose(config, resolve_backend(config, capability), capability, shape)
    return "flashmla" if best.use_flashmla else "bundled"


def spec_decode_specs() -> list[EngineSpec]:
    # Graph mode only: in vLLM 0.26 the GPU n-gram proposer drafted nothing under enforce_eager.
    return [
        EngineSpec("CUSTOM", "fp8", 64, True, spec_tokens=SPEC_TOKENS, mla_backend=ours_at(64)),
        EngineSpec("CUSTOM", "auto", 16, True, spec_tokens=SPEC_TOKENS),
    ]


def mtp_specs() -> list[EngineSpec]:
    return [
        EngineSpec("CUSTOM", "fp8", 64, True, spec_tokens=k, spec_method="mtp", mla_backend=ours_at(64))
        for k in MTP_TOKENS
    ] + [EngineSpec("CUSTOM", "auto", 16, True, spec_tokens=3, spec_method="mtp")]


PARALLEL_PEER = "FLASHMLA"  # vLLM's backend run at the same layouts: how far a split moves its tokens


def parallel_specs() -> list[EngineSpec]:
    """TP 2, and DCP 2 on top, with each KV dtype (run one dtype per call: eight engines take long)."""
    return [
        EngineSpec("CUSTOM", kv, 64, True, tp=2, dcp=dcp, mla_backend=ours_at(64))
        for kv in ("fp8", "auto")
        for dcp in (1, 2)
    ]


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


def fallback_specs() -> list[EngineSpec]:
    override = {"device_capability": "8.0"}  # documented: choose kernels as if this were an SM 8.0 GPU
    return [
        EngineSpec("CUSTOM", "fp8", 16, True, mla_backend=override),
        EngineSpec("CUSTOM", "auto", 64, False, mla_backend=override),
    ]


def selftest_specs() -> list[EngineSpec]:
    return [EngineSpec("CUSTOM", "fp8", 64, True, mla_backend=ours_at(64)), EngineSpec("CUSTOM", "auto", 16, False)]


def selftest(spec: EngineSpec, model: str, prompts: list[list[int]], isolated: bool = False) -> tuple[bool, str]:
    """The forward_mqa check on corrupted outputs: it must check enough calls and fail them all."""
    run = run_engine_isolated if isolated else run_engine
    check = run(spec, model, prompts, corrupt=SELFTEST_CORRUPTION)["decode_check"]
    passed, note = judge_decode_check(check, asdict(spec))
    worst = max(check["max_rel_error"].values(), default=0.0)
    caught = not passed and worst > check["tolerance"] and not check["lse_ok"] and check["checked_calls"] > 0
    return caught, f"check {'failed, as it must' if caught else 'DID NOT CATCH the corruption'}: {note}"


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


def runs_of(refs: dict[str, dict], key: str) -> list[dict]:
    """Every run of one reference engine: ``key``, then its repeats ``key#2``, ``key#3``, ..."""
    return [refs[key]] + [refs[k] for k in sorted(refs) if k.startswith(key + "#")]


def mean_agreed_steps(tokens: list[list[int]], runs: list[dict]) -> float:
    return sum(agreed_steps(tokens, run["tokens"]) for run in runs) / len(runs)


def rule_calibration(refs: dict[str, dict], kv: str) -> dict:
    """Does vLLM's own second backend pass the tie rule against the reference, on this model?
    (Used where there is one reference, FP8; with two, their disagreements are ties already.)

    With an FP8 cache it need not: a tiny difference upstream flips the e4m3 rounding of new cache
    entries, and those 6% steps grow. Where vLLM fails its own rule, ours must instead stay with the
    reference at least as many greedy steps as vLLM's second backend does (averaged over the
    reference's runs when it ran more than once: FLASHMLA+spec does not repeat itself exactly)."""
    peer, ref_runs = refs[PEERS[kv][0] + kv], runs_of(refs, PEERS[kv][1] + kv)
    repeats = [run["tokens"] for run in ref_runs[1:]]
    return {
        "peer": PEERS[kv][0],
        "ref": PEERS[kv][1],
        "rule_holds": agreement(peer["tokens"], ref_runs[0]["tokens"], ref_runs[0]["gaps"], *repeats)["ok"],
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
        others = [refs[name + kv]["tokens"] for name in REFERENCES[kv] if name != ref_name]
        verdict = agreement(result["tokens"], ref["tokens"], ref["gaps"], *others, *(r["tokens"] for r in repeats))
        verdict["agreed_steps"] = mean_agreed_steps(result["tokens"], [ref, *repeats])
        result.setdefault("agreement", {})[ref_name] = verdict
        note = f"{ref_name}: {verdict['identical']}/{len(result['tokens'])} identical"
        if others or calibration["rule_holds"] or ref_name != calibration["ref"]:
            ok &= verdict["ok"]
            note += "" if verdict["ok"] else f", tie rule broken {verdict['failures']}"
        else:
            ok &= verdict["agreed_steps"] >= calibration["peer_agreed_steps"]
            note += (
                f", {verdict['agreed_steps']:g} steps agreed vs {calibration['peer_agreed_steps']:g} for vLLM's "
                f"{calibration['peer']} (which breaks the tie rule itself)"
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


def judge_decode_check(check: dict, spec: dict) -> tuple[bool, str]:
    """forward_mqa vs float64 on real decode calls: enough of them, on every layer, through graph
    replays when graphs are on, within the row tolerance; our backend's LSE too."""
    worst = max(check["max_rel_error"].values(), default=None)
    wanted = {
        "calls": MIN_CHECKED_CALLS,
        "layers": MODEL_LAYERS,
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


def judge_speculation(result: dict) -> tuple[bool, str]:
    """Real decode calls (not warm-up or capture runs) carried 1 + k query tokens per request, and
    vLLM proposed drafts."""
    q_lens = {int(k): v for k, v in result["decode_check"]["q_lens"].items()}
    counts = result.get("spec_decode", {})
    ok = q_lens.get(1 + result["spec"]["spec_tokens"], 0) > 0 and counts.get("num_drafts", 0) > 0
    rate = counts.get("acceptance_rate")
    return ok, (
        f"real decode calls by q_len {dict(sorted(q_lens.items()))}, drafts {counts.get('num_drafts', 0)}"
        + (f", acceptance {rate:.0%}" if rate is not None else "")
    )


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


def run_isolated_or_error(spec: EngineSpec, model: str, prompts: list[list[int]]) -> dict:
    """A peer's run; its failure is recorded, not raised (it only calibrates the judgement of ours)."""
    try:
        return run_engine_isolated(spec, model, prompts)
    except Exception as err:
        return {"name": spec.name, "error": repr(err)[:300]}


def reference_runs(
    model: str,
    prompts: list[list[int]],
    rows: list,
    kvs: set[str],
    spec_tokens: int = 0,
    repeats: int = 1,
    spec_method: str = "ngram",
    isolated: bool = False,
) -> dict[str, dict]:
    """vLLM's own backends (the references and the calibration peers) for both KV dtypes, keyed by
    backend name + KV dtype; the references ``repeats`` times (``key#2`` ...). Speculative
    (compiled) engines each run in their own process, every engine does with ``isolated``."""
    refs = {}
    for kv in REFERENCES.keys() & kvs:
        for name in sorted(set(REFERENCES[kv]) | set(PEERS[kv])):
            spec = EngineSpec(name, kv, 64, True, spec_tokens=spec_tokens, spec_method=spec_method)
            runs = repeats if name in REFERENCES[kv] else 1
            for run in range(runs):
                key = name + kv + (f"#{run + 1}" if run else "")
                refs[key] = (
                    run_engine_isolated(spec, model, prompts, SPEC_MAX_MODEL_LEN if spec_tokens else 2048)
                    if spec_tokens or isolated
                    else run_engine(spec, model, prompts)
                )
            ref = refs[name + kv]
            check = ref["decode_check"]
            errors = ", ".join(f"q_len {k}: {v:.1e}" for k, v in check["max_rel_error"].items())
            rows.append(
                (
                    ref["name"],
                    "reference",
                    f"its forward_mqa vs float64: {errors or 'not checked'} "
                    f"({check['checked_calls']} calls, {check['checked_graph_calls']} replayed) "
                    f"{check['check_problems'] or ''}",
                )
            )
    return refs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--parts", default="correctness,spec,fallback,throughput")
    parser.add_argument("--kv", default="fp8,auto", help="KV cache dtypes to run (a subset of fp8,auto)")
    parser.add_argument("--out", default="results/e2e")
    parser.add_argument("--model-dir", default="/tmp/mla_backend_models")
    parser.add_argument("--prompt-seeds", default="0", help="prompt sets (12 prompts each), e.g. 0,1")
    parser.add_argument(
        "--reference-runs",
        type=int,
        default=1,
        help="runs of each reference engine; where they differ, vLLM is undecided (a tie)",
    )
    args = parser.parse_args()
    parts, kvs = set(args.parts.split(",")), set(args.kv.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(save_tiny_deepseek_v3(Path(args.model_dir) / f"dsv3_h{args.heads}", heads=args.heads))
    prompts = [p for seed in args.prompt_seeds.split(",") for p in make_prompts(int(seed))]
    rows, all_ok = [], True

    throughput = []
    if "throughput" in parts:
        for name in ("CUSTOM", "FLASHMLA", "TRITON_MLA"):
            ours = ours_at(64) if name == "CUSTOM" else {}
            throughput.append(
                decode_tokens_per_s(EngineSpec(name, "fp8", 64, True, mla_backend=ours), model, 32, 2048, 128)
            )
        base = throughput[0]["tokens_per_s"]
        for t in throughput:
            rows.append(
                (
                    t["name"],
                    "throughput",
                    f"{t['tokens_per_s']:.0f} tok/s (ours/this = "
                    f"{base / t['tokens_per_s']:.2f}x) batch 32, ctx 2048, 128 new",
                )
            )

    refs, spec_refs, mtp_refs, plain_refs = {}, {}, {}, {}
    if parts & {"correctness", "fallback", "enginebest"}:
        refs = reference_runs(model, prompts, rows, kvs, repeats=args.reference_runs)
    if "spec" in parts:
        spec_prompts = [p for seed in args.prompt_seeds.split(",") for p in make_spec_prompts(int(seed))]
        spec_refs = reference_runs(model, spec_prompts, rows, kvs, spec_tokens=SPEC_TOKENS, repeats=args.reference_runs)
    mtp_model = str(Path(args.model_dir) / f"dsv3_h{args.heads}_mtp")
    if "mtp" in parts:
        save_tiny_deepseek_v3(mtp_model, heads=args.heads, mtp_layers=1)
        plain_refs = reference_runs(mtp_model, prompts, rows, kvs)
        for k in MTP_TOKENS:  # only the KV dtypes some run of ours drafts k tokens with
            needed = {s.kv_cache_dtype for s in mtp_specs() if s.spec_tokens == k} & kvs
            mtp_refs[k] = reference_runs(mtp_model, prompts, rows, needed, spec_tokens=k, spec_method="mtp")
    ours = []
    if "correctness" in parts:
        ours += [(s, "bundled") for s in correctness_specs()]
    if "fallback" in parts:
        ours += [(s, "fallback") for s in fallback_specs()]
    if "spec" in parts:
        ours += [(s, "bundled") for s in spec_decode_specs()]
    if "mtp" in parts:
        ours += [(s, "bundled") for s in mtp_specs()]
    if "parallel" in parts:
        ours += [(s, "bundled") for s in parallel_specs()]
    if "enginebest" in parts:
        ours += [(s, expected_engine_best_route(s, args.heads)) for s in engine_best_specs()]
    if "enginebest_parallel" in parts:
        ours += [(s, expected_engine_best_route(s, args.heads)) for s in engine_best_parallel_specs()]
    ours = [(s, route) for s, route in ours if s.kv_cache_dtype in kvs]
    results = []
    parallel_peers: dict[str, dict] = {}
    if "selftest" in parts:
        for spec in selftest_specs():
            if spec.kv_cache_dtype in kvs:
                ok, note = selftest(spec, model, prompts)
                all_ok &= ok
                rows.append((spec.name + " x1.05", "PASS" if ok else "FAIL", note))
                print(f"[e2e h{args.heads}] selftest {spec.name}: {'PASS' if ok else 'FAIL'} {note}", flush=True)
    singles: dict[str, dict] = {}  # per KV dtype: ours on one GPU (checked), the peer on one GPU
    for kv in sorted({spec.kv_cache_dtype for spec, route in ours if spec.tp > 1 and route == "bundled"}):
        single_spec = EngineSpec("CUSTOM", kv, 64, True, mla_backend=ours_at(64))
        singles[kv] = run_engine(single_spec, model, prompts)
        results.append(singles[kv])
        ok, notes = finish_judging(singles[kv], "bundled", True, [])
        all_ok &= ok
        rows.append((single_spec.name + " (1 GPU)", "PASS" if ok else "FAIL", "; ".join(notes)))
        parallel_peers[f"{PARALLEL_PEER} {kv} 1 GPU"] = run_engine(
            replace(single_spec, backend=PARALLEL_PEER), model, prompts
        )
    for spec, route in ours:
        try:
            if spec.tp > 1:
                result = run_engine_isolated(spec, model, prompts)
                kernel_note = judge_decode_check(result["decode_check"], result["spec"])[1]
                print(f"[e2e h{args.heads}] {spec.name}: {kernel_note}", flush=True)
                peer = run_isolated_or_error(replace(spec, backend=PARALLEL_PEER, mla_backend={}), model, prompts)
                kv = spec.kv_cache_dtype
                if route == "flashmla":
                    ok, notes = judge_flashmla_parallel(result, peer)
                else:
                    single_peer = parallel_peers[f"{PARALLEL_PEER} {kv} 1 GPU"]
                    ok, notes = judge_parallel(result, singles[kv], peer, single_peer)
                if result["routes"] != [route]:
                    ok = False
                    notes.append(f"route {result['routes']} != {route}")
                parallel_peers[spec.name] = peer
            elif spec.spec_tokens and spec.spec_method == "mtp":
                result = run_engine_isolated(spec, mtp_model, prompts)
                ok, notes = judge(result, mtp_refs[spec.spec_tokens], route)
                notes.append(non_speculative_note(result, plain_refs, spec.kv_cache_dtype))
            elif spec.spec_tokens:
                result = run_engine_isolated(spec, model, spec_prompts, SPEC_MAX_MODEL_LEN)
                ok, notes = judge(result, spec_refs, route)
            else:
                result = run_engine(spec, model, prompts)
                ok, notes = judge(result, refs, route)
        except Exception as err:  # one broken engine must not hide the others' results
            result, ok, notes = {"name": spec.name, "error": repr(err)}, False, [repr(err)[:300]]
        results.append(result)
        all_ok &= ok
        rows.append((spec.name, "PASS" if ok else "FAIL", "; ".join(notes)))
        print(f"[e2e h{args.heads}] {spec.name}: {'PASS' if ok else 'FAIL'} {'; '.join(notes)}", flush=True)

    (out / f"e2e_h{args.heads}_{'_'.join(sorted(parts))}_{'_'.join(sorted(kvs))}.json").write_text(
        json.dumps(
            {
                "heads": args.heads,
                "refs": refs,
                "spec_refs": spec_refs,
                "mtp_refs": mtp_refs,
                "plain_refs": plain_refs,
                "parallel_peers": parallel_peers,
                "ours": results,
                "throughput": throughput,
            },
            indent=1,
            default=str,
        )
    )
    print(f"\n== e2e, {args.heads} heads ({torch.cuda.get_device_name()}) ==")
    for name, status, notes in rows:
        print(f"{status:10s} {name:40s} {notes}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
