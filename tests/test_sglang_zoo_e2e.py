"""integration/sglang_e2e.py over the model zoo. Plain tests: the families and layouts it runs or starts
to be refused, its rows and JSON summary with the engines stood in, how start_refused reports an engine
(integration/engines/sglang_engine.py) and the verdict on it (judges/sglang_refusal.py). Under SGLang
0.5.17 (-m sglang): each checkpoint it writes (models/sglang_checkpoint.py) is the family's MLA model to
SGLang's ModelConfig and resolves to the family's model class, SGLang builds that class from it on CPU
with every weight loaded, and the refused families stop our factory with the message the run looks for.
CI runs those under SGLang 0.5.23 too (sglang_release.py says what differs).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sglang_fakes import run_engine_script
from sglang_release import PUBLISH_AS_SCHEDULER, server_args_fields, server_args_like

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the integration package, from the checkout
from integration import sglang_e2e  # noqa: E402
from integration.judges.sglang_refusal import judge_refusal  # noqa: E402
from integration.models import families  # noqa: E402
from integration.models.families import FAMILIES, Family  # noqa: E402
from integration.models.sglang_checkpoint import SGLANG_MODULES, refusal, refusal_env, save_sglang_checkpoint  # noqa: E402

BUNDLED = ["DeepSeek-V3 / R1", "DeepSeek-V2-Lite", "Moonlight", "Kimi-K2 / K2.5 (text)", "GLM-4.7-Flash"]
BUNDLED += ["LongCat-Flash", "Kimi-Linear", "Mistral Large 3", "Kimi-VL", "Kimi-K2.5 / K2.6"]
REFUSED = ["MiniCPM3"]  # the sparse families are sglang_sparse_e2e.py's


def planned(*argv: str) -> tuple[list[str], list[str]]:
    runs, refused = sglang_e2e.plan(sglang_e2e.parse(list(argv)))
    return [f"{f.name}@{f.heads[layout]}" for f, layout in runs], [f.name for f in refused]


def test_heads_alone_runs_the_tiny_deepseek_as_before():
    args = sglang_e2e.parse(["--heads", "128", "--kv", "auto"])
    assert (args.heads, args.families, planned("--heads", "128")) == (128, None, ([], []))
    assert sglang_e2e.parse([]).heads is None  # main() takes 16


def test_heads_with_families_is_an_error(capsys):
    with pytest.raises(SystemExit):
        sglang_e2e.parse(["--heads", "16", "--families", "GLM-4.7-Flash"])
    assert "Name@heads" in capsys.readouterr().err


def test_all_runs_every_family_sglang_serves_on_our_kernels_and_refuses_none():
    runs, refused = planned("--families", "all")
    assert [name.rpartition("@")[0] for name in runs] == BUNDLED and refused == []
    assert runs[0] == "DeepSeek-V3 / R1@16" and runs[3] == "Kimi-K2 / K2.5 (text)@8"  # first layouts
    every, _ = planned("--families", "all", "--layouts", "all")
    assert len(every) == sum(len(f.heads) for f in FAMILIES if f.name in BUNDLED)
    assert {"DeepSeek-V3 / R1@128", "Kimi-K2 / K2.5 (text)@64", "LongCat-Flash@64"} <= set(every)


def test_named_layouts_run_and_named_refused_families_are_started():
    runs, refused = planned("--families", "Kimi-K2@64,MiniCPM3,glm-4.7")
    assert runs == ["Kimi-K2 / K2.5 (text)@64", "GLM-4.7-Flash@20"] and refused == ["MiniCPM3"]
    assert planned("--refusals") == ([], REFUSED)
    assert planned("--families", "Moonlight", "--refusals") == (["Moonlight@16"], REFUSED)


def test_sparse_families_are_served_and_handed_to_the_sparse_run():
    """SGLang serves DeepSeek-V3.2 and GLM-5 through its dsa backend with our sparse decode: naming one
    here is an error that names sglang_sparse_e2e.py, and --refusals starts none of them."""
    for names in ("DeepSeek-V3.2", "GLM-4.7-Flash,GLM-5@64"):
        with pytest.raises(SystemExit, match="sglang_sparse_e2e.py"):
            planned("--families", names)
    assert not {f.name for f in FAMILIES if f.expect == "sparse"} & set(planned("--refusals")[1])


def test_unknown_families_and_ones_sglang_does_not_run_stop_the_run(monkeypatch):
    with pytest.raises(SystemExit, match="unknown family"):
        planned("--families", "Nope")
    with pytest.raises(SystemExit, match="no layout with 7 heads"):
        planned("--families", "DeepSeek-V3@7")
    other = Family("Other-MLA", "DeepSeek-V3", "OtherMLAForCausalLM", "other", {"TP1": 16}, "bundled")
    monkeypatch.setattr(families, "FAMILIES", (*FAMILIES, other))
    with pytest.raises(SystemExit, match=r"does not run \['Other-MLA'\]"):
        planned("--families", "Other-MLA")


def fake_engines(monkeypatch, tmp_path, check_error=1e-3, checked_ranks=None, verified=True):
    """The runner's engines and checkpoints stood in: every engine returns the same greedy tokens, the
    float64 check its summary (``check_error``, x the corruption) from each of ``checked_ranks``
    scheduler processes (default: one per data-parallel rank), with verification calls where the
    engine drafts and ``verified``; a refused engine stops as SGLang does."""
    from integration.engines import sglang_decode_check

    def run_isolated(model, prompts, decode, kv, graphs, log, greedy_only=False, env=None, engine_args=None):
        if env and sglang_decode_check.ENV in env:
            settings = json.loads(env[sglang_decode_check.ENV])
            error = check_error * (1 if settings["corruption"] == 1.0 else 50)
            ranks = checked_ranks or (engine_args or {}).get("dp_size", 1)
            drafts = (engine_args or {}).get("speculative_num_draft_tokens") if verified else None
            q_lens = {"1": 2, **({str(drafts): 6} if drafts else {})}
            for pid in range(4000, 4000 + ranks):
                summary = sglang_decode_check.process_summary(Path(settings["summary"]), pid)
                summary.write_text(json.dumps({"calls": 8, "rows": 640, "max_rel_err": error, "q_lens": q_lens}))
        runs.append((model, decode, kv, graphs, engine_args))
        return {"tokens": [[7, 8, 9]] * len(prompts), "gaps": [[1.0] * 3] * len(prompts), "tokens_per_s": 1e3}

    def start_refused(model, log, env=None):
        log.write_text(SCHEDULER_TRACEBACK)
        return STOPPED

    runs: list = []
    monkeypatch.setattr(sglang_e2e, "run_isolated", run_isolated)
    monkeypatch.setattr(sglang_e2e, "start_refused", start_refused)
    monkeypatch.setattr(sglang_e2e, "save_sglang_tiny_deepseek", lambda path, heads, mtp_layers=0: path)
    monkeypatch.setattr(sglang_e2e, "save_sglang_checkpoint", lambda family, path, layout: path)
    monkeypatch.setattr(sglang_e2e, "save_sglang_config", lambda family, path, layout: path)
    monkeypatch.setattr(sglang_e2e, "refusal", lambda family: SPARSE)
    return runs


def run_main(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["sglang_e2e.py", *argv])
    return sglang_e2e.main()


def test_the_runner_gives_one_row_per_model_layout_kv_and_part_and_keeps_the_json(monkeypatch, tmp_path, capsys):
    runs = fake_engines(monkeypatch, tmp_path)
    argv = ["--families", "GLM-4.7-Flash,Kimi-K2@64,MiniCPM3", "--references", "triton", "--out", str(tmp_path)]
    assert run_main(monkeypatch, *argv, "--page-sizes", "64") == 0
    rows = json.loads((tmp_path / "sglang_zoo.json").read_text())
    ours = [(r["model"], r["kv"], r["part"], r["status"]) for r in rows if r["status"] != "ref"]
    parts = ["check", "selftest x1.05", "tokens graphs", "tokens eager"]
    models = ["GLM-4.7-Flash TP1 (20 heads), page 64", "Kimi-K2 / K2.5 (text) TP1 (64 heads), page 64"]
    want = [(m, kv, p, "PASS") for m in models for kv in ("fp8_e4m3", "auto") for p in parts]
    assert ours == [("MiniCPM3 TP1 (40 heads)", "auto", "refused", "PASS"), *want]
    references = {"reference triton", "reference triton, fp8 query", "reference triton, fp8 query, eager"}
    assert {r["part"] for r in rows if r["status"] == "ref"} == references
    assert all(model.endswith(("GLM-4.7-Flash_h20", "Kimi-K2-Instruct_h64")) for model, *_ in runs)
    printed = capsys.readouterr().out  # each row as it comes, then the table
    assert f"{len(rows)} rows" in printed
    assert printed.count(models[1]) == 2 * len([r for r in rows if r["model"] == models[1]])


def test_the_tiny_path_keeps_its_summary_and_a_failing_part_fails_the_run(monkeypatch, tmp_path):
    fake_engines(monkeypatch, tmp_path, check_error=0.5)  # beyond every tolerance: the check fails
    argv = ["--heads", "32", "--kv", "auto", "--parts", "check", "--page-sizes", "64", "--out", str(tmp_path)]
    assert run_main(monkeypatch, *argv) == 1
    (row,) = json.loads((tmp_path / "sglang_h32.json").read_text())
    assert (row["model"], row["part"], row["status"]) == ("tiny DeepSeek-V3 (32 heads), page 64", "check", "FAIL")


def test_dp_attention_runs_every_engine_on_the_layout_and_the_check_on_every_rank(monkeypatch, tmp_path):
    runs = fake_engines(monkeypatch, tmp_path)
    argv = ["--heads", "128", "--kv", "fp8_e4m3", "--dp-attention", "2", "--references", "triton"]
    assert run_main(monkeypatch, *argv, "--page-sizes", "64", "--out", str(tmp_path)) == 0
    layout = {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True, "page_size": 64}
    assert len(runs) == 7 and all(engine_args == layout for *_, engine_args in runs)  # ours x4, triton x3
    rows = {r["part"]: r for r in json.loads((tmp_path / "sglang_h128.json").read_text()) if r["status"] != "ref"}
    assert all(r["status"] == "PASS" and r["model"].endswith("DP attention 2, page 64") for r in rows.values())
    assert "2 of 2 ranks checked" in rows["check"]["note"]


def test_dp_attention_fails_where_one_rank_checked_nothing(monkeypatch, tmp_path):
    fake_engines(monkeypatch, tmp_path, checked_ranks=1)  # the other rank ran no decode call
    argv = ["--heads", "128", "--kv", "fp8_e4m3", "--dp-attention", "2", "--parts", "check", "--out", str(tmp_path)]
    assert run_main(monkeypatch, *argv, "--page-sizes", "64") == 1
    (row,) = json.loads((tmp_path / "sglang_h128.json").read_text())
    assert row["status"] == "FAIL" and "1 of 2 ranks checked" in row["note"]


def test_mtp_drafting_runs_every_engine_with_the_drafter_and_needs_verification_checked(monkeypatch, tmp_path):
    runs = fake_engines(monkeypatch, tmp_path)
    saved: list = []
    monkeypatch.setattr(sglang_e2e, "save_sglang_tiny_deepseek", lambda path, heads, mtp=0: saved.append(mtp) or path)
    argv = ["--heads", "16", "--kv", "fp8_e4m3", "--spec-tokens", "3", "--references", "triton"]
    assert run_main(monkeypatch, *argv, "--page-sizes", "1", "--out", str(tmp_path)) == 0
    assert saved[-1] == 1  # the checkpoint holds the MTP layer
    drafting = sglang_e2e.speculative_args(3)
    assert drafting["speculative_num_draft_tokens"] == 4 and drafting["speculative_eagle_topk"] == 1
    assert all(engine_args == drafting for *_, engine_args in runs)  # page 1: SGLang's default, not given
    rows = {r["part"]: r for r in json.loads((tmp_path / "sglang_h16.json").read_text()) if r["status"] != "ref"}
    assert all(
        r["status"] == "PASS" and r["model"].endswith("MTP k=3, page 1 (SGLang's default)") for r in rows.values()
    )
    assert "6 calls verifying 4 tokens a request" in rows["check"]["note"]


def test_mtp_drafting_fails_where_no_verification_reached_our_kernel(monkeypatch, tmp_path):
    fake_engines(monkeypatch, tmp_path, verified=False)
    argv = ["--heads", "16", "--kv", "auto", "--spec-tokens", "1", "--parts", "check", "--out", str(tmp_path)]
    assert run_main(monkeypatch, *argv, "--page-sizes", "64") == 1
    (row,) = json.loads((tmp_path / "sglang_h16.json").read_text())
    assert row["status"] == "FAIL" and "0 calls verifying 2 tokens" in row["note"]


def test_by_default_one_run_covers_sglang_s_default_page_given_no_page_size_and_page_64(monkeypatch, tmp_path):
    """Page 1 is SGLang's default: its engines (ours and the references) start with no page size, so the
    default is what runs; page 64's with it. Every row names and records its page, the check's summaries
    of the two pages are kept apart, and a failing page fails the run."""
    runs = fake_engines(monkeypatch, tmp_path)
    argv = ["--heads", "16", "--kv", "auto", "--references", "triton", "--out", str(tmp_path)]
    assert run_main(monkeypatch, *argv) == 0
    pages = [engine_args for *_, engine_args in runs]
    assert pages == [None] * (len(runs) // 2) + [{"page_size": 64}] * (len(runs) // 2)
    rows = [r for r in json.loads((tmp_path / "sglang_h16.json").read_text()) if r["status"] != "ref"]
    assert [(r["page_size"], r["part"]) for r in rows] == [
        (page, part) for page in (1, 64) for part in ("check", "selftest x1.05", "tokens graphs", "tokens eager")
    ]
    assert {r["model"] for r in rows} == {
        "tiny DeepSeek-V3 (16 heads), page 1 (SGLang's default)",
        "tiny DeepSeek-V3 (16 heads), page 64",
    }
    assert (tmp_path / "page1").is_dir() and (tmp_path / "page64").is_dir()


@pytest.mark.parametrize("bad", ["48", "0", "2048", "1,x"])
def test_page_sizes_are_powers_of_two_mla_backend_reads(bad, capsys):
    with pytest.raises(SystemExit):
        sglang_e2e.parse(["--page-sizes", bad])
    assert "--page-sizes" in capsys.readouterr().err
    assert sglang_e2e.parse(["--page-sizes", "1,16,1024"]).page_sizes == [1, 16, 1024]


def test_drafting_is_the_tiny_model_s_and_fits_the_kernels_query_tokens(monkeypatch):
    for bad in (["--spec-tokens", "2", "--families", "GLM-4.7-Flash"], ["--spec-tokens", "8"]):
        with pytest.raises(SystemExit):
            sglang_e2e.parse(bad)
    assert sglang_e2e.speculative_args(0) is None


def test_the_check_s_summaries_add_up_over_the_scheduler_processes(tmp_path):
    from integration.engines import sglang_decode_check as check

    summary = tmp_path / "check_fp8_x1.0.json"
    assert check.read_summary(summary) is None
    for pid, (calls, error) in {11: (3, 1e-3), 12: (5, 4e-3)}.items():
        written = {"calls": calls, "rows": 10 * calls, "max_rel_err": error, "q_lens": {"1": calls - 1, "4": 1}}
        check.process_summary(summary, pid).write_text(json.dumps(written))
    (tmp_path / "check_fp8_x1.05.11.json").write_text("{}")  # another run's: not read
    assert check.read_summary(summary) == {
        "calls": 8,
        "rows": 80,
        "max_rel_err": 4e-3,
        "q_lens": {"1": 6, "4": 2},
        "processes": 2,
    }
    check.clear_summary(summary)
    assert check.read_summary(summary) is None and (tmp_path / "check_fp8_x1.05.11.json").exists()


@pytest.mark.sglang
def test_dp_attention_and_drafting_settings_are_sglang_engine_arguments():
    fields = server_args_fields()
    assert set(sglang_e2e.parallel_args(2)) <= fields and sglang_e2e.parallel_args(1) is None
    assert set(sglang_e2e.speculative_args(3)) <= fields


@pytest.mark.sglang
def test_our_backend_starts_with_the_drafting_settings_and_verifies(monkeypatch, caplog):
    """The settings the run drafts with pass the adapter's start-up checks (a chain; the drafter's
    multi-step attention on one of SGLang's own backends) and put verification on our backend (decode
    attention mode: in prefill mode SGLang verified on triton and ours decoded nothing, which the GPU
    run's check caught as no call checked)."""
    import logging

    from mla_backend.sglang import backend

    backends = dict(attention_backend=None, prefill_attention_backend="triton", decode_attention_backend="mla_backend")
    args = server_args_like(page_size=64, **backends, **sglang_e2e.speculative_args(3))
    with caplog.at_level(logging.WARNING, logger="mla_backend"):
        backend.check_server_args(args)  # raises on a setting it refuses
    assert args.speculative_attention_mode == "decode" and not caplog.records


