"""End-to-end check of the SGLang plugin on a GPU: a seeded DeepSeek-V3 through ``sglang.Engine`` with
``--decode-attention-backend mla_backend`` against SGLang's own decode backends (prefill: triton).

    python integration/sglang_e2e.py --heads 16 --kv fp8_e4m3,auto --parts tokens,check,selftest

Parts:
- tokens: greedy tokens agree with SGLang's triton decode up to its first tie (the vLLM check's rule,
  integration/run_e2e.py): a step where its top-2 logprob gap is below 0.1 nats, or where a second
  reference (--references) disagrees with it. With CUDA graphs and without; decode tokens/s of every
  backend come from the same run.
- check: in eager mode every decode call of ours during the greedy run is recomputed in float64 on the
  real paged cache (sglang_decode_check.py); the worst row must be within the kernel's tolerance.
- selftest: the same with our outputs scaled by 1.05; the check must fail.
Each engine runs in a process of its own. Exit status 1 if a part fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_e2e import SELFTEST_CORRUPTION, agreement, make_prompts  # noqa: E402
from sglang_decode_check import ENV, judge, plugin_dir  # noqa: E402

from mla_backend.tools.tiny_model import save_tiny_deepseek_v3  # noqa: E402

NEW_TOKENS = 32
PAGE_SIZE = 64
THROUGHPUT = dict(batch=32, context=2048, new_tokens=128)
REFERENCE, SECOND_REFERENCE = "triton", "flashmla"


def run_engine(model: str, decode: str, kv: str, graphs: bool, greedy_only: bool = False) -> dict:
    """One engine (this process): greedy tokens with top-2 logprobs, then decode tokens/s."""
    import sglang
    import torch

    engine = sglang.Engine(
        model_path=model,
        skip_tokenizer_init=True,
        page_size=PAGE_SIZE,
        prefill_attention_backend="triton",
        decode_attention_backend=decode,
        kv_cache_dtype=kv,
        disable_cuda_graph=not graphs,
        cuda_graph_max_bs_decode=THROUGHPUT["batch"],
        disable_radix_cache=True,
        sampling_backend="pytorch",
        grammar_backend="none",
        mem_fraction_static=0.5,
        log_level="warning",
    )
    try:
        greedy = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        outs = engine.generate(
            input_ids=make_prompts(), sampling_params=greedy, return_logprob=True, top_logprobs_num=2
        )
        tokens = [o["output_ids"] for o in outs]
        gaps = [[step[0][0] - step[1][0] for step in o["meta_info"]["output_top_logprobs"]] for o in outs]
        if greedy_only:
            return {"tokens": tokens, "gaps": gaps}
        gen = torch.Generator().manual_seed(7)
        batch = [
            torch.randint(0, 2048, (THROUGHPUT["context"],), generator=gen).tolist() for _ in range(THROUGHPUT["batch"])
        ]
        params = {"temperature": 0.0, "max_new_tokens": THROUGHPUT["new_tokens"], "ignore_eos": True}
        engine.generate(input_ids=batch, sampling_params={**params, "max_new_tokens": 4})  # warm-up
        start = time.perf_counter()
        engine.generate(input_ids=batch, sampling_params=params)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
    return {"tokens": tokens, "gaps": gaps, "tokens_per_s": THROUGHPUT["batch"] * THROUGHPUT["new_tokens"] / seconds}


def run_isolated(
    model: str, decode: str, kv: str, graphs: bool, log: Path, greedy_only: bool = False, env: dict | None = None
) -> dict:
    spec = json.dumps({"model": model, "decode": decode, "kv": kv, "graphs": graphs, "greedy_only": greedy_only})
    with open(log, "a") as sink:
        done = subprocess.run(
            [sys.executable, __file__, "--one", spec],
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
            env={**os.environ, **(env or {})},
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}; see {log.name}"}
    return json.loads(lines[-1])


def run_checked(model: str, kv: str, corruption: float, out: Path, log: Path) -> tuple[bool | None, str]:
    """Ours in eager mode with every decode call checked in the scheduler process: (within
    tolerance, note), or (None, why) where no call could be checked."""
    summary = out / f"check_{kv}_x{corruption}.json"
    summary.unlink(missing_ok=True)
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join([str(plugin_dir(out / "check_plugin")), here, os.environ.get("PYTHONPATH", "")])
    settings = json.dumps({"corruption": corruption, "summary": str(summary)})
    run = run_isolated(model, "mla_backend", kv, False, log, greedy_only=True, env={ENV: settings, "PYTHONPATH": path})
    if "error" in run:
        return None, run["error"]
    if not summary.exists():
        return None, "no decode call was checked"
    return judge(json.loads(summary.read_text()), fp8=kv.startswith("fp8"))


def describe(run: dict) -> str:
    return run.get("error") or f"{run['tokens_per_s']:.0f} decode tok/s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv", default="fp8_e4m3,auto")
    parser.add_argument("--references", default=f"{REFERENCE},{SECOND_REFERENCE}")
    parser.add_argument("--parts", default="tokens,check,selftest")
    parser.add_argument("--out", type=Path, default=Path("results/sglang"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        spec = json.loads(args.one)
        run = run_engine(spec["model"], spec["decode"], spec["kv"], spec["graphs"], spec["greedy_only"])
        print(json.dumps(run), flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    # SGLang's DeepSeek model reads moe_layer_freq, which transformers' config does not write.
    model = str(save_tiny_deepseek_v3(args.out / f"tiny_h{args.heads}", heads=args.heads, moe_layer_freq=1))
    log = args.out / "engines.log"
    references, parts = args.references.split(","), set(args.parts.split(","))
    results, failed = [], False
    for kv in args.kv.split(","):
        if "check" in parts:
            within, note = run_checked(model, kv, 1.0, args.out, log)
            ok = within is True
            failed |= not ok
            results.append({"part": "check", "kv": kv, "ok": ok, "note": note})
            print(f"{'PASS' if ok else 'FAIL':9} mla_backend {kv:9} eager   float64 check: {note}", flush=True)
        if "selftest" in parts:
            within, note = run_checked(model, kv, SELFTEST_CORRUPTION, args.out, log)
            ok = within is False  # the check ran and failed
            failed |= not ok
            results.append({"part": "selftest", "kv": kv, "ok": ok, "note": note})
            outcome = "check failed, as it must" if ok else "check did not fail"
            print(f"{'PASS' if ok else 'FAIL':9} mla_backend {kv:9} eager   x{SELFTEST_CORRUPTION} {outcome}: {note}")
        if "tokens" not in parts:
            continue
        ours = {graphs: run_isolated(model, "mla_backend", kv, graphs, log) for graphs in (True, False)}
        for graphs, run in ours.items():
            print(f"ours      mla_backend {kv:9} {'graphs' if graphs else 'eager '}  " + describe(run), flush=True)
        refs = {name: run_isolated(model, name, kv, True, log) for name in references}
        for name, ref in refs.items():
            results.append({"decode": name, "kv": kv, "graphs": True, **ref})
            print(f"reference {name:11} {kv:9} graphs  " + describe(ref), flush=True)
        base = refs[REFERENCE]
        others = [r["tokens"] for n, r in refs.items() if n != REFERENCE and "error" not in r]
        for graphs, run in ours.items():
            mode = "graphs" if graphs else "eager "
            if "error" in run or "error" in base:
                failed = True
                print(f"FAIL      mla_backend {kv:9} {mode}  {run.get('error') or 'no reference'}")
                continue
            verdict = agreement(run["tokens"], base["tokens"], base["gaps"], *others)
            failed |= not verdict["ok"]
            results.append({"decode": "mla_backend", "kv": kv, "graphs": graphs, **run, "verdict": verdict})
            print(
                f"{'PASS' if verdict['ok'] else 'FAIL':9} mla_backend {kv:9} {mode}  {verdict['identical']}/"
                f"{len(run['tokens'])} identical to {REFERENCE}, divergences (prompt, step, first tie) "
                f"{verdict['divergent']}"
            )
    (args.out / f"sglang_h{args.heads}.json").write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
