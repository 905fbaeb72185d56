"""integration/judges/faults.py on hand-made runs: each judge passes a good run and fails the broken
one the GPU check's selftest feeds it (a poisoned token, a request cut short, a leaked block, memory
that grows, an error in the log, no preemption); percentiles as numpy computes them; Prometheus text
as vLLM 0.26 writes it read into the samples the judges name; the command lines of every part of
integration/fault_check.py parsed by vLLM's own ``vllm serve`` parser; and each part of the check run
whole against a stand-in server that answers as vLLM's does (passing it, and failing it where the
stand-in cuts requests short, leaks blocks or ignores disconnects)."""

import contextlib
import json
import os
import re
import select
import sys
import threading
import time
import types
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the integration package, from the checkout
from http_stand_in import QuietHandler  # noqa: E402
from server_start import first_line, start_probe_as_background_job  # noqa: E402

from integration.engines.vllm_server import parse_metrics, pool_blocks, serve_command  # noqa: E402
from integration.engines.vllm_spec import EngineSpec  # noqa: E402
from integration.judges import faults  # noqa: E402
from integration.judges.tokens import TIE_NATS  # noqa: E402

REF = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
WIDE = [[1.0] * 4 for _ in REF]
IDLE = {faults.KV_USAGE: 0.0, faults.RUNNING: 0.0, faults.WAITING: 0.0}

