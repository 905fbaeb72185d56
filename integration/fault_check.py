"""Fault checks of the vLLM plugin under ``vllm serve`` on a GPU: ``--attention-backend CUSTOM`` on a
seeded DeepSeek-V3 with full CUDA graphs, page 64, driven by the ``openai`` client (token ids in and
out, greedy, ``ignore_eos``) through preemption, client aborts, prefix caching with chunked prefill,
long context and a soak, each against vLLM's own behaviour.

    python integration/fault_check.py --heads 16 --kv fp8 --backend auto --parts preemption,aborts --out results/faults
    python integration/fault_check.py --family DeepSeek-V3.2 --kv auto --parts preemption,prefix --out results/faults

``--family`` serves a sparse family of the zoo (DeepSeek-V3.2, GLM-5: our sparse backend and indexer)
instead of the tiny DeepSeek-V3, for the parts whose traffic fits its seeded checkpoint (preemption,
aborts, prefix), bf16 KV: the reference is then FLASHMLA_SPARSE, the peer FLASH_ATTN_MLA_SPARSE, and
the float64 window is the sparse check's (engines/vllm_sparse_checker.py: the calls the engine runs
eagerly, i.e. its mixed batches; replayed decode steps are judged by their tokens).

Parts (each starts its own servers; a call that must stay short runs one or two):
- preemption: a KV pool of PREEMPT_BLOCKS blocks (``--num-gpu-blocks-override``) against a burst of
  requests whose decode outgrows it. vLLM's ``vllm:num_preemptions_total`` must rise during the
  burst, every request must return all its tokens, and the burst's greedy tokens must equal those of
  the same requests sent one at a time (tie rule, gaps from the alone run).
- aborts: streams of which a seeded share disconnect after a seeded number of chunks (some before
  the first). The server must have stopped them (it generated fewer tokens than were asked for), the
  other streams must complete with the tokens of an earlier wave of the same requests (tie rule), and
  once idle the server must hold no request and no KV block (``vllm:kv_cache_usage_perc`` 0, read
  after one more engine step); a follow-up wave of the same requests must come out right and leave
  the pool empty again.
- prefix: vLLM's prefix caching on (its default) and a small ``--max-num-batched-tokens``: prefixes
  cached by a first wave, then shared-prefix, repeated, short and long prompts (split over several
  steps) in one batch. ``vllm:prefix_cache_hits_total`` must rise; the tokens must agree with vLLM's
  FLASHMLA under the same settings (tie rule); every decode call of the first 48 after start-up
  (vllm_decode_checker.DecodeChecker's window) is recomputed in float64 in the engine's process
  (integration/engines/vllm_worker_check.py) and judged as run_e2e.py judges it.
- long: requests ending at ``--max-model-len`` LONG_MODEL_LEN (a checkpoint with that many positions)
  together with short ones; tokens of both against FLASHMLA (tie rule), and the float64 window.
- soak: a seeded schedule of mixed traffic (lengths, token counts, shared prefixes, a few aborts) for
  ``--soak-s`` seconds; p50/p99 inter-token latency and tokens/s against FLASHMLA on the
  SOAK_REFERENCE_S seconds after a warm-up of the same schedule (within SPEED_SLACK), GPU memory flat after warm-up,
  no error or traceback in the server's log, exit 0 on SIGINT.

Tokens: where ours breaks the tie rule, the same traffic runs on a vLLM peer (FLASHMLA where the
reference is our own alone run or earlier wave, TRITON_MLA where it is FLASHMLA); if the peer breaks
the rule too (an FP8 cache can), ours must not agree significantly fewer steps than the peer
(integration/judges/faults.py judge_tokens).

--selftest: each part also feeds its judges broken versions of its own results (a request cut short,
a poisoned token, a leaked block, memory that grows, an error in the log, the preemption counter of
a phase without preemption), and the prefix part serves ours with outputs x SELFTEST_CORRUPTION,
whose float64 check must fail. Each such row passes where the judge caught the breakage.

Writes ``<out>/faults_{h<heads> or family}_{kv}_{backend}.json`` (parts from earlier calls into the same file are
kept) after every part and prints a PASS/FAIL table last; exit status 1 if a row fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines.budgets import budgets  # noqa: E402
from integration.engines.vllm_client import client_for, complete, stream  # noqa: E402
from integration.engines.vllm_server import (  # noqa: E402
    checked_server_env,
    free_port,
    gpu_memory_used_mib,
    pool_blocks,
    process_tree_rss_mib,
    running,
    scrape,
    serve_command,
    wait_until_idle,
)
from integration.engines.vllm_spec import EngineSpec  # noqa: E402
from integration.engines.vllm_worker_check import merged_summary  # noqa: E402
from integration.judges import faults, report  # noqa: E402
from integration.judges.decode_verdict import judge_decode_check, judge_selftest  # noqa: E402
from integration.judges.faults import gaps_of_runs, tokens_of  # noqa: E402
from integration.judges.sparse_check import judge_sparse_check, judge_sparse_selftest  # noqa: E402
from integration.models.prompts import make_prompts  # noqa: E402
from integration.models.tiny_model import TINY_DEFAULTS, save_tiny_deepseek_v3  # noqa: E402
from integration.settings import PEERS, SELFTEST_CORRUPTION  # noqa: E402

PARTS = ("preemption", "aborts", "prefix", "long", "soak")
VOCAB = TINY_DEFAULTS["vocab_size"]
START_TIMEOUT_S = 300
IDLE_TIMEOUT_S = 30  # for vLLM's gauges to read idle after the last response
ABORTS_SETTLE_S = 1.0  # for the server to notice a wave's disconnects before its probe request
REFERENCE = "FLASHMLA"
SPARSE_REFERENCE, SPARSE_PEER = "FLASHMLA_SPARSE", "FLASH_ATTN_MLA_SPARSE"  # the peer: bf16 KV only
SPARSE_PARTS = ("preemption", "aborts", "prefix")  # the others want checkpoints of more positions

# preemption: vLLM admits a request only while its prompt's blocks fit and preempts only when running
# requests outgrow the pool. 16 prompts of 832-896 tokens (14 blocks of 64 each, 224 of the 256) are
# all admitted; 256 new tokens each want 64 more blocks, where 32 are free.
PREEMPT_REQUESTS, PREEMPT_PROMPT, PREEMPT_TOKENS = 16, (832, 896), 256
PREEMPT_BLOCKS, PREEMPT_MODEL_LEN = 256, 2048
# aborts: 3 x 12 prompts of 1-1000 tokens; 40% of the clients leave after 0-48 of 64 chunks.
ABORT_SEEDS, ABORT_TOKENS, ABORT_SHARE, ABORT_LAST_CHUNK = (0, 1, 2), 64, 0.4, 48
# prefix: 3 prefixes of 1024 tokens, 4 prompts repeated; prefill steps of 512 tokens.
PREFIXES, PREFIX_LEN, SHARED_PER_PREFIX, REPEATED = 3, 1024, 4, 4
LONG_PROMPTS_IN_PREFIX, PREFIX_LONG_LEN, PREFIX_BATCHED, PREFIX_TOKENS = 2, (2500, 3000), 512, 48
PREFIX_MODEL_LEN = 4096  # the long prompts and their new tokens fit
# Calls checked in float64: the batch's steps beside chunked prefills (eager) and, after them, its
# replayed decode steps (2 layers a step).
PREFIX_CHECK_CALLS = 2 * (PREFIX_TOKENS + 40)
# long: two requests ending at the model length, with the 8 shortest of make_prompts.
LONG_MODEL_LEN, LONG_BATCHED, LONG_TOKENS, LONG_SHORT_PROMPTS = 32768, 8192, 48, 8
# soak: Poisson arrivals of mixed requests.
SOAK_RATE, SOAK_TOKENS, SOAK_PROMPT, SOAK_SHARED, SOAK_ABORTS = 12.0, (16, 64), (8, 2000), 0.3, 0.05
SOAK_REFERENCE_S, SOAK_SAMPLE_S, SOAK_MODEL_LEN, SOAK_BATCHED = 60.0, 2.0, 4096, 2048
SOAK_WARMUP_S, SOAK_WARMUP_SHARE = 10.0, 0.2  # memory is judged after the longer of the two


@dataclass
class Context(report.PartRows):
    heads: int
    kv: str
    backend: str  # our mla_backend "backend" setting: auto or xqa
    out: Path
    model_dir: Path
    seed: int
    soak_s: float
    selftest: bool
    family: str | None = None  # a sparse family of the zoo instead of the tiny DeepSeek-V3

    @property
    def name(self) -> str:
        return self.family or f"h{self.heads}"

    @property
    def reference(self) -> str:
        return SPARSE_REFERENCE if self.family else REFERENCE

    @property
    def peer(self) -> str:
        """vLLM's other backend for calibration where ours and the reference part."""
        return SPARSE_PEER if self.family else PEERS[self.kv][0]

    def spec(self, backend: str) -> EngineSpec:
        ours = {"backend": self.backend} if backend == "CUSTOM" and self.backend != "auto" else {}
        return EngineSpec(backend, self.kv, 64, True, mla_backend=ours)

    def model(self, max_positions: int | None = None) -> str:
        if self.family is not None:
            return sparse_checkpoint(self.family, self.model_dir, max_positions)
        if max_positions is None:
            return str(save_tiny_deepseek_v3(self.model_dir / f"dsv3_h{self.heads}", heads=self.heads))
        path = self.model_dir / f"dsv3_h{self.heads}_pos{max_positions}"
        return str(save_tiny_deepseek_v3(path, heads=self.heads, max_position_embeddings=max_positions))