SCHEDULER_TRACEBACK = """[2026-11-25 10:00:00] Scheduler hit an exception: Traceback (most recent call last):
  File "/tmp/sgl_site/sglang/srt/managers/scheduler.py", line 4930, in run_scheduler_process
    scheduler = Scheduler(
  File "/tmp/sgl_site/sglang/srt/model_executor/model_runner.py", line 2101, in init_attention_backend
    self.attn_backend = self._get_attention_backend()
  File "/tmp/mla/mla_backend/sglang/backend.py", line 97, in create_backend
    check_model(runner.model_config)
  File "/tmp/mla/mla_backend/sglang/backend.py", line 87, in check_model
    raise BackendUnavailableError(
mla_backend.config.BackendUnavailableError: mla_backend decodes dense MLA; this model's attention is sparse \
(an indexer picks the top-k tokens, with a cache of its own): start SGLang without --decode-attention-backend \
mla_backend so it picks its dsa backend

[2026-11-25 10:00:00] Received sigquit from a child process. It usually means the child failed.
"""
SPARSE = "this model's attention is sparse"
STOPPED = {"returncode": -9, "timed_out": False, "served": False, "left_over": []}


def test_a_refusal_passes_where_our_factory_stopped_start_up_with_the_message_and_all_ended():
    status, note = judge_refusal(STOPPED, SCHEDULER_TRACEBACK, SPARSE)
    assert status == "PASS" and "exit -9" in note and "BackendUnavailableError" in note


