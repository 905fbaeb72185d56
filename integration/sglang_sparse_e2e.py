"""DeepSeek-V3.2 and GLM-5 end to end on SGLang (GPU): SGLang's dsa backend with mla_backend's sparse
kernels as its decode sub-backend (``--dsa-decode-backend mla_backend``; mla_backend/sglang/dsa.py)
against SGLang's own sparse decode on the same indexer, prefill and pool.

    python integration/sglang_sparse_e2e.py --families DeepSeek-V3.2,GLM-5 --kv auto,fp8_e4m3 \
        --parts tokens,check,selftest,serve --out results/sglang_sparse

Per family (the zoo's seeded checkpoint as SGLang reads it, models/sglang_checkpoint.py; Name@heads picks
a layout) and KV dtype (``auto``: bf16 on SM90; ``fp8_e4m3``: SGLang's fp8_ds_mla rows of 656 bytes),
every engine through ``sglang.Engine`` in a process of its own (engines/sglang_engine.py, ``sparse``),
page 64, its prefill sub-backend SGLang's default (flashmla_sparse for bf16, flashmla_kv for fp8 on
SM90), prompts from models/prompts.make_sparse_prompts (longer than the top-k of 2048, so the indexer
chooses in prefill and decode, and shorter):
- tokens: ours with CUDA graphs against SGLang's decode with graphs, under the tie rule
  (judges/tokens.py): flashmla_sparse for bf16, flashmla_kv for fp8 (FlashMLA's fp8 kernel); no second
  SGLang sparse decode runs on the lent H200 (fa3 and tilelang are not in its bundle, trtllm and
  flashinfer_sparse_mla are SM100/SM120), so the reference also generates each prompt in a batch of its
  own: where its batch and its lone runs part, the step is a tie (an indexer whose k-th and next scores
  lie within rounding picks by the batch's rounding; a swapped key can carry much of a peaked row's
  attention). With fp8, where the rule breaks against FlashMLA's fp8 kernel, ours
  must stay with the bf16 reference (flashmla_sparse on a bf16 cache) about as many steps as
  flashmla_kv does (not significantly fewer), as sparse_e2e.py judges vLLM's. Decode tokens/s of both.
- check: ours eager, every decode call of ours recomputed in float64 from SGLang's pool and the rows our
  subclass was handed, and each call's lists against a float64 top-k of the indexer scorer's own inputs
  (engines/sglang_sparse_check.py; judges/sparse_check.py); where DeepGEMM is not installed the indexer
  must have scored with mla_backend's functions. With tokens, that run's tokens are judged as the graph
  run's are: a run whose every call is right to float64 and that still parts early points at the
  indexer's choice, not the kernel.
- selftest: the check with our outputs x settings.SELFTEST_CORRUPTION; it must fail.
- serve (asked for by name): ``python -m sglang.launch_server`` of ours as a user starts it, SGLang's radix
  cache on (engines/sglang_sparse_server.py), through /generate: the prompts in a batch, then SERVE_COPIES
  streams of each at once (reading their prompts from the radix cache). With CUDA graphs: every answer
  complete and under the tie rule against SGLang's decode (as tokens), every request and token counted
  by /metrics, decode through the graphs, the log clean and a stop by SIGINT; eager on the same traffic
  with every decode call of ours checked in float64 (the check's judge); with selftest, an eager server
  with our outputs x SELFTEST_CORRUPTION, whose check must fail, and the count judged with a request
  taken off it.

Every engine runs with SGLang's dense one-shot prefill off (SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0):
SGLang runs it with FA3 on SM90, which the bundle lacks; prefill stays sparse MLA. One row per (family,
KV dtype, part), printed last; JSON rows in
``--out``/sglang_sparse.json; exit status 1 if a part fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from functools import partial
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the checkout's integration, after the wheel
from integration.engines.sglang_decode_check import clear_summary  # noqa: E402
from integration.engines.sglang_engine import NEW_TOKENS, run_isolated  # noqa: E402
from integration.engines.sglang_sparse_check import plugin_env, read_summary  # noqa: E402
from integration.engines.sglang_sparse_server import serve as serve_model  # noqa: E402
from integration.judges import sglang_served  # noqa: E402
from integration.judges.engine_rows import add_row, describe, report  # noqa: E402
from integration.judges.faults import judge_completions  # noqa: E402
from integration.judges.sglang_faults import judge_log  # noqa: E402
from integration.judges.sparse_check import judge_sparse_check, judge_sparse_selftest  # noqa: E402
from integration.judges.tokens import (  # noqa: E402
    agreement,
    agreement_before,
    first_ties,
    significantly_fewer_steps,
    steps_per_prompt,
    ties_with_repeats,
)
from integration.models.families import Family, pick  # noqa: E402
from integration.models.prompts import checkpoint_sparse_prompts  # noqa: E402
from integration.models.sglang_checkpoint import save_sglang_checkpoint  # noqa: E402
from integration.settings import SELFTEST_CORRUPTION  # noqa: E402

OURS = "mla_backend"
REFERENCES = {"auto": "flashmla_sparse", "fp8_e4m3": "flashmla_kv"}  # SGLang's DSA decode per KV dtype
PARTS = ("tokens", "check", "selftest", "serve")
DEFAULT_PARTS = PARTS[:3]  # serve starts three servers per family and cache: asked for by name
SERVE_COPIES = 8  # streams per prompt in the serve part's second wave
SERVE_MODES = ("graphs", "eager")  # the serve part's servers of ours: with CUDA graphs, eager and checked
ENGINE_ENV = {"SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0"}  # no FA3 one-shot prefill (docstring)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="DeepSeek-V3.2,GLM-5", help="sparse zoo families (Name@heads)")
    parser.add_argument("--kv", default="auto,fp8_e4m3", help=f"KV dtypes among {sorted(REFERENCES)}")
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"of {','.join(PARTS)}")
    parser.add_argument(
        "--serve-modes", default=",".join(SERVE_MODES), help=f"the serve part's servers of ours, of {SERVE_MODES}"
    )
    parser.add_argument("--out", type=Path, default=Path("results/sglang_sparse"))
    args = parser.parse_args(argv)
    args.kv, args.parts, args.serve_modes = args.kv.split(","), args.parts.split(","), args.serve_modes.split(",")
    if unknown := [mode for mode in args.serve_modes if mode not in SERVE_MODES]:
        parser.error(f"--serve-modes: {unknown} (modes: {SERVE_MODES})")
    if unknown := [kv for kv in args.kv if kv not in REFERENCES]:
        parser.error(f"--kv: {unknown} (SGLang's DSA caches: {sorted(REFERENCES)})")
    if unknown := [part for part in args.parts if part not in PARTS]:
        parser.error(f"--parts: {unknown} (parts: {PARTS})")
    return args


def plan(args: argparse.Namespace) -> list[tuple[Family, str]]:
    """The (family, layout) pairs to run; a family that is not sparse stops the run."""
    chosen = pick(args.families, every_layout=False)
    dense = sorted({f.name for f, _ in chosen if f.expect != "sparse"})
    if dense:
        raise SystemExit(f"{dense} are not sparse: integration/sglang_e2e.py runs them")
    return chosen


class Runs:
    """One model's engines (run_isolated, sparse), each run at most once: the references are shared by
    the KV dtypes' parts (the fp8 verdict reads the bf16 reference)."""

    def __init__(self, model: str, prompts: list, work: Path, log: Path):
        self.model, self.prompts, self.work, self.log = model, prompts, work, log
        self.done: dict[tuple, dict] = {}
        self.checked_runs: dict[str, dict] = {}  # per KV dtype, the check's eager run (uncorrupted)
        self.served_peers: dict[tuple[str, bool], dict] = {}  # per KV dtype and graphs (served_calibrated)

    def engine(
        self, decode: str, kv: str, graphs: bool, greedy_only: bool = False, env: dict | None = None, alone=False
    ):
        key = (decode, kv, graphs, greedy_only, json.dumps(env, sort_keys=True), alone)
        if key not in self.done:
            settings = {**ENGINE_ENV, **(env or {})}
            self.done[key] = run_isolated(
                self.model, self.prompts, decode, kv, graphs, self.log, greedy_only, settings, sparse=True,
                also_alone=alone,
            )  # fmt: skip
        return self.done[key]

    def reference(self, kv: str) -> dict:
        """SGLang's decode for ``kv`` with graphs, each prompt also alone."""
        return self.engine(REFERENCES[kv], kv, True, alone=True)

    def checked(self, kv: str, corruption: float) -> tuple[dict | None, str]:
        """Ours eager with every decode call checked: (the check's summary, note); None where none came."""
        summary = self.work / f"sparse_check_{kv}_x{corruption}.json"
        clear_summary(summary)
        env = plugin_env(self.work / "sparse_check_plugin", corruption, summary, kv)
        run = self.engine(OURS, kv, False, greedy_only=True, env=env)
        if corruption == 1.0:
            self.checked_runs[kv] = run
        if "error" in run:
            return None, run["error"]
        checked = read_summary(summary)
        return checked, "" if checked is not None else "no decode call of ours was checked"

    def served(self, kv: str, graphs: bool, corruption: float | None = None) -> tuple[dict, dict | None]:
        """Ours under ``sglang.launch_server`` (engines/sglang_sparse_server.py), with graphs or eager;
        ``corruption``: eager with every decode call checked in float64, our outputs times it (its
        traffic the batch alone where it is not 1, the selftest). The server's run and the check's
        summary (None where none was installed or none came)."""
        env, summary = dict(ENGINE_ENV), None
        name = f"serve_{kv}_{mode_name(graphs)}" + ("" if corruption is None else f"_x{corruption}")
        if corruption is not None:
            summary = self.work / f"{name}_check.json"
            clear_summary(summary)
            env |= plugin_env(self.work / "sparse_check_plugin", corruption, summary, kv)
        copies = SERVE_COPIES if corruption in (None, 1.0) else 0
        run = serve_model(
            self.model, self.prompts, OURS, kv, self.work / f"{name}.log", graphs=graphs, copies=copies, env=env
        )
        return run, None if summary is None else read_summary(summary)

    def served_peer(self, kv: str, graphs: bool) -> dict:
        """SGLang's own decode for ``kv`` served as ours was (with graphs or eager: a batch's GEMMs and
        their rounding follow the mode) on the serve part's traffic, which calibrates the tie rule there
        (started at most once per mode, where ours breaks the rule)."""
        if (kv, graphs) not in self.served_peers:
            log = self.work / f"serve_{kv}_{REFERENCES[kv]}_{mode_name(graphs)}.log"
            self.served_peers[kv, graphs] = serve_model(
                self.model, self.prompts, REFERENCES[kv], kv, log, graphs=graphs, copies=SERVE_COPIES, env=ENGINE_ENV
            )
        return self.served_peers[kv, graphs]


