"""integration/sglang_fault_check.py on CPU: the SGLang judges (integration/judges/sglang_faults.py) pass
good runs and fail the broken ones the GPU check's selftest feeds them; answers of SGLang's ``/generate``
read into tokens and gaps; the server's command lines, environment, start and stop; each part of the
check run whole against a stand-in server that answers ``/generate``, ``/metrics``, ``/health`` and
``/flush_cache`` as SGLang 0.5.17 does (passing it, and failing it where the stand-in drops a request,
poisons a token, leaks KV tokens or ignores disconnects). Where SGLang is installed (``-m sglang``):
every command line parsed by SGLang's own parser, and the metrics SGLang's own collectors write read
into the samples the judges name.
"""

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # the integration package, from the checkout
from absent_packages import absent_packages  # noqa: E402
from http_stand_in import QuietHandler  # noqa: E402
from server_start import first_line, start_probe_as_background_job  # noqa: E402
from sglang_release import METRICS_PROBE_START  # noqa: E402

from integration.engines import sglang_client, sglang_server  # noqa: E402
from integration.judges import faults, sglang_faults  # noqa: E402

IDLE = {sglang_faults.RUNNING: 0.0, sglang_faults.QUEUED: 0.0, sglang_faults.USED_TOKENS: 0.0}
LABELS = 'engine_type="unified",model_name="/m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'


# What SGLang 0.5.17 serves on /metrics (prometheus_client's multiprocess mode; written by
# SchedulerMetricsCollector, the test_the_metrics_sglang_writes test below renders the real thing).
def exposition(running=0, queued=0, used=0, evictable=0, retracted=0, decode=0, prefill=0) -> str:
    def one(name, kind, value, extra=""):
        return f"# HELP {name} x\n# TYPE {name} {kind}\n{name}{{{LABELS}{extra}}} {float(value)}\n"

    realtime = (
        "# HELP sglang:realtime_tokens_total x\n# TYPE sglang:realtime_tokens_total counter\n"
        f'sglang:realtime_tokens_total{{engine_type="unified",mode="prefill_compute",model_name="/m",'
        f'moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {float(prefill)}\n'
        f'sglang:realtime_tokens_total{{engine_type="unified",mode="decode",model_name="/m",'
        f'moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {float(decode)}\n'
    )
    return (
        one("sglang:num_running_reqs", "gauge", running)
        + one("sglang:num_queue_reqs", "gauge", queued)
        + one("sglang:num_used_tokens", "gauge", used)
        + one("sglang:kv_evictable_tokens", "gauge", evictable)
        + one("sglang:num_retracted_requests_total", "counter", retracted)
        + one("sglang:num_retracted_reqs", "gauge", retracted, ',pid="4242"')
        + realtime
        + "# HELP python_gc_objects_collected_total x\n# TYPE python_gc_objects_collected_total counter\n"
        + 'python_gc_objects_collected_total{generation="0"} 12.0\n'
    )


# --- the judges -----------------------------------------------------------------------------------


def test_metrics_are_read_as_sglang_serves_them():
    metrics = sglang_server.parse_metrics(exposition(running=2, used=128, evictable=640, retracted=3, decode=40))
    assert metrics[sglang_faults.RUNNING] == 2 and metrics[sglang_faults.USED_TOKENS] == 128
    assert metrics[sglang_faults.EVICTABLE] == 640 and metrics[sglang_faults.RETRACTIONS] == 3
    assert (
        metrics[sglang_faults.DECODE_TOKENS] == 40
        and metrics["sglang:realtime_tokens_total{mode=prefill_compute}"] == 0
    )
    assert metrics["sglang:num_retracted_reqs"] == 3  # the writer's pid is not part of the key
    assert not any(name.startswith("python_") for name in metrics)


def test_retraction_seen_only_where_the_counter_rose():
    before = sglang_server.parse_metrics(exposition(retracted=2))
    after = sglang_server.parse_metrics(exposition(retracted=9))
    assert sglang_faults.judge_retraction(before, after) == (
        True,
        f"7 requests retracted ({sglang_faults.RETRACTIONS})",
    )
    assert not sglang_faults.judge_retraction(before, before)[0]
    assert not sglang_faults.judge_retraction({}, after)[0]  # a scrape with nothing in it is no reading
    assert not sglang_faults.judge_retraction(before, {})[0]


