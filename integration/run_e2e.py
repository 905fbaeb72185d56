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
  engines/vllm_decode_checker.py), on every layer, recomputed in float64 on the real cache: every output row that
  sees >= 16 keys within the kernel tolerance, and our LSE as well.
- Speculative runs decode with n-gram drafts, ours and the references alike (the verification's
  1 + k query tokens change every layer's numerics), on prompts that make every request draft at
  every step (models/prompts.py's make_spec_prompts); real decode calls carry 1 + k query tokens and
  vLLM reports drafts.
- MTP runs (--parts mtp) draft with DeepSeek-V3's own drafter, the checkpoint's MTP layer
  (speculative method deepseek_mtp, k = 1 and 3; its attention runs on our backend too), on a seeded
  checkpoint that holds one (tiny_model.add_mtp_layers); judged as the speculative runs are, against
  the references run with the same drafter and k, and reported against non-speculative greedy.
- Parallel runs (--parts parallel, two GPUs): ours with tensor parallelism 2, and with decode context
  parallelism 2 on top (vLLM merges our per-rank LSE), against ours on one GPU, whose forward_mqa
  is checked in float64 in the same run: greedy tokens agree up to its first tie. The workers run
  in processes of their own, out of the forward_mqa check's reach.
- Engine-best runs (--parts enginebest): `auto` at page 64 with CUDA graphs, fp8 and bf16 caches; on
  SM90 the route is the one the installed table (mla_backend/sm90_routes.json) picks, vLLM's
  FlashMLA where it is faster, its outputs checked in float64 as ours are. The other parts pin
  page-64 engines to our kernels (backend xqa). --parts enginebest_parallel (two GPUs) does the same
  with TP 2 and DCP 2, each rank's route and forward_mqa checked; where FlashMLA serves, the
  tokens are judged against vLLM's FLASHMLA at the same layout (the same kernel and plan: identical
  up to its first tie), else as the parallel runs are.
- Fallback runs (device_capability 8.0) are served by vLLM's Triton MLA kernel through our backend
  and judged against TRITON_MLA.
- Selftest: our engine with its outputs scaled by 1.05 and LSE shifted by 0.5 must fail the
  forward_mqa check, in graph and in eager mode.

This script holds the parts (which engines each runs, with what to expect) and the CLI; the rules
are in integration/judges/, the engines in integration/engines/, the checkpoint and prompts in
integration/models/.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines.vllm_engine import decode_tokens_per_s, run_engine, run_engine_isolated  # noqa: E402
from integration.engines.vllm_references import reference_runs, run_isolated_or_error  # noqa: E402
from integration.engines.vllm_spec import EngineSpec  # noqa: E402
from integration.judges.decode_verdict import judge_decode_check, judge_selftest  # noqa: E402
from integration.judges.parallel import PARALLEL_PEER, judge_flashmla_parallel, judge_parallel  # noqa: E402
from integration.judges.vllm_run import finish_judging, judge, non_speculative_note  # noqa: E402
from integration.models.prompts import make_prompts, make_spec_prompts  # noqa: E402
from integration.models.tiny_model import save_tiny_deepseek_v3  # noqa: E402
from integration.settings import SELFTEST_CORRUPTION, SPEC_MAX_MODEL_LEN  # noqa: E402

SPEC_TOKENS = 3
MTP_TOKENS = (1, 3)


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
    from mla_backend.config import MLABackendConfig
    from mla_backend.route import DecodeShape, resolve_route
    from mla_backend.vllm.backend import vllm_engine

    capability = torch.cuda.get_device_capability()
    config = MLABackendConfig(**spec.mla_backend)
    shape = DecodeShape(
        heads // spec.tp * spec.dcp,  # each rank's heads, gathered over DCP
        1 + spec.spec_tokens,
        spec.kv_cache_dtype == "fp8",
        spec.block_size,
        dcp=spec.dcp,
    )
    return resolve_route(config, capability, shape, vllm_engine()).kernel


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


def parallel_specs() -> list[EngineSpec]:
    """TP 2, and DCP 2 on top, with each KV dtype (run one dtype per call: eight engines take long)."""
    return [
        EngineSpec("CUSTOM", kv, 64, True, tp=2, dcp=dcp, mla_backend=ours_at(64))
        for kv in ("fp8", "auto")
        for dcp in (1, 2)
    ]


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
    return judge_selftest(check, asdict(spec))


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
