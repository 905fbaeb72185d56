"""The serve part of integration/sglang_sparse_e2e.py (DeepSeek-V3.2 and GLM-5 under
``sglang.launch_server`` with our sparse decode) on CPU, its servers stood in: servers that behave pass
every row, and each breakage a real server could show (an answer off the tie rule, a short answer, a
request /metrics missed, decode outside the graphs, a traceback, no SIGINT exit, no start, a check the
corruption did not fail) fails the row that sees it. Its metrics judge (judges/sglang_served.py) and,
under SGLang (-m sglang), the server's command line and the samples those judges read, as SGLang
parses and writes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # the integration package, from the checkout
from sglang_release import METRICS_PROBE_START  # noqa: E402
from test_sglang_sparse_e2e import dsa_step, fake_engines, recorded  # noqa: E402

from integration import sglang_sparse_e2e as e2e  # noqa: E402
from integration.engines import sglang_server, sglang_sparse_check  # noqa: E402
from integration.engines.sglang_decode_check import process_summary  # noqa: E402
from integration.judges import sglang_served  # noqa: E402

TOKENS = [7, 8, 9, 10]  # what fake_engines' every engine generates
LABELS = {"engine_type": "unified", "model_name": "/m"}


def metrics(requests: float, tokens: float, graph_decodes: float, eager_decodes: float) -> dict[str, float]:
    """A scrape as engines/sglang_server.parse_metrics keys SGLang's samples (streamed and not apart)."""
    return {
        f"{sglang_served.REQUESTS}{{is_streaming=false}}": requests / 2,
        f"{sglang_served.REQUESTS}{{is_streaming=true}}": requests / 2,
        f"{sglang_served.GENERATED}{{is_streaming=false}}": tokens,
        sglang_served.GRAPH_DECODES: graph_decodes,
        sglang_served.EAGER_DECODES: eager_decodes,
    }


def fake_servers(
    monkeypatch, breakage: str | None = None, peer_off: dict | None = None, peer_off_modes=(True, False)
) -> list[dict]:
    """Servers that answer every request with fake_engines' tokens and count what they answered; a
    checked one writes the recorder's summary of a real call (its output times the corruption).
    ``breakage`` names what goes wrong on our server with graphs (or, for the selftest, the corrupted
    server's check; "eager stream off the rule": our eager checked server's); SGLang's served decode
    answers the streams ``peer_off`` names (index: tokens) with those tokens where it is served with
    graphs or eager as ``peer_off_modes`` lists."""
    started: list[dict] = []
    monkeypatch.setattr(e2e, "NEW_TOKENS", len(TOKENS))

    def serve(model, prompts, decode, kv, log, *, graphs, copies, env):
        started.append({"decode": decode, "kv": kv, "graphs": graphs, "copies": copies, "env": env})
        server = {"command": ["--model-path", model], "start_s": 41.0, "stopped": True, "exit": 0}
        if breakage == "no start" and graphs:
            return {"error": "RuntimeError: serve_auto_graphs did not start (exit 1)", "log": "", "server": server}
        scale = 1.0
        if sglang_sparse_check.ENV in env:
            settings = json.loads(env[sglang_sparse_check.ENV])
            cancelled = breakage == "corruption missed" and settings["corruption"] != 1.0
            scale = 1.0 if cancelled else settings["corruption"]
            summary = recorded(dsa_step(kv != "auto"), torch.bfloat16, out_scale=scale)
            summary["indexer_scorer"] = "mla_backend"
            process_summary(Path(settings["summary"]), 4100).write_text(json.dumps(summary))
        answer = {"tokens": TOKENS, "gaps": [1.0] * 4, "finish": {"type": "length"}, "cached": 0, "retractions": 0}
        batch = [dict(answer) for _ in prompts]
        streams = [dict(answer, cached=len(p) - 1) for p in prompts * copies]
        broken = graphs and decode == e2e.OURS and breakage
        eager_checked = not graphs and decode == e2e.OURS and scale == 1.0
        if broken == "stream off the rule" or (eager_checked and breakage == "eager stream off the rule"):
            streams[5] = dict(answer, tokens=[7, 5, 5, 5])
        if decode != e2e.OURS and graphs in peer_off_modes:
            off = peer_off or {}
            streams = [dict(answer, tokens=off[i]) if i in off else r for i, r in enumerate(streams)]
        if broken == "short answer":
            batch[2] = dict(answer, tokens=TOKENS[:3])
        answered = len(batch) + len(streams)
        tokens = sum(len(r["tokens"]) for r in batch + streams)
        decodes = (0, 40) if not graphs or broken == "no graphs" else (40, 0)
        after = metrics(answered - (broken == "uncounted"), tokens, *decodes)
        log = "[TP0] Scheduler hit an exception: Traceback (most recent call last):" if broken == "traceback" else "ok"
        if broken == "no SIGINT exit":
            server = {**server, "stopped": False, "exit": -9}
        scrapes = [metrics(0, 0, 0, 0), after]
        return {"batch": batch, "streams": streams, "metrics": scrapes, "log": log, "server": server}

    monkeypatch.setattr(e2e, "serve_model", serve)
    return started


