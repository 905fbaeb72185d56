"""integration/dp_e2e.py on CPU: its servers' command lines through vLLM 0.26's own ``vllm serve``
parser; the MoE checkpoint as vLLM reads it (experts to split, the V1 model runner the worker check
wraps); the MoE ops it needs named as vLLM calls them; the per-rank and token judges failing on broken
runs; each part run whole on canned server results; the client's three kinds of traffic against a
stand-in server; and dev/make_moe_part.sh with dev/gpu_session.sh's stash and install, in shell."""

import asyncio
import base64
import hashlib
import json
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the integration package, from the checkout
from http_stand_in import QuietHandler  # noqa: E402
from test_e2e_rules import summary  # noqa: E402
from test_fault_judges import parsed, serve_parser  # noqa: E402, F401 (serve_parser: a fixture)

from integration import dp_e2e  # noqa: E402
from integration.engines import vllm_dp  # noqa: E402
from integration.judges.data_parallel import judge_every_dp_rank, judge_selftest_every_dp_rank  # noqa: E402
from integration.models.tiny_model import TINY_DEFAULTS  # noqa: E402
from integration.settings import SELFTEST_CORRUPTION  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"backend": "CUSTOM", "graphs": True, "spec_tokens": 0, "kv_cache_dtype": "fp8"}
LIB = "vllm/_moe_C_stable_libtorch.abi3.so"


# --- the servers and the checkpoint -----------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.parametrize("kv", ["fp8", "auto"])
@pytest.mark.parametrize("backend", ["CUSTOM", dp_e2e.REFERENCE, dp_e2e.PEER])
def test_every_server_is_data_parallel_with_experts_split_in_vllm_serve_s_terms(serve_parser, backend, kv):  # noqa: F811
    args = parsed(serve_parser, dp_e2e.server_command(dp_e2e.spec(backend, kv), "/m", 8000))
    assert args.data_parallel_size == dp_e2e.DP == 2 and args.enable_expert_parallel is True
    assert args.tensor_parallel_size == 1  # all heads on every rank
    assert args.attention_backend == backend and args.kv_cache_dtype == kv and args.block_size == 64
    assert args.additional_config == ({"mla_backend": {"backend": "xqa"}} if backend == "CUSTOM" else {})
    assert args.compilation_config.cudagraph_mode.name == "FULL_DECODE_ONLY"
    assert args.enable_prefix_caching is False and args.max_num_seqs == dp_e2e.MAX_NUM_SEQS
    assert args.host == "127.0.0.1" and args.skip_tokenizer_init


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return dp_e2e.moe_checkpoint(tmp_path_factory.mktemp("moe"), 16)


@pytest.mark.vllm
def test_the_checkpoint_routes_its_later_layers_over_experts_that_split_over_the_ranks(moe_model):
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, VllmConfig

    model = ModelConfig(model=moe_model, skip_tokenizer_init=True, dtype="bfloat16")
    hf = model.hf_config
    assert model.is_moe and model.architectures == ["DeepseekV3ForCausalLM"]
    assert model.get_num_experts() % dp_e2e.DP == 0 and model.get_num_experts() // dp_e2e.DP >= 2
    # vLLM's DeepseekV2DecoderLayer: a layer routes where index >= first_k_dense_replace (moe_layer_freq 1).
    assert 0 < hf.first_k_dense_replace < hf.num_hidden_layers == TINY_DEFAULTS["num_hidden_layers"]
    # The router vLLM builds with a correction bias (the checkpoint holds one) and sigmoid scores.
    assert (hf.topk_method, hf.scoring_func) == ("noaux_tc", "sigmoid")
    config = VllmConfig(
        model_config=model,
        device_config=DeviceConfig(device="cuda"),
        parallel_config=ParallelConfig(data_parallel_size=dp_e2e.DP, enable_expert_parallel=True),
    )
    assert config.needs_dp_coordinator  # the ranks step together (dummy batches on an idle rank)
    # The worker check wraps the V1 model runner: vLLM 0.26, the engine the check runs on the GPU
    # image, keeps models with experts there (later vLLMs move them to Model Runner V2).
    import vllm

    if vllm.__version__.startswith("0.26."):
        assert not config.use_v2_model_runner