# What vLLM 0.26's /metrics serves (prometheus_client's text format; names from vllm/v1/metrics/loggers.py).
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/m"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="/m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="/m"} 0.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="/m"} 7.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="/m"} 1.7e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="/m"} 1024.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="/m"} 30.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="/m"} 6.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="64",cache_dtype="fp8",engine="0",num_gpu_blocks="256"} 1.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 123.0
"""


# --- requests -------------------------------------------------------------------------------------


def test_every_request_complete_passes_and_a_request_cut_short_fails():
    assert faults.judge_completions([4, 4, 4], 4)[0]
    ok, note = faults.judge_completions([len(t) for t in faults.drop_token(REF)], 4)
    assert not ok and "(0, 3, 4)" in note
    assert faults.judge_completions([16, 64], [16, 64])[0] and not faults.judge_completions([16, 63], [16, 64])[0]
    assert not faults.judge_completions([], 4)[0]  # nothing ran is no pass
    with pytest.raises(ValueError):
        faults.judge_completions([4, 4], [4])


def test_tokens_pass_the_tie_rule_and_a_poisoned_token_fails_it():
    assert faults.judge_tokens(REF, REF, WIDE) == (True, "3/3 identical, tie rule holds")
    poisoned = faults.poison(REF, WIDE)
    assert poisoned[0][0] != REF[0][0] and poisoned[1:] == REF[1:] and REF[0][0] == 1  # a copy
    ok, note = faults.judge_tokens(poisoned, REF, WIDE)
    assert not ok and "(0, 0, 4)" in note


def test_the_poison_lands_where_the_reference_is_decided():
    gaps = [[TIE_NATS / 2] * 4, [1.0] * 4, [1.0] * 4]  # the first prompt's first step is a tie
    poisoned = faults.poison(REF, gaps)
    assert poisoned[0] == REF[0] and poisoned[1][0] != REF[1][0]
    assert not faults.judge_tokens(poisoned, REF, gaps)[0]
    assert faults.poison(REF, [[0.0] * 4] * 3) is None  # every first step a tie: nothing decided to poison


def test_a_peer_that_breaks_the_tie_rule_too_calibrates_it():
    ours = [[1, 2, 9, 9], [5, 6, 7, 8], [9, 10, 11, 12]]  # leaves at step 2 of 4, before any tie
    assert not faults.judge_tokens(ours, REF, WIDE)[0]
    keeps = {"name": "FLASHMLA", "tokens": REF, "ref": REF, "gaps": WIDE}
    ok, note = faults.judge_tokens(ours, REF, WIDE, keeps)
    assert not ok and "while vLLM's FLASHMLA keeps it" in note
    breaks = {"name": "FLASHMLA", "tokens": [[1, 9, 9, 9], [5, 6, 7, 8], [9, 10, 11, 12]], "ref": REF, "gaps": WIDE}
    ok, note = faults.judge_tokens(ours, REF, WIDE, breaks)
    assert ok and "10 steps agreed vs 9" in note
    # Ours leaving far earlier than a peer that leaves late, on every prompt, is significantly fewer.
    late = {"name": "FLASHMLA", "tokens": [[1, 2, 3, 9], [5, 6, 7, 9], [9, 10, 11, 9]], "ref": REF, "gaps": WIDE}
    early = [[9, 9, 9, 9], [5, 9, 9, 9], [9, 9, 9, 9]]
    assert not faults.judge_tokens(early, REF, WIDE, late)[0]


# --- the server's metrics --------------------------------------------------------------------------


def test_metrics_are_read_as_vllm_serves_them():
    metrics = parse_metrics(METRICS)
    assert metrics[faults.PREEMPTIONS] == 7.0 and metrics[faults.GENERATED] == 1024.0
    assert {name: metrics[name] for name in faults.IDLE} == IDLE
    assert metrics["vllm:request_success_total{finished_reason=abort}"] == 6.0
    assert not any(name.startswith("python_") for name in metrics)
    assert pool_blocks(metrics) == 256 and pool_blocks({}) is None


def test_preemption_seen_only_where_the_counter_rose():
    before = parse_metrics(METRICS)
    after = {**before, faults.PREEMPTIONS: 9.0}
    assert faults.judge_preemption(before, after) == (True, f"2 preemptions ({faults.PREEMPTIONS})")
    assert not faults.judge_preemption(before, before)[0]
    assert not faults.judge_preemption({}, after)[0]  # not reported is no pass


def test_an_idle_server_holds_no_block_and_a_leaked_block_fails():
    assert faults.judge_blocks_freed(IDLE)[0]
    assert faults.judge_blocks_freed(parse_metrics(METRICS))[0]
    for blocks in (256, 100_001):
        leaked = faults.leak_block(IDLE, blocks)
        assert leaked[faults.KV_USAGE] == pytest.approx(1 / (blocks - 1))
        assert not faults.judge_blocks_freed(leaked)[0]
    assert not faults.judge_blocks_freed({**IDLE, faults.RUNNING: 1.0})[0]
    assert not faults.judge_blocks_freed({**IDLE, faults.WAITING: 2.0})[0]
    ok, note = faults.judge_blocks_freed({faults.KV_USAGE: 0.0})
    assert not ok and "not reported" in note


def test_aborts_reach_the_server_only_if_it_generated_less_than_asked():
    assert faults.judge_aborts_reached_server(1500, 36 * 64, 14)[0]
    assert not faults.judge_aborts_reached_server(36 * 64, 36 * 64, 14)[0]  # it ran them all to the end
    assert not faults.judge_aborts_reached_server(1500, 36 * 64, 0)[0]  # no client left: nothing shown


# --- speed ----------------------------------------------------------------------------------------


def test_percentiles_are_numpy_s():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1001):
        values = rng.exponential(size=n).tolist()
        for q in (0, 1, 50, 90, 99, 100):
            assert faults.percentile(values, q) == pytest.approx(np.percentile(values, q))
    # p99 of 100 values sits 99% of the way along the sorted list: between the 99th and 100th values.
    assert faults.percentile([1e-3] * 98 + [1.0] * 2, 99) == 1.0  # two stalls in 100: p99 is a stall
    assert faults.percentile([1e-3] * 99 + [1.0], 99) == pytest.approx(1e-3 + 0.01 * (1.0 - 1e-3))
    assert faults.percentile([1e-3] * 100 + [1.0], 99) == 1e-3  # one in 101: p99 is not
    assert faults.percentile([1e-3] * 99 + [1.0], 50) == 1e-3


def test_inter_token_latencies_spread_a_chunk_s_gap_over_its_tokens():
    chunks = [(10.0, 1), (10.1, 1), (10.1, 0), (10.4, 3), (10.5, 1), (11.0, 0)]
    assert faults.inter_token_latencies(chunks) == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])
    assert faults.inter_token_latencies([(1.0, 1)]) == []


def test_speed_within_the_slack_of_the_reference():
    ref = faults.speed_summary([0.010] * 99 + [0.020], 1000, 10.0)
    assert ref["p50_ms"] == pytest.approx(10.0) and ref["tokens_per_s"] == 100.0
    assert faults.judge_speed(ref, ref, "FLASHMLA")[0]
    slow = faults.speed_summary([0.016] * 100, 1000, 10.0)
    assert not faults.judge_speed(slow, ref, "FLASHMLA")[0]
    stalls = faults.speed_summary([0.010] * 95 + [0.5] * 5, 1000, 10.0)  # p50 fine, p99 not
    assert not faults.judge_speed(stalls, ref, "FLASHMLA")[0]
    starved = faults.speed_summary([0.010] * 100, 600, 10.0)
    assert not faults.judge_speed(starved, ref, "FLASHMLA")[0]


# --- a soak ---------------------------------------------------------------------------------------


def test_flat_memory_passes_and_a_leak_fails():
    warm = [(t, 30_000.0 + (2_000.0 if t < 10 else 0.0) + (t % 3)) for t in range(0, 120, 2)]
    assert faults.judge_memory_flat(warm, 20)[0]  # the warm-up's climb is not judged
    spike = [(t, m + (4_000.0 if t == 60 else 0.0)) for t, m in warm]
    assert faults.judge_memory_flat(spike, 20)[0]  # one spike is not a leak
    ok, note = faults.judge_memory_flat(faults.grow_memory(warm, 5.0), 20)
    assert not ok and "max +256" in note
    assert not faults.judge_memory_flat(warm[:12], 20)[0]  # too few samples after warm-up: no verdict is no pass
    # Samples bunched as a busy machine delivers them: the selftest's leak still moves the medians 4x the limit.
    bunched = [(t, 30_000.0) for t in (20.0, 20.1, 20.2, 20.3, 20.4, 20.5, 21.0, 40.0, 40.1)]
    rate = faults.leak_rate_to_catch(bunched, 20, 4 * faults.MEMORY_GROWTH_MIB)
    ok, note = faults.judge_memory_flat(faults.grow_memory(bunched, rate), 20)
    assert not ok and "(+1024," in note


def test_a_log_with_an_error_or_a_traceback_fails():
    log = "INFO 11-24 10:00:00 [api_server.py:1] Started server process\nWARNING 11-24 [x.py:2] slow\n"
    assert faults.judge_log(log)[0]
    ok, note = faults.judge_log(faults.log_with_error(log))
    assert not ok and "EngineCore encountered a fatal error" in note
    assert not faults.judge_log(log + "Traceback (most recent call last):\n")[0]
    assert not faults.judge_log(log + "RuntimeError: CUDA error: an illegal memory access was encountered\n")[0]
    # As the GPU's vllm serve logs it: a warm-up traceback vLLM reports as a warning and goes past.
    warned = "".join(
        f"(APIServer pid=2143) WARNING 11-25 07:33:57 [base.py:258] {text}\n"
        for text in (
            "Chat template warmup failed",
            "Traceback (most recent call last):",
            '  File "/tmp/site/vllm/renderers/base.py", line 251, in warmup',
            "ValueError: Tokenizer not available when `skip_tokenizer_init=True`",
        )
    )
    assert faults.judge_log(log + warned)[0]
    assert not faults.judge_log(log + "(EngineCore pid=7) ERROR 11-25 07:34:00 [core.py:9] EngineCore failed\n")[0]
    fault = "(EngineCore pid=7) WARNING 11-25 07:34:00 [x.py:1] CUDA error: an illegal memory access was encountered\n"
    assert not faults.judge_log(log + fault)[0]


def test_only_a_timely_exit_0_on_sigint_is_clean():
    assert faults.judge_clean_exit(True, 0)[0]
    assert not faults.judge_clean_exit(True, 1)[0]
    assert not faults.judge_clean_exit(False, -9)[0]


# --- the servers' command lines ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve_parser():
    """vLLM's own ``vllm serve`` argument parser (its device guessed as the CPU's, as here)."""
    from vllm.platforms import current_platform

    device = current_platform.device_type
    current_platform.device_type = device or "cpu"
    try:
        try:  # vLLM 0.26; later releases moved it
            from vllm.entrypoints.openai.cli_args import make_arg_parser
        except ModuleNotFoundError:
            from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        yield make_arg_parser(FlexibleArgumentParser())
    finally:
        current_platform.device_type = device


def parsed(parser, command: list[str]):
    """The command's serve arguments through vLLM's parser; every flag spelt as vLLM spells it (no
    abbreviation, which argparse would accept)."""
    assert command[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    known = set(parser._option_string_actions)
    flags = [word for word in command[5:] if word.startswith("--")]
    assert set(flags) <= known, set(flags) - known
    return parser.parse_args(command[4:])


@pytest.mark.vllm
def test_every_part_s_servers_start_with_flags_vllm_serve_takes(serve_parser):
    from integration import fault_check as check

    ctx = check.Context(16, "fp8", "xqa", Path("/out"), Path("/models"), 34, 60.0, False)
    ours, ref = ctx.spec("CUSTOM"), ctx.spec("FLASHMLA")
    assert ours.mla_backend == {"backend": "xqa"} and ref.mla_backend == {}
    assert check.Context(16, "fp8", "auto", Path("/o"), Path("/m"), 0, 1.0, False).spec("CUSTOM").mla_backend == {}
    preemption = parsed(serve_parser, serve_command(ours, "/m", 8000, host="127.0.0.1", **check.preemption_flags()))
    assert preemption.num_gpu_blocks_override == check.PREEMPT_BLOCKS and preemption.enable_prefix_caching is False
    assert preemption.max_model_len == check.PREEMPT_MODEL_LEN and preemption.attention_backend == "CUSTOM"
    assert preemption.additional_config == {"mla_backend": {"backend": "xqa"}}
    assert preemption.kv_cache_dtype == "fp8" and preemption.block_size == 64 and preemption.host == "127.0.0.1"
    assert preemption.compilation_config.cudagraph_mode.name == "FULL_DECODE_ONLY"
    first, batch, kinds = check.prefix_prompts(0)
    prefix = parsed(serve_parser, serve_command(ref, "/m", 8000, **check.prefix_flags(batch)))
    assert prefix.enable_prefix_caching is None  # vLLM's default: on
    assert prefix.max_num_batched_tokens == check.PREFIX_BATCHED and prefix.attention_backend == "FLASHMLA"
    assert prefix.additional_config == {} and prefix.num_gpu_blocks_override is None
    assert max(len(batch[i]) for i in kinds["long"]) > 4 * check.PREFIX_BATCHED  # prefilled over several steps
    assert min(len(p) for p in first) >= 300 and len(batch) == prefix.max_num_seqs
    # vLLM refuses a request whose prompt and new tokens pass max_model_len (HTTP 400).
    assert max(map(len, first + batch)) + check.PREFIX_TOKENS <= prefix.max_model_len
    assert check.PREEMPT_PROMPT[1] + check.PREEMPT_TOKENS <= preemption.max_model_len
    # Preemption: every prompt admitted at once, and their decode outgrowing the pool.
    prompt_blocks = check.PREEMPT_REQUESTS * -(-check.PREEMPT_PROMPT[1] // 64)
    final_blocks = check.PREEMPT_REQUESTS * -(-(check.PREEMPT_PROMPT[0] + check.PREEMPT_TOKENS) // 64)
    assert prompt_blocks <= check.PREEMPT_BLOCKS < final_blocks
    long = parsed(serve_parser, serve_command(ours, "/m", 8000, **check.long_flags()))
    assert long.max_model_len == check.LONG_MODEL_LEN >= 32768 and long.enable_prefix_caching is None
    soak = parsed(serve_parser, serve_command(ours, "/m", 8000, **check.soak_flags()))
    assert soak.max_model_len == check.SOAK_MODEL_LEN and soak.max_num_batched_tokens == check.SOAK_BATCHED
    aborts = parsed(serve_parser, serve_command(ours, "/m", 8000, **check.abort_flags(36)))
    assert aborts.enable_prefix_caching is None and aborts.max_num_seqs == 36


@pytest.mark.vllm
def test_the_serving_check_s_command_is_unchanged_by_the_move(serve_parser):
    """integration/serve_check.py's server: prefix caching off, 96 sequences, no host flag."""
    from integration import serve_check

    command = serve_check.serve_command(EngineSpec("CUSTOM", "fp8", 64, True), "/m", 8123, {"backend": "nope"})
    args = parsed(serve_parser, command)
    assert args.enable_prefix_caching is False and args.max_num_seqs == 96 and args.max_model_len == 2048
    assert args.gpu_memory_utilization == 0.3 and args.port == 8123 and "--host" not in command
    assert args.additional_config == {"mla_backend": {"backend": "nope"}}