def serve_rows(tmp_path, kv: str = "auto") -> tuple[int, dict[str, dict]]:
    argv = ["--families", "GLM-5", "--kv", kv, "--parts", "serve,selftest", "--out", str(tmp_path)]
    status = e2e.main(argv)
    rows = json.loads((tmp_path / "sglang_sparse.json").read_text())
    return status, {r["part"]: r for r in rows if r["part"].startswith("serve")}


SERVED_ROWS = ["batch tokens", "32 streams tokens", "/metrics", "decode mode", "server"]


@pytest.mark.parametrize("kv", sorted(e2e.REFERENCES))
def test_servers_that_behave_pass_every_row_and_each_starts_as_a_user_starts_it(monkeypatch, tmp_path, kv):
    fake_engines(monkeypatch)
    started = fake_servers(monkeypatch)
    status, rows = serve_rows(tmp_path, kv)
    graphs = [f"serve graphs: {what}" for what in [*SERVED_ROWS, "selftest, a request uncounted"]]
    checked = [f"serve eager, checked: {what}" for what in [*SERVED_ROWS, "float64"]]
    expected = graphs + checked + ["serve eager x1.05: check", f"serve reference {e2e.REFERENCES[kv]} offline"]
    assert list(rows) == expected and all(r["status"] == "PASS" for r in list(rows.values())[:-1]), rows
    assert status == 0  # the check and selftest parts' own rows pass too
    assert rows["serve graphs: 32 streams tokens"]["note"].startswith("32/32 complete; 32/32 identical")
    assert "/metrics counted 36 of 36 requests, 144 of 144 tokens" in rows["serve graphs: /metrics"]["note"]
    served = started[-3:]  # the check and selftest parts' engines are fake_engines'
    copies = e2e.SERVE_COPIES
    assert [(s["graphs"], s["copies"]) for s in served] == [(True, copies), (False, copies), (False, 0)]
    assert all(s["decode"] == e2e.OURS and s["kv"] == kv for s in served)
    assert all(s["env"]["SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"] == "0" for s in served)
    assert sglang_sparse_check.ENV not in served[0]["env"]
    corruptions = [json.loads(s["env"][sglang_sparse_check.ENV])["corruption"] for s in served[1:]]
    assert corruptions == [1.0, e2e.SELFTEST_CORRUPTION]


@pytest.mark.parametrize(
    ("breakage", "failing"),
    [
        ("stream off the rule", "serve graphs: 32 streams tokens"),
        ("short answer", "serve graphs: batch tokens"),
        ("uncounted", "serve graphs: /metrics"),
        ("no graphs", "serve graphs: decode mode"),
        ("traceback", "serve graphs: server"),
        ("no SIGINT exit", "serve graphs: server"),
        ("no start", "serve graphs"),
        ("corruption missed", "serve eager x1.05: check"),
    ],
)
def test_each_breakage_fails_the_row_that_sees_it_and_the_run(monkeypatch, tmp_path, breakage, failing):
    fake_engines(monkeypatch)
    fake_servers(monkeypatch, breakage)
    status, rows = serve_rows(tmp_path)
    assert status == 1
    assert [part for part, r in rows.items() if r["status"] == "FAIL"] == [failing]


PROMPT_1_AT_STEP_1 = {9: [7, 5, 0, 0]}  # stream 9 is a copy of prompt 1 (streams: the prompts, 8 times over)