def sparse_checkpoint(family_name: str, model_dir: Path, max_positions: int | None) -> str:
    """The zoo's seeded checkpoint of a sparse family (its published positions only)."""
    from integration.models.checkpoints import save_sparse_checkpoint

    if max_positions is not None:
        raise ValueError(f"a sparse family's checkpoint keeps its published positions, not {max_positions}")
    return str(save_sparse_checkpoint(family_name, model_dir)[1])


# --- one server -----------------------------------------------------------------------------------


@dataclass
class Served:
    name: str
    model: str
    port: int
    process: object
    log: Path
    check_dir: Path | None


@contextlib.contextmanager
def served(
    ctx: Context,
    backend: str,
    label: str,
    model: str,
    checked: bool = False,
    corrupt=None,
    check_calls: int | None = None,
    **flags,
):
    """A server of ``backend`` for the time of the block; its start, stop and exit go into the
    part's details. ``checked``: our decode calls recomputed in float64 in the engine's process,
    the first ``check_calls`` of them (48 by default)."""
    spec = ctx.spec(backend)
    port = free_port()
    name = f"{label}_{backend}" + ("_corrupt" if corrupt else "")
    log = ctx.out / f"{name}_{ctx.name}_{ctx.kv}_{ctx.backend}.log"
    check_dir = ctx.out / f"check_{name}_{ctx.name}_{ctx.kv}_{ctx.backend}" if checked else None
    if check_dir is not None:
        for stale in check_dir.glob("rank*.json"):
            stale.unlink()
    env = checked_server_env(check_dir, ctx.kv, corrupt, check_calls, ctx.family is not None) if check_dir else None
    command = serve_command(spec, model, port, host="127.0.0.1", **flags)
    record = ctx.details.setdefault("servers", {}).setdefault(name, {"command": command[3:]})
    with running(command, log, port, record, START_TIMEOUT_S, env) as server:
        yield Served(name, model, port, server, log, check_dir)


