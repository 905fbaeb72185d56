"""Fault checks of the SGLang plugin under ``python -m sglang.launch_server`` on a GPU (issue #34, item 6):
``--decode-attention-backend mla_backend`` (prefill: triton) on the seeded DeepSeek-V3, page 64, driven
through SGLang's native ``/generate`` (token ids in and out, greedy, ``ignore_eos``) through retraction,
client aborts and the radix cache with chunked prefill: integration/fault_check.py's checks of
``vllm serve``, at a smaller scale, each against SGLang's own behaviour.

    python integration/sglang_fault_check.py --heads 16 --kv fp8_e4m3 --parts preemption,aborts,radix --selftest \
        --out results/sglang_faults

Parts (each starts its own servers; integration/engines/sglang_server.py):
- preemption: a KV pool of PREEMPT_POOL tokens (``--max-total-tokens``) and a burst whose decode outgrows
  it, admitted optimistically (``--schedule-conservativeness`` PREEMPT_CONSERVATIVENESS). SGLang's
  ``sglang:num_retracted_requests_total`` must rise during the burst (it retracts decode requests when
  the pool runs full: "KV cache pool is full. Retract requests."), every request must return all its
  tokens, the burst's greedy tokens must equal those of the same requests sent one at a time first
  (tie rule, gaps from the alone run; the radix cache emptied in between), and the idle server must
  hold no KV token afterwards.
- aborts: streams of which a seeded share disconnect after a seeded number of chunks (some before the
  first). The scheduler must have stopped them (it ran fewer decode steps than the streams would
  have), the other streams and a follow-up wave must complete with the tokens of a first wave of the
  same requests (tie rule), and once idle the server must run and queue nothing and hold no KV token
  outside the radix cache's evictable ones (``sglang:num_used_tokens`` 0), after the aborts and after
  the follow-up.
- radix: the radix cache on (SGLang's default) with prefill chunks of RADIX_CHUNK tokens: prefixes and
  prompts cached by a first wave, then shared-prefix, repeated, short and long prompts (prefilled over
  several chunks) in one batch. Each shared-prefix and repeated request must read its prefix from the
  cache (``cached_tokens``), the tokens must agree with SGLang's triton decode under the same settings
  (tie rule), and in an eager run of the same traffic every decode call of ours is recomputed in
  float64 in the scheduler process (integration/engines/sglang_decode_check.py) and must be within
  the kernel's tolerance.
Every server runs with SGLang's idle leak check strict (``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE``:
a leaked token or request slot ends the scheduler, saying so); each part's log must hold no traceback
and none of SGLang's failure messages, and the server must stop on SIGINT.

Tokens: where ours breaks the tie rule, the same traffic runs on SGLang's triton decode, which
calibrates it (judges/faults.py judge_tokens): if triton breaks the rule too, ours must not agree
significantly fewer steps than triton does. With an FP8 cache the radix part's reference is triton on
the query rounded to FP8, as ours reads it (engines/sglang_quantized_query.py), and plain triton the
calibrating peer, as integration/sglang_e2e.py judges FP8; with a bf16 cache its reference is plain
triton, and the tie rule alone judges (SGLang has no second MLA decode backend without FlashInfer).

--selftest: each part also feeds its judges broken versions of its own results (a request cut short,
a poisoned token, the retraction counter of the phase without retraction, KV tokens never given back,
SGLang's leak failure in the log, a batch without radix hits), and the radix part serves ours with
outputs x SELFTEST_CORRUPTION, whose float64 check must fail. Each such row passes where the judge
caught the breakage.

Writes ``<out>/sglang_faults_h{heads}_{kv}.json`` (parts from earlier calls into the same file are
kept) after every part and prints a PASS/FAIL table last; exit status 1 if a row fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import cast

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines import sglang_client as client  # noqa: E402
from integration.engines.sglang_decode_check import clear_summary, read_summary  # noqa: E402
from integration.engines.sglang_decode_check import plugin_env as check_env  # noqa: E402
from integration.engines.sglang_quantized_query import plugin_env as fp8_query_env  # noqa: E402
from integration.engines.sglang_server import (  # noqa: E402
    flush_cache,
    launch_command,
    scrape,
    server_env,
    start,
    stop,
    wait_until_idle,
)
from integration.engines.vllm_server import free_port, running  # noqa: E402
from integration.judges import faults, report, sglang_faults  # noqa: E402
from integration.judges.decode_verdict import judge_sglang_check  # noqa: E402
from integration.judges.faults import gaps_of_runs, tokens_of  # noqa: E402
from integration.models.prompts import make_prompts  # noqa: E402
from integration.models.sglang_checkpoint import save_sglang_tiny_deepseek  # noqa: E402
from integration.models.tiny_model import TINY_DEFAULTS  # noqa: E402
from integration.settings import SELFTEST_CORRUPTION  # noqa: E402

PARTS = ("preemption", "aborts", "radix")
OURS, PEER = "mla_backend", "triton"
FP8_QUERY_REFERENCE = "triton, fp8 query"  # engines/sglang_quantized_query.py
VOCAB = cast(int, TINY_DEFAULTS["vocab_size"])
START_TIMEOUT_S = 300
IDLE_TIMEOUT_S = 40  # past SGLang's 30-s refresh of an idle server's gauges, should one be missed
PROBE, PROBE_TOKENS = list(range(1, 9)), 2  # one decode step: the scheduler then publishes its idle state

# preemption: 16 prompts of 192-256 tokens in a pool of 4096 tokens (64 pages); every third asks for 32
# new tokens, the others for 384. SGLang (0.5.17's PrefillAdder) admits a new request only while its
# prompt and *all* its new tokens fit beside the running ones' remaining tokens times the new-token
# ratio (0.21 with conservativeness 0.3, decaying), and admits no more until a running request ends.
# With equal budgets the first 8 fill the pool, finish together, and nothing is retracted. Short ones
# ending early reopen admission while the long ones are counted at the ratio only: the requests then
# admitted outgrow the pool and SGLang retracts (3 a run in a model of that rule, for prompt seeds 0-5).
PREEMPT_REQUESTS, PREEMPT_PROMPT, PREEMPT_SHORT, PREEMPT_LONG = 16, (192, 256), 32, 384
PREEMPT_POOL, PREEMPT_CHUNK, PREEMPT_CONSERVATIVENESS = 4096, 4096, 0.3
# aborts: 3 x 12 prompts of 1-1000 tokens; 40% of the clients leave after 0-48 of 64 chunks.
ABORT_SEEDS, ABORT_TOKENS, ABORT_SHARE, ABORT_LAST_CHUNK = (0, 1, 2), 64, 0.4, 48
SERVE_POOL = 65536  # the aborts' and the radix part's pool: no retraction there
# radix: 2 prefixes of 512 tokens shared by 3 prompts each, 3 prompts repeated, 3 short ones and 2 of
# 1500-2000 tokens prefilled in chunks of 512.
RADIX_PREFIXES, RADIX_PREFIX_LEN, RADIX_SHARED, RADIX_REPEATED = 2, 512, 3, 3
RADIX_SHORT, RADIX_LONG, RADIX_LONG_LEN, RADIX_CHUNK, RADIX_TOKENS = 3, 2, (1500, 2000), 512, 32


@dataclass
class Context(report.PartRows):
    heads: int
    kv: str  # SGLang's --kv-cache-dtype: fp8_e4m3 or auto (bf16)
    out: Path
    model_dir: Path
    seed: int
    selftest: bool

    @property
    def fp8(self) -> bool:
        return self.kv.startswith("fp8")

    def model(self) -> str:
        # SGLang's DeepSeek model reads moe_layer_freq, which transformers' config does not write.
        path = self.model_dir / f"dsv3_h{self.heads}_sglang"
        return str(save_sglang_tiny_deepseek(path, self.heads))


# --- one server -----------------------------------------------------------------------------------


@dataclass
class Served:
    name: str
    port: int
    process: object
    log: Path
    check: Path | None  # where the float64 check writes its summary, if installed


@contextlib.contextmanager
def served(
    ctx: Context,
    decode: str,
    label: str,
    model: str,
    *,
    graphs: bool = True,
    check: float | None = None,
    fp8_query: bool = False,
    **flags,
):
    """A server of ``decode`` for the time of the block; its start, stop and exit go into the part's
    details. ``check``: eager, every decode call of ours recomputed in float64 in the scheduler with
    our outputs times ``check`` (1.0: as they are). ``fp8_query``: triton decoding the query rounded
    to FP8 (the FP8 reference)."""
    name = f"{label}_{decode}" + ("_fp8query" if fp8_query else "") + ("" if check is None else f"_checked_x{check}")
    log = ctx.out / f"{name}_h{ctx.heads}_{ctx.kv}.log"
    extra: dict[str, str] = {}
    summary = None
    if check is not None:
        graphs = False  # the check recomputes each call as it runs: no graph replays
        summary = ctx.out / f"check_{name}_h{ctx.heads}_{ctx.kv}.json"
        clear_summary(summary)
        extra = check_env(ctx.out / "check_plugin", check, summary)
    elif fp8_query:
        extra = fp8_query_env(ctx.out / "fp8_query_plugin")
    port = free_port()
    command = launch_command(model, port, decode, ctx.kv, graphs=graphs, **flags)
    record = ctx.details.setdefault("servers", {}).setdefault(name, {"command": command[3:]})

    def judge_log() -> None:  # also for a server that died mid-part: its note says why
        record["log"] = sglang_faults.judge_log(log.read_text(errors="replace"))[1]

    with running(
        command, log, port, record, START_TIMEOUT_S, server_env(extra), start=start, stop=stop, before_stop=judge_log
    ) as server:
        yield Served(name, port, server, log, summary)


def on_server(ctx: Context, decode: str, label: str, model: str, traffic, **kwargs) -> dict:
    """Start a server, run ``traffic(served)`` (a coroutine function) on it, stop it; the result with
    the server's log as it stood before the stop (SIGINT makes uvicorn's exit noisy), the float64
    check's summary where installed (None where no call was checked), and the stop."""
    with served(ctx, decode, label, model, **kwargs) as server:
        result = asyncio.run(traffic(server))
        result["log"] = server.log.read_text(errors="replace")
    if server.check is not None:
        result["decode_check"] = read_summary(server.check)
    result["stop"] = ctx.details["servers"][server.name]
    return result


