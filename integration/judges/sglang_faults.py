"""Verdicts on SGLang's server under faults (integration/sglang_fault_check.py), in SGLang's own terms:
its Prometheus samples (SGLang 0.5.17, sglang/srt/observability/metrics_collector.py), the radix
cache's hits as ``/generate`` reports them, and its log. The rules both engines share (every request
complete, the tie rule, disconnects that stop requests, error lines) are judges/faults.py's.

The breakers at the end make the broken runs these judges must fail on: a token never given back, a
leak SGLang's own idle check reports, a batch that read nothing from the radix cache.
"""

from __future__ import annotations

import re

from integration.judges import faults

# Sample keys as integration/engines/sglang_server.py's parse_metrics writes them.
RETRACTIONS = "sglang:num_retracted_requests_total"  # decode requests retracted because the KV pool ran full
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
# max_total_num_tokens - (available + evictable) (scheduler_components/pool_stats_observer.py): the
# radix cache keeps finished requests' tokens but as evictable, so an idle server reads exactly 0
# unless some token was never given back (what SGLang's own idle check asserts).
USED_TOKENS = "sglang:num_used_tokens"
EVICTABLE = "sglang:kv_evictable_tokens"  # what the radix cache holds, free to evict
DECODE_TOKENS = "sglang:realtime_tokens_total{mode=decode}"  # the scheduler's: running requests per decode step
IDLE = (RUNNING, QUEUED, USED_TOKENS)

# SGLang's own failures: its idle check (managers/scheduler_components/invariant_checker.py; it raises
# under SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE, else warns), the busy check's assertion, a
# scheduler that died. Its log records carry no level, so an error is known by its words.
SGLANG_FAULT = re.compile(
    r"memory leak detected|Mem Leak Detected|KV double free|use-after-free|Scheduler hit an exception"
)


def judge_retraction(before: dict[str, float], after: dict[str, float]) -> tuple[bool, str]:
    """SGLang retracted decode requests (its preemption) between two scrapes of /metrics. The counter
    is a labelled one, which prometheus_client writes only from its first increment: a scrape that
    holds the scheduler's gauges but not the counter reads it as 0; a scrape without those gauges is
    no reading at all."""
    for when, scrape in (("first", before), ("second", after)):
        missing = [name for name in IDLE if name not in scrape]
        if missing:
            return False, f"the {when} scrape holds no scheduler metrics: {missing} not reported"
    counted = ({RETRACTIONS: 0.0, **before}, {RETRACTIONS: 0.0, **after})
    return faults.judge_counter_rose(*counted, RETRACTIONS, "requests retracted")


def judge_idle(idle: dict[str, float]) -> tuple[bool, str]:
    """The server, idle, runs and queues no request and holds no KV token outside the radix cache's
    evictable ones."""
    missing = [name for name in IDLE if name not in idle]
    if missing:
        return False, f"not reported: {missing}"
    used, running, queued = idle[USED_TOKENS], idle[RUNNING], idle[QUEUED]
    ok = used == 0 and running == 0 and queued == 0
    cached = f", {idle[EVICTABLE]:g} cached (evictable)" if EVICTABLE in idle else ""
    return ok, f"{used:g} KV tokens held{cached}; {running:g} running, {queued:g} queued"


def judge_radix_hits(cached: list[int]) -> tuple[bool, str]:
    """Each request whose prompt starts with one cached earlier (``cached_tokens`` of its answer) read
    that prefix from the radix cache."""
    missed = [i for i, tokens in enumerate(cached) if tokens <= 0]
    note = f"{len(cached) - len(missed)}/{len(cached)} read their prefix from the radix cache ({sum(cached)} tokens)"
    if missed:
        note += f"; none for requests {missed[:6]}"
    return bool(cached) and not missed, note


def is_fault_line(line: str) -> bool:
    """A traceback, a GPU fault (faults.is_error_line), or one of SGLang's own failure messages."""
    return faults.is_error_line(line) or bool(SGLANG_FAULT.search(line))


def judge_log(text: str) -> tuple[bool, str]:
    """No traceback, GPU fault or SGLang failure (a leak its idle check found, a dead scheduler) in the
    server's log."""
    bad = [line.strip() for line in text.splitlines() if is_fault_line(line)]
    if not bad:
        return True, "no traceback, leak or scheduler failure in the server log"
    return False, f"{len(bad)} fault lines, first: {bad[0][:200]}"


# --- broken runs, for the judges to fail on -----------------------------------------------------


def leak_tokens(idle: dict[str, float], tokens: int) -> dict[str, float]:
    """Idle metrics as they would read with ``tokens`` KV tokens never given back."""
    return {**idle, USED_TOKENS: idle.get(USED_TOKENS, 0.0) + tokens}


def log_with_leak(text: str) -> str:
    """The log with the failure SGLang's strict idle check ends a scheduler with."""
    failure = (
        "[2026-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        "ValueError: pool memory leak detected! [full] total=4096, available=3968, evictable=0, "
        "protected=0, session_held=0, uncached=0"
    )
    return f"{text}\n{failure}\n"


def no_cache_hits(cached: list[int]) -> list[int]:
    """``cached_tokens`` as a server whose radix cache never matched would report them."""
    return [0] * len(cached)