@pytest.mark.parametrize(
    "change, log, want",
    [
        ({"served": True}, SCHEDULER_TRACEBACK, "started and served"),
        ({"timed_out": True}, SCHEDULER_TRACEBACK, "did not stop"),
        ({"left_over": ["4242 sglang::scheduler"]}, SCHEDULER_TRACEBACK, "left behind"),
        ({}, SCHEDULER_TRACEBACK + "Fatal Python error: Segmentation fault\n", "crashed"),
        ({}, SCHEDULER_TRACEBACK.replace(SPARSE, "something else"), "without"),
    ],
)
def test_a_refusal_fails_where_it_served_hung_left_processes_crashed_or_said_something_else(change, log, want):
    status, note = judge_refusal({**STOPPED, **change}, log, SPARSE)
    assert status == "FAIL" and want in note


def test_an_engine_stopped_before_any_decode_backend_was_asked_for_is_unreached_not_passed():
    """MiniCPM3: the transformers SGLang 0.5.17 works with reads its config only with the model's remote
    code, so the engine stops in its own process, long before the factory."""
    log = 'Traceback (most recent call last):\n  File "/tmp/sgl_site/sglang/srt/server_args.py", line 3530\n'
    log += "ValueError: The checkpoint you are trying to load has model type `minicpm3` ...\n"
    status, note = judge_refusal({**STOPPED, "returncode": 1}, log, "needs kv_lora_rank 512")
    assert status == "UNREACHED" and "minicpm3" in note
    assert judge_refusal(STOPPED, log + SPARSE, SPARSE)[0] == "UNREACHED"  # the message alone is not our factory


