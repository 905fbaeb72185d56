"""End-to-end check of the SGLang plugin on a GPU: seeded MLA models through ``sglang.Engine`` with
``--decode-attention-backend mla_backend`` against SGLang's own decode backends (prefill: triton).

    python integration/sglang_e2e.py --heads 16 --kv fp8_e4m3,auto --parts tokens,check,selftest --page-sizes 1,64
    python integration/sglang_e2e.py --families all --layouts all --refusals --out results/sglang_zoo

Models: a tiny DeepSeek-V3 with --heads heads, or (--families) the zoo's families as SGLang 0.5.17
reads them (models/sglang_checkpoint.py; names as zoo_e2e.py takes them, ``all`` for every family it
runs on our kernels), in each family's first layout or (--layouts all) every one. Per page size
(--page-sizes; 1 is SGLang's default, so its engines start without a page size, as a user's would), model
and KV dtype:
- tokens: greedy tokens agree with SGLang's triton decode up to its first tie (the vLLM check's rule,
  integration/judges/tokens.py): a step where its top-2 logprob gap is below 0.1 nats, or where a second
  reference (--references) disagrees with it. With an FP8 cache the reference is triton on the query
  rounded to FP8, as ours reads it (engines/sglang_quantized_query.py), and plain triton the second;
  the FP8 reference also runs without CUDA graphs, and where its two runs part is a tie too.
  With CUDA graphs and without; decode tokens/s of every backend come from the same run.
- check: in eager mode every decode call of ours during the greedy run is recomputed in float64 on the
  real paged cache (integration/engines/sglang_decode_check.py); the worst row must be within the
  kernel's tolerance.
- selftest: the same with our outputs scaled by 1.05; the check must fail.
With --spec-tokens K (the tiny DeepSeek-V3 only) the checkpoint holds an MTP layer and every engine
drafts with it (SGLang's NEXTN: K draft steps, chains, the drafter's attention on triton); ours
verifies the K drafts plus the bonus token per step, and the check must have seen such calls.
With --dp-attention N every engine, ours and the references, runs SGLang's data-parallel attention on
N GPUs (``tp_size`` = ``dp_size`` = N, ``enable_dp_attention``): each rank decodes all heads of its own
requests, ranks without requests run idle steps, and the check must have run on every rank.
Refused families (--refusals: all of them; or named in --families): an engine on dummy weights must stop
at start-up with our message and leave no process behind (judges/sglang_refusal.py). The sparse families
(DeepSeek-V3.2, GLM-5) are integration/sglang_sparse_e2e.py's: SGLang serves them on our sparse decode.
Each engine runs in a process of its own (integration/engines/sglang_engine.py). One row per (model,
layout, KV dtype, part); exit status 1 if a part fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines.sglang_decode_check import clear_summary, plugin_env, read_summary  # noqa: E402
from integration.engines.sglang_engine import run_isolated, start_refused  # noqa: E402
from integration.engines.sglang_quantized_query import plugin_env as quantized_query_env  # noqa: E402
from integration.judges.decode_verdict import judge_sglang_check  # noqa: E402
from integration.judges.engine_rows import add_row, describe, report  # noqa: E402
from integration.judges.sglang_refusal import judge_refusal  # noqa: E402
from integration.judges.tokens import agreement, calibrated_agreement  # noqa: E402
from integration.models.families import FAMILIES, Family  # noqa: E402
from integration.models.prompts import make_prompts  # noqa: E402
from integration.models.sglang_checkpoint import (  # noqa: E402
    pick_served,
    refusal,
    refusal_env,
    save_sglang_checkpoint,
    save_sglang_config,
    save_sglang_tiny_deepseek,
)
from integration.settings import SELFTEST_CORRUPTION  # noqa: E402

REFERENCE, SECOND_REFERENCE = "triton", "flashmla"
FP8_QUERY_REFERENCE = "triton, fp8 query"  # engines/sglang_quantized_query.py


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, help="the tiny DeepSeek-V3's heads (default 16; not with --families)")
    parser.add_argument("--families", help="zoo families, comma-separated (Name@heads for a layout), or all")
    parser.add_argument("--layouts", choices=("first", "all"), default="first")
    parser.add_argument("--refusals", action="store_true", help="also start every family our backend refuses")
    parser.add_argument("--kv", default="fp8_e4m3,auto")
    parser.add_argument(
        "--page-sizes", default="1,64", help="KV page sizes, powers of two to 1024 (1: SGLang's default, not given)"
    )
    parser.add_argument("--references", default=f"{REFERENCE},{SECOND_REFERENCE}")
    parser.add_argument("--parts", default="tokens,check,selftest")
    parser.add_argument("--dp-attention", type=int, default=1, help="GPUs of data-parallel attention (1: none)")
    parser.add_argument("--spec-tokens", type=int, default=0, help="MTP draft tokens per step (0: no speculation)")
    parser.add_argument("--out", type=Path, default=Path("results/sglang"))
    args = parser.parse_args(argv)
    if args.dp_attention < 1:
        parser.error("--dp-attention: at least 1")
    if args.spec_tokens and args.families:
        parser.error("--spec-tokens drafts with the tiny DeepSeek-V3's MTP layer; leave out --families")
    if not 0 <= args.spec_tokens <= 7:
        parser.error("--spec-tokens: 0 to 7 (our kernels take up to 8 query tokens a request)")
    if args.heads is not None and args.families:
        parser.error("--heads picks the tiny DeepSeek-V3; with --families name a layout as Name@heads")
    try:
        args.page_sizes = [int(p) for p in args.page_sizes.split(",")]
    except ValueError:
        parser.error(f"--page-sizes: comma-separated integers, got {args.page_sizes!r}")
    if any(p < 1 or p > 1024 or p & (p - 1) for p in args.page_sizes):
        parser.error(f"--page-sizes: powers of two from 1 to 1024 (what mla_backend reads), got {args.page_sizes}")
    return args


def plan(args: argparse.Namespace) -> tuple[list[tuple[Family, str]], list[Family]]:
    """The (family, layout) pairs whose parts run, and the families started to be refused. A sparse
    family named stops the run: SGLang serves it through its dsa backend with our sparse decode, which
    integration/sglang_sparse_e2e.py runs."""
    chosen = pick_served(args.families, args.layouts == "all") if args.families else []
    sparse = sorted({f.name for f, _ in chosen if f.expect == "sparse"})
    if sparse:
        raise SystemExit(f"{sparse}: sparse (DSA) models, served by --dsa-decode-backend mla_backend: run them with "
                         "integration/sglang_sparse_e2e.py")  # fmt: skip
    refused = [f for f in FAMILIES if f.expect == "refused" and (args.refusals or any(f is c for c, _ in chosen))]
    return [(f, layout) for f, layout in chosen if f.expect == "bundled"], refused


def run_checked(
    model: str, prompts: list, kv: str, corruption: float, work: Path, log: Path, layout_args: dict | None = None
) -> tuple[bool | None, str]:
    """Ours in eager mode with every decode call checked in the scheduler process: (within
    tolerance, note), or (None, why) where no call could be checked."""
    summary = work / f"check_{kv}_x{corruption}.json"
    clear_summary(summary)
    env = plugin_env(work / "check_plugin", corruption, summary)
    checked_run = partial(run_isolated, greedy_only=True, env=env, engine_args=layout_args)
    run = checked_run(model, prompts, "mla_backend", kv, False, log)
    if "error" in run:
        return None, run["error"]
    checked = read_summary(summary)
    if checked is None:
        return None, "no decode call was checked"
    ok, note = judge_sglang_check(checked, fp8=kv.startswith("fp8"))
    if layout_args and "dp_size" in layout_args:  # every data-parallel attention rank decodes: each must check
        ok = ok and checked["processes"] == layout_args["dp_size"]
        note += f"; {checked['processes']} of {layout_args['dp_size']} ranks checked"
    if layout_args and "speculative_num_draft_tokens" in layout_args:  # verification reached our kernel
        verified = checked["q_lens"].get(str(layout_args["speculative_num_draft_tokens"]), 0)
        ok = ok and verified > 0
        note += f"; {verified} calls verifying {layout_args['speculative_num_draft_tokens']} tokens a request"
    return ok, note


def parallel_args(dp_attention: int) -> dict | None:
    """sglang.Engine arguments of data-parallel attention over ``dp_attention`` GPUs (None: one GPU)."""
    if dp_attention == 1:
        return None
    return {"tp_size": dp_attention, "dp_size": dp_attention, "enable_dp_attention": True}


def speculative_args(spec_tokens: int) -> dict | None:
    """sglang.Engine arguments of drafting ``spec_tokens`` tokens a step with the checkpoint's MTP layer
    (None: no speculation). Our backend verifies (SGLang verifies on the prefill backend unless the
    attention mode is decode); SGLang builds the drafter's attention itself."""
    if spec_tokens == 0:
        return None
    return {
        "speculative_algorithm": "NEXTN",
        "speculative_attention_mode": "decode",
        "speculative_num_steps": spec_tokens,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": spec_tokens + 1,
        "speculative_draft_attention_backend": "triton",
    }