async def idle_metrics(server: Served) -> dict[str, float]:
    """/metrics once the server is idle: a probe's decode step first, so that the scheduler's idle
    report follows a report with a request running (SGLang republishes only a gauge it knows stale)."""
    await client.together(server.port, [PROBE], PROBE_TOKENS)
    return await asyncio.to_thread(wait_until_idle, server.port, sglang_faults.IDLE, IDLE_TIMEOUT_S)


async def metrics(server: Served) -> dict[str, float]:
    return await asyncio.to_thread(scrape, server.port)


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(length)]


def judge_tokens_or_calibrate(ctx: Context, check: str, ours, ref, ref_gaps, run_peer=None) -> None:
    """Tokens under the tie rule, calibrated where ours breaks it by SGLang's triton decode on the same
    traffic (faults.judge_tokens_or_calibrate)."""
    peer = {"engine": "SGLang", "name": PEER}
    ctx.row(check, faults.judge_tokens_or_calibrate(ours, ref, ref_gaps, run_peer, peer))


def judge_server(ctx: Context, run: dict) -> None:
    """The log of a server of ours, and its stop."""
    ctx.row("server log", sglang_faults.judge_log(run["log"]))
    stopped, code = run["stop"]["stopped"], run["stop"]["exit"]
    ctx.row("stops on SIGINT", (stopped, f"exit {code}" + ("" if stopped else " (killed: no exit in 60 s)")))