# Stand-ins for the engine process start_refused runs (integration/engines/sglang_engine.py): one that
# hangs with a child, one that exits leaving a child running, one that serves.
CHILD = "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
HANGS = CHILD + "import time\ntime.sleep(60)\n"
LEAVES = CHILD + "sys.stderr.write('stopped\\n')\nsys.exit(1)\n"
SERVES = "import sys\nsys.stdin.read()\nprint('{\"tokens\": [[1]]}')\n"


@pytest.mark.slow  # three engine processes, one of them left to its timeout
def test_start_refused_reports_a_hang_a_process_left_behind_and_serving_and_kills_what_remains(tmp_path, monkeypatch):
    import psutil

    from integration.engines import sglang_engine

    engine, log = tmp_path / "engine.py", tmp_path / "engine.log"
    monkeypatch.setattr(sglang_engine, "__file__", str(engine))
    engine.write_text(HANGS)
    run = sglang_engine.start_refused("model", log, timeout_s=3)
    assert run["timed_out"] and run["left_over"] == [] and not run["served"]  # its whole session killed
    engine.write_text(LEAVES)
    run = sglang_engine.start_refused("model", log, timeout_s=60)
    assert (run["returncode"], run["timed_out"], run["served"]) == (1, False, False)
    assert len(run["left_over"]) == 1 and log.read_text() == "stopped\n"
    pid = int(run["left_over"][0].split()[0])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # killed after
    engine.write_text(SERVES)
    assert sglang_engine.start_refused("model", log, timeout_s=60)["served"]


