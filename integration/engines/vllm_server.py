"""``vllm serve`` as the serving checks run it: the command line (an EngineSpec's settings as flags,
plus the serving knobs a check turns: prefix caching, the KV pool's size, the prefill chunk, the
context length), start and health, the server's Prometheus ``/metrics`` read into numbers, the
memory it holds, and a stop by SIGINT as Ctrl-C sends it. It passes no verdict: the checks' judges
(integration/judges/) do, on what it returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from integration.engines import prometheus
from integration.engines.child_signals import sigint_at_default
from integration.engines.vllm_spec import EngineSpec, engine_kwargs
from integration.engines.vllm_worker_check import checked_env

MAX_NUM_SEQS = 96  # concurrent requests a served engine takes unless told (serve_check's 96 streams)
SERVER_LABELS = ("model_name", "engine")  # name the server, not the quantity: samples are summed over them


def serve_command(
    spec: EngineSpec,
    model: str,
    port: int,
    mla_backend: dict | None = None,
    *,
    max_model_len: int = 2048,
    max_num_seqs: int = MAX_NUM_SEQS,
    memory_fraction: float = 0.3,
    prefix_caching: bool | None = False,
    num_gpu_blocks: int | None = None,
    max_num_batched_tokens: int | None = None,
    host: str | None = None,
) -> list[str]:
    """``vllm serve`` with the offline engine's settings (engine_kwargs), as command-line flags.

    ``mla_backend``: our settings (``--additional-config``), else the spec's. ``prefix_caching``:
    False turns it off (the offline engines run without it, so tokens compare), True on, None leaves
    vLLM's default (on). ``num_gpu_blocks`` fixes the KV pool's size (``--num-gpu-blocks-override``;
    a small pool makes vLLM preempt), ``max_num_batched_tokens`` the tokens per step (a prompt longer
    than that is prefilled in chunks over several steps)."""
    kwargs = engine_kwargs(spec, model, max_model_len, memory_fraction=memory_fraction)
    flags = [
        "--attention-backend", kwargs["attention_backend"],
        "--kv-cache-dtype", kwargs["kv_cache_dtype"],
        "--block-size", str(kwargs["block_size"]),
        "--dtype", kwargs["dtype"],
        "--seed", str(kwargs["seed"]),
        "--max-model-len", str(kwargs["max_model_len"]),
        "--max-num-seqs", str(max_num_seqs),
        "--gpu-memory-utilization", str(kwargs["gpu_memory_utilization"]),
        "--skip-tokenizer-init",
    ]  # fmt: skip
    if prefix_caching is not None:
        flags.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    if num_gpu_blocks is not None:
        flags += ["--num-gpu-blocks-override", str(num_gpu_blocks)]
    if max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if host is not None:
        flags += ["--host", host]
    flags += ["--port", str(port)]
    if "compilation_config" in kwargs:
        flags += ["--compilation-config", json.dumps(kwargs["compilation_config"])]
    mla_backend = spec.mla_backend if mla_backend is None else mla_backend
    if mla_backend:
        flags += ["--additional-config", json.dumps({"mla_backend": mla_backend})]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, *flags]


def checked_server_env(
    directory: Path, kv: str, corrupt: float | None = None, max_calls: int | None = None, sparse: bool = False
) -> dict[str, str]:
    """Environment additions for a server of ours whose attention calls are recomputed in float64 in
    its engine process (vllm_worker_check.checked_env; ``sparse``: a sparse model's calls)."""
    return checked_env(directory, "CUSTOM", kv, corrupt, max_calls, sparse)


def start_server(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``command`` with its output in ``log``. It runs in the log's folder: ``python -m`` puts
    its working directory first on sys.path, and from the checkout that would import the checkout's
    mla_backend instead of the installed one under test."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink:
        return subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
            env={**os.environ, **(env or {})},
            preexec_fn=sigint_at_default,  # stop's SIGINT must reach it even from a background job
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(server: subprocess.Popen, port: int, timeout_s: float) -> bool:
    """True once /health answers 200; False if the server exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(2)
    return False


def metrics_answer(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.status == 200 and "vllm:" in response.read().decode()


def parse_metrics(text: str) -> dict[str, float]:
    """vLLM's samples of a /metrics text (prometheus.parse_metrics), summed over SERVER_LABELS."""
    return prometheus.parse_metrics(text, "vllm:", SERVER_LABELS)


def scrape(port: int) -> dict[str, float]:
    """The server's /metrics, parsed (parse_metrics)."""
    return parse_metrics(prometheus.metrics_text(port))


def pool_blocks(metrics: dict[str, float]) -> int | None:
    """The KV pool's size in blocks, from the labels of vLLM's ``vllm:cache_config_info``."""
    for key in metrics:
        if key.startswith("vllm:cache_config_info{") and (found := re.search(r"[{,]num_gpu_blocks=(\d+)", key)):
            return int(found.group(1))
    return None


def wait_until_idle(port: int, names: tuple[str, ...], timeout_s: float = 30) -> dict[str, float]:
    """Scrape until every metric in ``names`` reads 0 (vLLM publishes its gauges after each engine
    step, so they lag the last response) or the time runs out; the last scrape either way."""
    return prometheus.wait_until_zero(lambda: scrape(port), names, timeout_s)


def gpu_memory_used_mib() -> float | None:
    """Memory in use on the first visible GPU, as nvidia-smi reports it (every process's); None
    where nvidia-smi does not answer."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    command = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(command + ([f"--id={visible}"] if visible else []), capture_output=True, text=True)
        return float(done.stdout.split()[0]) if done.returncode == 0 else None
    except (OSError, ValueError, IndexError):
        return None


def process_tree_rss_mib(pid: int) -> float | None:
    """Resident host memory of a process and its children (the server's engine core), in MiB."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def stop(server: subprocess.Popen, timeout_s: float = 60) -> bool:
    """SIGINT, as Ctrl-C; True if the server exits in time."""
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        return False


@contextlib.contextmanager
def running(
    command: list[str],
    log: Path,
    port: int,
    record: dict,
    start_timeout_s: float,
    env=None,
    start=start_server,
    stop=stop,
    before_stop=None,
):
    """The server of ``command`` for the time of the block, once /health answers: a server that does
    not start raises with the tail of its log. Its start time, stop and exit go into ``record``.
    ``start`` and ``stop``: the engine's own (SGLang's stop its process group); ``before_stop``: called
    first on the way out (a log read before SIGINT makes it noisy)."""
    begun = time.monotonic()
    server = start(command, log, env)
    try:
        healthy = wait_until_healthy(server, port, start_timeout_s)
        record["start_s"] = round(time.monotonic() - begun, 1)
        if not healthy:
            tail = " | ".join(log.read_text(errors="replace").splitlines()[-3:])[-400:]
            raise RuntimeError(f"{log.stem} did not start (exit {server.poll()}; {log.name}): {tail}")
        yield server
    finally:
        if before_stop is not None:
            before_stop()
        record.update(stopped=stop(server), exit=server.returncode)