def page_args(page_size: int) -> dict:
    """sglang.Engine's page size: none at 1, SGLang's default, so that the default is what runs."""
    return {} if page_size == 1 else {"page_size": page_size}


def page_label(page_size: int) -> str:
    return f"page {page_size}" + (" (SGLang's default)" if page_size == 1 else "")


def engine_layout(args: argparse.Namespace, page_size: int = 1) -> dict | None:
    """The further sglang.Engine arguments every engine of the run at ``page_size`` takes (None: none)."""
    layout = {**(parallel_args(args.dp_attention) or {}), **(speculative_args(args.spec_tokens) or {})}
    return {**layout, **page_args(page_size)} or None


def tokens(
    model: str,
    prompts: list,
    kv: str,
    references: list[str],
    work: Path,
    log: Path,
    row,
    layout_args: dict | None = None,
) -> None:
    """Ours with CUDA graphs and without against the references, under the tie rule (FP8: calibrated);
    every engine with the further arguments ``layout_args``."""
    run = partial(run_isolated, engine_args=layout_args)
    ours = {graphs: run(model, prompts, "mla_backend", kv, graphs, log) for graphs in (True, False)}
    refs = {name: run(model, prompts, name, kv, True, log) for name in references}
    base_name, repeats = REFERENCE, []
    if kv.startswith("fp8"):  # judged on the inputs ours sees: the query rounded to FP8 too
        base_name = FP8_QUERY_REFERENCE
        env = quantized_query_env(work / "fp8_query_plugin")
        refs = {base_name: run(model, prompts, REFERENCE, kv, True, log, env=env), **refs}
        # The same reference without graphs: where the two part, triton itself is undecided (a tie).
        again = run(model, prompts, REFERENCE, kv, False, log, env=env)
        row(f"reference {base_name}, eager", "ref", describe(again), decode=base_name, graphs=False, **again)
        repeats = [again["tokens"]] if "error" not in again else []
    for name, ref in refs.items():
        row(f"reference {name}", "ref", describe(ref), decode=name, graphs=True, **ref)
    base = refs[base_name]
    others = [r["tokens"] for n, r in refs.items() if n != base_name and "error" not in r]
    for graphs, run in ours.items():
        part = f"tokens {'graphs' if graphs else 'eager'}"
        if "error" in run or "error" in base:
            row(part, "FAIL", run.get("error") or f"no reference: {base['error']}", decode="mla_backend", graphs=graphs)
            continue
        if base_name == FP8_QUERY_REFERENCE and "error" not in refs[REFERENCE]:
            verdict = calibrated_agreement(
                run["tokens"], base["tokens"], base["gaps"], refs[REFERENCE]["tokens"], *repeats
            )
        else:
            verdict = agreement(run["tokens"], base["tokens"], base["gaps"], *others)
        note = (
            f"{describe(run)}; {verdict['identical']}/{len(run['tokens'])} identical to {base_name}, divergences "
            f"(prompt, step, first tie) {verdict['divergent']}"
        )
        if verdict.get("rule_holds") is False:
            note += f"; {verdict['agreed_steps']} steps agreed vs {verdict['peer_agreed_steps']} for plain {REFERENCE}"
        row(
            part, "PASS" if verdict["ok"] else "FAIL", note, decode="mla_backend", graphs=graphs, **run, verdict=verdict
        )