# A stand-in sglang whose Engine prints the settings it was given and ends the process.
def test_the_engine_script_run_from_elsewhere_builds_its_settings_with_the_checkout_s_integration(tmp_path):
    """run_isolated runs sglang_engine.py as a script (python path/to/sglang_engine.py) with no checkout
    on PYTHONPATH: its settings, which read the model's config through integration, must still build."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "kimi_vl", "vision_config": {}}))
    spec = {"model": str(model), "prompts": [[1]], "decode": "mla_backend", "kv": "auto", "graphs": True}
    settings = run_engine_script(tmp_path, {**spec, "greedy_only": True})
    assert settings["model_path"] == str(model) and settings["enable_multimodal"] is False


# -- under SGLang 0.5.17 and 0.5.23 ---------------------------------------------------------------------

# CI runs these in its SGLang venv (-m sglang) and deselects them elsewhere; run without -m where SGLang
# is missing, they are skipped rather than failing on the import.
needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs SGLang")

RUN = [
    pytest.param(f, layout, id=f"{f.published}-{layout}") for f in FAMILIES if f.name in BUNDLED for layout in f.heads
]


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize("family, layout", RUN)
def test_each_checkpoint_the_run_writes_is_the_family_s_mla_model_to_sglang(family, layout, tmp_path):
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture

    # under the family's name, as the run writes it (SGLang reads a path naming mistral-large-3 as Mistral's format)
    config = ModelConfig(str(save_sglang_checkpoint(family, tmp_path / family.published, layout)))
    assert config.attention_arch == AttentionArch.MLA and config.num_attention_heads == family.heads[layout]
    assert (config.kv_lora_rank, config.qk_rope_head_dim) == (512, 64)
    model_class, architecture = get_model_architecture(config)
    assert architecture == family.architecture
    assert model_class.__module__ == f"sglang.srt.models.{SGLANG_MODULES[family.architecture]}"


@pytest.mark.sglang
@needs_sglang
def test_kimi_vl_runs_on_its_text_model_alone_without_an_image_processor(tmp_path):
    """For every multimodal model SGLang loads an image processor from the checkpoint, even with
    skip_tokenizer_init, and the zoo's Kimi-VL ships none (its prompts are token ids): the run turns
    multimodal off for it, which SGLang's ModelConfig honours (and is multimodal without it); every
    other family keeps SGLang's default."""
    from sglang.srt.configs.model_config import ModelConfig

    from integration.engines.sglang_engine import engine_settings

    kimi_vl = next(f for f in FAMILIES if f.architecture == "KimiVLForConditionalGeneration")
    path = str(save_sglang_checkpoint(kimi_vl, tmp_path / kimi_vl.published))
    settings = engine_settings(path, "mla_backend", "fp8_e4m3", True)
    assert set(settings) <= server_args_fields() and "page_size" not in settings  # the run's, or SGLang's default
    assert settings["enable_multimodal"] is False
    assert not ModelConfig(path, enable_multimodal=settings["enable_multimodal"]).is_multimodal
    assert ModelConfig(path).is_multimodal
    text_model = save_sglang_checkpoint(FAMILIES[0], tmp_path / "text")
    assert engine_settings(str(text_model), "mla_backend", "fp8_e4m3", True)["enable_multimodal"] is None


