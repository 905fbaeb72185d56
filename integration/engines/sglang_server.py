"""``python -m sglang.launch_server`` as the SGLang fault check (integration/sglang_fault_check.py) and the
sparse check's serve part (sglang_sparse_server.py) run it: the command line (the seeded model, token
ids in, page 64, triton prefill and the decode backend under test, or SGLang's dsa backend with the
decode sub-backend under test; the serving knobs a part turns), the process environment, start and health, the
Prometheus ``/metrics`` read into numbers, an emptied radix cache, and a stop by SIGINT. It passes no
verdict: integration/judges/ does, on what it returns. A free port and the wait for ``/health`` are
vllm_server.py's (neither depends on the engine).

SGLang finds our backend through the ``sglang.srt.plugins`` entry point of the installed mla_backend.
Flags, endpoints and metrics are SGLang 0.5.17's (sglang/srt/server_args.py, entrypoints/http_server.py,
observability/metrics_collector.py); tests/test_sglang_fault_check.py parses the command lines with
SGLang's own parser.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from integration.engines import prometheus
from integration.engines.child_signals import sigint_at_default
from integration.engines.sglang_engine import DSA_PAGE_SIZE, PAGE_SIZE, STAND_IN_PACKAGES, engine_env

# SGLang's idle check (managers/scheduler_components/invariant_checker.py) raises on a leaked KV token
# or request slot instead of warning: the scheduler dies and says why in the log.
STRICT_IDLE_CHECK = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
# Labels that name the server, not the quantity; samples that differ only in them are added up. pid:
# prometheus_client's multiprocess mode (SGLang's) labels some gauges with the writing process.
SERVER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank", "pid")
CUDA_GRAPH_MAX_BS = 48  # the parts' batches fit; fewer graphs to capture at each start
MEMORY_FRACTION = 0.5  # as integration/sglang_e2e.py's engines


def launch_command(
    model: str,
    port: int,
    decode: str,
    kv: str,
    *,
    graphs: bool = True,
    max_total_tokens: int | None = None,
    chunked_prefill_size: int | None = None,
    schedule_conservativeness: float | None = None,
    host: str = "127.0.0.1",
    sparse: bool = False,
) -> list[str]:
    """The server of ``decode`` (``mla_backend`` or an SGLang backend) on ``model``.

    Radix cache on (SGLang's default). ``graphs`` False: eager (no CUDA graph in either phase), as the
    float64 decode check needs. ``max_total_tokens`` sizes the KV pool (a small one makes SGLang
    retract decode requests), ``chunked_prefill_size`` the prefill chunk, ``schedule_conservativeness``
    how much of each running request's remaining tokens SGLang reserves before admitting more (below 1:
    fewer, so a burst is admitted optimistically and retracted when its decode outgrows the pool).
    Every decode step publishes the pool's gauges (``--decode-log-interval 1``): an idle server then
    reports its final state at once, not after SGLang's 30-s idle refresh. ``sparse``: a DSA model,
    SGLang's dsa backend with ``decode`` its decode sub-backend and its own prefill sub-backend (as
    sglang_engine.sparse_settings)."""
    if sparse:
        attention = ["--page-size", str(DSA_PAGE_SIZE), "--attention-backend", "dsa", "--dsa-decode-backend", decode]
    else:
        attention = [
            "--page-size", str(PAGE_SIZE),
            "--prefill-attention-backend", "triton",
            "--decode-attention-backend", decode,
        ]  # fmt: skip
    flags = [
        "--model-path", model,
        "--skip-tokenizer-init",
        *attention,
        "--kv-cache-dtype", kv,
        "--sampling-backend", "pytorch",
        "--grammar-backend", "none",
        "--mem-fraction-static", str(MEMORY_FRACTION),
        "--enable-metrics",
        "--decode-log-interval", "1",
        "--host", host,
        "--port", str(port),
    ]  # fmt: skip
    if graphs:
        flags += ["--cuda-graph-max-bs-decode", str(CUDA_GRAPH_MAX_BS)]
    else:  # what the deprecated --disable-cuda-graph sets
        flags += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    if max_total_tokens is not None:
        flags += ["--max-total-tokens", str(max_total_tokens)]
    if chunked_prefill_size is not None:
        flags += ["--chunked-prefill-size", str(chunked_prefill_size)]
    if schedule_conservativeness is not None:
        flags += ["--schedule-conservativeness", str(schedule_conservativeness)]
    return [sys.executable, "-m", "sglang.launch_server", *flags]


def server_env(extra: dict[str, str] | None = None, packages: tuple[str, ...] = STAND_IN_PACKAGES) -> dict[str, str]:
    """The server's environment: sglang_engine.engine_env's (the stand-ins of ``packages`` where they are
    absent; a DSA model's leave DeepGEMM out) with SGLang's strict idle check and ``extra`` (a test-only
    plugin's settings and path, a setting of SGLang's)."""
    return engine_env({**STRICT_IDLE_CHECK, **(extra or {})}, packages)


def start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start ``command`` with its output in ``log``, in a process group of its own (stop ends the
    scheduler and detokenizer processes with it). It runs in the log's folder: ``python -m`` puts its
    working directory first on sys.path, and from the checkout that would import the checkout's
    mla_backend instead of the installed one under test."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink:
        return subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
            env=env,
            start_new_session=True,
            preexec_fn=sigint_at_default,  # stop's SIGINT must reach it even from a background job
        )


def stop(server: subprocess.Popen, timeout_s: float = 60) -> bool:
    """SIGINT to the server, as Ctrl-C sends it; True if it exits in time. Whatever is left of its
    process group is then killed and waited for, so that the next server finds the GPU free."""
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout_s)
        stopped = True
    except subprocess.TimeoutExpired:
        stopped = False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    return stopped


def parse_metrics(text: str) -> dict[str, float]:
    """SGLang's samples of a /metrics text (prometheus.parse_metrics), summed over SERVER_LABELS."""
    return prometheus.parse_metrics(text, "sglang:", SERVER_LABELS)


def scrape(port: int) -> dict[str, float]:
    return parse_metrics(prometheus.metrics_text(port))


def wait_until_idle(port: int, names: tuple[str, ...], timeout_s: float) -> dict[str, float]:
    """Scrape until every metric in ``names`` reads 0 or the time runs out; the last scrape either way
    (the scheduler publishes its idle gauges once it finds itself idle, after the last response)."""
    return prometheus.wait_until_zero(lambda: scrape(port), names, timeout_s)


def settled(port: int, timeout_s: float) -> dict[str, float]:
    """/metrics once its counters stop moving (prometheus.wait_until_settled): SGLang's tokenizer manager
    counts a request as it finishes it, which need not come before the client has its answer."""
    return prometheus.wait_until_settled(lambda: scrape(port), timeout_s)


def flush_cache(port: int) -> bool:
    """Empty the radix cache (``/flush_cache``; SGLang does it only while no request runs)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/flush_cache", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False