# --- the parts ------------------------------------------------------------------------------------


def preemption_flags() -> dict:
    return dict(
        max_total_tokens=PREEMPT_POOL,
        chunked_prefill_size=PREEMPT_CHUNK,
        schedule_conservativeness=PREEMPT_CONSERVATIVENESS,
    )


def preemption_budgets() -> list[int]:
    """New tokens per burst request: short ones every third, so that admission reopens mid-burst."""
    return [PREEMPT_SHORT if i % 3 == 0 else PREEMPT_LONG for i in range(PREEMPT_REQUESTS)]


def preemption_prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [random_prompt(rng, rng.randint(*PREEMPT_PROMPT)) for _ in range(PREEMPT_REQUESTS)]


def part_preemption(ctx: Context) -> None:
    prompts, wanted = preemption_prompts(ctx.seed), preemption_budgets()
    model = ctx.model()
    flags = preemption_flags()

    async def traffic(server: Served) -> dict:
        # One at a time first, on an empty radix cache, then emptied again: the burst computes its
        # own prefills, and retracted requests their recomputation, as the alone run did.
        before = await idle_metrics(server)
        alone = await client.one_at_a_time(server.port, prompts, wanted)
        between = await idle_metrics(server)
        flushed = await asyncio.to_thread(flush_cache, server.port)
        burst = await client.together(server.port, prompts, wanted)
        after = await idle_metrics(server)
        return {"alone": alone, "burst": burst, "flushed": flushed, "metrics": [before, between, after]}

    ours = on_server(ctx, OURS, "preemption", model, traffic, **flags)
    before, between, after = ours["metrics"]
    retracted = [r["retractions"] for r in ours["burst"]]
    ctx.details["retraction"] = {
        "burst": after.get(sglang_faults.RETRACTIONS, 0) - between.get(sglang_faults.RETRACTIONS, 0),
        "alone": between.get(sglang_faults.RETRACTIONS, 0) - before.get(sglang_faults.RETRACTIONS, 0),
        "per_request": retracted,
        "cache_flushed": ours["flushed"],
    }
    ok, note = sglang_faults.judge_retraction(between, after)
    ctx.row("retracted under the burst", (ok, f"{note}; {sum(1 for n in retracted if n)} requests retracted"))
    counts = [len(t) for t in tokens_of(ours["alone"] + ours["burst"])]
    ctx.row("every request complete", faults.judge_completions(counts, wanted + wanted))
    ctx.row("idle after the burst: no token held", sglang_faults.judge_idle(after))
    alone, gaps, burst = tokens_of(ours["alone"]), gaps_of_runs(ours["alone"]), tokens_of(ours["burst"])
    ctx.details["tokens"] = {"alone": alone, "alone_gaps": gaps, "burst": burst}

    def peer():
        ref = on_server(ctx, PEER, "preemption", model, traffic, **flags)
        return tokens_of(ref["burst"]), tokens_of(ref["alone"]), gaps_of_runs(ref["alone"])

    judge_tokens_or_calibrate(ctx, "burst tokens vs each alone", burst, alone, gaps, peer)
    judge_server(ctx, ours)
    if ctx.selftest:
        cut = faults.drop_token(burst)
        ctx.selftest_row("a request cut short", faults.judge_completions([len(t) for t in cut], wanted))
        poisoned = faults.poison(burst, gaps, VOCAB)
        ctx.selftest_row("a poisoned token", faults.judge_tokens(poisoned, alone, gaps) if poisoned else None)
        ctx.selftest_row("no retraction (the alone phase)", sglang_faults.judge_retraction(before, between))