# SGLang builds each family's model class on CPU and loads the checkpoint into it, in a process of its own
# (the distributed groups and server arguments it needs are process-wide). Four stand-ins let the classes
# be built without a GPU, none of them in the weights' path: the CUDA path's RoPE class (not the CPU
# engine's) built on CPU, without the custom rotary kernel it would import where there is no CUDA,
# LongCat's side stream, and the device Kimi-VL's MoonViT asks for its 2D RoPE tables.
PRELUDE = (
    """
import inspect, json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.distributed.parallel_state import model_parallel_is_initialized
from sglang.srt.layers.dp_attention import initialize_dp_attention
from sglang.srt.layers.rotary_embedding import base, factory, rope_variant
from sglang.srt.model_loader.utils import get_model_architecture
from sglang.srt.models import kimi_vl_moonvit
from sglang.srt import runtime_context
from sglang.srt.server_args import ServerArgs
from integration.models.families import FAMILIES
from integration.models.sglang_checkpoint import save_sglang_checkpoint

base._is_cpu = True
factory.get_rope_cpu = lambda *args: factory.get_rope(*args[:8])
rope_variant.get_device = lambda *args: "cpu"
kimi_vl_moonvit.get_device = lambda *args: "cpu"
runtime_context.set_stream("alt", object())
init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                             distributed_init_method="tcp://127.0.0.1:" + sys.argv[2])
torch.set_default_dtype(torch.bfloat16)
"""
    + PUBLISH_AS_SCHEDULER
    + """

# The server arguments published, then the model-parallel groups (once; 0.5.23 sizes them from what was
# published).
def start(args):
    publish_as_scheduler(args)
    if not model_parallel_is_initialized():
        initialize_model_parallel()


# Attention's data parallelism: 0.5.17 sets it up from the model's config, 0.5.23 from what was published.
def start_dp_attention(args, config):
    if "model_config" in inspect.signature(initialize_dp_attention).parameters:
        initialize_dp_attention(server_args=args, model_config=config)
    else:
        initialize_dp_attention(args)


# The parameters left unloaded (NaN) after loading the checkpoint into the class built from config.
def loaded(model_class, config, path):
    model = model_class(config, None)
    for parameter in model.parameters():
        parameter.data.fill_(float("nan"))
    model.load_weights(iter(load_file(next(path.glob("*.safetensors"))).items()))
    return [n for n, p in model.named_parameters() if p.float().isnan().any()]
"""
)
BUILD = (
    PRELUDE
    + """
result = {}
for name in json.loads(sys.argv[3]):
    family = next(f for f in FAMILIES if f.name == name)
    path = save_sglang_checkpoint(family, Path(sys.argv[1]) / family.published)
    args = ServerArgs(model_path=str(path), device="cpu", page_size=64, prefill_attention_backend="triton",
                      decode_attention_backend="triton", skip_tokenizer_init=True, disable_radix_cache=True)
    start(args)
    config = ModelConfig.from_server_args(args)
    start_dp_attention(args, config)
    try:
        result[name] = loaded(get_model_architecture(config)[0], config.hf_config, path)
    except Exception as err:
        result[name] = repr(err)[:500]
print("RESULT " + json.dumps(result))
"""
)


