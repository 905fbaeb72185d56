"""Verdicts on a server under faults (integration/fault_check.py): requests that must all complete,
preemption that must have happened, blocks that must come back after aborts, greedy tokens under the
tie rule (judges/tokens.py), inter-token latency and throughput against a reference backend, memory
that must stay flat through a soak, a server log free of errors, a clean exit on SIGINT.

Each judge is a function of what the server and its clients returned (token lists, Prometheus
samples parsed into ``{name: value}``, memory samples, the log's text) and answers ``(ok, note)``.
The breakers at the end make the broken runs a judge must fail on (a poisoned token, a dropped
token, a leaked block, memory that grows, an error in the log): the check's selftest and the CPU
tests feed them to the judges.
"""

from __future__ import annotations

import re
import statistics

from integration.judges.tokens import TIE_NATS, agreement, significantly_fewer_steps, steps_per_prompt

# vLLM 0.26's Prometheus samples (vllm/v1/metrics/loggers.py; counters carry ``_total``).
PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = "vllm:kv_cache_usage_perc"  # 1 - free / (blocks - 1); cached blocks of finished requests count as free
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
GENERATED = "vllm:generation_tokens_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"  # tokens found in the prefix cache
IDLE = (RUNNING, WAITING, KV_USAGE)

USAGE_IDLE_MAX = 1e-6  # exactly 0 when every block is free; one block held of a 100k-block pool is 1e-5
MEMORY_GROWTH_MIB = 256  # GPU memory may move this much between the first and last third after warm-up
MEMORY_SAMPLES_MIN = 6  # samples after warm-up, fewer are too few to judge
SPEED_SLACK = 1.5  # ours may be this much slower than the reference (p50, p99 latency; tokens/s)
LOG_ERROR = re.compile(r"Traceback \(most recent call last\)|\bERROR\b|CUDA error|illegal memory access")
# vLLM's record prefix: "(APIServer pid=1) WARNING 11-25 07:33:57 [base.py:258] ...", one per line of a record.
LOG_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d ")
GPU_FAULT = re.compile(r"CUDA error|illegal memory access")


# --- requests -----------------------------------------------------------------------------------


def judge_completions(counts: list[int], wanted: int | list[int]) -> tuple[bool, str]:
    """Every request returned the number of tokens it asked for (``ignore_eos``: exactly that many)."""
    wanted = [wanted] * len(counts) if isinstance(wanted, int) else wanted
    if len(wanted) != len(counts):
        raise ValueError(f"{len(counts)} counts for {len(wanted)} requests")
    short = [(i, got, want) for i, (got, want) in enumerate(zip(counts, wanted)) if got != want]
    note = f"{len(counts) - len(short)}/{len(counts)} complete"
    if short:
        note += f"; (request, tokens, asked) {short[:6]}"
    return bool(counts) and not short, note


def judge_tokens(
    ours: list[list[int]], ref: list[list[int]], ref_gaps: list[list[float]], peer: dict | None = None
) -> tuple[bool, str]:
    """Greedy tokens against a reference run up to its first tie (judges/tokens.py's rule).

    ``peer`` calibrates the rule where vLLM breaks it itself: ``{"name", "tokens", "ref", "gaps"}``,
    a vLLM backend's tokens in the same situation against its own reference (``"engine"``, where
    given, names another engine whose backend it is: the SGLang check's). With an FP8 cache a
    tiny change upstream (batch shape, recomputed prefill) flips e4m3 roundings of new cache entries,
    and a backend need not keep its tokens under the rule; where the peer breaks it too, ours must
    not stay with its reference significantly fewer steps than the peer does with its own."""
    verdict = agreement(ours, ref, ref_gaps)
    note = f"{verdict['identical']}/{len(ours)} identical"
    if verdict["ok"]:
        return True, note + ", tie rule holds"
    broken = f", tie rule broken at (request, step, first tie) {verdict['failures'][:4]}"
    if peer is None:
        return False, note + broken
    engine = peer.get("engine", "vLLM")
    if agreement(peer["tokens"], peer["ref"], peer["gaps"])["ok"]:
        return False, note + broken + f" while {engine}'s {peer['name']} keeps it"
    mine, theirs = steps_per_prompt(ours, ref), steps_per_prompt(peer["tokens"], peer["ref"])
    ok = not significantly_fewer_steps(mine, theirs)
    return ok, (
        note + f"; {engine}'s {peer['name']} breaks the tie rule too: {sum(mine)} steps agreed vs {sum(theirs)} "
        f"for {peer['name']}" + ("" if ok else " (significantly fewer)")
    )