def test_every_expert_of_every_routed_layer_is_saved_under_the_names_vllm_loads(moe_model):
    from safetensors import safe_open

    with safe_open(str(next(Path(moe_model).glob("*.safetensors"))), "pt") as weights:
        names = set(weights.keys())
    config = json.loads((Path(moe_model) / "config.json").read_text())
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp."
        experts = {n for n in names if n.startswith(prefix + "experts.")}
        if layer < config["first_k_dense_replace"]:
            assert not experts and prefix + "gate_proj.weight" in names
            continue
        wanted = {
            f"{prefix}experts.{e}.{proj}_proj.weight"
            for e in range(config["n_routed_experts"])
            for proj in ("gate", "up", "down")
        }
        assert experts == wanted
        assert {prefix + "gate.weight", prefix + "gate.e_score_correction_bias"} <= names


@pytest.mark.vllm
def test_the_moe_ops_named_are_what_vllm_0_26_calls_on_this_path():
    import inspect

    from vllm import _custom_ops
    from vllm.model_executor.layers.fused_moe import fused_moe
    from vllm.model_executor.layers.fused_moe.experts import triton_moe
    from vllm.model_executor.layers.fused_moe.router import grouped_topk_router

    for op in vllm_dp.MOE_OPS:
        assert f"torch.ops._moe_C.{op}(" in inspect.getsource(getattr(_custom_ops, op))
    assert "ops.grouped_topk(" in inspect.getsource(grouped_topk_router.fused_grouped_topk)
    assert "moe_align_block_size(" in inspect.getsource(fused_moe._prepare_expert_assignment)
    assert "ops.moe_sum(" in inspect.getsource(triton_moe.TritonExperts.moe_sum)


# --- the judges -----------------------------------------------------------------------------------------


def test_every_rank_is_judged_as_one_gpu_and_a_rank_that_checked_nothing_fails():
    assert judge_every_dp_rank({0: summary(), 1: summary()}, SPEC, 2)[0]
    ok, note = judge_every_dp_rank({0: summary()}, SPEC, 2)
    assert not ok and "rank 1: checked nothing" in note
    idle = summary(checked_calls=0, checked_graph_calls=0, lse_checked_calls=0, checked_layers=[], max_rel_error={})
    assert not judge_every_dp_rank({0: summary(), 1: idle}, SPEC, 2)[0]  # a summary, but no call checked
    assert not judge_every_dp_rank({0: summary(), 1: summary(max_rel_error={1: 5e-2})}, SPEC, 2)[0]
    assert not judge_every_dp_rank({0: summary(), 1: summary(checked_graph_calls=0)}, SPEC, 2)[0]
    assert not judge_every_dp_rank({0: summary(), 1: summary(), 2: summary()}, SPEC, 2)[0]


def test_the_selftest_passes_only_where_every_rank_caught_the_corruption():
    bad = summary(max_rel_error={1: 5e-2}, lse_ok=False, max_lse_error=0.5)
    assert judge_selftest_every_dp_rank({0: bad, 1: bad}, SPEC, 2)[0]
    assert not judge_selftest_every_dp_rank({0: bad, 1: summary()}, SPEC, 2)[0]  # rank 1 let it through
    assert not judge_selftest_every_dp_rank({0: bad}, SPEC, 2)[0]


def test_rank_summaries_are_read_per_rank(tmp_path):
    for rank in (1, 0):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(summary(checked_calls=rank + 5)))
    ranks = vllm_dp.rank_summaries(tmp_path)
    assert sorted(ranks) == [0, 1] and ranks[1]["checked_calls"] == 6
    assert vllm_dp.rank_summaries(tmp_path / "none") == {}


# --- the parts, on canned server results -------------------------------------------------------------


def canned(tokens_by_phase, ranks=None) -> dict:
    phases = {
        name: [{"tokens": list(t), "gaps": [1.0] * len(t)} for t in tokens] for name, tokens in tokens_by_phase.items()
    }
    result = {"phases": phases}
    if ranks is not None:
        result["ranks"], result["decode_check"] = ranks, {}
    return result