# The tiny DeepSeek-V3 with its MTP layer, as sglang_e2e.py --spec-tokens writes it: the target, and the
# drafter SGLang's NEXTN speculation builds from the same checkpoint (ModelConfig's is_draft_model).
DRAFTER = (
    PRELUDE
    + """
from integration.models.sglang_checkpoint import save_sglang_tiny_deepseek
path = save_sglang_tiny_deepseek(Path(sys.argv[1]) / "tiny_mtp", heads=16, mtp_layers=1)
args = ServerArgs(model_path=str(path), device="cpu", page_size=64, prefill_attention_backend="triton",
                  decode_attention_backend="triton", skip_tokenizer_init=True, disable_radix_cache=True)
start(args)
result = {}
for role, draft in (("target", False), ("drafter", True)):
    config = ModelConfig.from_server_args(args, is_draft_model=draft)
    start_dp_attention(args, config)
    model_class = get_model_architecture(config)[0]
    try:
        result[role] = [model_class.__name__, loaded(model_class, config.hf_config, path)]
    except Exception as err:
        result[role] = [model_class.__name__, repr(err)[:500]]
print("RESULT " + json.dumps(result))
"""
)

# Mistral Large 3 and its Eagle drafter (models/mistral_eagle_drafter.py) in Mistral's format, under the
# names SGLang reads them by (mistral-large-3, and "eagle" for the drafter), as SGLang's EAGLE worker
# builds the drafter: ModelConfig's is_draft_model on the drafter's path.
MISTRAL_EAGLE = (
    PRELUDE
    + """
from integration.models.mistral_eagle_drafter import save_mistral_eagle_drafter
family = next(f for f in FAMILIES if f.drafter == "eagle")
target = save_sglang_checkpoint(family, Path(sys.argv[1]) / family.published)
drafter = save_mistral_eagle_drafter(target, Path(sys.argv[1]) / (family.published + "-Eagle"))
args = ServerArgs(model_path=str(target), speculative_draft_model_path=str(drafter), device="cpu", page_size=64,
                  prefill_attention_backend="triton", decode_attention_backend="triton", skip_tokenizer_init=True,
                  disable_radix_cache=True)
start(args)
config = ModelConfig.from_server_args(args, model_path=str(drafter), is_draft_model=True)
start_dp_attention(args, config)
model_class = get_model_architecture(config)[0]
result = {"class": model_class.__name__, "mla": config.attention_arch.name, "layers": config.num_hidden_layers,
          "latent": [config.kv_lora_rank, config.qk_rope_head_dim], "heads": config.num_attention_heads}
try:  # its __init__ takes keywords only
    keywords = lambda hf_config, quant_config: model_class(config=hf_config, quant_config=quant_config)
    result["left"] = loaded(keywords, config.hf_config, drafter)
except Exception as err:
    result["left"] = repr(err)[:500]
print("RESULT " + json.dumps(result))
"""
)


