"""Data-parallel attention with expert parallelism on two GPUs, as DeepSeek is served: ``vllm serve
--data-parallel-size 2 --enable-expert-parallel --attention-backend CUSTOM`` on a seeded DeepSeek-V3 whose
second layer routes over 8 experts (4 a rank). Every rank holds all query heads and decodes its own
requests on our kernels; a rank without requests runs vLLM's dummy batches in step with the other, as
the experts' collectives need. Page 64, full CUDA graphs, our kernels pinned (``backend: xqa``).

    python integration/dp_e2e.py --heads 128 --kv fp8,auto --out results/dp
    python integration/dp_e2e.py --heads 16 --kv fp8 --selftest --out results/dp

Needs vLLM's MoE kernels, which the offline bundle leaves out: dev/make_moe_part.sh and PART=stash of
dev/gpu_session.sh put them in. Parts: ``kernels`` (the MoE ops importable, two GPUs), one per KV
dtype, and with --selftest ``selftest``. Pass rules; exit status 1 if a row fails:
- Traffic, the same on every server: 24 prompts sent together (both ranks get requests); 4 prompts one
  after another (one request for two ranks: the other runs dummy batches); 6 arriving 0.3 s apart
  (the load ramps up from one request). Every request returns its 32 tokens.
- Every rank's forward_mqa calls, recomputed in float64 in its engine process
  (engines/vllm_worker_check.py, a summary per rank): each rank judged as one GPU is (enough calls,
  every layer, graph replays, our LSE, within tolerance); a rank that checked nothing fails.
- Greedy tokens of each phase against vLLM's FLASHMLA at the same layout under the tie rule, where a
  step at which the routed layer's top-k experts nearly tie counts as a tie too, found by replaying
  the checkpoint in float64 on the CPU (judges/router_ties.py: ours and FLASHMLA must hold float64's
  token and the token of the swapped expert, one each); where ours still breaks it, the same traffic
  on TRITON_MLA calibrates it: if TRITON_MLA breaks it too against FLASHMLA (an FP8 cache can), ours
  must not agree significantly fewer steps (judges/faults.py).
- --selftest: ours with outputs x SELFTEST_CORRUPTION on the first KV dtype: every rank's check must
  fail; and each KV part's judges are fed FLASHMLA's tokens with a decided one changed, and ours with
  the last rank's summary left out: they must fail.

Writes ``<out>/dp_h{heads}.json`` (parts of earlier calls kept) and prints a PASS/FAIL table last.
``--rejudge`` judges the tokens saved there again with the judges as they are now (on a CPU; no
server, so without TRITON_MLA's calibration) and rewrites those rows.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines.vllm_dp import (  # noqa: E402
    MOE_OPS,
    dp_serve_command,
    missing_moe_ops,
    rank_summaries,
    traffic,
)
from integration.engines.vllm_server import (  # noqa: E402
    checked_server_env,
    free_port,
    running,
)
from integration.engines.vllm_spec import EngineSpec  # noqa: E402
from integration.engines.vllm_worker_check import merged_summary  # noqa: E402
from integration.judges import faults, report  # noqa: E402
from integration.judges.data_parallel import judge_every_dp_rank, judge_selftest_every_dp_rank  # noqa: E402
from integration.judges.faults import gaps_of_runs, tokens_of  # noqa: E402
from integration.judges.router_ties import RouterReplay  # noqa: E402
from integration.judges.tokens import agreement  # noqa: E402
from integration.models.prompts import make_prompts  # noqa: E402
from integration.models.tiny_model import save_tiny_deepseek_v3  # noqa: E402
from integration.settings import SELFTEST_CORRUPTION  # noqa: E402

DP = 2
TOKENS = 32
MAX_NUM_SEQS = 32  # per rank
START_TIMEOUT_S = 600  # two engine cores load, capture their graphs and meet over NCCL
# float64 window per rank: 2 layers x its decode steps over every phase, the steps it runs in step
# with the other rank included (about 200 a rank at 16 heads; 160 left the last phase's unchecked).
CHECK_CALLS = 2 * 240
REFERENCE, PEER = "FLASHMLA", "TRITON_MLA"
# DeepSeek-V3's router (sigmoid scores with a correction bias: vLLM's fused grouped top-k), small experts.
MOE = {"dense_layers": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_intermediate_size": 256}


def phases() -> dict[str, dict]:
    """The traffic every server gets, in this order (engines/vllm_dp.traffic)."""
    return {
        "together": {"prompts": make_prompts(0) + make_prompts(1), "max_tokens": TOKENS, "mode": "together"},
        "alone": {"prompts": make_prompts(2)[3:7], "max_tokens": TOKENS, "mode": "alone"},
        "staggered": {"prompts": make_prompts(3)[2:8], "max_tokens": TOKENS, "mode": "staggered", "gap_s": 0.3},
    }


def spec(backend: str, kv: str) -> EngineSpec:
    ours = {"backend": "xqa"} if backend == "CUSTOM" else {}  # at page 64 on SM90 `auto` may pick FlashMLA
    return EngineSpec(backend, kv, 64, True, mla_backend=ours, max_num_seqs=MAX_NUM_SEQS)


def moe_checkpoint(model_dir: Path, heads: int) -> str:
    return str(save_tiny_deepseek_v3(model_dir / f"dsv3_h{heads}_moe", heads=heads, **MOE))


@dataclass
class Context(report.PartRows):
    heads: int
    out: Path
    model_dir: Path
    selftest: bool
    dp: int = DP
    blocked: str = ""  # why no server can run here (the kernels part found it)

    @functools.cached_property
    def router(self) -> RouterReplay:
        return RouterReplay(moe_checkpoint(self.model_dir, self.heads))


def token_row(name: str, phase: dict) -> str:
    return f"{name} ({phase['mode']}) tokens vs {REFERENCE}"


def judge_phase_tokens(router: RouterReplay, prompts, mine, theirs, gaps, run_peer) -> tuple[bool, str]:
    """The tie rule, the router's near ties counted as ties (judges/router_ties.py); where ours still
    breaks it and ``run_peer`` is given, TRITON_MLA on the same traffic calibrates it."""
    verdict = agreement(mine, theirs, gaps)
    notes: list[str] = []
    if verdict["failures"]:
        left, notes = router.explain(prompts, mine, theirs, verdict["failures"])
        if not left:
            note = f"{verdict['identical']}/{len(mine)} identical, tie rule holds where router ties count: "
            return True, note + "; ".join(notes)
    ok, note = faults.judge_tokens_or_calibrate(mine, theirs, gaps, run_peer, {"name": PEER})
    return ok, note if ok or not notes else f"{note}; {'; '.join(notes)}"


def server_command(engine: EngineSpec, model: str, port: int, dp: int = DP) -> list[str]:
    """Every server of the check: ``dp`` ranks, experts split, prefix caching off (tokens compare)."""
    return dp_serve_command(engine, model, port, dp, host="127.0.0.1", max_num_seqs=MAX_NUM_SEQS)


def serve_and_drive(ctx: Context, engine: EngineSpec, label: str, checked: bool, corrupt=None, only=None) -> dict:
    """Start a data-parallel server, send it ``phases()`` (``only`` those named), stop it. The
    per-phase results; with ``checked``, each rank's float64 summary and their merge."""
    if ctx.blocked:
        raise RuntimeError(ctx.blocked)
    model = moe_checkpoint(ctx.model_dir, ctx.heads)
    port = free_port()
    log = ctx.out / f"{label}_h{ctx.heads}.log"
    check_dir = ctx.out / f"check_{label}_h{ctx.heads}" if checked else None
    env = None
    if check_dir is not None:
        for stale in check_dir.glob("rank*.json"):
            stale.unlink()
        env = checked_server_env(check_dir, engine.kv_cache_dtype, corrupt, CHECK_CALLS)
    command = server_command(engine, model, port, ctx.dp)
    record = ctx.details.setdefault("servers", {}).setdefault(label, {"command": command[3:]})
    with running(command, log, port, record, START_TIMEOUT_S, env):
        wanted = {k: v for k, v in phases().items() if only is None or k in only}
        result: dict = {"phases": asyncio.run(traffic(port, model, wanted))}
    if check_dir is not None:
        result["ranks"] = rank_summaries(check_dir)
        result["decode_check"] = merged_summary(check_dir)
    return result


