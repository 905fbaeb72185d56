"""End-to-end check of the SGLang plugin on a GPU: a seeded DeepSeek-V3 through ``sglang.Engine`` with
``--decode-attention-backend mla_backend`` against SGLang's own decode backends (prefill: triton).

    python integration/sglang_e2e.py --heads 16 --kv fp8_e4m3,auto --parts tokens,check,selftest

Parts:
- tokens: greedy tokens agree with SGLang's triton decode up to its first tie (the vLLM check's rule,
  integration/judges/tokens.py): a step where its top-2 logprob gap is below 0.1 nats, or where a second
  reference (--references) disagrees with it. With an FP8 cache the reference is triton on the query
  rounded to FP8, as ours reads it (engines/sglang_quantized_query.py), and plain triton the second.
  With CUDA graphs and without; decode tokens/s of every backend come from the same run.
- check: in eager mode every decode call of ours during the greedy run is recomputed in float64 on the
  real paged cache (integration/engines/sglang_decode_check.py); the worst row must be within the
  kernel's tolerance.
- selftest: the same with our outputs scaled by 1.05; the check must fail.
Each engine runs in a process of its own (integration/engines/sglang_engine.py). Exit status 1 if a
part fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines.sglang_decode_check import plugin_env  # noqa: E402
from integration.engines.sglang_engine import run_isolated  # noqa: E402
from integration.engines.sglang_quantized_query import plugin_env as quantized_query_env  # noqa: E402
from integration.judges.decode_verdict import judge_sglang_check  # noqa: E402
from integration.judges.tokens import agreement, calibrated_agreement  # noqa: E402
from integration.models.prompts import make_prompts  # noqa: E402
from integration.settings import SELFTEST_CORRUPTION  # noqa: E402
from mla_backend.tools.tiny_model import save_tiny_deepseek_v3  # noqa: E402

REFERENCE, SECOND_REFERENCE = "triton", "flashmla"
FP8_QUERY_REFERENCE = "triton, fp8 query"  # engines/sglang_quantized_query.py


def run_checked(
    model: str, prompts: list[list[int]], kv: str, corruption: float, out: Path, log: Path
) -> tuple[bool | None, str]:
    """Ours in eager mode with every decode call checked in the scheduler process: (within
    tolerance, note), or (None, why) where no call could be checked."""
    summary = out / f"check_{kv}_x{corruption}.json"
    summary.unlink(missing_ok=True)
    env = plugin_env(out / "check_plugin", corruption, summary)
    run = run_isolated(model, prompts, "mla_backend", kv, False, log, greedy_only=True, env=env)
    if "error" in run:
        return None, run["error"]
    if not summary.exists():
        return None, "no decode call was checked"
    return judge_sglang_check(json.loads(summary.read_text()), fp8=kv.startswith("fp8"))


def describe(run: dict) -> str:
    return run.get("error") or f"{run['tokens_per_s']:.0f} decode tok/s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv", default="fp8_e4m3,auto")
    parser.add_argument("--references", default=f"{REFERENCE},{SECOND_REFERENCE}")
    parser.add_argument("--parts", default="tokens,check,selftest")
    parser.add_argument("--out", type=Path, default=Path("results/sglang"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # SGLang's DeepSeek model reads moe_layer_freq, which transformers' config does not write.
    model = str(save_tiny_deepseek_v3(args.out / f"tiny_h{args.heads}", heads=args.heads, moe_layer_freq=1))
    log = args.out / "engines.log"
    references, parts = args.references.split(","), set(args.parts.split(","))
    prompts = make_prompts()
    results, failed = [], False
    for kv in args.kv.split(","):
        if "check" in parts:
            within, note = run_checked(model, prompts, kv, 1.0, args.out, log)
            ok = within is True
            failed |= not ok
            results.append({"part": "check", "kv": kv, "ok": ok, "note": note})
            print(f"{'PASS' if ok else 'FAIL':9} mla_backend {kv:9} eager   float64 check: {note}", flush=True)
        if "selftest" in parts:
            within, note = run_checked(model, prompts, kv, SELFTEST_CORRUPTION, args.out, log)
            ok = within is False  # the check ran and failed
            failed |= not ok
            results.append({"part": "selftest", "kv": kv, "ok": ok, "note": note})
            outcome = "check failed, as it must" if ok else "check did not fail"
            print(f"{'PASS' if ok else 'FAIL':9} mla_backend {kv:9} eager   x{SELFTEST_CORRUPTION} {outcome}: {note}")
        if "tokens" not in parts:
            continue
        ours = {graphs: run_isolated(model, prompts, "mla_backend", kv, graphs, log) for graphs in (True, False)}
        for graphs, run in ours.items():
            print(f"ours      mla_backend {kv:9} {'graphs' if graphs else 'eager '}  " + describe(run), flush=True)
        refs = {name: run_isolated(model, prompts, name, kv, True, log) for name in references}
        base_name = REFERENCE
        if kv.startswith("fp8"):  # judged on the inputs ours sees: the query rounded to FP8 too
            base_name = FP8_QUERY_REFERENCE
            env = quantized_query_env(args.out / "fp8_query_plugin")
            refs = {base_name: run_isolated(model, prompts, REFERENCE, kv, True, log, env=env), **refs}
        for name, ref in refs.items():
            results.append({"decode": name, "kv": kv, "graphs": True, **ref})
            print(f"reference {name:11} {kv:9} graphs  " + describe(ref), flush=True)
        base = refs[base_name]
        others = [r["tokens"] for n, r in refs.items() if n != base_name and "error" not in r]
        for graphs, run in ours.items():
            mode = "graphs" if graphs else "eager "
            if "error" in run or "error" in base:
                failed = True
                print(f"FAIL      mla_backend {kv:9} {mode}  {run.get('error') or 'no reference'}")
                continue
            if base_name == FP8_QUERY_REFERENCE and "error" not in refs[REFERENCE]:
                verdict = calibrated_agreement(run["tokens"], base["tokens"], base["gaps"], refs[REFERENCE]["tokens"])
            else:
                verdict = agreement(run["tokens"], base["tokens"], base["gaps"], *others)
            failed |= not verdict["ok"]
            results.append({"decode": "mla_backend", "kv": kv, "graphs": graphs, **run, "verdict": verdict})
            print(
                f"{'PASS' if verdict['ok'] else 'FAIL':9} mla_backend {kv:9} {mode}  {verdict['identical']}/"
                f"{len(run['tokens'])} identical to {base_name}, divergences (prompt, step, first tie) "
                f"{verdict['divergent']}"
                + (
                    f"; {verdict['agreed_steps']} steps agreed vs {verdict['peer_agreed_steps']} for plain "
                    f"{REFERENCE}, which breaks the tie rule itself"
                    if verdict.get("rule_holds") is False
                    else ""
                )
            )
    (args.out / f"sglang_h{args.heads}.json").write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