def reference_tokens() -> dict:
    return {
        name: [[(7 * i + k) % 2048 for k in range(dp_e2e.TOKENS)] for i in range(len(phase["prompts"]))]
        for name, phase in dp_e2e.phases().items()
    }


class CannedRouter:
    """Stands in for the float64 replay (tests/test_router_ties.py runs the real one): every failure
    is a router tie where ``ties`` says so, none otherwise."""

    def __init__(self, ties: bool):
        self.ties, self.asked = ties, []

    def explain(self, prompts, ours, ref, failures):
        self.asked.append(list(failures))
        return ([] if self.ties else list(failures)), [f"{f[:2]}: canned" for f in failures]


@pytest.fixture
def part(monkeypatch, tmp_path):
    """Runs the kernels part, then ``run_part(ctx)``, on canned results: ``servers`` maps a server's
    backend to its result (for ours, a callable of the ``corrupt`` setting may stand in); the second
    part's rows, and the backends whose servers started. No failure is a router tie unless
    ``router_ties``."""
    from integration.judges import report

    started = []

    def run(run_part, servers, selftest=False, kernels_missing=(), router_ties=False):
        monkeypatch.setattr(dp_e2e.Context, "router", CannedRouter(router_ties))

        def serve_and_drive(ctx, engine, label, checked, corrupt=None, only=None):
            if ctx.blocked:
                raise RuntimeError(ctx.blocked)
            started.append(engine.backend)
            result = servers[engine.backend]
            return result(corrupt) if callable(result) else result

        monkeypatch.setattr(dp_e2e, "serve_and_drive", serve_and_drive)
        monkeypatch.setattr(dp_e2e, "missing_moe_ops", lambda: list(kernels_missing))
        ctx = dp_e2e.Context(16, tmp_path, tmp_path, selftest)
        report.run_part(ctx, lambda: dp_e2e.part_kernels(ctx))
        return report.run_part(ctx, lambda: run_part(ctx))["rows"], started

    return run


def good_ranks():
    return {0: summary(), 1: summary()}