def abort_plan(seed: int) -> tuple[list[list[int]], list[int | None]]:
    """The prompts, and per prompt the chunk after which its client leaves (None: it stays)."""
    prompts = [p for s in ABORT_SEEDS for p in make_prompts(s)]
    rng = random.Random(seed)
    leave = [rng.randint(0, ABORT_LAST_CHUNK) if rng.random() < ABORT_SHARE else None for _ in prompts]
    return prompts, leave


def abort_flags() -> dict:
    return dict(max_total_tokens=SERVE_POOL)


def part_aborts(ctx: Context) -> None:
    prompts, leave = abort_plan(ctx.seed)
    model = ctx.model()
    flags = abort_flags()

    async def traffic(server: Served) -> dict:
        baseline = await client.streams(server.port, prompts, ABORT_TOKENS)
        before = await idle_metrics(server)
        wave = await client.streams(server.port, prompts, ABORT_TOKENS, leave)
        await asyncio.sleep(1.0)  # the aborted requests' last steps
        counted = await metrics(server)  # before the next probe adds its own decode step
        after_aborts = await idle_metrics(server)
        follow = await client.streams(server.port, prompts, ABORT_TOKENS)
        after_follow = await idle_metrics(server)
        return {
            "baseline": baseline,
            "wave": wave,
            "follow": follow,
            "metrics": [before, counted, after_aborts, after_follow],
        }

    ours = on_server(ctx, OURS, "aborts", model, traffic, **flags)
    before, counted, after_aborts, after_follow = ours["metrics"]
    wave = ours["wave"]
    left = [i for i, r in enumerate(wave) if r["left"]]
    stayed = [i for i, r in enumerate(wave) if not r["left"]]
    # A request decodes max_new_tokens - 1 steps after its prefill: a server that ignored the
    # disconnects would have run at least that many for every stream.
    decoded = counted.get(sglang_faults.DECODE_TOKENS, 0) - before.get(sglang_faults.DECODE_TOKENS, 0)
    asked = (ABORT_TOKENS - 1) * len(wave)
    ctx.details["aborts"] = {"left": len(left), "stayed": len(stayed), "decode_steps": decoded, "asked": asked}
    ok = faults.judge_aborts_reached_server(decoded, asked, len(left))[0]
    note = f"{len(left)} clients disconnected; the scheduler ran {decoded:g} of the {asked} decode steps asked for"
    ctx.row("disconnects stop their requests", (ok, note))
    ctx.row("idle after the aborts: no token held", sglang_faults.judge_idle(after_aborts))
    baseline, gaps = tokens_of(ours["baseline"]), gaps_of_runs(ours["baseline"])
    wave_tokens, follow = tokens_of(wave), tokens_of(ours["follow"])
    ctx.row("the other streams complete", faults.judge_completions([len(wave_tokens[i]) for i in stayed], ABORT_TOKENS))
    ctx.row("follow-up wave complete", faults.judge_completions([len(t) for t in follow], ABORT_TOKENS))
    ctx.row("idle after the follow-up: no token held", sglang_faults.judge_idle(after_follow))
    peer_run: dict = {}  # one triton run calibrates both token verdicts, started only if one needs it

    def peer(indices):
        def run():
            if not peer_run:
                peer_run.update(on_server(ctx, PEER, "aborts", model, traffic, **flags))
            ref, ref_gaps = tokens_of(peer_run["baseline"]), gaps_of_runs(peer_run["baseline"])
            later = tokens_of(peer_run["wave"] if indices is not None else peer_run["follow"])
            keep = indices if indices is not None else range(len(ref))
            return [later[i] for i in keep], [ref[i] for i in keep], [ref_gaps[i] for i in keep]

        return run

    judge_tokens_or_calibrate(
        ctx,
        "the other streams' tokens vs the first wave",
        [wave_tokens[i] for i in stayed],
        [baseline[i] for i in stayed],
        [gaps[i] for i in stayed],
        peer(stayed),
    )
    judge_tokens_or_calibrate(ctx, "follow-up tokens vs the first wave", follow, baseline, gaps, peer(None))
    judge_server(ctx, ours)
    if ctx.selftest:
        leaked = sglang_faults.leak_tokens(after_follow, 64)
        ctx.selftest_row("a leaked page (64 tokens held)", sglang_faults.judge_idle(leaked))
        ctx.selftest_row("a leak in the log", sglang_faults.judge_log(sglang_faults.log_with_leak(ours["log"])))
        cut = faults.drop_token(follow)
        ctx.selftest_row("a request cut short", faults.judge_completions([len(t) for t in cut], ABORT_TOKENS))
        poisoned = faults.poison(follow, gaps, VOCAB)
        ctx.selftest_row("a poisoned token", faults.judge_tokens(poisoned, baseline, gaps) if poisoned else None)