def on_server(ctx: Context, backend: str, label: str, model: str, traffic, **kwargs) -> dict:
    """Start a server, run ``traffic(served)`` (a coroutine function) on it, stop it; the result,
    with the float64 check's summary where the server was checked."""
    with served(ctx, backend, label, model, **kwargs) as server:
        result = asyncio.run(traffic(server))
    if server.check_dir is not None:
        result["decode_check"] = merged_summary(server.check_dir)
    result["stop"] = ctx.details["servers"][server.name]
    return result


# --- the client -----------------------------------------------------------------------------------


async def together(server: Served, prompts: list[list[int]], max_tokens: int | list[int]) -> list[dict]:
    wanted = budgets(prompts, max_tokens)
    async with client_for(server.port) as client:
        return list(await asyncio.gather(*(complete(client, server.model, p, n) for p, n in zip(prompts, wanted))))


async def one_at_a_time(server: Served, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    async with client_for(server.port) as client:
        return [await complete(client, server.model, p, max_tokens) for p in prompts]


async def streams(server: Served, prompts: list[list[int]], max_tokens: int, leave=None) -> list[dict]:
    leave = leave or [None] * len(prompts)
    async with client_for(server.port) as client:
        return list(
            await asyncio.gather(*(stream(client, server.model, p, max_tokens, k) for p, k in zip(prompts, leave)))
        )


async def metrics(server: Served) -> dict[str, float]:
    return await asyncio.to_thread(scrape, server.port)


async def idle_metrics(server: Served) -> dict[str, float]:
    return await asyncio.to_thread(wait_until_idle, server.port, faults.IDLE, IDLE_TIMEOUT_S)


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(length)]


def judge_tokens_or_calibrate(ctx, check, ours, ref, ref_gaps, run_peer, peer_name) -> None:
    """Tokens under the tie rule, calibrated where ours breaks it by vLLM's ``peer_name`` on the same
    traffic (faults.judge_tokens_or_calibrate)."""
    ctx.row(check, faults.judge_tokens_or_calibrate(ours, ref, ref_gaps, run_peer, {"name": peer_name}))


# --- the parts ------------------------------------------------------------------------------------


def preemption_flags() -> dict:
    """A pool of PREEMPT_BLOCKS blocks, prefix caching off: a preempted request recomputes its
    cache, and the alone run leaves nothing for the burst to reuse."""
    return dict(
        max_model_len=PREEMPT_MODEL_LEN,
        num_gpu_blocks=PREEMPT_BLOCKS,
        prefix_caching=False,
        max_num_seqs=PREEMPT_REQUESTS,
    )


