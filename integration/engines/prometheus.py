"""A server's Prometheus ``/metrics`` as numbers, for any engine: the exposition parsed into
``{sample: value}`` for one engine's samples, a wait until chosen gauges read 0, and a wait until the
counters stop moving. The engines' drivers (vllm_server.py, sglang_server.py) name their prefix and the
labels that name the server."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable


def parse_metrics(text: str, prefix: str, server_labels: tuple[str, ...]) -> dict[str, float]:
    """Prometheus text as ``{sample: value}``, the samples whose name starts with ``prefix`` only. A
    sample's key is its name (a counter's with ``_total``), with the labels other than
    ``server_labels`` appended as ``{label=value,...}`` (sorted); samples that differ only in
    ``server_labels`` are added up."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(prefix):
                continue
            labels = sorted((k, v) for k, v in sample.labels.items() if k not in server_labels)
            key = sample.name + ("{" + ",".join(f"{k}={v}" for k, v in labels) + "}" if labels else "")
            values[key] = values.get(key, 0.0) + sample.value
    return values


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def wait_until_zero(
    scrape: Callable[[], dict[str, float]], names: tuple[str, ...], timeout_s: float
) -> dict[str, float]:
    """``scrape()`` until every metric in ``names`` reads 0 or the time runs out; the last scrape
    either way (engines publish their gauges after a step, so they lag the last response)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = scrape()
        if all(metrics.get(name, 1.0) == 0.0 for name in names) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.5)


def counters(metrics: dict[str, float]) -> dict[str, float]:
    """The counters among parsed samples (prometheus_client names them ``*_total``)."""
    return {k: v for k, v in metrics.items() if k.endswith("_total") or "_total{" in k}


def wait_until_settled(
    scrape: Callable[[], dict[str, float]], timeout_s: float, interval_s: float = 1.0
) -> dict[str, float]:
    """``scrape()`` until its counters read the same in two scrapes ``interval_s`` apart, or the time runs
    out; the last scrape either way (an engine may count a request after the client has its answer)."""
    deadline = time.monotonic() + timeout_s
    last = scrape()
    while time.monotonic() < deadline:
        time.sleep(interval_s)
        now = scrape()
        if counters(now) == counters(last):
            return now
        last = now
    return last