def judge_tokens_or_calibrate(
    ours: list[list[int]], ref: list[list[int]], ref_gaps: list[list[float]], run_peer, peer: dict
) -> tuple[bool, str]:
    """judge_tokens; where ours breaks the tie rule and ``run_peer`` is given, ``run_peer()`` gives
    (peer tokens, peer's reference tokens, gaps) for the same traffic on the backend ``peer`` names
    (``"name"``, and ``"engine"`` where not vLLM), which calibrates the rule. The peer runs only then."""
    verdict = judge_tokens(ours, ref, ref_gaps)
    if verdict[0] or run_peer is None:
        return verdict
    tokens, peer_ref, peer_gaps = run_peer()
    return judge_tokens(ours, ref, ref_gaps, {**peer, "tokens": tokens, "ref": peer_ref, "gaps": peer_gaps})


def tokens_of(results: list[dict]) -> list[list[int]]:
    """The generated tokens of each request of a run."""
    return [r["tokens"] for r in results]


def gaps_of_runs(results: list[dict]) -> list[list[float]]:
    """The top-2 logprob gaps of each request of a run."""
    return [r["gaps"] for r in results]


# --- the server's metrics -----------------------------------------------------------------------


def judge_counter_rose(before: dict[str, float], after: dict[str, float], name: str, what: str) -> tuple[bool, str]:
    """The counter ``name`` rose between two scrapes of /metrics: ``what`` happened."""
    if name not in before or name not in after:
        return False, f"{name} not reported"
    count = after[name] - before[name]
    return count > 0, f"{count:g} {what} ({name})"


def judge_preemption(before: dict[str, float], after: dict[str, float]) -> tuple[bool, str]:
    """vLLM preempted requests between two scrapes of /metrics."""
    return judge_counter_rose(before, after, PREEMPTIONS, "preemptions")


def judge_blocks_freed(idle: dict[str, float]) -> tuple[bool, str]:
    """The server, idle, holds no request and no KV block. With prefix caching on, the blocks of
    finished requests stay cached but sit in the free queue, so the usage reads 0 all the same; a
    block an aborted request never gave back keeps it above 0."""
    missing = [name for name in IDLE if name not in idle]
    if missing:
        return False, f"not reported: {missing}"
    usage, running, waiting = idle[KV_USAGE], idle[RUNNING], idle[WAITING]
    ok = usage <= USAGE_IDLE_MAX and running == 0 and waiting == 0
    return ok, f"KV usage {usage:.2e} (max {USAGE_IDLE_MAX:g}), {running:g} running, {waiting:g} waiting"


def judge_aborts_reached_server(generated: float, requested: int, aborted: int) -> tuple[bool, str]:
    """Clients that disconnected stopped their requests: the server generated fewer tokens than were
    asked for (had it ignored the disconnects, it would have generated them all)."""
    ok = aborted > 0 and generated < requested
    return ok, f"{aborted} clients disconnected; the server generated {generated:g} of {requested} tokens asked for"


# --- speed --------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def inter_token_latencies(chunks: list[tuple[float, int]]) -> list[float]:
    """Per-token gaps of one stream from its chunks' (arrival time, tokens): a chunk of n tokens
    after a gap g counts n gaps of g / n. The first chunk's wait is time to first token, not counted;
    chunks without tokens (the usage chunk) are skipped."""
    timed = [(t, n) for t, n in chunks if n > 0]
    return [(t1 - t0) / n for (t0, _), (t1, n) in zip(timed, timed[1:]) for _ in range(n)]


def speed_summary(latencies: list[float], tokens: int, seconds: float) -> dict:
    return {
        "p50_ms": 1e3 * percentile(latencies, 50),
        "p99_ms": 1e3 * percentile(latencies, 99),
        "max_ms": 1e3 * max(latencies, default=0.0),
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "tokens": tokens,
        "seconds": seconds,
    }


def judge_speed(ours: dict, ref: dict, ref_name: str, slack: float = SPEED_SLACK) -> tuple[bool, str]:
    """Ours on the same traffic as a reference backend: p50 and p99 inter-token latency within
    ``slack`` times the reference's, tokens/s at least the reference's over ``slack``."""
    ok = (
        ours["p50_ms"] <= slack * ref["p50_ms"]
        and ours["p99_ms"] <= slack * ref["p99_ms"]
        and ours["tokens_per_s"] >= ref["tokens_per_s"] / slack
    )
    return ok, (
        f"p50/p99 ITL {ours['p50_ms']:.2f}/{ours['p99_ms']:.2f} ms, {ours['tokens_per_s']:.0f} tok/s; "
        f"{ref_name} {ref['p50_ms']:.2f}/{ref['p99_ms']:.2f} ms, {ref['tokens_per_s']:.0f} tok/s (slack {slack:g}x)"
    )


# --- a soak -------------------------------------------------------------------------------------


