"""Verdicts on what an SGLang server's ``/metrics`` counted over a run of traffic (the serve part of
integration/sglang_sparse_e2e.py): every request and every token it answered counted, and its decode
steps run the way the server was started, through CUDA graphs or eagerly. Metric names are SGLang
0.5.17's (observability/metrics_collector.py), as engines/sglang_server.parse_metrics keys them.
"""

from __future__ import annotations

REQUESTS = "sglang:num_requests_total"  # labelled by is_streaming
GENERATED = "sglang:generation_tokens_total"  # labelled by is_streaming
GRAPH_DECODES = "sglang:cuda_graph_passes_total{mode=decode_cuda_graph}"
EAGER_DECODES = "sglang:cuda_graph_passes_total{mode=decode_none}"


def samples_of(name: str, metrics: dict[str, float]) -> list[str]:
    """The keys of ``name``'s samples, under any labels."""
    return [k for k in metrics if k == name or k.startswith(name + "{")]


def counted(before: dict[str, float], after: dict[str, float], name: str) -> float:
    """How much ``name`` rose between two scrapes, summed over its labels."""
    return sum(after[k] for k in samples_of(name, after)) - sum(before[k] for k in samples_of(name, before))


def judge_counted(before: dict[str, float], after: dict[str, float], requests: int, tokens: int) -> tuple[bool, str]:
    """The server counted exactly the requests it answered and the tokens it returned."""
    got_requests, got_tokens = counted(before, after, REQUESTS), counted(before, after, GENERATED)
    ok = got_requests == requests and got_tokens == tokens
    return ok, f"/metrics counted {got_requests:g} of {requests} requests, {got_tokens:g} of {tokens} tokens"


def judge_decode_mode(before: dict[str, float], after: dict[str, float], graphs: bool) -> tuple[bool, str]:
    """A server started with CUDA graphs replayed them for decode; one started eager (the float64 check
    sees only calls that run) never did."""
    replayed, eager = counted(before, after, GRAPH_DECODES), counted(before, after, EAGER_DECODES)
    ok = replayed > 0 if graphs else replayed == 0 and eager > 0
    return ok, f"decode steps: {replayed:g} through CUDA graphs, {eager:g} eager"


def one_request_uncounted(after: dict[str, float]) -> dict[str, float]:
    """The last scrape as a server that lost count of one request would give it (for the selftest)."""
    key = next(iter(samples_of(REQUESTS, after)), REQUESTS)
    return {**after, key: after.get(key, 0.0) - 1}
