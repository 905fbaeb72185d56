"""integration/sglang_sparse_e2e.py (SGLang's DSA models on our sparse decode) on CPU. Plain tests: the
families and KV dtypes it runs, its rows and verdicts with the engines stood in, the settings and
environment each engine gets, and the recorder (engines/sglang_sparse_check.py) feeding the sparse judges
(judges/sparse_check.py) on a real call: a correct one passes, a wrong output, a wrong row and a wrong
top-k fail. Under SGLang (-m sglang; 0.5.17 and 0.5.23): the engines' settings parse with our plugin
registered, the checkpoints are DSA models SGLang builds and loads, and the recorder reaches SGLang's
indexer scorer and our subclass where mla_backend's plugin put them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the integration package, from the checkout
from sglang_fakes import keep_indexer_modules, run_engine_script  # noqa: E402

from integration import sglang_sparse_e2e as e2e  # noqa: E402
from integration.engines import sglang_engine, sglang_sparse_check  # noqa: E402
from integration.engines.sglang_decode_check import process_summary  # noqa: E402
from integration.engines.sglang_sparse_check import SGLangSparseChecker, positions_of_slots  # noqa: E402
from integration.judges.sparse_check import (  # noqa: E402
    indexer_logits64,
    judge_sparse_check,
    judge_sparse_selftest,
)
from mla_backend.reference import sparse_mla_reference  # noqa: E402
from mla_backend.sparse_cache import pack_fp8_ds_mla  # noqa: E402

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs SGLang")


def planned(*argv: str) -> list[str]:
    return [f"{f.name}@{f.heads[layout]}" for f, layout in e2e.plan(e2e.parse(list(argv)))]


def test_by_default_both_sparse_families_in_their_first_layout_and_both_caches():
    args = e2e.parse([])
    assert planned() == ["DeepSeek-V3.2@16", "GLM-5@8"]
    assert args.kv == ["auto", "fp8_e4m3"] and args.parts == ["tokens", "check", "selftest"]
    assert planned("--families", "GLM-5@64") == ["GLM-5@64"]


@pytest.mark.parametrize("argv", [["--kv", "fp8"], ["--kv", "auto,fp8_ds_mla"], ["--parts", "tokens,drafts"]])
def test_unknown_kv_dtypes_and_parts_are_errors(argv, capsys):
    with pytest.raises(SystemExit):
        e2e.parse(argv)
    assert argv[0] in capsys.readouterr().err


def test_a_dense_family_is_sglang_e2e_s():
    with pytest.raises(SystemExit, match="sglang_e2e.py"):
        planned("--families", "GLM-5,GLM-4.7-Flash")


# -- the recorder and the judges on a real call ------------------------------------------------------------

PAGE, HEADS, INDEX_HEADS, DIM, TOPK = 64, 4, 8, 32, 48


def dsa_step(fp8: bool, seed: int = 0):
    """One decode step of two requests as SGLang's DSA backend has it: the KV pool, the page table at
    page 64, the index cache and the scorer's inputs, the true top-k of the scorer's float64 logits as
    pool rows (what our subclass is handed), the query, and the float64 output over those rows."""
    gen = torch.Generator().manual_seed(seed)
    pages, lengths = 6, [150, 40]
    values = torch.randn(pages * PAGE, 1, 576, generator=gen) * 0.5
    pool = pack_fp8_ds_mla(values, "arbitrary_fp32").view(torch.float8_e4m3fn) if fp8 else values.to(torch.bfloat16)
    table = torch.stack([torch.randperm(pages, generator=gen)[:3] for _ in lengths]).to(torch.int32)
    keys = (torch.randn(pages, PAGE, DIM, generator=gen) * 2).to(torch.float8_e4m3fn)
    scales = torch.rand(pages, PAGE, generator=gen) + 0.5
    index_cache = torch.cat([keys.view(torch.uint8).reshape(pages, -1), scales.view(torch.uint8).reshape(pages, -1)], 1)
    index_cache = index_cache.view(pages, PAGE, 1, DIM + 4)  # SGLang's view for its scorer
    q = (torch.randn(2, 1, INDEX_HEADS, DIM, generator=gen)).to(torch.float8_e4m3fn)
    weights = torch.rand(2, INDEX_HEADS, generator=gen)
    context = torch.tensor(lengths, dtype=torch.int32)[:, None]
    slots = torch.full((2, TOPK), -1, dtype=torch.int32)
    for row, length in enumerate(lengths):
        at = torch.arange(length)
        rows_of = table[row, at // PAGE].long() * PAGE + at % PAGE
        flat_keys = keys[table[row].long()].reshape(-1, DIM)[:length].double()
        flat_scales = scales[table[row].long()].reshape(-1)[:length].double()
        logits = indexer_logits64(q[row], flat_keys, flat_scales, weights[row : row + 1])[0]
        best = torch.topk(logits, min(length, TOPK)).indices
        slots[row, : best.numel()] = rows_of[best].to(torch.int32)
    query = (torch.randn(2, HEADS, 576, generator=gen) * 0.5).to(torch.bfloat16)
    rows = pool.view(torch.uint8) if fp8 else pool
    out, _ = sparse_mla_reference(query, rows.view(pages * PAGE, -1), slots, 0.1)
    return dict(pool=pool, scorer=(q, index_cache, weights, context, table), slots=slots, query=query, out=out)


def recorded(step: dict, kv_dtype: torch.dtype, out_scale: float = 1.0, slots=None) -> dict:
    """The recorder's summary of one scorer call and the attention call after it."""
    checker = SGLangSparseChecker(kv_dtype)
    checker.score(*step["scorer"])
    out = (step["out"] * out_scale).to(torch.bfloat16)
    checker.record_call(step["query"], step["pool"], step["slots"] if slots is None else slots, 0.1, out)
    return checker.summary()