def run_built(script: str, folder: Path, *more: str) -> dict:
    """Runs one of the scripts above in a process of its own; its RESULT line."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    args = [str(folder), str(port), *more]
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return run_built(BUILD, tmp_path_factory.mktemp("built"), json.dumps(BUNDLED))


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize("name", BUNDLED)
def test_sglang_builds_each_family_s_model_from_its_checkpoint_and_loads_every_weight(built, name):
    """What the GPU run would otherwise find at start-up: a config key SGLang's model code reads and the
    checkpoint lacks (moe_layer_freq, LongCat's rope, Kimi-Linear's linear_attn_config), or a weight under
    a name its loader does not map (a parameter left unloaded)."""
    assert built[name] == [], built[name]


@pytest.mark.sglang
@needs_sglang
def test_sglang_builds_the_tiny_model_s_nextn_drafter_and_loads_its_mtp_layer(tmp_path):
    """What --spec-tokens found at start-up on the GPU: SGLang's NextN layer routes over experts and
    reads router keys transformers does not write. Every weight of target and drafter loads, but the
    drafter's embedding and head: SGLang's EAGLE worker hands it the target's (set_embed_and_head)."""
    result = run_built(DRAFTER, tmp_path)
    assert result["target"] == ["DeepseekV3ForCausalLM", []], result
    name, left = result["drafter"]
    assert name == "DeepseekV3ForCausalLMNextN", name
    assert sorted(left) == ["lm_head.weight", "model.embed_tokens.weight"], left


@pytest.mark.sglang
@needs_sglang
def test_sglang_builds_mistral_large_3_s_eagle_drafter_as_mla_and_loads_its_weights(tmp_path):
    """SGLang (0.5.17, 0.5.23) turns the zoo's Eagle drafter (Mistral's format, one layer) into its
    MistralLarge3ForCausalLMEagle with MLA attention of the target's latent and heads, and loads every
    weight but the embedding and head, which its EAGLE worker takes from the target."""
    result = run_built(MISTRAL_EAGLE, tmp_path)
    family = next(f for f in FAMILIES if f.drafter == "eagle")
    assert result["class"] == "MistralLarge3ForCausalLMEagle" and result["mla"] == "MLA", result
    assert result["layers"] == 1 and result["latent"] == [512, 64] and result["heads"] == family.heads["TP8"]
    assert sorted(result["left"]) == ["lm_head.weight", "model.embed_tokens.weight"], result["left"]


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize("family", [f for f in FAMILIES if f.name in REFUSED], ids=lambda f: f.name)
def test_each_refused_family_stops_our_factory_with_the_message_the_run_looks_for(family, tmp_path, monkeypatch):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture

    from integration.models.sglang_checkpoint import save_sglang_config
    from mla_backend.config import BackendUnavailableError
    from mla_backend.sglang import backend

    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", "12.0")
    for name, value in refusal_env(family).items():  # MiniCPM3's latent: the bundled kernels named
        monkeypatch.setenv(name, value)
    if family.model_type == "minicpm3":  # SGLang reads its config only with the model's remote code
        config = SimpleNamespace(**{k: family.config()[k] for k in ("kv_lora_rank", "qk_rope_head_dim")})
    else:
        config = ModelConfig(str(save_sglang_config(family, tmp_path)))
        assert get_model_architecture(config)[1] == family.architecture
    server_args = SimpleNamespace(page_size=64, speculative_algorithm=None)
    server_args.get_attention_backends = lambda: ("triton", "mla_backend")
    # A model runner's fields the factory reads (the route's KV dtype and page size among them).
    runner = SimpleNamespace(
        model_config=config, server_args=server_args, device="cpu", kv_cache_dtype=torch.bfloat16, page_size=64
    )
    with pytest.raises(BackendUnavailableError) as info:
        backend.create_backend(runner)
    assert refusal(family) in str(info.value)
