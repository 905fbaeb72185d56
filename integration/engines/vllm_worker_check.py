"""The decode check (vllm_decode_checker.DecodeChecker) inside vLLM's worker processes, for engines that
run their model in other processes: tensor- and decode-context-parallel runs.

``plugin_dir`` writes a test-only entry point in the group ``vllm.general_plugins``, which every
vLLM process loads; ``install`` does nothing unless ENV is set (the checked engine only). In a
worker it wraps the model runner: the checker starts after the model is loaded (before the CUDA
graphs are captured, so their probes are recorded), arms on the first real step, checks each step's
calls after it, and writes its summary to ``<dir>/rank<N>.json`` after every step. ``merged_summary``
joins the ranks' summaries into the shape of one DecodeChecker.summary().

Under decode context parallelism each rank's call attends to its share of the cache (vLLM passes the
local sequence lengths) with every rank's query heads; the check recomputes exactly that call, so it
judges each partial output and its LSE, the values the ranks then merge.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from integration.engines.entry_point_dir import entry_point_dir, path_with

# {"backend": "CUSTOM", "kv": "fp8" | "auto", "dir": path, "corrupt": null | float, "max_calls": null | int,
#  "sparse": bool (a DeepSeek Sparse Attention model: the sparse impl's calls, vllm_sparse_checker.py)}
ENV = "MLA_E2E_WORKER_CHECK"
ENTRY_POINT = "integration.engines.vllm_worker_check:install"


def plugin_dir(root: Path) -> Path:
    return entry_point_dir(root, "vllm.general_plugins", "mla_backend_worker_check", ENTRY_POINT)


def checked_env(
    directory: Path,
    backend: str,
    kv: str,
    corrupt: float | None = None,
    max_calls: int | None = None,
    sparse: bool = False,
) -> dict[str, str]:
    """Environment additions for a vLLM process whose decode calls are recomputed in float64: the
    settings, and a PYTHONPATH that starts with this plugin's directory (under ``directory``, where
    the ranks' summaries land too; read them with merged_summary). ``corrupt`` scales our outputs
    (the check must then fail); ``max_calls`` widens the window of checked calls (48 by default)."""
    directory.mkdir(parents=True, exist_ok=True)
    settings = {
        "backend": backend,
        "kv": kv,
        "dir": str(directory),
        "corrupt": corrupt,
        "max_calls": max_calls,
        "sparse": sparse,
    }
    return {ENV: json.dumps(settings), "PYTHONPATH": path_with(plugin_dir(directory / "plugin"))}


def install() -> None:
    """Entry point (see the module docstring)."""
    settings = os.environ.get(ENV)
    if not settings:
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, "_mla_worker_check", False):  # plugins may load twice in a process
        return
    GPUModelRunner._mla_worker_check = True
    settings = json.loads(settings)
    load_model, execute_model = GPUModelRunner.load_model, GPUModelRunner.execute_model
    state: dict = {}

    def checked_load_model(runner, *args, **kwargs):
        result = load_model(runner, *args, **kwargs)
        if "checker" not in state:
            state["checker"] = start_checker(settings)
        return result

    def checked_execute_model(runner, *args, **kwargs):
        checker = state.get("checker")
        if checker is not None and not checker.armed:
            checker.arm()
        result = execute_model(runner, *args, **kwargs)
        if checker is not None:
            checker.after_step()
            summary = checker.summary()
            summary_path(settings["dir"]).write_text(json.dumps(summary))
        return result

    GPUModelRunner.load_model = checked_load_model
    GPUModelRunner.execute_model = checked_execute_model


def start_checker(settings: dict):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from integration.engines.vllm_decode_checker import DecodeChecker
    from integration.settings import KV_DTYPES

    if settings.get("sparse"):
        from integration.engines.vllm_sparse_checker import SparseChecker

        sparse = SparseChecker(KV_DTYPES[settings["kv"]], corrupt=settings.get("corrupt"))
        sparse.max_calls = settings.get("max_calls") or sparse.max_calls
        sparse.__enter__()
        return sparse
    backend = settings["backend"]
    checker = DecodeChecker(
        AttentionBackendEnum[backend].get_class().get_impl_cls(),
        KV_DTYPES[settings["kv"]],
        force_lse=backend == "CUSTOM",
        corrupt=settings.get("corrupt"),
        max_calls=settings.get("max_calls") or 48,
    )
    checker.__enter__()  # wraps forward_mqa for the life of the worker
    return checker


def merged_sparse_summary(parts: list[dict]) -> dict:
    """SparseChecker.summary() of each rank as one: ok where every rank's is, counts added, the worst
    error kept."""
    calls = sum((Counter(p["calls"]) for p in parts), Counter())
    errors = [p["worst_row_error"] for p in parts if p["worst_row_error"] is not None]
    added = (
        "checked_calls",
        "checked_rows",
        "mixed_calls_checked",
        "topk_checked_rows",
        "topk_selecting_rows",
        "topk_boundary_ties",
    )
    return {
        "ranks": len(parts),
        "ok": bool(parts) and all(p["ok"] for p in parts),
        "calls": dict(calls),
        **{key: sum(p[key] for p in parts) for key in added},
        "worst_row_error": max(errors, default=None),
        "tolerance": max((p["tolerance"] for p in parts), default=0.0),
        "indexer_scorer": sorted({p["indexer_scorer"] for p in parts}),
        "topk_failures": [f for p in parts for f in p["topk_failures"]][:3],
        "problems": sorted({problem for p in parts for problem in p["problems"]}),
    }


def summary_path(directory: str) -> Path:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return Path(directory) / f"rank{rank}.json"


def merged_summary(directory: Path) -> dict:
    """The ranks' summaries as one: counts added, worst errors kept, problems joined; ``ranks`` says
    how many ranks reported (a rank that wrote nothing checked nothing)."""
    parts = [json.loads(p.read_text()) for p in sorted(Path(directory).glob("rank*.json"))]
    if any("worst_row_error" in p for p in parts):
        return merged_sparse_summary(parts)
    q_lens = sum((Counter({str(k): v for k, v in p["q_lens"].items()}) for p in parts), Counter())
    by_layer = sum((Counter(p.get("calls_by_layer", {})) for p in parts), Counter())
    worst: dict[str, float] = {}
    for part in parts:
        for k, v in part["max_rel_error"].items():
            worst[str(k)] = max(worst.get(str(k), 0.0), v)
    lse_errors = [p["max_lse_error"] for p in parts if p["max_lse_error"] is not None]
    return {
        "ranks": len(parts),
        "routes": sorted({route for p in parts for route in p.get("routes", [])}),
        "q_lens": dict(q_lens),
        "calls_by_layer": dict(sorted(by_layer.items())),
        "graph_calls": sum(p["graph_calls"] for p in parts),
        "checked_calls": sum(p["checked_calls"] for p in parts),
        "checked_graph_calls": sum(p["checked_graph_calls"] for p in parts),
        "checked_layers": sorted({layer for p in parts for layer in p["checked_layers"]}),
        "checked_rows": sum(p["checked_rows"] for p in parts),
        "max_rel_error": worst,
        "tolerance": max((p["tolerance"] for p in parts), default=0.0),
        "lse_checked_calls": sum(p["lse_checked_calls"] for p in parts),
        "lse_ok": all(p["lse_ok"] for p in parts),
        "max_lse_error": max(lse_errors, default=None),
        "check_problems": sorted({problem for p in parts for problem in p["check_problems"]}),
    }