@pytest.mark.parametrize(
    ("peer_off", "earlier", "ok"),
    [
        (PROMPT_1_AT_STEP_1, "{1: (4, 1)}", True),  # the reference's backend itself parts there on a copy
        ({9: [7, 8, 5, 5]}, "{1: (4, 2)}", False),  # it parts on prompt 1 a step later than ours
        ({3: [7, 5, 0, 0]}, "{3: (4, 1)}", False),  # it parts on another prompt
        ({}, "{}", False),  # it keeps the rule (as the breakage test above)
    ],
)
def test_served_tokens_off_the_rule_pass_only_where_sglang_s_served_decode_parts_on_that_prompt_as_early(
    monkeypatch, tmp_path, peer_off, earlier, ok
):
    """Ours parting from the offline reference at step 1 on one copy of prompt 1: SGLang's
    flashmla_sparse served with the same traffic is the reference run again, each of its answers one
    more run of its prompt, and a step where one parts is a tie."""
    fake_engines(monkeypatch)
    started = fake_servers(monkeypatch, "stream off the rule", peer_off=peer_off)
    status, rows = serve_rows(tmp_path)
    assert status == (0 if ok else 1), rows
    note = rows["serve graphs: 32 streams tokens"]["note"]
    served = "SGLang's flashmla_sparse served graphs (36 answers)"
    assert f"{served} parts before the reference's first tie at (prompt: tie, step) {earlier}" in note
    assert ok or "ours still breaks it at [(5, 1, " in note
    peers = [s for s in started if s["decode"] == "flashmla_sparse"]
    assert len(peers) == 1 and peers[0]["graphs"] and peers[0]["copies"] == e2e.SERVE_COPIES
    kept = json.loads((tmp_path / "sglang_sparse.json").read_text())  # the verdicts' inputs, for a look afterwards
    offline, served = kept[-2], kept[-1]
    assert offline["part"] == "serve reference flashmla_sparse offline" and offline["tokens"] == [TOKENS] * 4
    assert len(offline["gaps"]) == len(offline["alone_tokens"]) == 4
    assert served["part"] == "serve reference flashmla_sparse graphs" and served["status"] == "ref"
    assert served["tokens"]["streams"][9] == peer_off.get(9, TOKENS) and len(served["tokens"]["batch"]) == 4


@pytest.mark.parametrize(("peer_off_modes", "ok"), [((False,), True), ((True,), False)])
def test_an_eager_server_s_break_is_weighed_by_sglang_s_decode_served_eager_not_with_graphs(
    monkeypatch, tmp_path, peer_off_modes, ok
):
    """Eager and graphed batches round their GEMMs differently, so where our eager server breaks the
    rule, SGLang's flashmla_sparse served eager is the reference run again, not its graphed server."""
    fake_engines(monkeypatch)
    started = fake_servers(monkeypatch, "eager stream off the rule", PROMPT_1_AT_STEP_1, peer_off_modes)
    status, rows = serve_rows(tmp_path)
    assert status == (0 if ok else 1), rows
    note = rows["serve eager, checked: 32 streams tokens"]["note"]
    assert "SGLang's flashmla_sparse served eager (36 answers) parts" in note
    assert [p["graphs"] for p in started if p["decode"] == "flashmla_sparse"] == [False]


def test_serve_modes_start_only_the_servers_asked_for_and_unknown_modes_are_refused(monkeypatch, tmp_path):
    fake_engines(monkeypatch)
    started = fake_servers(monkeypatch)
    argv = ["--families", "GLM-5", "--kv", "auto", "--parts", "serve", "--out", str(tmp_path)]
    assert e2e.main([*argv, "--serve-modes", "eager"]) == 0
    assert [s["graphs"] for s in started] == [False]
    rows = json.loads((tmp_path / "sglang_sparse.json").read_text())
    served = {r["part"].split(":")[0] for r in rows if r["part"].startswith("serve")}
    assert served == {"serve eager, checked", "serve reference flashmla_sparse offline"}
    with pytest.raises(SystemExit):
        e2e.parse([*argv, "--serve-modes", "graphs,offline"])