def test_a_counter_sglang_never_wrote_reads_as_zero_retractions():
    """A server that has not retracted yet serves no sample of the (labelled) counter at all."""
    never = {k: v for k, v in sglang_server.parse_metrics(exposition()).items() if k != sglang_faults.RETRACTIONS}
    after = sglang_server.parse_metrics(exposition(retracted=2))
    assert sglang_faults.judge_retraction(never, after) == (
        True,
        f"2 requests retracted ({sglang_faults.RETRACTIONS})",
    )
    assert not sglang_faults.judge_retraction(never, never)[0]  # the alone phase: nothing retracted


def test_an_idle_server_holds_no_token_and_a_leaked_page_fails():
    ok, note = sglang_faults.judge_idle(sglang_server.parse_metrics(exposition(evictable=4096)))
    assert ok and "4096 cached (evictable)" in note  # the radix cache's tokens are free to evict
    leaked = sglang_faults.leak_tokens(IDLE, 64)
    assert leaked[sglang_faults.USED_TOKENS] == 64 and IDLE[sglang_faults.USED_TOKENS] == 0  # a copy
    assert not sglang_faults.judge_idle(leaked)[0]
    assert not sglang_faults.judge_idle(sglang_faults.leak_tokens(IDLE, 1))[0]
    assert not sglang_faults.judge_idle({**IDLE, sglang_faults.RUNNING: 1.0})[0]
    assert not sglang_faults.judge_idle({**IDLE, sglang_faults.QUEUED: 3.0})[0]
    ok, note = sglang_faults.judge_idle({sglang_faults.USED_TOKENS: 0.0})
    assert not ok and "not reported" in note


def test_radix_hits_need_every_cached_prefix_read():
    assert sglang_faults.judge_radix_hits([512, 448, 64])[0]
    ok, note = sglang_faults.judge_radix_hits([512, 0, 64])
    assert not ok and "none for requests [1]" in note
    assert not sglang_faults.judge_radix_hits(sglang_faults.no_cache_hits([512, 448]))[0]
    assert not sglang_faults.judge_radix_hits([])[0]  # nothing ran is no pass


def test_a_log_with_a_leak_a_traceback_or_a_dead_scheduler_fails():
    log = textwrap.dedent("""\
        [2026-11-25 10:00:00] server_args=ServerArgs(model_path='/m', ...)
        [2026-11-25 10:00:09 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 768
        [2026-11-25 10:00:10] Received output for rid='a1' but the state was deleted in TokenizerManager.
        [2026-11-25 10:00:11] The server is fired up and ready to roll!
        INFO:     127.0.0.1:40000 - "POST /generate HTTP/1.1" 200 OK
        """)
    assert sglang_faults.judge_log(log)[0]  # a retraction and a client that left are SGLang's normal life
    ok, note = sglang_faults.judge_log(sglang_faults.log_with_leak(log))
    assert not ok and "Scheduler hit an exception" in note
    warned = "[2026-11-25 10:00:12 TP0] pool memory leak detected! [full] total=4096, available=3968, evictable=0\n"
    assert not sglang_faults.judge_log(log + warned)[0]  # the check's warning, where it is not strict
    assert not sglang_faults.judge_log(log + "Traceback (most recent call last):\n")[0]
    assert not sglang_faults.judge_log(log + "RuntimeError: CUDA error: an illegal memory access was encountered\n")[0]
    assert not sglang_faults.judge_log(log + "ERROR:    Exception in ASGI application\n")[0]


def test_the_token_verdict_names_the_engine_of_its_peer():
    ref, gaps, ours = [[1, 2, 3, 4]], [[1.0] * 4], [[1, 9, 9, 9]]
    keeps = {"engine": "SGLang", "name": "triton", "tokens": ref, "ref": ref, "gaps": gaps}
    ok, note = faults.judge_tokens(ours, ref, gaps, keeps)
    assert not ok and "while SGLang's triton keeps it" in note
    breaks = {**keeps, "tokens": [[1, 9, 9, 9]]}
    ok, note = faults.judge_tokens(ours, ref, gaps, breaks)
    assert ok and "SGLang's triton breaks the tie rule too" in note
    assert (
        "vLLM's FLASHMLA keeps it"
        in faults.judge_tokens(ours, ref, gaps, {**keeps, "engine": "vLLM", "name": "FLASHMLA"})[1]
    )