def run_model(model: str, label: str, args: argparse.Namespace, work: Path, log: Path, rows: list) -> None:
    """The parts on one model, each page size and KV dtype; a row per part into ``rows``."""
    prompts, parts = make_prompts(), set(args.parts.split(","))
    if args.spec_tokens:
        label += f", MTP k={args.spec_tokens}"
    if args.dp_attention > 1:
        label += f", DP attention {args.dp_attention}"
    for page_size in args.page_sizes:
        page_work = work / f"page{page_size}"
        page_work.mkdir(parents=True, exist_ok=True)
        run_page(model, f"{label}, {page_label(page_size)}", args, page_size, page_work, log, rows, prompts, parts)


def run_page(
    model: str,
    label: str,
    args: argparse.Namespace,
    page_size: int,
    work: Path,
    log: Path,
    rows: list,
    prompts: list,
    parts: set[str],
) -> None:
    """The parts on one model at one page size, each KV dtype; each row records the page size."""
    layout_args = engine_layout(args, page_size)
    for kv in args.kv.split(","):
        row = partial(add_row, rows, label, kv, page_size=page_size)
        if "check" in parts:
            within, note = run_checked(model, prompts, kv, 1.0, work, log, layout_args)
            row("check", "PASS" if within is True else "FAIL", note)
        if "selftest" in parts:  # passes where the check ran and failed
            within, note = run_checked(model, prompts, kv, SELFTEST_CORRUPTION, work, log, layout_args)
            outcome = "check failed, as it must" if within is False else "check did not fail"
            row(f"selftest x{SELFTEST_CORRUPTION}", "PASS" if within is False else "FAIL", f"{outcome}: {note}")
        if "tokens" in parts:
            tokens(model, prompts, kv, args.references.split(","), work, log, row, layout_args)