# --- the whole check against a stand-in server ---------------------------------------------------------


def next_tokens(prompt: list[int], n: int) -> list[int]:
    return [(sum(prompt) + 7 * k) % 2048 for k in range(n)]


class StandIn(QuietHandler):
    """Answers as vLLM 0.26's server does, where fault_check reads it: /health, /metrics (the samples
    the judges name), completions with token ids, ``token_id:N`` top logprobs and, streamed, one chunk
    per token. A client that disconnects stops its request. ``breakage`` turns one fault on:
    "cut" (every request one token short), "leak" (blocks never given back), "ignore_disconnects".

    A stream whose client will leave (``leaving``, told by the check's client) pauses at that chunk
    until the client has gone, as a server slower than its clients does: unpaced, a busy machine can
    let it write every token into the socket before the client reads the first. Requests sent
    together (``expect_together``, told by the check's client) are answered once all have arrived,
    as vLLM batches a burst: else a busy client can send them too slowly to ever run more than 4."""

    protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes, as a disconnect does
    breakage: str | None = None
    lock = threading.Lock()
    state: dict = {}
    seen_blocks: set = set()
    leaving: dict = {}  # prompt -> the chunks its client reads before it leaves
    arrivals = threading.Condition()
    together = {"expected": 0, "arrived": 0}
    settled = threading.Condition(lock)  # notified as each request's handler finishes

    @classmethod
    def reset(cls, breakage=None):
        cls.breakage = breakage
        cls.state = {"running": 0, "generated": 0, "preemptions": 0, "hits": 0, "leaked": 0}
        cls.seen_blocks = set()
        cls.leaving = {}
        cls.expect_together(0)

    @classmethod
    def expect_together(cls, count: int) -> None:
        with cls.arrivals:
            cls.together = {"expected": count, "arrived": 0}

    @classmethod
    def wait_until_settled(cls, limit_s: float = 60.0) -> None:
        """Until no request is in a handler: the gauges then read what the requests left behind (a leak
        shows at once); the limit only keeps a lost handler from hanging the test."""
        with cls.settled:
            assert cls.settled.wait_for(lambda: cls.state["running"] == 0, limit_s), "the stand-in never settled"

    def wait_for_the_rest_of_the_burst(self, limit_s: float = 60.0) -> None:
        """Until every request sent together has arrived; the limit only keeps a lost one from hanging the test."""
        with self.arrivals:
            self.together["arrived"] += 1
            self.arrivals.notify_all()
            self.arrivals.wait_for(lambda: self.together["arrived"] >= self.together["expected"], limit_s)

    def do_GET(self):
        if self.path == "/metrics":
            s = self.state
            usage = s["leaked"] / 255 if s["running"] == 0 else 0.5
            body = METRICS.replace(
                'vllm:kv_cache_usage_perc{engine="0",model_name="/m"} 0.0',
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="/m"}} {usage}',
            )
            body = body.replace(
                'running{engine="0",model_name="/m"} 0.0', f'running{{engine="0",model_name="/m"}} {s["running"]}'
            )
            body = body.replace("} 7.0", f"}} {s['preemptions']}").replace("} 1024.0", f"}} {s['generated']}")
            hits = f'vllm:prefix_cache_hits_total{{engine="0",model_name="/m"}} {s["hits"]}'
            body += f"# TYPE vllm:prefix_cache_hits_total counter\n{hits}\n"
            self.send(body.encode(), "text/plain")
        else:
            self.send(b"", "text/plain")

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, n = request["prompt"], request["max_tokens"]
        assert request["temperature"] == 0.0 and request["ignore_eos"] and request["return_token_ids"]
        assert request["logprobs"] == 2 and request["return_tokens_as_token_ids"]
        tokens = next_tokens(prompt, n - (self.breakage == "cut"))
        with self.lock:
            self.state["running"] += 1
            if self.state["running"] > 4:
                self.state["preemptions"] += 1
            blocks = {tuple(prompt[i : i + 64]) for i in range(0, len(prompt) - 63, 64)}
            self.state["hits"] += 64 * len(blocks & self.seen_blocks)
            self.seen_blocks |= blocks
        head = {"id": "c", "object": "text_completion", "created": 0, "model": request["model"]}
        try:
            if request.get("stream"):
                self.stream(prompt, head, tokens)
            else:
                self.wait_for_the_rest_of_the_burst()
                time.sleep(0.02)
                self.add_generated(len(tokens))
                choice = {
                    "index": 0,
                    "text": "",
                    "finish_reason": "length",
                    "token_ids": tokens,
                    "logprobs": logprobs(tokens),
                }
                usage = {"prompt_tokens": len(prompt), "completion_tokens": len(tokens), "total_tokens": 0}
                self.send(json.dumps({**head, "choices": [choice], "usage": usage}).encode(), "application/json")
        finally:
            with self.lock:
                self.state["running"] -= 1
                self.state["leaked"] += self.breakage == "leak"
                self.settled.notify_all()

    def add_generated(self, count):
        with self.lock:
            self.state["generated"] += count

    def wait_for_the_client_to_go(self, limit_s: float = 60.0) -> None:
        """Until the client closes the connection (it sends nothing after its request, so the socket
        turns readable only then); the limit only keeps a lost client from hanging the test."""
        select.select([self.connection], [], [], limit_s)

    def stream(self, prompt, head, tokens):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        leave_after = self.leaving.get(tuple(prompt))
        try:
            for k, token in enumerate(tokens):
                if k == leave_after:
                    self.wait_for_the_client_to_go()
                time.sleep(0.002)
                finish = "length" if k == len(tokens) - 1 else None
                choice = {
                    "index": 0,
                    "text": "",
                    "finish_reason": finish,
                    "token_ids": [token],
                    "logprobs": logprobs([token]),
                }
                self.wfile.write(f"data: {json.dumps({**head, 'choices': [choice]})}\n\n".encode())
                self.wfile.flush()
                self.add_generated(1)
            usage = {"prompt_tokens": 1, "completion_tokens": len(tokens), "total_tokens": 0}
            self.wfile.write(
                f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode()
            )
        except (BrokenPipeError, ConnectionResetError):
            if self.breakage == "ignore_disconnects":
                self.add_generated(len(tokens) - k)  # as if it had gone on to the end