def part_kernels(ctx: Context) -> None:
    """What every later part needs: vLLM's MoE ops in this environment, and a GPU per rank."""
    import torch

    missing = missing_moe_ops()
    ctx.row("vLLM's MoE kernels", (not missing, f"missing {missing}" if missing else ", ".join(MOE_OPS)))
    gpus = torch.cuda.device_count()
    ctx.row(f"{ctx.dp} GPUs", (gpus >= ctx.dp, f"{gpus} visible"))
    if missing:
        ctx.blocked = "vLLM's MoE kernels are missing: bash dev/make_moe_part.sh, then PART=stash (dev/gpu_session.sh)"
    elif gpus < ctx.dp:
        ctx.blocked = f"{gpus} GPUs for {ctx.dp} data-parallel ranks"


def part_kv(ctx: Context, kv: str) -> None:
    ours_spec = spec("CUSTOM", kv)
    ours = serve_and_drive(ctx, ours_spec, f"ours_{kv}", checked=True)
    ranks, engine = ours["ranks"], asdict(ours_spec)
    ctx.details["decode_check"] = {"ranks": ranks, "merged": ours["decode_check"]}
    ctx.row("every rank's forward_mqa vs float64", judge_every_dp_rank(ranks, engine, ctx.dp))
    ref = serve_and_drive(ctx, spec(REFERENCE, kv), f"{REFERENCE}_{kv}", checked=False)
    peer = functools.cache(lambda: serve_and_drive(ctx, spec(PEER, kv), f"{PEER}_{kv}", checked=False))
    counts = []
    for name, phase in phases().items():
        mine, theirs = tokens_of(ours["phases"][name]), tokens_of(ref["phases"][name])
        gaps = gaps_of_runs(ref["phases"][name])
        counts += [len(t) for t in mine]
        ctx.details.setdefault("tokens", {})[name] = {"ours": mine, REFERENCE: theirs, "gaps": gaps}

        def run_peer(name=name, theirs=theirs, gaps=gaps):
            return tokens_of(peer()["phases"][name]), theirs, gaps

        verdict = judge_phase_tokens(ctx.router, phase["prompts"], mine, theirs, gaps, run_peer)
        ctx.row(token_row(name, phase), verdict)
    ctx.row("every request complete", faults.judge_completions(counts, TOKENS))
    if ctx.selftest:
        # The reference's own tokens with one decided token changed: the token judge must fail them.
        ref_tokens, gaps = ctx.details["tokens"]["together"][REFERENCE], ctx.details["tokens"]["together"]["gaps"]
        poisoned = faults.poison(ref_tokens, gaps)
        prompts = phases()["together"]["prompts"]
        judged = poisoned and judge_phase_tokens(ctx.router, prompts, poisoned, ref_tokens, gaps, None)
        ctx.selftest_row("a poisoned token", judged)
        last = ctx.dp - 1
        fewer = {rank: summary for rank, summary in ranks.items() if rank != last}
        ctx.selftest_row(f"rank {last} checked nothing", judge_every_dp_rank(fewer, engine, ctx.dp))