def memory_growth(samples: list[tuple[float, float]], warmup_s: float) -> tuple[float, float, float, int] | None:
    """Memory samples ``(seconds since start, MiB)`` after warm-up: the medians of their first and
    last thirds, the peak and how many there are; None with fewer than MEMORY_SAMPLES_MIN (too few to
    judge). Medians: one allocation spike is not a leak, a steady climb moves the whole last third."""
    after = [mib for t, mib in samples if t >= warmup_s]
    if len(after) < MEMORY_SAMPLES_MIN:
        return None
    third = len(after) // 3
    return statistics.median(after[:third]), statistics.median(after[-third:]), max(after), len(after)


def judge_memory_flat(
    samples: list[tuple[float, float]], warmup_s: float, max_growth_mib: float = MEMORY_GROWTH_MIB
) -> tuple[bool, str]:
    """After warm-up, memory grows by at most ``max_growth_mib`` from the first third of the samples
    to the last (memory_growth)."""
    growth = memory_growth(samples, warmup_s)
    if growth is None:
        return False, f"fewer than {MEMORY_SAMPLES_MIN} samples after {warmup_s:.0f} s of warm-up: too few to judge"
    first, last, peak, count = growth
    return last - first <= max_growth_mib, (
        f"{first:.0f} -> {last:.0f} MiB after {warmup_s:.0f} s of warm-up ({last - first:+.0f}, max "
        f"+{max_growth_mib:g}; {count} samples, peak {peak:.0f})"
    )


def is_error_line(line: str) -> bool:
    """An error, a traceback or a GPU fault. A traceback that vLLM logs as a warning (its chat-template
    warm-up fails under --skip-tokenizer-init, and it says so and goes on) is vLLM's own verdict: not
    an error; a GPU fault is one at any level."""
    level = LOG_LEVEL.search(line)
    if level is None or level.group(1) in ("ERROR", "CRITICAL"):
        return bool(LOG_ERROR.search(line))
    return bool(GPU_FAULT.search(line))


def judge_log(text: str) -> tuple[bool, str]:
    """No error and no traceback in the server's log."""
    bad = [line.strip() for line in text.splitlines() if is_error_line(line)]
    if not bad:
        return True, "no error or traceback in the server log"
    return False, f"{len(bad)} error lines, first: {bad[0][:200]}"


def judge_clean_exit(stopped: bool, returncode: int | None) -> tuple[bool, str]:
    """The server exited on SIGINT in time, with status 0."""
    return stopped and returncode == 0, f"exit {returncode}" + ("" if stopped else " (killed: no exit in time)")


# --- broken runs, for the judges to fail on -----------------------------------------------------


def poison(tokens: list[list[int]], gaps: list[list[float]], vocab: int = 2048) -> list[list[int]] | None:
    """A copy with one token changed where the reference is decided (its top-2 gap at least
    TIE_NATS and no tie before it): the tie rule must fail. None if every reference step is a tie."""
    for i, (stream, stream_gaps) in enumerate(zip(tokens, gaps)):
        if stream and stream_gaps and stream_gaps[0] >= TIE_NATS:
            poisoned = [list(t) for t in tokens]
            poisoned[i][0] = (stream[0] + 1) % vocab
            return poisoned
    return None


def drop_token(tokens: list[list[int]]) -> list[list[int]]:
    """A copy in which the first non-empty request lost its last token (a request cut short)."""
    dropped = [list(t) for t in tokens]
    i = next(i for i, t in enumerate(dropped) if t)
    dropped[i].pop()
    return dropped


def leak_block(idle: dict[str, float], blocks: int) -> dict[str, float]:
    """Idle metrics as they would read with one block of a ``blocks`` pool never given back."""
    return {**idle, KV_USAGE: idle.get(KV_USAGE, 0.0) + 1 / max(blocks - 1, 1)}


def leak_rate_to_catch(samples: list[tuple[float, float]], warmup_s: float, growth_mib: float) -> float:
    """MiB/s of a steady leak that moves memory_growth's last-third median ``growth_mib`` above its
    first-third median, whatever the spacing of the samples the machine delivered."""
    times = [t for t, _ in samples if t >= warmup_s]
    third = len(times) // 3
    spread = statistics.median(times[-third:]) - statistics.median(times[:third]) if third else 0.0
    return growth_mib / max(spread, 1e-3)


def grow_memory(samples: list[tuple[float, float]], mib_per_s: float) -> list[tuple[float, float]]:
    """Memory samples with a steady leak of ``mib_per_s`` added."""
    return [(t, mib + mib_per_s * t) for t, mib in samples]


def log_with_error(text: str) -> str:
    """The log with an engine failure at its end, as vLLM logs one."""
    failure = "ERROR 01-01 00:00:00 [core.py:1] EngineCore encountered a fatal error."
    return f"{text}\n{failure}\nTraceback (most recent call last):\n"