def logprobs(tokens):
    """vLLM's completions logprobs with ``return_tokens_as_token_ids``: the chosen token 1.5 nats ahead."""
    top = [{f"token_id:{t}": -0.2, f"token_id:{(t + 1) % 2048}": -1.7} for t in tokens]
    return {
        "tokens": [f"token_id:{t}" for t in tokens],
        "token_logprobs": [-0.2] * len(tokens),
        "top_logprobs": top,
        "text_offset": [0] * len(tokens),
    }


class Listener(ThreadingHTTPServer):
    request_queue_size = 256  # the checks open dozens of connections at once
    daemon_threads = True


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """fault_check with its servers replaced by the stand-in (one for all of them) and, for checked
    servers, a float64 check summary as the worker check writes it (failing for corrupted outputs)."""
    from integration import fault_check as check

    StandIn.reset()
    httpd = Listener(("127.0.0.1", 0), StandIn)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log = tmp_path / "server.log"
    log.write_text("INFO 11-24 10:00:00 [api_server.py:1] Started server process\n")

    @contextlib.contextmanager
    def served(ctx, backend, label, model, checked=False, corrupt=None, **flags):
        name = f"{label}_{backend}" + ("_corrupt" if corrupt else "")
        record = ctx.details.setdefault("servers", {}).setdefault(name, {"command": flags})
        check_dir = None
        if checked:
            check_dir = tmp_path / name
            check_dir.mkdir(exist_ok=True)
            error = 5e-2 if corrupt else 2e-3
            rank = {"q_lens": {"1": 60}, "graph_calls": 40, "checked_calls": 48, "checked_graph_calls": 20,
                    "calls_by_layer": {"layer0": 30, "layer1": 30}, "checked_layers": ["layer0", "layer1"],
                    "checked_rows": 900,
                    "max_rel_error": {"1": error}, "tolerance": 2e-2, "lse_checked_calls": 48, "lse_ok": not corrupt,
                    "max_lse_error": 0.5 if corrupt else 1e-5, "check_problems": [], "routes": ["bundled"]}  # fmt: skip
            (check_dir / "rank0.json").write_text(json.dumps(rank))
        yield check.Served(name, model, httpd.server_address[1], types.SimpleNamespace(pid=os.getpid()), log, check_dir)
        record.update(stopped=True, exit=0)

    monkeypatch.setattr(check, "served", served)
    monkeypatch.setattr(check, "stream", stream_telling_the_stand_in(check.stream))
    monkeypatch.setattr(check, "together", together_telling_the_stand_in(check.together))
    monkeypatch.setattr(check.Context, "model", lambda self, max_positions=None: "/m")
    monkeypatch.setattr(check, "gpu_memory_used_mib", lambda: 30_000.0)
    monkeypatch.setattr(check, "SOAK_SAMPLE_S", 0.05)
    monkeypatch.setattr(check, "SOAK_WARMUP_S", 0.0)
    monkeypatch.setattr(check, "SOAK_REFERENCE_S", 1.0)
    # Idle is an event here, not a window: once every handler has finished, one scrape (the real
    # server's gauges lag its responses, so the check polls them for up to IDLE_TIMEOUT_S).
    monkeypatch.setattr(check, "wait_until_idle", lambda port, names, timeout_s: settled_scrape(check, port))
    monkeypatch.setattr(check, "ABORTS_SETTLE_S", 0.0)  # the aborted handlers are waited for the same way
    monkeypatch.setattr(faults, "SPEED_SLACK", 10.0)  # the stand-in is both backends: its speeds differ by noise
    yield check, tmp_path
    httpd.shutdown()