def part_preemption(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    prompts = [random_prompt(rng, rng.randint(*PREEMPT_PROMPT)) for _ in range(PREEMPT_REQUESTS)]
    flags = preemption_flags()
    model = ctx.model()

    async def traffic(server: Served) -> dict:
        # The burst first, so that the float64 window holds its first steps: decodes beside
        # chunked prefills, in eager batches, before and after the preemptions.
        before = await idle_metrics(server)
        burst = await together(server, prompts, PREEMPT_TOKENS)
        between = await idle_metrics(server)  # idle: the counters hold the last response's step
        alone = await one_at_a_time(server, prompts, PREEMPT_TOKENS)
        return {"alone": alone, "burst": burst, "metrics": [before, between, await idle_metrics(server)]}

    ours = on_server(ctx, "CUSTOM", "preemption", model, traffic, checked=True, **flags)
    before, between, after = ours["metrics"]
    ctx.details["preemptions"] = {
        "burst": between.get(faults.PREEMPTIONS, 0) - before.get(faults.PREEMPTIONS, 0),
        "alone": after.get(faults.PREEMPTIONS, 0) - between.get(faults.PREEMPTIONS, 0),
        "pool_blocks": pool_blocks(after),
    }
    ctx.row("preempted under the burst", faults.judge_preemption(before, between))
    counts = [len(t) for t in tokens_of(ours["alone"] + ours["burst"])]
    ctx.row("every request complete", faults.judge_completions(counts, PREEMPT_TOKENS))
    alone, gaps, burst = tokens_of(ours["alone"]), gaps_of_runs(ours["alone"]), tokens_of(ours["burst"])
    ctx.details["tokens"] = {"alone": alone, "alone_gaps": gaps, "burst": burst}
    judge_check(ctx, ours["decode_check"])

    def peer():
        ref = on_server(ctx, ctx.reference, "preemption", model, traffic, **flags)
        return tokens_of(ref["burst"]), tokens_of(ref["alone"]), gaps_of_runs(ref["alone"])

    judge_tokens_or_calibrate(ctx, "burst tokens vs each alone", burst, alone, gaps, peer, ctx.reference)
    if ctx.selftest:
        ctx.selftest_row(
            "a request cut short", faults.judge_completions([len(t) for t in faults.drop_token(burst)], PREEMPT_TOKENS)
        )
        poisoned = faults.poison(burst, gaps)
        ctx.selftest_row("a poisoned token", poisoned and faults.judge_tokens(poisoned, alone, gaps))
        ctx.selftest_row("no preemption (the alone phase)", faults.judge_preemption(between, after))


def abort_flags(requests: int) -> dict:
    """vLLM's defaults (prefix caching on: the blocks of finished requests stay cached, yet free)."""
    return dict(prefix_caching=None, max_num_seqs=requests)


def part_aborts(ctx: Context) -> None:
    prompts = [p for seed in ABORT_SEEDS for p in make_prompts(seed)]
    rng = random.Random(ctx.seed)
    leave = [rng.randint(0, ABORT_LAST_CHUNK) if rng.random() < ABORT_SHARE else None for _ in prompts]
    model = ctx.model()
    flags = abort_flags(len(prompts))

    async def traffic(server: Served) -> dict:
        baseline = await streams(server, prompts, ABORT_TOKENS)
        before = await idle_metrics(server)  # idle: the counters hold the last response's step
        wave = await streams(server, prompts, ABORT_TOKENS, leave)
        await asyncio.sleep(ABORTS_SETTLE_S)
        probe = await together(server, [prompts[0][:8]], 1)  # one engine step: the gauges read after the aborts
        after_aborts = await idle_metrics(server)
        follow = await streams(server, prompts, ABORT_TOKENS)
        return {
            "baseline": baseline,
            "wave": wave,
            "follow": follow,
            "probe_tokens": len(probe[0]["tokens"]),
            "metrics": [before, after_aborts, await idle_metrics(server)],
        }

    ours = on_server(ctx, "CUSTOM", "aborts", model, traffic, **flags)
    judge_aborts(ctx, ours, model, traffic, flags)


def judge_aborts(ctx: Context, ours: dict, model: str, traffic, flags: dict) -> None:
    before, after_aborts, after_follow = ours["metrics"]
    left = [i for i, r in enumerate(ours["wave"]) if r["left"]]
    stayed = [i for i, r in enumerate(ours["wave"]) if not r["left"]]
    generated = after_aborts.get(faults.GENERATED, 0) - before.get(faults.GENERATED, 0) - ours["probe_tokens"]
    asked = ABORT_TOKENS * len(ours["wave"])
    ctx.details["aborts"] = {"left": len(left), "stayed": len(stayed), "generated": generated, "asked": asked}
    ctx.row("disconnects stop their requests", faults.judge_aborts_reached_server(generated, asked, len(left)))
    ctx.row("idle after the aborts: no block held", faults.judge_blocks_freed(after_aborts))
    baseline = tokens_of(ours["baseline"])
    gaps = gaps_of_runs(ours["baseline"])
    wave, follow = tokens_of(ours["wave"]), tokens_of(ours["follow"])
    ctx.row("the other streams complete", faults.judge_completions([len(wave[i]) for i in stayed], ABORT_TOKENS))
    ctx.row("follow-up wave complete", faults.judge_completions([len(t) for t in follow], ABORT_TOKENS))
    ctx.row("idle after the follow-up: no block held", faults.judge_blocks_freed(after_follow))
    peer_run: dict = {}  # one FLASHMLA run calibrates both token verdicts, started only if one needs it

    def peer(indices):
        def run():
            if not peer_run:
                peer_run.update(on_server(ctx, ctx.reference, "aborts", model, traffic, **flags))
            ref, ref_gaps = tokens_of(peer_run["baseline"]), gaps_of_runs(peer_run["baseline"])
            later = tokens_of(peer_run["wave"] if indices is not None else peer_run["follow"])
            keep = indices if indices is not None else range(len(ref))
            return [later[i] for i in keep], [ref[i] for i in keep], [ref_gaps[i] for i in keep]

        return run

    judge_tokens_or_calibrate(
        ctx,
        "the other streams' tokens vs the first wave",
        [wave[i] for i in stayed],
        [baseline[i] for i in stayed],
        [gaps[i] for i in stayed],
        peer(stayed),
        ctx.reference,
    )
    judge_tokens_or_calibrate(
        ctx, "follow-up tokens vs the first wave", follow, baseline, gaps, peer(None), ctx.reference
    )
    if ctx.selftest:
        blocks = pool_blocks(after_follow) or 1000
        ctx.selftest_row("a leaked block", faults.judge_blocks_freed(faults.leak_block(after_follow, blocks)))
        ctx.selftest_row(
            "a request cut short", faults.judge_completions([len(t) for t in faults.drop_token(follow)], ABORT_TOKENS)
        )
        poisoned = faults.poison(follow, gaps)
        ctx.selftest_row("a poisoned token", poisoned and faults.judge_tokens(poisoned, baseline, gaps))


def prefix_prompts(seed: int) -> tuple[list[list[int]], list[list[int]], dict[str, list[int]]]:
    """The first wave (the prefixes and the prompts to repeat, one token each: their cache is then
    filled) and the batch (repeated prompts twice, shared-prefix prompts, short ones, long ones last,
    so the short ones are decoding while the long ones are prefilled in chunks), with the batch's
    indices of each kind."""
    rng = random.Random(seed)
    prefixes = [random_prompt(rng, PREFIX_LEN) for _ in range(PREFIXES)]
    repeated = [random_prompt(rng, rng.randint(300, 900)) for _ in range(REPEATED)]
    shared = [p + random_prompt(rng, rng.randint(20, 200)) for p in prefixes for _ in range(SHARED_PER_PREFIX)]
    short = [random_prompt(rng, rng.randint(1, 100)) for _ in range(4)]
    long = [random_prompt(rng, rng.randint(*PREFIX_LONG_LEN)) for _ in range(LONG_PROMPTS_IN_PREFIX)]
    batch = repeated + repeated + shared + short + long
    kinds, start = {}, 0
    for kind, group in (("repeated", repeated * 2), ("shared", shared), ("short", short), ("long", long)):
        kinds[kind] = list(range(start, start + len(group)))
        start += len(group)
    return prefixes + repeated, batch, kinds


def prefix_flags(batch: list[list[int]]) -> dict:
    """Prefix caching on (vLLM's default), PREFIX_BATCHED tokens a step: long prompts take several."""
    return dict(
        prefix_caching=None,
        max_num_batched_tokens=PREFIX_BATCHED,
        max_num_seqs=len(batch),
        max_model_len=PREFIX_MODEL_LEN,
    )


def part_prefix(ctx: Context) -> None:
    first, batch, kinds = prefix_prompts(ctx.seed)
    model = ctx.model()
    flags = prefix_flags(batch)

    async def traffic(server: Served) -> dict:
        warm = await together(server, first, 1)  # prefill only: fills the cache, uses no decode call of the window
        between = await idle_metrics(server)
        runs = await together(server, batch, PREFIX_TOKENS)
        return {"first": warm, "batch": runs, "metrics": [between, await idle_metrics(server)]}

    ours = on_server(ctx, "CUSTOM", "prefix", model, traffic, checked=True, check_calls=PREFIX_CHECK_CALLS, **flags)
    between, after = ours["metrics"]
    hits = after.get(faults.PREFIX_HITS, 0) - between.get(faults.PREFIX_HITS, 0)
    ctx.details["prefix"] = {"cache_hit_tokens": hits, "kinds": {k: len(v) for k, v in kinds.items()}}
    ctx.row(
        "prefix cache hit by the batch", (hits > 0, f"{hits:g} prompt tokens from the cache ({faults.PREFIX_HITS})")
    )
    counts = [len(t) for t in tokens_of(ours["first"])] + [len(t) for t in tokens_of(ours["batch"])]
    ctx.row("every request complete", faults.judge_completions(counts, [1] * len(first) + [PREFIX_TOKENS] * len(batch)))
    ref = on_server(ctx, ctx.reference, "prefix", model, traffic, **flags)
    mine, theirs = tokens_of(ours["first"] + ours["batch"]), tokens_of(ref["first"] + ref["batch"])
    gaps = gaps_of_runs(ref["first"] + ref["batch"])

    def peer():
        other = on_server(ctx, ctx.peer, "prefix", model, traffic, **flags)
        return tokens_of(other["first"] + other["batch"]), theirs, gaps

    judge_tokens_or_calibrate(ctx, f"tokens vs {ctx.reference}", mine, theirs, gaps, peer, ctx.peer)
    judge_check(ctx, ours["decode_check"])
    if ctx.selftest:
        corrupt = on_server(
            ctx,
            "CUSTOM",
            "prefix",
            model,
            traffic,
            checked=True,
            check_calls=PREFIX_CHECK_CALLS,
            corrupt=SELFTEST_CORRUPTION,
            **flags,
        )
        caught, note = (
            judge_sparse_selftest(corrupt["decode_check"])
            if ctx.family
            else judge_selftest(corrupt["decode_check"], asdict(ctx.spec("CUSTOM")))
        )
        ctx.rows.append((f"selftest: outputs x{SELFTEST_CORRUPTION}", caught, note))
        poisoned = faults.poison(mine, gaps)
        ctx.selftest_row("a poisoned token", poisoned and faults.judge_tokens(poisoned, theirs, gaps))


def judge_check(ctx: Context, check: dict) -> None:
    """The float64 window of our decode calls, judged as run_e2e.py judges an engine's (a sparse
    family's: as sparse_e2e.py judges its checked run)."""
    ctx.details["decode_check"] = check
    if ctx.family:
        ctx.row("sparse calls vs float64", judge_sparse_check(check))
        return
    ok, note = judge_decode_check(check, asdict(ctx.spec("CUSTOM")))
    ctx.row("decode calls vs float64", (ok, f"{note}; route {check.get('routes')}"))


def long_flags() -> dict:
    """LONG_MODEL_LEN tokens of context, prefilled LONG_BATCHED a step; prefix caching on."""
    return dict(max_model_len=LONG_MODEL_LEN, max_num_batched_tokens=LONG_BATCHED, prefix_caching=None, max_num_seqs=16)


def part_long(ctx: Context) -> None:
    rng = random.Random(ctx.seed)
    short = sorted(make_prompts(0), key=len)[:LONG_SHORT_PROMPTS]
    ends = (LONG_MODEL_LEN, LONG_MODEL_LEN - 1000)  # the last token lands at the model length, or near it
    long = [random_prompt(rng, end - LONG_TOKENS) for end in ends]
    prompts = short + long  # the short ones first: they decode while the long ones are prefilled
    model = ctx.model(LONG_MODEL_LEN)
    flags = long_flags()

    async def traffic(server: Served) -> dict:
        return {"runs": await together(server, prompts, LONG_TOKENS)}

    ours = on_server(ctx, "CUSTOM", "long", model, traffic, checked=True, **flags)
    mine = tokens_of(ours["runs"])
    ctx.row("every request complete", faults.judge_completions([len(t) for t in mine], LONG_TOKENS))
    ref = on_server(ctx, REFERENCE, "long", model, traffic, **flags)
    theirs, gaps = tokens_of(ref["runs"]), gaps_of_runs(ref["runs"])
    peer_run: dict = {}

    def peer(keep):
        def run():
            if not peer_run:
                peer_run.update(on_server(ctx, PEERS[ctx.kv][0], "long", model, traffic, **flags))
            other = tokens_of(peer_run["runs"])
            return [other[i] for i in keep], [theirs[i] for i in keep], [gaps[i] for i in keep]

        return run

    n = len(short)
    for label, keep in ((f"{len(long)} requests ending at {LONG_MODEL_LEN}", range(n, len(prompts))),
                        (f"{n} short requests beside them", range(n))):  # fmt: skip
        keep = list(keep)
        judge_tokens_or_calibrate(
            ctx,
            f"{label} vs {REFERENCE}",
            [mine[i] for i in keep],
            [theirs[i] for i in keep],
            [gaps[i] for i in keep],
            peer(keep),
            PEERS[ctx.kv][0],
        )
    judge_check(ctx, ours["decode_check"])
    if ctx.selftest:
        ctx.selftest_row(
            "a request cut short", faults.judge_completions([len(t) for t in faults.drop_token(mine[n:])], LONG_TOKENS)
        )
        poisoned = faults.poison(mine[n:], gaps[n:])
        ctx.selftest_row("a poisoned token", poisoned and faults.judge_tokens(poisoned, theirs[n:], gaps[n:]))


@dataclass
class Arrival:
    at: float  # seconds after the start
    prompt: list[int]
    max_tokens: int
    leave_after: int | None


def soak_schedule(seed: int, seconds: float) -> list[Arrival]:
    """Poisson arrivals at SOAK_RATE for ``seconds``: prompts of mixed lengths (a share sharing one
    of four prefixes), mixed token counts, a few clients that leave early. A shorter run's schedule
    is the start of a longer one's."""
    rng = random.Random(seed)
    prefixes = [random_prompt(rng, 512) for _ in range(4)]
    arrivals, at = [], 0.0
    while True:
        at += rng.expovariate(SOAK_RATE)
        if at >= seconds:
            return arrivals
        prompt = random_prompt(rng, rng.randint(*SOAK_PROMPT))
        if rng.random() < SOAK_SHARED:
            prompt = rng.choice(prefixes) + prompt[: SOAK_PROMPT[1] - 512]
        max_tokens = rng.randint(*SOAK_TOKENS)
        leave = rng.randint(0, max_tokens - 1) if rng.random() < SOAK_ABORTS else None
        arrivals.append(Arrival(at, prompt, max_tokens, leave))


def memory_warmup_s(seconds: float) -> float:
    """Memory is judged after the longer of SOAK_WARMUP_S and SOAK_WARMUP_SHARE of the soak."""
    return max(SOAK_WARMUP_S, SOAK_WARMUP_SHARE * seconds)


def samples_after_warmup(samples: list[tuple[float, float | None, float | None]], seconds: float) -> int:
    warmup = memory_warmup_s(seconds)
    return sum(t >= warmup for t, _, _ in samples)


async def soak(server: Served, schedule: list[Arrival]) -> dict:
    """Send ``schedule`` on time, sample memory meanwhile, wait for the last request; the log as it
    stood before the stop (the stop itself is judged by its exit status). Sampling goes on past the
    last request until the memory judge has its MEMORY_SAMPLES_MIN after warm-up: a busy machine
    delivers fewer samples than the interval promises."""
    samples: list[tuple[float, float | None, float | None]] = []
    done = asyncio.Event()
    ended: dict[str, float] = {}
    # The client first: making it can import the HTTP stack, which holds the loop for seconds on a
    # busy machine and would delay the first arrivals and samples against the clock.
    async with client_for(server.port) as client:
        begun = time.monotonic()

        def enough() -> bool:
            return done.is_set() and samples_after_warmup(samples, ended["seconds"]) >= faults.MEMORY_SAMPLES_MIN

        async def sample():
            while not enough():
                gpu = await asyncio.to_thread(gpu_memory_used_mib)
                host = await asyncio.to_thread(process_tree_rss_mib, server.process.pid)
                samples.append((time.monotonic() - begun, gpu, host))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(done.wait(), SOAK_SAMPLE_S)
                if done.is_set():
                    await asyncio.sleep(SOAK_SAMPLE_S)  # the traffic is over: the samples' interval

        async def send(arrival: Arrival) -> dict:
            await asyncio.sleep(max(0.0, begun + arrival.at - time.monotonic()))
            try:
                return await stream(client, server.model, arrival.prompt, arrival.max_tokens, arrival.leave_after)
            except Exception as err:  # a failed request is a result, not the end of the soak
                return {"tokens": [], "chunks": [], "left": False, "error": repr(err)[:200], "begun": time.monotonic()}

        sampler = asyncio.create_task(sample())
        results = await asyncio.gather(*(send(a) for a in schedule))
    ended["seconds"] = seconds = time.monotonic() - begun
    done.set()
    await sampler
    return {"results": results, "seconds": seconds, "samples": samples, "log": server.log.read_text(errors="replace")}


def speed(schedule: list[Arrival], results: list[dict], since: float, until: float) -> dict:
    """Latency and throughput of the requests that arrived from ``since`` to ``until`` seconds."""
    picked = [r for a, r in zip(schedule, results) if since <= a.at < until and r["chunks"]]
    latencies = [gap for r in picked for gap in faults.inter_token_latencies(r["chunks"])]
    first = min((r["begun"] for r in picked), default=0.0)
    last = max((r["chunks"][-1][0] for r in picked), default=0.0)
    return faults.speed_summary(latencies, sum(len(r["tokens"]) for r in picked), last - first)


def soak_flags() -> dict:
    return dict(max_model_len=SOAK_MODEL_LEN, max_num_batched_tokens=SOAK_BATCHED, prefix_caching=None, max_num_seqs=64)


def part_soak(ctx: Context) -> None:
    schedule = soak_schedule(ctx.seed, ctx.soak_s)
    model = ctx.model()
    flags = soak_flags()

    def traffic_for(arrivals: list[Arrival]):
        async def traffic(server: Served) -> dict:
            return await soak(server, arrivals)

        return traffic

    ours = on_server(ctx, "CUSTOM", "soak", model, traffic_for(schedule), **flags)
    results = ours["results"]
    errors = [r["error"] for r in results if "error" in r]
    stayed = [(a, r) for a, r in zip(schedule, results) if not r["left"] and "error" not in r]
    complete = faults.judge_completions([len(r["tokens"]) for _, r in stayed], [a.max_tokens for a, _ in stayed])
    left = sum(r["left"] for r in results)
    ctx.row(
        f"soak of {ours['seconds']:.0f} s (asked {ctx.soak_s:g} s)",
        (
            complete[0] and not errors,
            f"{len(schedule)} requests, {left} left early by their clients; {complete[1]}"
            + (f"; {len(errors)} failed: {errors[0]}" if errors else ""),
        ),
    )
    # Speed is judged after a warm-up: whichever server runs first pays for compiling the kernels
    # that only traffic reaches (prefill shapes, chunked-context merges), and the other reuses them.
    warm_s = min(SOAK_WARMUP_S, ctx.soak_s / 2)
    reference_s = min(ctx.soak_s, warm_s + SOAK_REFERENCE_S)
    reference_schedule = [a for a in schedule if a.at < reference_s]
    ref = on_server(ctx, REFERENCE, "soak", model, traffic_for(reference_schedule), **flags)
    mine, theirs = (
        speed(schedule, results, warm_s, reference_s),
        speed(reference_schedule, ref["results"], warm_s, reference_s),
    )
    cold = {
        "ours": speed(schedule, results, 0.0, warm_s),
        REFERENCE: speed(reference_schedule, ref["results"], 0.0, warm_s),
    }
    # ours over the whole soak after warm-up, reported beside the judged window (the peer runs only that)
    whole = speed(schedule, results, warm_s, ours["seconds"])
    ctx.details["speed"] = {
        "ours": mine,
        REFERENCE: theirs,
        "window_s": [warm_s, reference_s],
        "warm_up": cold,
        "ours_whole_run": whole,
    }
    ok, note = faults.judge_speed(mine, theirs, REFERENCE, faults.SPEED_SLACK)
    ctx.row(
        f"speed vs {REFERENCE}, {warm_s:.0f}-{reference_s:.0f} s",
        (
            ok,
            f"{note}; first {warm_s:.0f} s (not judged): p99 {cold['ours']['p99_ms']:.1f} ms, "
            f"{REFERENCE} {cold[REFERENCE]['p99_ms']:.1f} ms; ours {warm_s:.0f}-{ours['seconds']:.0f} s: "
            f"p50/p99 {whole['p50_ms']:.2f}/{whole['p99_ms']:.2f} ms, {whole['tokens_per_s']:.0f} tok/s",
        ),
    )
    warmup = memory_warmup_s(ours["seconds"])
    gpu = [(t, m) for t, m, _ in ours["samples"] if m is not None]
    host = [(t, m) for t, _, m in ours["samples"] if m is not None]
    ctx.details["memory"] = {"warmup_s": warmup, "gpu_mib": gpu, "host_mib": host}
    memory_ok, memory_note = faults.judge_memory_flat(gpu, warmup)
    host_growth = faults.memory_growth(host, warmup)
    host_note = f"{host_growth[0]:.0f} -> {host_growth[1]:.0f} MiB" if host_growth else "too few samples"
    ctx.row("GPU memory flat", (memory_ok, f"{memory_note}; server's host memory {host_note}"))
    ctx.row("server log", faults.judge_log(ours["log"]))
    ctx.row("exit on SIGINT", faults.judge_clean_exit(ours["stop"]["stopped"], ours["stop"]["exit"]))
    if ctx.selftest:
        growth = faults.leak_rate_to_catch(gpu, warmup, 4 * faults.MEMORY_GROWTH_MIB)
        ctx.selftest_row("memory that grows", faults.judge_memory_flat(faults.grow_memory(gpu, growth), warmup))
        ctx.selftest_row("an error in the log", faults.judge_log(faults.log_with_error(ours["log"])))
        cut = faults.drop_token([r["tokens"] for _, r in stayed])
        ctx.selftest_row(
            "a request cut short", faults.judge_completions([len(t) for t in cut], [a.max_tokens for a, _ in stayed])
        )


RUNNERS = {
    "preemption": part_preemption,
    "aborts": part_aborts,
    "prefix": part_prefix,
    "long": part_long,
    "soak": part_soak,
}


def run_part(ctx: Context, part: str) -> dict:
    return report.run_part(ctx, lambda: RUNNERS[part](ctx))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--family", help=f"a sparse family of the zoo instead of DeepSeek-V3 (parts {SPARSE_PARTS})")
    parser.add_argument("--kv", default="fp8", choices=["fp8", "auto"])
    parser.add_argument("--backend", default="auto", choices=["auto", "xqa"], help="our mla_backend setting")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument("--soak-s", type=float, default=600.0, help="how long the soak sends traffic")
    parser.add_argument("--selftest", action="store_true", help="also feed the judges broken runs: they must fail")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--out", type=Path, default=Path("results/faults"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/mla_backend_models"))
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {','.join(PARTS)}")
    if args.family and (set(parts) - set(SPARSE_PARTS) or args.kv != "auto"):
        parser.error(f"--family runs the parts {','.join(SPARSE_PARTS)} with --kv auto (FP8 has no sparse peer here)")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    # `timeout` ends a call with SIGTERM: leave through the finally blocks, which stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ctx = Context(
        args.heads, args.kv, args.backend, args.out, args.model_dir, args.seed, args.soak_s, args.selftest, args.family
    )
    path = args.out / f"faults_{ctx.name}_{args.kv}_{args.backend}.json"
    return report.run_parts(
        parts,
        lambda part: run_part(ctx, part),
        path,
        dict(heads=args.heads, family=args.family, kv=args.kv, backend=args.backend),
        f"vllm serve under faults, {args.family or f'{args.heads} heads'}, kv {args.kv}, backend {args.backend}",
    )


if __name__ == "__main__":
    sys.exit(main())