def mode_name(graphs: bool) -> str:
    return "graphs" if graphs else "eager"


def scorer_expected() -> str | None:
    """Whose decode scorer SGLang's indexer must use: mla_backend's where DeepGEMM is not installed."""
    return "mla_backend" if importlib.util.find_spec("deep_gemm") is None else None


def judge_check(summary: dict, selftest: bool) -> tuple[bool, str]:
    if selftest:
        return judge_sparse_selftest(summary)
    ok, note = judge_sparse_check(summary)
    wanted = scorer_expected()
    if wanted is not None and summary["indexer_scorer"] != wanted:
        return False, f"the indexer scored with {summary['indexer_scorer']!r}, not {wanted}'s; {note}"
    return ok, f"{note}; scorer {summary['indexer_scorer']}"


def tokens(runs: Runs, kv: str, row) -> None:
    """Ours with graphs, and the checked eager run where the check ran, against SGLang's decode with
    graphs under the tie rule (where its batch and lone runs part is a tie too); with fp8 calibrated on
    the bf16 reference where the rule breaks."""
    ref = runs.reference(kv)
    name = REFERENCES[kv]
    row(f"reference {name}", "ref", describe(ref), decode=name, graphs=True, **ref)
    judged = [("tokens graphs", runs.engine(OURS, kv, True), True)]
    if (checked := runs.checked_runs.get(kv)) is not None:
        judged.append(("tokens eager, checked run", checked, False))
    for title, ours, graphs in judged:
        if "error" in ours or "error" in ref:
            row(title, "FAIL", ours.get("error") or f"no reference: {ref['error']}", decode=OURS)
            continue
        verdict, note = judge_tokens(runs, kv, ours["tokens"])
        if "tokens_per_s" in ours:
            note = f"{describe(ours)}; {note}"
        status = "PASS" if verdict["ok"] else "FAIL"
        row(title, status, note, decode=OURS, graphs=graphs, **ours, verdict=verdict)