def settled_scrape(check, port: int) -> dict[str, float]:
    StandIn.wait_until_settled()
    return check.scrape(port)


def stream_telling_the_stand_in(stream):
    """The check's streaming client, telling the stand-in where each client will leave."""

    async def told(client, model, prompt, max_tokens, leave_after=None):
        StandIn.leaving[tuple(prompt)] = leave_after  # None: this time it stays to the end
        return await stream(client, model, prompt, max_tokens, leave_after)

    return told


def together_telling_the_stand_in(together):
    """The check's burst of completions, telling the stand-in how many to wait for."""

    async def told(server, prompts, max_tokens):
        StandIn.expect_together(len(prompts))
        return await together(server, prompts, max_tokens)

    return told


def run(check, tmp_path, part, selftest=True):
    ctx = check.Context(16, "fp8", "auto", tmp_path, tmp_path, 34, 2.0, selftest)
    result = check.run_part(ctx, part)
    return {row["check"]: row for row in result["rows"]}, result


@pytest.mark.slow  # each part against a stand-in server, with its waits
@pytest.mark.parametrize("part", ["preemption", "aborts", "prefix", "long", "soak"])
def test_each_part_passes_a_server_that_behaves_and_its_selftest_catches_every_breakage(stand_in, part):
    check, tmp_path = stand_in
    rows, result = run(check, tmp_path, part)
    assert rows and all(row["ok"] for row in rows.values()), [r for r in rows.values() if not r["ok"]]
    selftests = [name for name in rows if name.startswith("selftest: ")]
    assert len(selftests) >= 2 and all(rows[name]["note"].startswith(("caught", "check failed")) for name in selftests)
    json.dumps(result, default=str)  # the summary is written as JSON
    if part == "soak":  # ours over the whole soak, beside the window judged against the peer
        whole, judged = result["details"]["speed"]["ours_whole_run"], result["details"]["speed"]["ours"]
        assert whole["tokens"] >= judged["tokens"] > 0
        assert re.search(r"ours \d+-\d+ s: p50/p99", rows_named(rows, "speed"))  # as long as the run took