def test_generate_answers_are_read_into_tokens_gaps_and_cache_hits():
    answer = {  # /generate with return_logprob, top_logprobs_num 2, skip_tokenizer_init: (logprob, id, text)
        "output_ids": [7, 8],
        "meta_info": {
            "finish_reason": {"type": "length", "length": 2},
            "cached_tokens": 448,
            "num_retractions": 1,
            "output_top_logprobs": [[[-0.1, 7, None], [-1.6, 3, None]], [[-2.0, 9, None], [-0.5, 8, None]]],
        },
    }
    result = sglang_client.result_of(answer)
    assert result["tokens"] == [7, 8] and result["cached"] == 448 and result["retractions"] == 1
    assert result["gaps"] == pytest.approx([1.5, 1.5]) and result["finish"]["type"] == "length"
    assert sglang_client.gaps_of([[[-0.3, 1, None]]]) == [float("inf")]  # one candidate: no tie
    body = sglang_client.request_body([1, 2], 5, stream=True)
    assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}
    assert body["return_logprob"] and body["top_logprobs_num"] == 2 and body["stream"] and body["input_ids"] == [1, 2]


# --- the servers ------------------------------------------------------------------------------------


def commands() -> dict[str, list[str]]:
    """Every server the check starts, by part and kind."""
    from integration import sglang_fault_check as check

    made = {}
    for part, flags in (("preemption", check.preemption_flags()), ("aborts", check.abort_flags()),
                        ("radix", check.radix_flags())):  # fmt: skip
        for decode in (check.OURS, check.PEER):
            made[f"{part} {decode}"] = sglang_server.launch_command("/m", 30000, decode, "fp8_e4m3", **flags)
    made["radix checked"] = sglang_server.launch_command(
        "/m", 30001, "mla_backend", "auto", graphs=False, **check.radix_flags()
    )
    return made


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_server_commands_carry_what_each_part_needs():
    made = commands()
    for name, command in made.items():
        assert command[1:3] == ["-m", "sglang.launch_server"] and "--skip-tokenizer-init" in command
        assert (
            flag_value(command, "--page-size") == "64"
            and flag_value(command, "--prefill-attention-backend") == "triton"
        )
        assert "--enable-metrics" in command and flag_value(command, "--decode-log-interval") == "1"
        assert "--disable-radix-cache" not in command  # SGLang's default: on
        assert (
            flag_value(command, "--sampling-backend") == "pytorch"
            and flag_value(command, "--grammar-backend") == "none"
        )
    assert flag_value(made["preemption mla_backend"], "--decode-attention-backend") == "mla_backend"
    assert flag_value(made["preemption triton"], "--decode-attention-backend") == "triton"
    eager = made["radix checked"]
    assert flag_value(eager, "--cuda-graph-backend-decode") == "disabled" and "--cuda-graph-max-bs-decode" not in eager
    assert flag_value(made["radix mla_backend"], "--cuda-graph-max-bs-decode") == str(sglang_server.CUDA_GRAPH_MAX_BS)