def main() -> int:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "engines.log"
    rows: list[dict] = []
    families, refused = plan(args)
    for family in refused:  # quick: each stops at start-up (its first layout, on dummy weights)
        layout = next(iter(family.heads))
        model = save_sglang_config(family, args.out / "models" / f"{family.published}_config", layout)
        engine_log = args.out / f"refusal_{family.published}.log"
        stopped = start_refused(str(model), engine_log, refusal_env(family))
        status, note = judge_refusal(stopped, engine_log.read_text(), refusal(family))
        add_row(rows, f"{family.name} {layout} ({family.heads[layout]} heads)", "auto", "refused", status, note)
    if not args.families:
        heads = args.heads or 16
        mtp = 1 if args.spec_tokens else 0
        name = f"tiny_h{heads}" + ("_mtp" if mtp else "")
        model = save_sglang_tiny_deepseek(args.out / name, heads, mtp)
        run_model(str(model), f"tiny DeepSeek-V3 ({heads} heads)", args, args.out, log, rows)
    summary = args.out / (f"sglang_h{args.heads or 16}.json" if not args.families else "sglang_zoo.json")
    for family, layout in families:
        name = f"{family.published}_h{family.heads[layout]}"
        model = save_sglang_checkpoint(family, args.out / "models" / name, layout)
        run_model(
            str(model), f"{family.name} {layout} ({family.heads[layout]} heads)", args, args.out / name, log, rows
        )
        summary.write_text(json.dumps(rows, indent=1))  # a run cut at its time limit keeps the families done
    return report(rows, summary)


if __name__ == "__main__":
    sys.exit(main())