def rows_named(rows: dict, prefix: str) -> str:
    return next(row["note"] for name, row in rows.items() if name.startswith(prefix))


@pytest.mark.slow  # each part against a stand-in server, with its waits
@pytest.mark.parametrize(
    "breakage, part, failing",
    [
        ("cut", "preemption", ["every request complete"]),  # cut alone and in the burst alike: tokens agree
        ("cut", "long", ["every request complete"]),
        ("leak", "aborts", ["idle after the aborts: no block held", "idle after the follow-up: no block held"]),
        ("ignore_disconnects", "aborts", ["disconnects stop their requests"]),
    ],
)
def test_a_server_that_breaks_fails_the_part(stand_in, breakage, part, failing):
    check, tmp_path = stand_in
    StandIn.reset(breakage)
    rows, _ = run(check, tmp_path, part, selftest=False)
    assert [name for name, row in rows.items() if not row["ok"]] == failing


def test_a_checked_server_runs_in_its_log_folder_and_finds_the_worker_check(tmp_path):
    """start_server runs the command where its log is (``python -m`` puts that folder first on
    sys.path, not the checkout, whose mla_backend would shadow the installed one), with the worker
    check's settings and its entry point on the path."""
    from integration.engines.vllm_server import checked_server_env, start_server
    from integration.engines.vllm_worker_check import ENTRY_POINT, ENV

    probe = (
        "import importlib.metadata, json, os, sys\n"
        "plugins = [e.value for e in importlib.metadata.entry_points(group='vllm.general_plugins')]\n"
        f"setting = os.environ['{ENV}']\n"
        "print(json.dumps({'cwd': os.getcwd(), 'plugins': plugins, 'env': setting}))\n"
    )
    env = checked_server_env(tmp_path / "check", "fp8", corrupt=1.05, max_calls=160)
    log = tmp_path / "logs" / "server.log"
    server = start_server([sys.executable, "-c", probe], log, env)
    assert server.wait(60) == 0
    seen = json.loads(log.read_text())
    assert seen["cwd"] == str(log.parent) and ENTRY_POINT in seen["plugins"]
    assert json.loads(seen["env"]) == {
        "backend": "CUSTOM",
        "kv": "fp8",
        "dir": str(tmp_path / "check"),
        "corrupt": 1.05,
        "max_calls": 160,
        "sparse": False,
    }