def judge_tokens(runs: Runs, kv: str, ours: list[list[int]], copies: int = 1) -> tuple[dict, str]:
    """Ours (the reference's prompts ``copies`` times over) against SGLang's decode for ``kv`` under the
    tie rule, its lone runs a source of ties; with fp8 calibrated on the bf16 reference where the rule
    breaks. The verdict (agreement's, ``ok`` the final word) and its note."""
    ref = runs.reference(kv)
    verdict = agreement(ours, ref["tokens"] * copies, ref["gaps"] * copies, ref["alone_tokens"] * copies)
    note = (
        f"{verdict['identical']}/{len(ours)} identical to {REFERENCES[kv]}, divergences "
        f"(prompt, step, first tie) {verdict['divergent']}"
    )
    if not verdict["ok"] and kv.startswith("fp8"):
        verdict["ok"], more = fp8_calibrated(runs, ours, ref["tokens"] * copies, copies)
        note += f"; {more}"
    return verdict, note


def fp8_calibrated(runs: Runs, ours: list[list[int]], ref: list[list[int]], copies: int = 1) -> tuple[bool, str]:
    """Where ours breaks the tie rule against FlashMLA's fp8 kernel (``ref``): ours must stay with the
    bf16 reference not significantly fewer steps than that kernel does."""
    bf16 = runs.reference("auto")
    if "error" in bf16:
        return False, f"no bf16 reference to calibrate on: {bf16['error']}"
    ours_steps, peer_steps = (steps_per_prompt(tokens, bf16["tokens"] * copies) for tokens in (ours, ref))
    ok = not significantly_fewer_steps(ours_steps, peer_steps)
    steps = f"ours {sum(ours_steps)}, {REFERENCES['fp8_e4m3']} {sum(peer_steps)}"
    return ok, f"steps with the bf16 {REFERENCES['auto']}: {steps}"