def radix_prompts(seed: int) -> tuple[list[list[int]], list[list[int]], dict[str, list[int]]]:
    """The first wave (the prefixes and the prompts to repeat, one new token each: the radix cache then
    holds them) and the batch (the repeated prompts twice, shared-prefix prompts, short ones, the long
    ones last: the others decode while those are prefilled in chunks), with the batch's indices of
    each kind."""
    rng = random.Random(seed)
    prefixes = [random_prompt(rng, RADIX_PREFIX_LEN) for _ in range(RADIX_PREFIXES)]
    repeated = [random_prompt(rng, rng.randint(300, 900)) for _ in range(RADIX_REPEATED)]
    shared = [p + random_prompt(rng, rng.randint(20, 200)) for p in prefixes for _ in range(RADIX_SHARED)]
    short = [random_prompt(rng, rng.randint(1, 100)) for _ in range(RADIX_SHORT)]
    long = [random_prompt(rng, rng.randint(*RADIX_LONG_LEN)) for _ in range(RADIX_LONG)]
    kinds: dict[str, list[int]] = {}
    batch: list[list[int]] = []
    for kind, group in (("repeated", repeated * 2), ("shared", shared), ("short", short), ("long", long)):
        kinds[kind] = list(range(len(batch), len(batch) + len(group)))
        batch += group
    return prefixes + repeated, batch, kinds


def radix_flags() -> dict:
    return dict(max_total_tokens=SERVE_POOL, chunked_prefill_size=RADIX_CHUNK)