def test_a_sparse_family_is_served_against_vllm_s_sparse_backends_with_the_sparse_check(tmp_path, monkeypatch):
    """--family: FLASHMLA_SPARSE the reference, FLASH_ATTN_MLA_SPARSE the peer, the zoo's seeded
    checkpoint, the worker check told to check the sparse impl; its servers' files named by the family.
    Parts needing more positions, and FP8 (no sparse peer), are refused at the command line."""
    from integration import fault_check as check

    ctx = check.Context(16, "auto", "auto", tmp_path, tmp_path / "models", 34, 60.0, False, "DeepSeek-V3.2")
    assert (ctx.reference, ctx.peer, ctx.name) == ("FLASHMLA_SPARSE", "FLASH_ATTN_MLA_SPARSE", "DeepSeek-V3.2")
    dense = check.Context(16, "fp8", "auto", tmp_path, tmp_path, 34, 60.0, False)
    assert (dense.reference, dense.peer, dense.name) == ("FLASHMLA", "TRITON_MLA", "h16")
    model = Path(ctx.model())
    assert json.loads((model / "config.json").read_text())["index_topk"] == 2048
    with pytest.raises(ValueError, match="published positions"):
        ctx.model(check.LONG_MODEL_LEN)
    started = {}

    def running(command, log, port, record, timeout, env):
        started.update(env=env, log=log)
        return contextlib.nullcontext()

    monkeypatch.setattr(check, "running", running)
    with check.served(ctx, "CUSTOM", "prefix", str(model), checked=True):
        pass
    from integration.engines.vllm_worker_check import ENV

    assert json.loads(started["env"][ENV])["sparse"] is True
    assert started["log"].name == "prefix_CUSTOM_DeepSeek-V3.2_auto_auto.log"
    for argv in (["--kv", "fp8", "--parts", "prefix"], ["--kv", "auto", "--parts", "long"]):
        argv = ["--family", "GLM-5", *argv]
        monkeypatch.setattr(sys, "argv", ["fault_check", *argv, "--out", str(tmp_path)])
        with pytest.raises(SystemExit):
            check.main()


def test_a_server_started_from_a_job_that_ignores_sigint_still_stops_on_it(tmp_path):
    """A background job (``cmd &``, nohup, the lent GPU's detached runs) starts with SIGINT ignored and its
    children inherit that; the server must get SIGINT back at its default, or stop's SIGINT does nothing."""
    from integration.engines.vllm_server import start_server, stop

    log = tmp_path / "logs" / "server.log"
    server = start_probe_as_background_job(start_server, log)
    assert "default_int_handler" in first_line(log)
    assert stop(server, timeout_s=10)


def test_a_part_stopped_by_a_signal_reports_the_rows_it_has(monkeypatch, tmp_path):
    from integration import fault_check as check

    def stopped(ctx):
        ctx.row("first check", (True, "fine"))
        raise SystemExit(143)

    monkeypatch.setitem(check.RUNNERS, "soak", stopped)
    result = check.run_part(check.Context(16, "fp8", "auto", tmp_path, tmp_path, 0, 1.0, False), "soak")
    assert result["interrupted"] and [r["ok"] for r in result["rows"]] == [True, False]
    assert result["rows"][1]["note"] == "stopped by SystemExit 143"