def test_a_good_run_passes_every_row_and_starts_no_peer(part, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ref = reference_tokens()
    servers = {"CUSTOM": canned(ref, good_ranks()), "FLASHMLA": canned(ref)}
    rows, started = part(lambda ctx: dp_e2e.part_kv(ctx, "fp8"), servers, selftest=True)
    assert all(row["ok"] for row in rows), rows
    assert started == ["CUSTOM", "FLASHMLA"]  # the tie rule held: no calibration run
    checks = [row["check"] for row in rows]
    assert {f"{n} ({p['mode']}) tokens vs FLASHMLA" for n, p in dp_e2e.phases().items()} <= set(checks)
    assert {"selftest: a poisoned token", "selftest: rank 1 checked nothing"} <= set(checks)


def test_tokens_that_break_the_tie_rule_fail_where_the_peer_keeps_it_and_the_peer_runs_once(part, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ref = reference_tokens()
    broken = {name: [[t[0], (t[1] + 1) % 2048, *t[2:]] for t in tokens] for name, tokens in ref.items()}
    servers = {"CUSTOM": canned(broken, good_ranks()), "FLASHMLA": canned(ref), "TRITON_MLA": canned(ref)}
    rows, started = part(lambda ctx: dp_e2e.part_kv(ctx, "fp8"), servers)
    token_rows = [row for row in rows if "tokens vs" in row["check"]]
    assert len(token_rows) == 3 and not any(row["ok"] for row in token_rows)
    assert all("TRITON_MLA keeps it" in row["note"] for row in token_rows)
    assert started == ["CUSTOM", "FLASHMLA", "TRITON_MLA"]  # one calibration server for every phase


def test_tokens_that_part_only_at_router_ties_pass_and_start_no_peer(part, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ref = reference_tokens()
    broken = {name: [[t[0], (t[1] + 1) % 2048, *t[2:]] for t in tokens] for name, tokens in ref.items()}
    servers = {"CUSTOM": canned(broken, good_ranks()), "FLASHMLA": canned(ref), "TRITON_MLA": canned(ref)}
    rows, started = part(lambda ctx: dp_e2e.part_kv(ctx, "fp8"), servers, router_ties=True)
    token_rows = [row for row in rows if "tokens vs" in row["check"]]
    assert len(token_rows) == 3 and all(row["ok"] for row in token_rows)
    assert all("router ties count" in row["note"] for row in token_rows)
    assert started == ["CUSTOM", "FLASHMLA"]


def test_a_rank_without_requests_fails_the_part(part, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ref = reference_tokens()
    servers = {"CUSTOM": canned(ref, {0: summary()}), "FLASHMLA": canned(ref)}
    rows, _ = part(lambda ctx: dp_e2e.part_kv(ctx, "auto"), servers)
    (row,) = [row for row in rows if row["check"] == "every rank's forward_mqa vs float64"]
    assert not row["ok"] and "rank 1: checked nothing" in row["note"]


@pytest.mark.parametrize("caught", [True, False])
def test_the_corrupted_run_s_row_passes_only_where_every_rank_s_check_failed(part, monkeypatch, caught):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    bad = summary(max_rel_error={1: 5e-2}, lse_ok=False, max_lse_error=0.5)

    def ours(corrupt):
        assert corrupt == SELFTEST_CORRUPTION
        return canned({"together": reference_tokens()["together"]}, {0: bad, 1: bad if caught else summary()})

    rows, _ = part(lambda ctx: dp_e2e.part_selftest(ctx, "fp8"), {"CUSTOM": ours})
    assert rows[-1]["ok"] is caught


def test_without_the_moe_kernels_no_server_starts_and_every_part_fails(part):
    rows, started = part(lambda ctx: dp_e2e.part_kv(ctx, "fp8"), {}, kernels_missing=["moe_sum"])
    assert started == [] and rows[0]["check"] == "ran to the end" and not rows[0]["ok"]
    assert "make_moe_part.sh" in rows[0]["note"]


def test_the_check_exits_1_on_a_failed_row_and_0_when_all_pass(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dp_e2e, "missing_moe_ops", lambda: [])
    monkeypatch.setattr(dp_e2e.signal, "signal", lambda *a: None)
    ref = reference_tokens()
    for ranks, status in ((good_ranks(), 0), ({1: summary()}, 1)):
        servers = {"CUSTOM": canned(ref, ranks), "FLASHMLA": canned(ref)}
        monkeypatch.setattr(dp_e2e, "serve_and_drive", lambda ctx, engine, *a, **k: servers[engine.backend])
        out = tmp_path / str(status)
        monkeypatch.setattr(sys, "argv", ["dp_e2e.py", "--kv", "fp8", "--out", str(out), "--model-dir", str(tmp_path)])
        assert dp_e2e.main() == status
        assert set(json.loads((out / "dp_h128.json").read_text())["parts"]) == {"kernels", "fp8"}


@pytest.mark.parametrize("ties", [True, False])
def test_rejudging_a_saved_run_turns_a_token_row_by_the_router_replay_alone(monkeypatch, tmp_path, ties):
    monkeypatch.setattr(dp_e2e.Context, "router", CannedRouter(ties))
    ref = reference_tokens()
    mine = {name: [list(t) for t in tokens] for name, tokens in ref.items()}
    mine["alone"][0][1] += 1  # decided (every gap 1.0): breaks the tie rule
    name, phase = "alone", dp_e2e.phases()["alone"]
    tokens = {n: {"ours": mine[n], "FLASHMLA": ref[n], "gaps": [[1.0] * len(t) for t in ref[n]]} for n in ref}
    rows = [{"check": dp_e2e.token_row(name, phase), "ok": False, "note": "broken"}]
    rows.append({"check": "selftest: a poisoned token", "ok": True, "note": "caught"})
    part = {"wall_s": 1, "rows": rows, "details": {"tokens": tokens}, "interrupted": False}
    (tmp_path / "dp_h16.json").write_text(json.dumps({"heads": 16, "dp": 2, "parts": {"auto": part}}))
    monkeypatch.setattr(sys, "argv", ["dp_e2e.py", "--heads", "16", "--rejudge", "--out", str(tmp_path)])
    assert dp_e2e.main() == 1  # without ties the token row fails; with canned ties the poisoned token passes
    saved = json.loads((tmp_path / "dp_h16.json").read_text())["parts"]["auto"]["rows"]
    assert saved[0]["ok"] is ties and "rejudged" in saved[0]["note"]
    assert saved[1]["ok"] is not ties  # the poisoned token, judged by the same replay


# --- the client against a stand-in server ----------------------------------------------------------------


class Completions(QuietHandler):
    """Answers /v1/completions as vLLM 0.26 does with return_token_ids and ``token_id:N`` top logprobs,
    after DELAY_S; records each request's arrival and the requests in flight."""

    DELAY_S = 0.15
    lock = threading.Lock()
    in_flight = 0
    most_in_flight = 0
    arrivals: list = []

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
            cls.arrivals.append(time.monotonic())
        time.sleep(cls.DELAY_S)
        with cls.lock:
            cls.in_flight -= 1
        assert request["temperature"] == 0.0 and request["return_token_ids"] and request["ignore_eos"]
        ids = [(sum(request["prompt"]) + k) % 2048 for k in range(request["max_tokens"])]
        top = [{f"token_id:{t}": -0.1, f"token_id:{t + 1}": -0.1 - (k + 1) / 10} for k, t in enumerate(ids)]
        choice = {"index": 0, "text": "", "finish_reason": "length", "token_ids": ids}
        choice["logprobs"] = {"tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": top}
        body = {"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
        self.send(json.dumps(body).encode(), "application/json")


@pytest.fixture
def stand_in():
    Completions.in_flight = Completions.most_in_flight = 0
    Completions.arrivals = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


@pytest.mark.parametrize(("mode", "most"), [("together", 4), ("alone", 1)])
def test_traffic_reads_tokens_and_gaps_and_sends_together_or_one_at_a_time(stand_in, mode, most):
    prompts = [[1, 2], [3], [4, 5, 6], [7]]
    results = asyncio.run(vllm_dp.traffic(stand_in, "m", {"p": {"prompts": prompts, "max_tokens": 3, "mode": mode}}))
    assert [r["tokens"] for r in results["p"]] == [[(sum(p) + k) % 2048 for k in range(3)] for p in prompts]
    assert results["p"][0]["gaps"] == pytest.approx([0.1, 0.2, 0.3])
    assert Completions.most_in_flight == most


def test_staggered_arrivals_are_spaced_by_the_gap(stand_in):
    # arrivals are scheduled at i * gap from the start, so one late wake-up shortens the next interval:
    # 0.2 s of slack for a loaded 2-core CI machine, still above the stand-in's 0.15 s answer
    phase = {"prompts": [[1], [2], [3]], "max_tokens": 2, "mode": "staggered", "gap_s": 0.5}
    asyncio.run(vllm_dp.traffic(stand_in, "m", {"s": phase}))
    first, second, third = sorted(Completions.arrivals)
    assert second - first >= 0.3 and third - second >= 0.3
    assert Completions.most_in_flight == 1  # each answered (0.15 s) before the next arrives


def test_the_phases_put_fewer_requests_than_ranks_in_flight_at_times_and_more_at_others():
    phases = dp_e2e.phases()
    assert phases["alone"]["mode"] == "alone" and len(phases["together"]["prompts"]) >= 4 * dp_e2e.DP
    assert phases["staggered"]["mode"] == "staggered" and phases["staggered"]["gap_s"] > 0
    longest = max(len(p) for phase in phases.values() for p in phase["prompts"])
    assert longest + dp_e2e.TOKENS <= 2048  # serve_command's max_model_len


# --- the MoE part in shell: built, stashed on the GPU machine, installed into the bundle -------------------


def fake_wheel(path: Path, payload: bytes, record_payload: bytes | None = None) -> Path:
    digest = hashlib.sha256(record_payload if record_payload is not None else payload).digest()
    sha = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(LIB, payload)
        wheel.writestr("vllm-0.26.0.dist-info/RECORD", f"{LIB},sha256={sha},{len(payload)}\n")
    return path


def make_part(tmp_path: Path, wheel: Path) -> subprocess.CompletedProcess:
    (tmp_path / "noprune.py").write_text("import sys; assert sys.argv[2] == '9'\n")  # the fake is no ELF
    env = {"PATH": "/usr/bin:/bin", "WHEEL": str(wheel), "PRUNE": str(tmp_path / "noprune.py"), "STRIP_SO": "0"}
    env["PY"] = sys.executable
    script = ROOT / "dev" / "make_moe_part.sh"
    return subprocess.run(["bash", str(script), str(tmp_path / ".gpu-moe")], env=env, capture_output=True, text=True)


def install_moe(repo: Path, site: Path, stash: Path) -> subprocess.CompletedProcess:
    """gpu_session.sh's install_moe, as written there, run in ``repo`` against ``site``."""
    text = (ROOT / "dev" / "gpu_session.sh").read_text()
    function = text[text.index("install_moe() {") : text.index("\n}\n", text.index("install_moe() {")) + 3]
    part = next(line for line in text.splitlines() if line.startswith("MOE_PART="))
    script = f"{part}\nMOE_STASH={stash}\n{function}\ninstall_moe {site}\n"
    return subprocess.run(["bash", "-c", script], cwd=repo, capture_output=True, text=True)


def test_the_part_is_built_stashed_and_installed_once_into_the_bundle(tmp_path):
    built = make_part(tmp_path, fake_wheel(tmp_path / "vllm.whl", b"kernels"))
    assert built.returncode == 0, built.stderr
    part = tmp_path / ".gpu-moe" / "vllm026_moe_C_sm90only.tar.xz"
    with tarfile.open(part) as tar:
        assert tar.getnames() == [f"site/{LIB}"]  # unpacks into the bundle's site/, as its parts do
    stash = tmp_path / "stash"
    env = {"PATH": "/usr/bin:/bin", "PART": "stash", "MOE_STASH": str(stash)}
    stashed = subprocess.run(["bash", str(ROOT / "dev/gpu_session.sh")], cwd=tmp_path, env=env, capture_output=True)
    assert stashed.returncode == 0, stashed.stderr
    assert (stash / part.name).read_bytes() == part.read_bytes()
    # The next call: .gpu-moe is not carried there, the stash is used.
    repo, site = tmp_path / "next_call", tmp_path / "site"
    repo.mkdir()
    (site / "vllm").mkdir(parents=True)
    assert install_moe(repo, site, stash).returncode == 0
    assert (site / LIB).read_bytes() == b"kernels"
    (site / LIB).write_bytes(b"installed before")  # installed once: a later call leaves it
    assert install_moe(repo, site, stash).returncode == 0 and (site / LIB).read_bytes() == b"installed before"


def test_nothing_is_stashed_or_built_from_a_part_that_does_not_match_its_sums(tmp_path):
    built = make_part(tmp_path, fake_wheel(tmp_path / "vllm.whl", b"kernels", record_payload=b"other"))
    assert built.returncode != 0 and "RECORD" in built.stderr
    assert not (tmp_path / ".gpu-moe" / "vllm026_moe_C_sm90only.tar.xz").exists()
    assert make_part(tmp_path, fake_wheel(tmp_path / "vllm.whl", b"kernels")).returncode == 0
    part = tmp_path / ".gpu-moe" / "vllm026_moe_C_sm90only.tar.xz"
    part.write_bytes(part.read_bytes()[:-1] + b"\0")  # damaged on the way
    stash = tmp_path / "stash"
    env = {"PATH": "/usr/bin:/bin", "PART": "stash", "MOE_STASH": str(stash)}
    stashed = subprocess.run(["bash", str(ROOT / "dev/gpu_session.sh")], cwd=tmp_path, env=env, capture_output=True)
    assert stashed.returncode != 0 and not stash.exists()