def part_radix(ctx: Context) -> None:
    first, batch, kinds = radix_prompts(ctx.seed)
    model = ctx.model()
    flags = radix_flags()

    async def traffic(server: Served) -> dict:
        warm = await client.together(server.port, first, 1)  # fills the radix cache
        return {"first": warm, "batch": await client.together(server.port, batch, RADIX_TOKENS)}

    ours = on_server(ctx, OURS, "radix", model, traffic, **flags)
    hitting = kinds["shared"] + kinds["repeated"]
    cached = [ours["batch"][i]["cached"] for i in hitting]
    ctx.details["radix"] = {
        "kinds": {k: len(v) for k, v in kinds.items()},
        "cached_tokens": [r["cached"] for r in ours["batch"]],
    }
    ctx.row("radix cache hit by the batch", sglang_faults.judge_radix_hits(cached))
    runs = ours["first"] + ours["batch"]
    wanted = [1] * len(first) + [RADIX_TOKENS] * len(batch)
    ctx.row("every request complete", faults.judge_completions([len(r["tokens"]) for r in runs], wanted))
    reference = FP8_QUERY_REFERENCE if ctx.fp8 else PEER
    ref = on_server(ctx, PEER, "radix", model, traffic, fp8_query=ctx.fp8, **flags)
    mine, theirs, gaps = (
        tokens_of(runs),
        tokens_of(ref["first"] + ref["batch"]),
        gaps_of_runs(ref["first"] + ref["batch"]),
    )

    def peer():  # plain triton against the FP8-query reference, as sglang_e2e.py calibrates FP8
        other = on_server(ctx, PEER, "radix", model, traffic, **flags)
        return tokens_of(other["first"] + other["batch"]), theirs, gaps

    judge_tokens_or_calibrate(ctx, f"tokens vs {reference}", mine, theirs, gaps, peer if ctx.fp8 else None)
    judge_server(ctx, ours)
    checked = on_server(ctx, OURS, "radix", model, traffic, check=1.0, **flags)
    judge_check(ctx, checked["decode_check"])
    ctx.details["eager_tokens"] = tokens_of(checked["first"] + checked["batch"])
    if ctx.selftest:
        corrupt = on_server(ctx, OURS, "radix", model, traffic, check=SELFTEST_CORRUPTION, **flags)
        summary = corrupt["decode_check"]
        verdict = judge_sglang_check(summary, ctx.fp8) if summary else (True, "no decode call was checked")
        ran = bool(summary) and summary["rows"] > 0
        ctx.selftest_row(f"outputs x{SELFTEST_CORRUPTION}", (verdict[0] or not ran, verdict[1]))
        poisoned = faults.poison(mine, gaps, VOCAB)
        ctx.selftest_row("a poisoned token", faults.judge_tokens(poisoned, theirs, gaps) if poisoned else None)
        ctx.selftest_row("no radix hit", sglang_faults.judge_radix_hits(sglang_faults.no_cache_hits(cached)))


def judge_check(ctx: Context, summary: dict | None) -> None:
    """The float64 check of every eager decode call of ours, as sglang_e2e.py judges it."""
    ctx.details["decode_check"] = summary
    if summary is None:
        ctx.row("decode calls vs float64", (False, "no decode call was checked"))
    else:
        ctx.row("decode calls vs float64", judge_sglang_check(summary, ctx.fp8))


RUNNERS = {"preemption": part_preemption, "aborts": part_aborts, "radix": part_radix}


def run_part(ctx: Context, part: str) -> dict:
    return report.run_part(ctx, lambda: RUNNERS[part](ctx))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv", default="fp8_e4m3", choices=["fp8_e4m3", "auto"], help="SGLang's --kv-cache-dtype")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument("--selftest", action="store_true", help="also feed the judges broken runs: they must fail")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--out", type=Path, default=Path("results/sglang_faults"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/mla_backend_models"))
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {','.join(PARTS)}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    # `timeout` ends a call with SIGTERM: leave through the finally blocks, which stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ctx = Context(args.heads, args.kv, args.out, args.model_dir, args.seed, args.selftest)
    path = args.out / f"sglang_faults_h{args.heads}_{args.kv}.json"
    return report.run_parts(
        parts,
        lambda part: run_part(ctx, part),
        path,
        dict(heads=args.heads, kv=args.kv),
        f"sglang.launch_server under faults, {args.heads} heads, kv {args.kv}",
    )


if __name__ == "__main__":
    sys.exit(main())