def test_the_parts_sizes_make_sglang_retract_and_fit_where_they_must():
    from integration import sglang_fault_check as check
    from integration.models.tiny_model import TINY_DEFAULTS

    pages = -(-check.PREEMPT_POOL // 64)
    wanted = check.preemption_budgets()
    assert len(wanted) == check.PREEMPT_REQUESTS
    # Each burst request fits alone (SGLang clips max_new_tokens to pool - paged prompt - page - 1)...
    assert -(-check.PREEMPT_PROMPT[1] // 64) * 64 + max(wanted) + 64 + 1 < check.PREEMPT_POOL
    # ...and the burst does not: its requests need more pages at their end than the pool holds.
    assert sum(-(-(check.PREEMPT_PROMPT[0] + n) // 64) for n in wanted) > pages
    assert 0 < check.PREEMPT_CONSERVATIVENESS < 1  # below SGLang's default: running requests reserve less
    # Short requests among the first admitted (those whose full budgets fit the pool) end early and
    # reopen admission while long ones still run.
    admitted, room = [], check.PREEMPT_POOL
    for n in wanted:
        need = -(-check.PREEMPT_PROMPT[1] // 64) * 64 + n + 64
        if need >= room:
            break
        admitted.append(n)
        room -= need
    assert min(admitted) < max(admitted) and len(admitted) < len(wanted)
    # ...and one prefill chunk takes every prompt of the burst, so the chunk does not cap admission
    assert check.PREEMPT_REQUESTS * -(-check.PREEMPT_PROMPT[1] // 64) * 64 <= check.PREEMPT_CHUNK
    prompts, leave = check.abort_plan(34)
    assert sum(len(p) + check.ABORT_TOKENS for p in prompts) < check.SERVE_POOL  # no retraction among the aborts
    assert all(k is None or k < check.ABORT_TOKENS for k in leave) and sum(k is not None for k in leave) >= 8
    first, batch, kinds = check.radix_prompts(34)
    context = TINY_DEFAULTS["max_position_embeddings"]
    assert max(map(len, first + batch)) + check.RADIX_TOKENS < context
    assert min(len(batch[i]) for i in kinds["long"]) > 2 * check.RADIX_CHUNK  # prefilled over several chunks
    assert sum(len(p) + check.RADIX_TOKENS for p in first + batch) < check.SERVE_POOL
    assert all(len(batch[i]) > 64 for i in kinds["shared"] + kinds["repeated"])  # a whole page to hit
    assert kinds["long"] == list(range(len(batch) - check.RADIX_LONG, len(batch)))  # the long ones last


def test_the_server_environment_is_the_engines_with_the_strict_idle_check(monkeypatch, tmp_path):
    """As integration/sglang_e2e.py's engines: the FlashInfer and DeepGEMM stand-ins where those are
    absent (the lent GPU's image), a checked server's plugin beside them; and SGLang's idle check strict."""
    from integration.engines import sglang_decode_check, sglang_engine

    absent_packages(monkeypatch)
    monkeypatch.setenv("PYTHONPATH", "/installed")
    env = sglang_server.server_env(sglang_decode_check.plugin_env(tmp_path / "plugin", 1.0, tmp_path / "s.json"))
    assert env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "1" and env["SGLANG_IS_FLASHINFER_AVAILABLE"] == "false"
    stand_ins = [str(sglang_engine.STAND_INS / name) for name in ("flashinfer", "deep_gemm")]
    assert env["PYTHONPATH"].split(os.pathsep) == [*stand_ins, str(tmp_path / "plugin"), "/installed"]
    assert sglang_decode_check.ENV in env and env["HOME"] == os.environ["HOME"]
    assert sglang_server.server_env()["PYTHONPATH"].split(os.pathsep) == [*stand_ins, "/installed"]


def test_a_checked_server_runs_in_its_log_folder_finds_the_check_and_stops_on_sigint(tmp_path):
    """start runs the command where its log is (``python -m`` puts that folder first on sys.path, not the
    checkout, whose mla_backend would shadow the installed one), with the float64 check's settings and
    its entry point where SGLang looks for plugins; stop's SIGINT ends it."""
    from integration.engines import sglang_decode_check

    probe = (
        "import importlib.metadata, json, os, time\n"
        "plugins = [e.value for e in importlib.metadata.entry_points(group='sglang.srt.plugins')]\n"
        f"seen = {{'cwd': os.getcwd(), 'plugins': plugins, 'check': os.environ['{sglang_decode_check.ENV}'],\n"
        "        'strict': os.environ['SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE']}\n"
        "print(json.dumps(seen), flush=True)\ntime.sleep(60)\n"
    )
    extra = sglang_decode_check.plugin_env(tmp_path / "plugin", 1.05, tmp_path / "summary.json")
    log = tmp_path / "logs" / "server.log"
    server = sglang_server.start([sys.executable, "-c", probe], log, sglang_server.server_env(extra))
    seen = json.loads(first_line(log))
    assert seen["cwd"] == str(log.parent) and sglang_decode_check.ENTRY_POINT in seen["plugins"]
    assert json.loads(seen["check"]) == {"corruption": 1.05, "summary": str(tmp_path / "summary.json")}
    assert seen["strict"] == "1"
    assert sglang_server.stop(server, timeout_s=10) and server.returncode is not None


def test_a_server_started_from_a_job_that_ignores_sigint_still_stops_on_it(tmp_path):
    """A background job (``cmd &``, nohup, the lent GPU's detached runs) starts with SIGINT ignored and its
    children inherit that; the server must get SIGINT back at its default, or stop's SIGINT does nothing."""
    log = tmp_path / "logs" / "server.log"
    server = start_probe_as_background_job(
        lambda command, log: sglang_server.start(command, log, dict(os.environ)), log
    )
    assert "default_int_handler" in first_line(log)
    assert sglang_server.stop(server, timeout_s=10)


def test_a_server_that_ignores_sigint_is_killed_with_its_children(tmp_path):
    """Its scheduler and detokenizer are children in its process group: none outlives the stop."""
    probe = (
        "import signal, subprocess, sys, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\ntime.sleep(60)\n"
    )
    log = tmp_path / "server.log"
    server = sglang_server.start([sys.executable, "-c", probe], log, dict(os.environ))
    child = int(first_line(log))
    assert not sglang_server.stop(server, timeout_s=1)
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


# --- the whole check against a stand-in server ---------------------------------------------------------


def next_tokens(prompt: list[int], n: int) -> list[int]:
    return [(sum(prompt) + 7 * k) % 2048 for k in range(n)]


def top_logprobs(tokens: list[int]) -> list:
    """The chosen token 1.5 nats ahead of the next."""
    return [[[-0.2, t, None], [-1.7, (t + 1) % 2048, None]] for t in tokens]


class StandIn(QuietHandler):
    """Answers as SGLang 0.5.17's server does where the check reads it: /health, /metrics (the samples
    the judges name), /flush_cache, and /generate with token ids, top-2 logprobs and the radix cache's
    hits (64-token pages seen before); streamed, one event per token with the output so far. A client
    that disconnects stops its request. A request arriving while 4 run counts as retracted.

    ``breakage`` turns one fault on: "drop" (requests whose prompt sums to a multiple of 4 end half
    way), "poison" (our decode changes the first token of a prompt it has answered before), "leak"
    (every request keeps a page, and the scheduler says so in the log), "ignore_disconnects"."""

    protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes, as a disconnect does
    breakage: str | None = None
    lock = threading.Lock()
    state: dict = {}
    log: Path | None = None

    @classmethod
    def reset(cls, breakage=None, log=None):
        cls.breakage, cls.log = breakage, log
        cls.state = {"running": 0, "leaked": 0, "retracted": 0, "decode": 0, "pages": set()}
        cls.serve("none")

    @classmethod
    def serve(cls, decode: str) -> None:
        """A new server of ``decode``: nothing seen, nothing cached."""
        cls.state.update(backend=decode, prompts=set(), pages=set())

    def do_GET(self):
        s = self.state
        if self.path == "/metrics":
            used = 64 * s["running"] + s["leaked"]
            text = exposition(s["running"], 0, used, 64 * len(s["pages"]), s["retracted"], s["decode"])
            self.send(text.encode(), "text/plain")
        else:
            self.send(b"", "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"]))) if self.path == "/generate" else {}
        if self.path == "/flush_cache":
            self.state["pages"] = set()
            return self.send(b"Cache flushed.\n", "text/plain")
        prompt, params = body["input_ids"], body["sampling_params"]
        n = params["max_new_tokens"]
        assert params["temperature"] == 0.0 and params["ignore_eos"] and body["return_logprob"]
        assert body["top_logprobs_num"] == 2
        tokens, finish = next_tokens(prompt, n), {"type": "length", "length": n}
        with self.lock:
            s = self.state
            repeat = tuple(prompt) in s["prompts"]
            s["prompts"].add(tuple(prompt))
            pages = [tuple(prompt[:end]) for end in range(64, len(prompt), 64)]  # at most len - 1 from the cache
            cached = 64 * next((k for k, page in enumerate(pages) if page not in s["pages"]), len(pages))
            s["pages"] |= set(pages)
            s["running"] += 1
            retracted = s["running"] > 4
            s["retracted"] += retracted
        if self.breakage == "poison" and repeat and s["backend"] == "mla_backend":
            tokens[0] = (tokens[0] + 1) % 2048
        if self.breakage == "drop" and sum(prompt) % 4 == 0:
            tokens, finish = tokens[: n // 2], {"type": "abort", "message": "dropped"}
        meta = {"prompt_tokens": len(prompt), "cached_tokens": cached, "num_retractions": int(retracted)}
        try:
            if body["stream"]:
                self.stream(tokens, finish, meta)
            else:
                time.sleep(0.02)
                self.count_decode(len(tokens) - 1)
                meta.update(
                    finish_reason=finish, completion_tokens=len(tokens), output_top_logprobs=top_logprobs(tokens)
                )
                self.send(json.dumps({"output_ids": tokens, "meta_info": meta}).encode(), "application/json")
        finally:
            with self.lock:
                s["running"] -= 1
                if self.breakage == "leak":
                    s["leaked"] += 64
                    if self.log is not None and s["leaked"] == 64:
                        self.log.write_text(sglang_faults.log_with_leak(self.log.read_text()))

    def count_decode(self, steps: int) -> None:
        with self.lock:
            self.state["decode"] += max(steps, 0)

    def stream(self, tokens, finish, meta):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        sent = 0
        try:
            for k in range(len(tokens)):
                time.sleep(0.002)
                done = k == len(tokens) - 1
                out = {**meta, "finish_reason": finish if done else None, "completion_tokens": k + 1}
                out["output_top_logprobs"] = top_logprobs(tokens[: k + 1])
                self.wfile.write(f"data: {json.dumps({'output_ids': tokens[: k + 1], 'meta_info': out})}\n\n".encode())
                self.wfile.flush()
                sent = k + 1
                self.count_decode(k > 0)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            if self.breakage == "ignore_disconnects":
                self.count_decode(len(tokens) - max(sent, 1))  # as if it had gone on to the end


class Listener(ThreadingHTTPServer):
    request_queue_size = 256  # the checks open dozens of connections at once
    daemon_threads = True


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """sglang_fault_check with its servers replaced by the stand-in (one for all of them, as a new
    server each time one starts) and, for checked servers, the float64 check's summary as the SGLang
    check writes it (failing for corrupted outputs)."""
    from integration import sglang_fault_check
    from integration.engines import sglang_decode_check

    log = tmp_path / "server.log"
    log.write_text("[2026-11-25 10:00:00] The server is fired up and ready to roll!\n")
    StandIn.reset(log=log)
    httpd = Listener(("127.0.0.1", 0), StandIn)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    @contextlib.contextmanager
    def served(ctx, decode, label, model, *, graphs=True, check=None, fp8_query=False, **flags):
        name = (
            f"{label}_{decode}" + ("_fp8query" if fp8_query else "") + ("" if check is None else f"_checked_x{check}")
        )
        record = ctx.details.setdefault("servers", {}).setdefault(name, {"command": flags})
        StandIn.serve(decode + ("_fp8query" if fp8_query else ""))
        summary = None
        if check is not None:
            summary = tmp_path / f"check_{name}.json"
            error = 2e-3 if check == 1.0 else 5e-2
            written = sglang_decode_check.process_summary(summary, os.getpid())  # the server's scheduler
            written.write_text(json.dumps({"calls": 64, "rows": 9000, "max_rel_err": error}))
        process = types.SimpleNamespace(pid=os.getpid())
        yield sglang_fault_check.Served(name, httpd.server_address[1], process, log, summary)
        record.update(stopped=True, exit=-2)  # SIGINT: uvicorn re-raises it once it has shut down

    monkeypatch.setattr(sglang_fault_check, "served", served)
    monkeypatch.setattr(sglang_fault_check.Context, "model", lambda self: "/m")
    monkeypatch.setattr(sglang_fault_check, "IDLE_TIMEOUT_S", 1.0)
    yield sglang_fault_check, tmp_path
    httpd.shutdown()


def run(check, tmp_path, part, selftest=True, kv="fp8_e4m3"):
    ctx = check.Context(16, kv, tmp_path, tmp_path, 34, selftest)
    result = check.run_part(ctx, part)
    return {row["check"]: row for row in result["rows"]}, result


@pytest.mark.slow  # each part against a stand-in server, with its waits
@pytest.mark.parametrize("part", ["preemption", "aborts", "radix"])
def test_each_part_passes_a_server_that_behaves_and_its_selftest_catches_every_breakage(stand_in, part):
    check, tmp_path = stand_in
    rows, result = run(check, tmp_path, part)
    assert rows and all(row["ok"] for row in rows.values()), [r for r in rows.values() if not r["ok"]]
    selftests = [name for name in rows if name.startswith("selftest: ")]
    assert len(selftests) >= 3 and all(rows[name]["note"].startswith("caught") for name in selftests)
    json.dumps(result, default=str)  # the summary is written as JSON


def test_the_bf16_radix_part_judges_against_plain_triton(stand_in):
    check, tmp_path = stand_in
    rows, result = run(check, tmp_path, "radix", selftest=False, kv="auto")
    assert rows["tokens vs triton"]["ok"] and rows["decode calls vs float64"]["ok"]
    assert sorted(result["details"]["servers"]) == [
        "radix_mla_backend",
        "radix_mla_backend_checked_x1.0",
        "radix_triton",
    ]


def test_a_broken_server_fails_the_rows_that_see_it_and_the_peer_runs_only_then(stand_in):
    check, tmp_path = stand_in
    _, good = run(check, tmp_path, "preemption", selftest=False)
    assert list(good["details"]["servers"]) == ["preemption_mla_backend"]  # the tie rule held: no peer needed
    StandIn.reset("poison", log=tmp_path / "server.log")
    rows, poisoned = run(check, tmp_path, "preemption", selftest=False)
    assert "while SGLang's triton keeps it" in rows["burst tokens vs each alone"]["note"]
    assert list(poisoned["details"]["servers"]) == ["preemption_mla_backend", "preemption_triton"]


@pytest.mark.slow  # each part against a stand-in server, with its waits
@pytest.mark.parametrize(
    "breakage, part, failing",
    [
        ("drop", "preemption", ["every request complete"]),  # alone and in the burst alike: tokens agree
        ("drop", "radix", ["every request complete"]),
        ("poison", "preemption", ["burst tokens vs each alone"]),
        ("poison", "aborts", ["the other streams' tokens vs the first wave", "follow-up tokens vs the first wave"]),
        ("poison", "radix", ["tokens vs triton, fp8 query"]),
        ("leak", "preemption", ["idle after the burst: no token held", "server log"]),
        (
            "leak",
            "aborts",
            ["idle after the aborts: no token held", "idle after the follow-up: no token held", "server log"],
        ),
        ("ignore_disconnects", "aborts", ["disconnects stop their requests"]),
    ],
)
def test_a_server_that_breaks_fails_the_part(stand_in, breakage, part, failing):
    check, tmp_path = stand_in
    StandIn.reset(breakage, log=tmp_path / "server.log")
    rows, _ = run(check, tmp_path, part, selftest=False)
    assert [name for name, row in rows.items() if not row["ok"]] == failing


def test_a_part_stopped_by_a_signal_reports_the_rows_it_has(monkeypatch, tmp_path):
    from integration import sglang_fault_check as check

    def stopped(ctx):
        ctx.row("first check", (True, "fine"))
        raise SystemExit(143)

    monkeypatch.setitem(check.RUNNERS, "radix", stopped)
    result = check.run_part(check.Context(16, "auto", tmp_path, tmp_path, 0, False), "radix")
    assert result["interrupted"] and [r["ok"] for r in result["rows"]] == [True, False]


# --- against SGLang itself (-m sglang: CI's SGLang venv) ----------------------------------------------------


@pytest.fixture(scope="module")
def sglang_parser():
    """SGLang's own launch_server parser, with the plugins loaded as launch_server loads them (ours
    makes ``mla_backend`` a valid backend)."""
    import argparse

    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def parsed(parser, command: list[str]):
    """The command's arguments through SGLang's parser, every flag spelt as SGLang spells it (no
    abbreviation, which argparse would accept)."""
    known = set(parser._option_string_actions)
    flags = [word for word in command[3:] if word.startswith("--")]
    assert set(flags) <= known, set(flags) - known
    return parser.parse_args(command[3:])


@pytest.mark.sglang
def test_every_server_starts_with_flags_sglang_takes(sglang_parser):
    from integration import sglang_fault_check as check

    made = {name: parsed(sglang_parser, command) for name, command in commands().items()}
    for args in made.values():
        assert (
            args.skip_tokenizer_init and args.enable_metrics and args.page_size == 64 and args.decode_log_interval == 1
        )
        assert args.prefill_attention_backend == "triton" and not args.disable_radix_cache
        assert args.sampling_backend == "pytorch" and args.grammar_backend == "none"
        # The client reads each streamed event as the output so far, one event per token.
        assert not args.incremental_streaming_output and args.stream_interval == 1
    ours, peer = made["preemption mla_backend"], made["preemption triton"]
    assert ours.decode_attention_backend == "mla_backend" and peer.decode_attention_backend == "triton"
    assert ours.max_total_tokens == check.PREEMPT_POOL and ours.kv_cache_dtype == "fp8_e4m3"
    assert ours.schedule_conservativeness == check.PREEMPT_CONSERVATIVENESS
    assert ours.chunked_prefill_size == check.PREEMPT_CHUNK and ours.cuda_graph_max_bs_decode == 48
    radix = made["radix mla_backend"]
    assert radix.chunked_prefill_size == check.RADIX_CHUNK and radix.max_total_tokens == check.SERVE_POOL
    eager = made["radix checked"]
    assert eager.cuda_graph_backend_decode == "disabled" and eager.cuda_graph_backend_prefill == "disabled"
    assert eager.kv_cache_dtype == "auto" and made["aborts mla_backend"].schedule_conservativeness == 1.0


METRICS_PROBE = (
    METRICS_PROBE_START
    + """
from sglang.srt.observability.metrics_collector import QueueCount, SchedulerMetricsCollector, SchedulerStats
collector = SchedulerMetricsCollector(labels=labels, server_args=args)
collector.log_stats(SchedulerStats(num_running_reqs=QueueCount(total=2), num_queue_reqs=QueueCount(total=1),
                                   num_used_tokens=128, kv_evictable_tokens=640, num_retracted_reqs=3))
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
sys.stdout.write(generate_latest(registry).decode() + "\\n# ---- after a retraction\\n")
collector.increment_retracted_reqs(3, 700, 90)
collector.increment_realtime_tokens(None, prefill_compute_tokens=500, decode_tokens=40)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
sys.stdout.write(generate_latest(registry).decode())
"""
)


@pytest.mark.sglang
def test_the_metrics_sglang_writes_are_the_samples_the_judges_read():
    """SGLang's own scheduler collector, in the multiprocess mode its server runs it in, rendered as
    /metrics serves it: every sample a judge names is there, under that name, with its value."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", METRICS_PROBE], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    first, rendered = done.stdout.split("# ---- after a retraction\n")
    assert sglang_faults.RETRACTIONS not in sglang_server.parse_metrics(first)  # written from its first use
    assert sglang_faults.judge_retraction(sglang_server.parse_metrics(first), sglang_server.parse_metrics(rendered))[0]
    metrics = sglang_server.parse_metrics(rendered)
    assert {name: metrics[name] for name in sglang_faults.IDLE} == {
        sglang_faults.RUNNING: 2.0,
        sglang_faults.QUEUED: 1.0,
        sglang_faults.USED_TOKENS: 128.0,
    }
    assert metrics[sglang_faults.EVICTABLE] == 640 and metrics[sglang_faults.RETRACTIONS] == 3
    assert metrics[sglang_faults.DECODE_TOKENS] == 40
    assert not sglang_faults.judge_idle(metrics)[0]


@pytest.mark.sglang
def test_sglang_s_strict_idle_check_raises_with_words_the_log_judge_knows(monkeypatch):
    from sglang.srt.environ import envs
    from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker

    for name, value in sglang_server.STRICT_IDLE_CHECK.items():
        monkeypatch.setenv(name, value)
    assert envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE.get() is True
    holder = types.SimpleNamespace(count_memory_leak_warnings=0)
    with pytest.raises(ValueError) as raised:
        SchedulerInvariantChecker._report_leak(holder, "pool", "[full] total=4096, available=3968, evictable=0")
    assert sglang_faults.SGLANG_FAULT.search(str(raised.value))
    assert not sglang_faults.judge_log(f"[2026-11-25 10:00:12 TP0] {raised.value}\n")[0]