@pytest.mark.parametrize("fp8", [False, True])
def test_the_recorder_s_summary_of_a_correct_call_passes_the_sparse_judge(fp8):
    summary = recorded(dsa_step(fp8), torch.float8_e4m3fn if fp8 else torch.bfloat16)
    ok, note = judge_sparse_check(summary)
    assert ok, note
    assert summary["checked_rows"] == 2 * HEADS and summary["topk_checked_rows"] == 2 and not summary["problems"]


def test_a_scaled_output_fails_the_check_and_passes_the_selftest():
    summary = recorded(dsa_step(False), torch.bfloat16, out_scale=1.05)
    assert not judge_sparse_check(summary)[0]
    caught, note = judge_sparse_selftest(summary)
    assert caught, note


def test_a_list_that_is_not_the_indexer_s_top_k_fails():
    step = dsa_step(False, seed=1)
    slots = step["slots"].clone()
    table = step["scorer"][4]
    chosen = set(slots[0].tolist())
    other = next(s for s in (table[0, p // PAGE].item() * PAGE + p % PAGE for p in range(150)) if s not in chosen)
    slots[0, 0] = other  # a low-scoring position instead of the best one; the output over it is still exact
    step["out"], _ = sparse_mla_reference(step["query"], step["pool"].view(-1, 576), slots, 0.1)
    summary = recorded(step, torch.bfloat16, slots=slots)
    assert summary["worst_row_error"] < 1e-2  # the attention itself is right
    ok, note = judge_sparse_check(summary)
    assert not ok and "below the k-th best" in note


def test_positions_of_slots_inverts_the_page_table():
    table = torch.tensor([[3, 1]], dtype=torch.int32)
    slots = torch.tensor([[3 * 64 + 5, 64 + 2, -1, 7]], dtype=torch.int32)  # row 7 is not the request's
    assert positions_of_slots(slots, table, [100]).tolist() == [[5, 66, -1, 100]]


def test_the_summary_file_is_the_scheduler_s_and_two_are_a_problem(tmp_path):
    summary = tmp_path / "sparse_check_auto_x1.0.json"
    assert sglang_sparse_check.read_summary(summary) is None
    written = recorded(dsa_step(False), torch.bfloat16)
    process_summary(summary, 11).write_text(json.dumps(written))
    assert sglang_sparse_check.read_summary(summary) == written
    process_summary(summary, 12).write_text(json.dumps(written))
    both = sglang_sparse_check.read_summary(summary)
    assert not both["ok"] and "2 processes checked" in both["problems"]


# -- the runner with its engines stood in ------------------------------------------------------------------


def fake_engines(monkeypatch, check_out_scale=1.0, fp8_tokens=None, bf16_tokens=None, alone_tokens=None):
    """Every engine returns the same greedy tokens (``fp8_tokens``/``bf16_tokens`` for ours with that
    cache where given; a reference's prompts alone ``alone_tokens`` where given); a checked engine's
    scheduler writes the recorder's summary of a real call, its output scaled by ``check_out_scale`` and
    the run's corruption."""
    runs: list = []

    def run_isolated(
        model, prompts, decode, kv, graphs, log, greedy_only=False, env=None, sparse=False, also_alone=False
    ):
        assert sparse and env["SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"] == "0"
        assert also_alone == (decode in e2e.REFERENCES.values())  # each reference also runs its prompts alone
        runs.append((decode, kv, graphs, env.get("MLA_BACKEND")))
        if sglang_sparse_check.ENV in env:
            settings = json.loads(env[sglang_sparse_check.ENV])
            step = dsa_step(settings["kv"] != "auto")
            summary = recorded(step, torch.bfloat16, out_scale=check_out_scale * settings["corruption"])
            summary["indexer_scorer"] = "mla_backend"
            process_summary(Path(settings["summary"]), 4000).write_text(json.dumps(summary))
        tokens = [[7, 8, 9, 10]] * len(prompts)
        ours_tokens = {"fp8_e4m3": fp8_tokens, "auto": bf16_tokens}[kv]
        if ours_tokens is not None and decode == e2e.OURS:
            tokens = ours_tokens
        greedy = {"tokens": tokens, "gaps": [[1.0] * 4] * len(prompts)}
        if also_alone:
            greedy["alone_tokens"] = alone_tokens or tokens
        return greedy if greedy_only else {**greedy, "tokens_per_s": 1e3}  # as sglang_engine.run_engine

    monkeypatch.setattr(e2e, "run_isolated", run_isolated)
    monkeypatch.setattr(e2e, "save_sglang_checkpoint", fake_checkpoint)
    monkeypatch.setattr(e2e, "scorer_expected", lambda: "mla_backend")
    return runs


def fake_checkpoint(family, path, layout):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"vocab_size": 2048}))
    return path