def part_selftest(ctx: Context, kv: str) -> None:
    """Ours with corrupted outputs on every rank: each rank's float64 check must fail."""
    corrupt_spec = spec("CUSTOM", kv)
    label = f"ours_{kv}_corrupt"
    run = serve_and_drive(ctx, corrupt_spec, label, checked=True, corrupt=SELFTEST_CORRUPTION, only=["together"])
    caught, note = judge_selftest_every_dp_rank(run["ranks"], asdict(corrupt_spec), ctx.dp)
    ctx.rows.append((f"outputs x{SELFTEST_CORRUPTION} caught on every rank ({kv})", caught, note))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=128, help="query heads, all of them on every rank")
    parser.add_argument("--kv", default="fp8,auto", help="KV cache dtypes, a part each (of fp8,auto)")
    parser.add_argument("--selftest", action="store_true", help="also corrupt our outputs: the check must fail")
    parser.add_argument("--out", type=Path, default=Path("results/dp"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/mla_backend_models"))
    parser.add_argument("--rejudge", action="store_true", help="judge the tokens saved in <out> again, on a CPU")
    args = parser.parse_args()
    kvs = [kv for kv in args.kv.split(",") if kv]
    if not kvs or set(kvs) - {"fp8", "auto"}:
        parser.error(f"--kv takes fp8 and auto, not {args.kv!r}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    # `timeout` ends a call with SIGTERM: leave through the finally blocks, which stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ctx = Context(args.heads, args.out, args.model_dir, args.selftest)
    if args.rejudge:
        return rejudge(ctx, args.out / f"dp_h{args.heads}.json")
    runners = {"kernels": lambda: part_kernels(ctx)}
    runners |= {kv: functools.partial(part_kv, ctx, kv) for kv in kvs}
    if args.selftest:
        runners["selftest"] = functools.partial(part_selftest, ctx, kvs[0])
    return report.run_parts(
        runners,
        lambda part: report.run_part(ctx, runners[part]),
        args.out / f"dp_h{args.heads}.json",
        dict(heads=args.heads, dp=DP),
        f"vllm serve, data parallel {DP} + expert parallel, {args.heads} heads on every rank",
    )


def rejudge(ctx: Context, path: Path) -> int:
    """The token rows (and the poisoned-token selftest) of a saved run, judged again from its tokens."""
    summary = json.loads(path.read_text())
    every = phases()
    for result in summary["parts"].values():
        saved = result["details"].get("tokens")
        if not saved:
            continue
        for row in result["rows"]:
            for name, phase in every.items():
                if row["check"] == token_row(name, phase):
                    t = saved[name]
                    ok, note = judge_phase_tokens(
                        ctx.router, phase["prompts"], t["ours"], t[REFERENCE], t["gaps"], None
                    )
                    row.update(ok=ok, note=f"{note} (rejudged from the saved tokens)")
            if row["check"] == "selftest: a poisoned token":
                t = saved["together"]
                poisoned = faults.poison(t[REFERENCE], t["gaps"])
                ok, note = judge_phase_tokens(
                    ctx.router, every["together"]["prompts"], poisoned, t[REFERENCE], t["gaps"], None
                )
                row.update(ok=not ok, note=f"{'NOT CAUGHT' if ok else 'caught'}: {note} (rejudged)")
    path.write_text(json.dumps(summary, indent=1, default=str))
    title = f"vllm serve, data parallel {summary['dp']} + expert parallel, {summary['heads']} heads, rejudged"
    return report.print_table(summary, summary["parts"], path, title)


if __name__ == "__main__":
    sys.exit(main())