def test_the_count_sums_sglang_s_labels_and_the_decode_mode_follows_the_start():
    before, after = metrics(4, 10, 3, 1), metrics(40, 154, 60, 1)
    assert sglang_served.counted(before, after, sglang_served.REQUESTS) == 36
    assert sglang_served.judge_counted(before, after, 36, 144) == (
        True,
        "/metrics counted 36 of 36 requests, 144 of 144 tokens",
    )
    assert not sglang_served.judge_counted(before, after, 36, 145)[0]
    assert not sglang_served.judge_counted(before, sglang_served.one_request_uncounted(after), 36, 144)[0]
    assert sglang_served.judge_decode_mode(before, after, graphs=True)[0]
    assert not sglang_served.judge_decode_mode(before, after, graphs=False)[0]  # an eager server replayed graphs
    eager = metrics(40, 154, 3, 30)
    assert sglang_served.judge_decode_mode(before, eager, graphs=False)[0]
    assert not sglang_served.judge_decode_mode(before, eager, graphs=True)[0]


def test_metrics_are_read_once_the_counters_stop_moving_and_gauges_do_not_hold_it_up():
    """The serve part reads /metrics only after the tokenizer manager has counted every answered request:
    a scrape whose counters still moved is not taken; a gauge that changes does not delay the read."""
    from integration.engines import prometheus

    counts = iter([1, 3, 4, 4, 4])  # requests counted as the scrapes come
    scrapes = []

    def scrape():
        scrapes.append({f"{sglang_served.REQUESTS}{{is_streaming=true}}": next(counts), "sglang:gauge": len(scrapes)})
        return scrapes[-1]

    got = prometheus.wait_until_settled(scrape, timeout_s=5, interval_s=0.001)
    assert got is scrapes[3] and len(scrapes) == 4
    moving = iter(range(10**6))
    last = prometheus.wait_until_settled(lambda: {"x_total": next(moving)}, timeout_s=0.05, interval_s=0.001)
    assert last["x_total"] > 1  # never settled: the last scrape when the time ran out


def test_the_sparse_server_command_names_the_dsa_backend_and_leaves_prefill_to_it():
    command = sglang_server.launch_command("/m", 30000, "mla_backend", "fp8_e4m3", graphs=True, sparse=True)
    value = {flag: command[command.index(flag) + 1] for flag in command if flag.startswith("--")}
    assert value["--attention-backend"] == "dsa" and value["--dsa-decode-backend"] == "mla_backend"
    assert value["--page-size"] == "64" and value["--kv-cache-dtype"] == "fp8_e4m3"
    assert "--prefill-attention-backend" not in command and "--decode-attention-backend" not in command
    assert "--disable-radix-cache" not in command


# -- under SGLang ---------------------------------------------------------------------------------------------


@pytest.mark.sglang
@pytest.mark.parametrize("graphs", [True, False])
def test_sglang_parses_the_sparse_server_command_with_our_plugin(graphs):
    import argparse

    from sglang.srt.server_args import ServerArgs
    from test_sglang_fault_check import parsed

    from mla_backend.sglang import register

    register()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    command = sglang_server.launch_command("/m", 30000, "mla_backend", "auto", graphs=graphs, sparse=True)
    args = parsed(parser, command)
    assert (args.attention_backend, args.dsa_decode_backend, args.page_size) == ("dsa", "mla_backend", 64)
    assert args.prefill_attention_backend is None and args.decode_attention_backend is None
    assert args.enable_metrics and not args.disable_radix_cache
    assert (args.cuda_graph_backend_decode == "disabled") == (not graphs)


SERVED_PROBE = (
    METRICS_PROBE_START
    + """
from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector, TokenizerMetricsCollector
scheduler = SchedulerMetricsCollector(labels=labels, server_args=args)
tokenizer = TokenizerMetricsCollector(server_args=args, labels={"model_name": "/m", "engine_type": "unified"})
for graph in (True, True, True, False):
    scheduler.increment_decode_cuda_graph_pass(graph)
for streaming, new in ((False, 32), (True, 32), (True, 31)):
    tokenizer.observe_one_finished_request({"model_name": "/m", "engine_type": "unified"}, 2300, new, 2299, 0.5,
                                           False, is_streaming=streaming)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
sys.stdout.write(generate_latest(registry).decode())
"""
)


@pytest.mark.sglang
def test_the_samples_the_serve_judges_read_are_those_sglang_writes():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", SERVED_PROBE], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    after = sglang_server.parse_metrics(done.stdout)
    assert sglang_served.judge_counted({}, after, 3, 95)[0]
    assert sglang_served.counted({}, after, sglang_served.GRAPH_DECODES) == 3
    assert sglang_served.counted({}, after, sglang_served.EAGER_DECODES) == 1