def test_the_runner_gives_a_row_per_family_kv_and_part_and_keeps_the_json(monkeypatch, tmp_path, capsys):
    runs = fake_engines(monkeypatch)
    assert e2e.main(["--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "sglang_sparse.json").read_text())
    ours = [(r["model"], r["kv"], r["part"], r["status"]) for r in rows if r["status"] != "ref"]
    models = ["DeepSeek-V3.2 TP8 (16 heads)", "GLM-5 TP8 (8 heads)"]
    parts = ["check", "selftest x1.05", "tokens graphs", "tokens eager, checked run"]
    assert ours == [(m, kv, p, "PASS") for m in models for kv in ("auto", "fp8_e4m3") for p in parts]
    refs = {(r["kv"], r["part"]) for r in rows if r["status"] == "ref"}
    assert refs == {(kv, f"reference {e2e.REFERENCES[kv]}") for kv in e2e.REFERENCES}
    # per model and cache: ours checked twice (eager) and with graphs, the reference with graphs
    assert sorted(runs[:4]) == sorted(
        [("mla_backend", "auto", False, None)] * 2
        + [("flashmla_sparse", "auto", True, None), ("mla_backend", "auto", True, None)]
    )
    assert len(runs) == 2 * 2 * 4
    assert "scorer mla_backend" in next(r["note"] for r in rows if r["part"] == "check")
    assert f"{len(rows)} rows" in capsys.readouterr().out


def test_a_check_beyond_the_tolerance_or_a_selftest_that_passes_fails_the_run(monkeypatch, tmp_path):
    fake_engines(monkeypatch, check_out_scale=1.1)
    assert e2e.main(["--families", "GLM-5", "--kv", "auto", "--parts", "check", "--out", str(tmp_path)]) == 1
    fake_engines(monkeypatch, check_out_scale=1 / 1.05)  # the corruption cancelled: the selftest passes the check
    assert e2e.main(["--families", "GLM-5", "--kv", "auto", "--parts", "selftest", "--out", str(tmp_path)]) == 1
    (row,) = json.loads((tmp_path / "sglang_sparse.json").read_text())
    assert row["status"] == "FAIL" and "DID NOT CATCH" in row["note"]


def test_an_indexer_that_did_not_score_with_ours_fails_the_check():
    summary = recorded(dsa_step(False), torch.bfloat16)
    summary["indexer_scorer"] = "deep_gemm"
    ok, note = e2e.judge_check(summary, selftest=False)
    assert ok == (e2e.scorer_expected() is None) and "deep_gemm" in note


def test_fp8_tokens_off_the_rule_pass_only_staying_with_the_bf16_reference_as_long_as_flashmla(monkeypatch, tmp_path):
    argv = ["--families", "GLM-5", "--kv", "fp8_e4m3", "--parts", "tokens", "--out", str(tmp_path)]
    runs = fake_engines(monkeypatch, fp8_tokens=[[7, 5, 5, 5]] * 4)  # parts at step 1 on every prompt: no tie there
    assert e2e.main(argv) == 1
    assert ("flashmla_sparse", "auto", True, None) in runs  # the bf16 reference, run for the calibration
    fake_engines(monkeypatch, fp8_tokens=[[7, 8, 9, 5]] * 4)
    assert e2e.main(argv) == 1  # flashmla_kv stays all four steps, ours three
    rows = [r for r in json.loads((tmp_path / "sglang_sparse.json").read_text()) if r["status"] != "ref"]
    assert "ours 12, flashmla_kv 16" in rows[0]["note"]


def test_where_the_reference_s_lone_run_parts_from_its_batch_is_a_tie(monkeypatch, tmp_path):
    """Ours parting from the reference at step 1 (gaps all wide) fails, unless the reference's own run
    of that prompt alone parts there too (its indexer picked by the batch's rounding)."""
    argv = ["--families", "GLM-5", "--kv", "auto", "--parts", "tokens", "--out", str(tmp_path)]
    ours = [[7, 5, 5, 5]] + [[7, 8, 9, 10]] * 3
    fake_engines(monkeypatch, bf16_tokens=ours)
    assert e2e.main(argv) == 1
    fake_engines(monkeypatch, bf16_tokens=ours, alone_tokens=[[7, 6, 6, 6]] + [[7, 8, 9, 10]] * 3)
    assert e2e.main(argv) == 0
    fake_engines(monkeypatch, bf16_tokens=ours, alone_tokens=[[7, 8, 9, 10]] * 3 + [[7, 6, 6, 6]])
    assert e2e.main(argv) == 1  # a tie on another prompt does not excuse this one


def test_the_checked_eager_run_s_tokens_are_judged_too(monkeypatch, tmp_path):
    """With the check and tokens, the checked run's tokens get a row of their own under the same rule:
    calls right to float64 in a run that parts early (the fake: ours parts at step 1, eager and graphs)."""
    argv = ["--families", "GLM-5", "--kv", "auto", "--parts", "check,tokens", "--out", str(tmp_path)]
    fake_engines(monkeypatch, bf16_tokens=[[7, 5, 5, 5]] + [[7, 8, 9, 10]] * 3)
    assert e2e.main(argv) == 1
    rows = {r["part"]: r for r in json.loads((tmp_path / "sglang_sparse.json").read_text())}
    assert rows["check"]["status"] == "PASS" and rows["tokens graphs"]["status"] == "FAIL"
    eager = rows["tokens eager, checked run"]
    assert eager["status"] == "FAIL" and not eager["graphs"] and "(0, 1, 4)" in eager["note"]


def test_the_engine_script_runs_each_prompt_alone_after_the_batch(tmp_path):
    """run_engine with ``also_alone``: the batch's tokens, then each prompt in a generate call of its own."""
    engine = (
        "class Engine:\n"
        "    def __init__(self, **settings): pass\n"
        "    def shutdown(self): pass\n"
        "    def generate(self, input_ids, sampling_params, **kwargs):\n"
        "        step = {'output_top_logprobs': [[(-0.1, 1), (-2.0, 2)]] * 2}\n"
        "        return [{'output_ids': [len(input_ids), p[0]], 'meta_info': step} for p in input_ids]\n"
    )
    spec = {"model": "m", "prompts": [[11], [12]], "decode": "flashmla_sparse", "kv": "auto", "graphs": True}
    run = run_engine_script(tmp_path, {**spec, "greedy_only": True, "sparse": True, "also_alone": True}, engine)
    assert run["tokens"] == [[2, 11], [2, 12]] and run["alone_tokens"] == [[1, 11], [1, 12]]
    assert run["gaps"] == [[1.9, 1.9]] * 2


def test_the_engine_script_starts_a_sparse_engine_on_sglang_s_dsa_backend(tmp_path):
    """run_isolated's script with ``sparse``: SGLang's dsa backend, our decode as its sub-backend, page 64,
    SGLang's prefill default (no dense backend named)."""
    spec = {"model": "m", "prompts": [[1]], "decode": "mla_backend", "kv": "fp8_e4m3", "graphs": True}
    settings = run_engine_script(tmp_path, {**spec, "greedy_only": True, "sparse": True})
    assert (settings["attention_backend"], settings["dsa_decode_backend"], settings["page_size"]) == (
        "dsa",
        "mla_backend",
        64,
    )
    assert "prefill_attention_backend" not in settings and "decode_attention_backend" not in settings
    assert settings["kv_cache_dtype"] == "fp8_e4m3" and settings["disable_cuda_graph"] is False


def test_a_sparse_engine_gets_no_deep_gemm_stand_in_so_our_indexer_takes_over(monkeypatch):
    """Where neither FlashInfer nor DeepGEMM is installed (the lent GPU): a dense engine gets both stand-ins;
    a sparse one only FlashInfer's, so that deep_gemm is not found and mla_backend's plugin scores the
    indexer (a found deep_gemm would be left to SGLang: indexer_without_deep_gemm asks find_spec)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("flashinfer", "deep_gemm") else find_spec(name)
    )
    dense = sglang_engine.engine_env({}).get("PYTHONPATH", "").split(os.pathsep)
    sparse_env = sglang_engine.engine_env({}, sglang_engine.SPARSE_STAND_IN_PACKAGES)
    sparse = sparse_env["PYTHONPATH"].split(os.pathsep)
    stand_in = {name: str(sglang_engine.STAND_INS / name) for name in ("flashinfer", "deep_gemm")}
    assert stand_in["flashinfer"] in dense and stand_in["deep_gemm"] in dense
    assert stand_in["flashinfer"] in sparse and stand_in["deep_gemm"] not in sparse
    assert sparse_env["SGLANG_ENABLE_JIT_DEEPGEMM"] == "false"
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('deep_gemm') is not None)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(dense)},
    )
    assert found.stdout.strip() == "True"  # with the stand-in on the path, the plugin would step aside


# -- under SGLang ---------------------------------------------------------------------------------------------


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize("kv", sorted(e2e.REFERENCES))
def test_every_engine_s_settings_parse_with_our_plugin_registered(kv):
    import argparse

    from sglang.srt.server_args import ServerArgs
    from sglang_release import server_args_fields

    from mla_backend.sglang import register

    register()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for decode in (e2e.OURS, e2e.REFERENCES[kv]):
        settings = sglang_engine.sparse_settings("m", decode, kv, True)
        assert set(settings) <= server_args_fields()
        argv = ["--model-path", "m"]
        for name in ("attention_backend", "dsa_decode_backend", "kv_cache_dtype", "page_size"):
            argv += [f"--{name.replace('_', '-')}", str(settings[name])]
        parsed = parser.parse_args(argv)
        assert (parsed.attention_backend, parsed.dsa_decode_backend) == ("dsa", decode)


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize("name", ["DeepSeek-V3.2", "GLM-5"])
def test_each_checkpoint_is_a_dsa_model_to_sglang(name, tmp_path):
    from sglang.srt.configs.model_config import ModelConfig, is_deepseek_dsa
    from sglang.srt.model_loader.utils import get_model_architecture

    from integration.models.sglang_checkpoint import save_sglang_checkpoint

    ((family, layout),) = e2e.plan(e2e.parse(["--families", name]))
    config = ModelConfig(str(save_sglang_checkpoint(family, tmp_path / family.published, layout)))
    assert is_deepseek_dsa(config.hf_config) and config.hf_config.index_topk == 2048
    assert (config.kv_lora_rank, config.qk_rope_head_dim, config.num_attention_heads) == (512, 64, family.heads[layout])
    assert get_model_architecture(config)[1] == family.architecture


@pytest.mark.sglang
@needs_sglang
def test_sglang_builds_both_sparse_models_from_their_checkpoints_and_loads_every_weight(tmp_path):
    """SGLang's server arguments of a DSA model read the GPU's capability (SM90 here, the lent H200's)."""
    from test_sglang_zoo_e2e import BUILD, run_built

    sm90 = "torch.set_default_dtype(torch.bfloat16)\ntorch.cuda.get_device_capability = lambda *args: (9, 0)\n"
    script = BUILD.replace("torch.set_default_dtype(torch.bfloat16)\n", sm90, 1)
    assert script != BUILD
    assert run_built(script, tmp_path, json.dumps(["DeepSeek-V3.2", "GLM-5"])) == {"DeepSeek-V3.2": [], "GLM-5": []}


@pytest.mark.sglang
@needs_sglang
def test_the_recorder_reaches_sglang_s_scorer_and_our_subclass_where_our_plugin_put_them(monkeypatch, tmp_path):
    """Without DeepGEMM, SGLang's indexer scores with mla_backend's function (0.5.17: its module's
    deep_gemm is our shim; 0.5.23: its resolver returns ours); the checked engine's plugin wraps that
    scorer and our subclass's attention as mla_backend's plugin builds the subclass."""
    from mla_backend import indexer
    from mla_backend.sglang import deep_gemm_shim, dsa, register

    register()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "deep_gemm" else find_spec(n, *a))
    keep_indexer_modules(monkeypatch)
    monkeypatch.setattr(deep_gemm_shim, "fp8_paged_mqa_logits", deep_gemm_shim.fp8_paged_mqa_logits)
    assert dsa.indexer_without_deep_gemm()
    subclass = dsa.ensure_subclass()
    monkeypatch.setattr(subclass, "mla_attend", subclass.mla_attend)
    monkeypatch.setattr(dsa, "make_subclass", dsa.make_subclass)
    summary = tmp_path / "sparse_check_auto_x1.0.json"
    monkeypatch.setenv(sglang_sparse_check.ENV, json.dumps({"corruption": 1.0, "summary": str(summary), "kv": "auto"}))
    original = subclass.mla_attend
    sglang_sparse_check.install()  # the subclass is built already: wrapped at once
    assert subclass.mla_attend is not original and dsa.make_subclass.__name__ == "make_checked_subclass"
    indexer_module = importlib.import_module(dsa.INDEXER_MODULE)
    if hasattr(indexer_module, sglang_sparse_check.RESOLVER):  # 0.5.23
        scorer = getattr(indexer_module, sglang_sparse_check.RESOLVER)()
    else:
        scorer = indexer_module.deep_gemm.fp8_paged_mqa_logits
    assert scorer is not indexer.fp8_paged_mqa_logits  # wrapped ...
    assert indexer.fp8_paged_mqa_logits in [cell.cell_contents for cell in scorer.__closure__ or ()]  # ... around ours
