"""The plugin's indexer hook (mla_backend/vllm/indexer_hook.py) against the real vLLM (CI: the oldest
and the newest supported release), on CPU, each case in a fresh process (vLLM caches whether DeepGEMM
imports): with DeepGEMM made unimportable, the plugin lets vLLM's sparse-attention indexer be built and
vLLM's own DeepGEMM wrappers score with ours, checked through those wrappers against the float64 loops
of test_indexer_cpu; with DeepGEMM as installed, vLLM keeps it wherever it imports; without the plugin,
the indexer stays refused (the check these cases make can fail)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # fresh vLLM processes, one a case

TESTS = Path(__file__).resolve().parent

# argv: "blocked" (DeepGEMM unimportable) or "installed"; "plugin" or "no-plugin". Prints a JSON report.
CHECK = """
import inspect, json, sys
if sys.argv[1] == "blocked":
    sys.modules["deep_gemm"] = None
    sys.modules["vllm.third_party.deep_gemm"] = None
sys.path.insert(0, sys.argv[3])
if sys.argv[2] == "plugin":
    from mla_backend.vllm import register
    register()
import torch
import vllm.model_executor.layers.sparse_attn_indexer as indexer_module
import vllm.utils.deep_gemm as dg
from vllm.utils.import_utils import has_deep_gemm
from mla_backend import indexer as ix
import test_indexer_cpu as t

report = {"deep_gemm": has_deep_gemm(), "indexer_built": indexer_module.has_deep_gemm()}
dg._lazy_init()
report["ours"] = dg._fp8_fp4_paged_mqa_logits_impl is ix.fp8_fp4_paged_mqa_logits
report["checked"] = []
if report["ours"]:
    paged = inspect.signature(dg.fp8_fp4_paged_mqa_logits).parameters
    q, cache, weights, table = t.paged_case(7, t.LENS, 2)
    ends = [[n] * 2 for n in t.LENS]
    lens = torch.tensor(ends, dtype=torch.int32)
    meta = ix.get_paged_mqa_logits_metadata(lens, cache.shape[1], 8)
    extra = {"clean_logits": False} if "clean_logits" in paged else {}
    got = dg.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, meta, 30, **extra)
    t.assert_logits_match(got, t.naive_paged(q, cache, weights, ends, table, 30))
    report["checked"].append("paged")

    ragged = inspect.signature(dg.fp8_fp4_mqa_logits).parameters
    q, k, k_scale, weights = t.ragged_case(4)
    if "clean_logits" in ragged:  # vLLM 0.26: [M, N], every position in its own column
        got = dg.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, t.STARTS, t.ENDS, True)
        want = t.naive_ragged(q, k, k_scale, weights, t.STARTS, t.ENDS)
    else:  # 0.33: [M, max_seqlen_k], row i from its start
        got = dg.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, t.STARTS, t.ENDS, 28)
        want = t.naive_ragged(q, k, k_scale, weights, t.STARTS, t.ENDS, width=28)
    t.assert_logits_match(got, want)
    report["checked"].append("ragged")
print("REPORT " + json.dumps(report))
"""


def run_check(deep_gemm: str, plugin: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CHECK, deep_gemm, plugin, str(TESTS)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


def test_without_deepgemm_the_indexer_is_built_and_vllms_wrappers_score_with_ours():
    report = run_check("blocked", "plugin")
    assert report["deep_gemm"] is False  # vLLM's own answer, which the plugin leaves alone
    assert report["indexer_built"] is True
    assert report["ours"] is True
    assert report["checked"] == ["paged", "ragged"]


def test_without_the_plugin_vllm_refuses_the_indexer_and_has_no_logits():
    report = run_check("blocked", "no-plugin")
    assert report == {"deep_gemm": False, "indexer_built": False, "ours": False, "checked": []}


def test_where_deepgemm_imports_vllm_keeps_it():
    """On CPU no GPU is below SM 9.0, so DeepGEMM's own impls stay wherever it imports."""
    report = run_check("installed", "plugin")
    assert report["indexer_built"] is True
    assert report["ours"] is (not report["deep_gemm"])