def serve(runs: Runs, kv: str, row, selftest: bool, modes=SERVE_MODES) -> None:
    """``python -m sglang.launch_server`` of ours as a user starts it (SGLang's radix cache and scheduler
    on): with CUDA graphs, the check's prompts in a batch and then SERVE_COPIES streams of each at once,
    every answer complete and under the tie rule against SGLang's decode (as the tokens part; where ours
    breaks it, SGLang's decode served the same way is that reference run again: served_calibrated), each
    request and token counted by /metrics, decode through graphs, the log clean and a stop by SIGINT;
    eager with every decode call checked in float64 (the check part's judge) on the same traffic; with
    ``selftest``, an eager server with our outputs x SELFTEST_CORRUPTION, whose check must fail."""
    ref = runs.reference(kv)
    if "error" in ref:
        row("serve", "FAIL", f"no reference: {ref['error']}")
        return
    servers = [("graphs", True, None)] if "graphs" in modes else []
    if "eager" in modes:
        servers.append(("eager, checked", False, 1.0))
    if selftest:
        servers.append((f"eager x{SELFTEST_CORRUPTION}", False, SELFTEST_CORRUPTION))
    for label, graphs, corruption in servers:
        run, summary = runs.served(kv, graphs, corruption)
        title = f"serve {label}"
        if "error" in run:
            row(title, "FAIL", run["error"], server=run["server"])
            continue
        if corruption not in (None, 1.0):
            ok, note = judge_check(summary, selftest=True) if summary else (False, "no decode call was checked")
            row(f"{title}: check", "PASS" if ok else "FAIL", note, check=summary)
            continue
        judge_served(runs, kv, partial(row_of, row, title), run, graphs)
        if corruption == 1.0:
            ok, note = judge_check(summary, selftest=False) if summary else (False, "no decode call was checked")
            row(f"{title}: float64", "PASS" if ok else "FAIL", note, check=summary)
    offline = {key: ref[key] for key in ("tokens", "gaps", "alone_tokens")}  # the verdicts' inputs, kept
    row(f"serve reference {REFERENCES[kv]} offline", "ref", "the tie rule's reference", **offline)
    for graphs in (True, False):
        if (peer := runs.served_peers.get((kv, graphs))) is not None:  # it calibrated a row: its tokens kept
            tokens = {key: [r["tokens"] for r in peer.get(key, [])] for key in ("batch", "streams")}
            note = peer.get("error", "served the same traffic")
            row(f"serve reference {REFERENCES[kv]} {mode_name(graphs)}", "ref", note, tokens=tokens)


def row_of(row, title: str, what: str, outcome: tuple[bool, str], **details) -> None:
    """A row of one server's (``title``) from a judge's (ok, note)."""
    row(f"{title}: {what}", "PASS" if outcome[0] else "FAIL", outcome[1], **details)


def judge_served(runs: Runs, kv: str, row, run: dict, graphs: bool) -> None:
    """One server's answers, counts, decode mode, log and stop."""
    batch, streams = [r["tokens"] for r in run["batch"]], [r["tokens"] for r in run["streams"]]
    for what, tokens, copies in (("batch", batch, 1), (f"{len(streams)} streams", streams, SERVE_COPIES)):
        complete = judge_completions([len(t) for t in tokens], NEW_TOKENS)
        verdict, note = judge_tokens(runs, kv, tokens, copies)
        if not verdict["ok"]:
            verdict["ok"], more = served_calibrated(runs, kv, tokens, copies, graphs)
            note += f"; {more}"
        outcome = (complete[0] and verdict["ok"], f"{complete[1]}; {note}")
        row(f"{what} tokens", outcome, verdict=verdict, tokens=tokens)
    cached = sum(r["cached"] for r in run["streams"])
    before, after = run["metrics"]
    answered, generated = len(batch) + len(streams), sum(map(len, batch + streams))
    counted = sglang_served.judge_counted(before, after, answered, generated)
    row("/metrics", (counted[0], f"{counted[1]}; {cached} prompt tokens of the streams from the radix cache"))
    row("decode mode", sglang_served.judge_decode_mode(before, after, graphs))
    server = run["server"]
    log_ok, log_note = judge_log(run["log"])
    stop = f"started in {server['start_s']} s, SIGINT: exit {server['exit']}"
    row("server", (log_ok and server["stopped"], f"{stop}; {log_note}"), server=server)
    if graphs:  # the selftest of the count: one request lost from it must fail
        broken = sglang_served.judge_counted(before, sglang_served.one_request_uncounted(after), answered, generated)
        row("selftest, a request uncounted", (not broken[0], broken[1]))


def served_calibrated(runs: Runs, kv: str, ours: list[list[int]], copies: int, graphs: bool) -> tuple[bool, str]:
    """Where ours breaks the tie rule under the server (its batches are not the offline reference's:
    32 streams of four prompts, their prompts read from the radix cache): SGLang's own decode served
    with the same traffic and mode (``graphs``) is the reference run again, each of its answers to a
    prompt (batch and streams) one more run of that prompt, and a step where one parts from the offline
    reference is a tie (as the offline reference's lone runs are; the tie rule's own definition)."""
    peer = runs.served_peer(kv, graphs)
    name = f"SGLang's {REFERENCES[kv]} served {mode_name(graphs)}"
    if "error" in peer:
        return False, f"no {name} to calibrate on: {peer['error']}"
    ref = runs.reference(kv)
    ties = first_ties(ref["tokens"], ref["gaps"], ref["alone_tokens"])
    prompts = len(ref["tokens"])
    answers = [(i, r["tokens"]) for i, r in enumerate(peer["batch"])]
    answers += [(i % prompts, r["tokens"]) for i, r in enumerate(peer["streams"])]
    served = ties_with_repeats(ref["tokens"], ties, answers)
    verdict = agreement_before(ours, ref["tokens"] * copies, served * copies)
    earlier = {p: (ties[p], served[p]) for p in range(prompts) if served[p] < ties[p]}
    note = f"{name} ({len(answers)} answers) parts before the reference's first tie at (prompt: tie, step) {earlier}"
    if not verdict["ok"]:
        note += f"; ours still breaks it at {verdict['failures'][:3]}"
    return verdict["ok"], note


def run_family(family: Family, layout: str, args: argparse.Namespace, rows: list) -> None:
    heads = family.heads[layout]
    name = f"{family.published}_h{heads}"
    model = save_sglang_checkpoint(family, args.out / "models" / name, layout)
    prompts = checkpoint_sparse_prompts(model)
    work = args.out / name
    work.mkdir(parents=True, exist_ok=True)
    runs = Runs(str(model), prompts, work, args.out / "engines.log")
    label = f"{family.name} {layout} ({heads} heads)"
    for kv in args.kv:
        row = partial(add_row, rows, label, kv)
        for part, corruption in (("check", 1.0), ("selftest", SELFTEST_CORRUPTION)):
            if part not in args.parts:
                continue
            summary, why = runs.checked(kv, corruption)
            title = part if part == "check" else f"selftest x{corruption}"
            if summary is None:
                row(title, "FAIL", why)
                continue
            ok, note = judge_check(summary, selftest=part == "selftest")
            row(title, "PASS" if ok else "FAIL", note, check=summary)
        if "tokens" in args.parts:
            tokens(runs, kv, row)
        if "serve" in args.parts:
            serve(runs, kv, row, "selftest" in args.parts, args.serve_modes)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    summary = args.out / "sglang_sparse.json"
    for family, layout in plan(args):
        run_family(family, layout, args, rows)
        summary.write_text(json.dumps(rows, indent=1))  # a run cut at its time limit keeps the families done
    return report(rows, summary, note_width=200)


if __name__ == "__main__":
    sys.exit(main())
