"""One vLLM engine run for the end-to-end checks: greedy generation with logprobs, plus a check of
the backend's forward_mqa outputs on the real paged cache against the float64 reference
(vllm_decode_checker.py), in eager and CUDA-graph mode; in worker processes for multi-GPU engines
(vllm_worker_check.py). Decode throughput of one backend (decode_tokens_per_s).

Engines run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the check can wrap the impl."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from integration.engines.vllm_decode_checker import DecodeChecker  # noqa: E402
from integration.engines.vllm_spec import EngineSpec, engine_kwargs  # noqa: E402
from integration.engines.vllm_worker_check import checked_env, merged_summary  # noqa: E402
from integration.settings import KV_DTYPES  # noqa: E402


@contextlib.contextmanager
def after_each_step(callback):
    """Call ``callback`` after every model step of the in-process engine (its forward has been
    launched; the next step has not started), on either of vLLM's model runners: vLLM 0.26 runs
    DeepseekV2ForCausalLM and models without experts on its V2 runner by default."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    originals = {runner: runner.execute_model for runner in (GPUModelRunner, RunnerV2)}

    def wrapped(original):
        def execute_model(runner, *args, **kwargs):
            result = original(runner, *args, **kwargs)
            callback()
            return result

        return execute_model

    for runner, original in originals.items():
        runner.execute_model = wrapped(original)
    try:
        yield
    finally:
        for runner, original in originals.items():
            runner.execute_model = original


def run_engine(
    spec: EngineSpec,
    model: str,
    prompts: list[list[int]],
    max_tokens: int = 32,
    logprobs: int = 2,
    max_model_len: int = 2048,
    corrupt: float | None = None,
    also_alone: bool = False,
) -> dict:
    """Generate greedily; returns tokens, top-2 logprob gaps, timings and the decode check.
    ``corrupt`` scales every forward_mqa output (the check must then fail). ``also_alone``: then each
    prompt again in a batch of its own (``alone_tokens``): where the two part, the engine's own tokens
    depend on what shares the batch, which a server's batches differ in."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = engine_kwargs(spec, model, max_model_len, memory_fraction=0.15)
    result: dict = {"spec": asdict(spec), "name": spec.name}
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    load_general_plugins()  # what the engine does first: registers CUSTOM through our entry point
    worker_check = check_in_workers(spec, corrupt) if spec.tp > 1 else None
    checker = DecodeChecker(
        AttentionBackendEnum[spec.backend].get_class().get_impl_cls(),
        KV_DTYPES[spec.kv_cache_dtype],
        force_lse=spec.backend == "CUSTOM",
        corrupt=corrupt,
    )
    started = time.perf_counter()
    try:
        with checker, after_each_step(checker.after_step):
            llm = LLM(**kwargs)
            checker.arm()
            result["init_s"] = time.perf_counter() - started
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, ignore_eos=True)
            begun = time.perf_counter()
            outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            result["generate_s"] = time.perf_counter() - begun
            if also_alone:
                alone = [llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)[0] for p in prompts]
                result["alone_tokens"] = [list(o.outputs[0].token_ids) for o in alone]
            llm_metrics = llm.get_metrics() if spec.spec_tokens else []
            del llm
        result["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
        result["gaps"] = [[top2_gap(step) for step in o.outputs[0].logprobs] for o in outputs]
        if worker_check is None:
            result["decode_check"] = checker.summary()
        else:  # the workers built the model: their routes
            result["decode_check"] = merged_summary(worker_check)
        result["routes"] = result["decode_check"].pop("routes")
        result["spec_decode"] = spec_decode_counts(llm_metrics)
        result["target_layers"] = target_layers(model)
    finally:
        release_engine()
    return result


def check_in_workers(spec: EngineSpec, corrupt: float | None) -> Path:
    """Multi-GPU engines run the model in worker processes: the check goes there through a test-only
    vLLM plugin (vllm_worker_check.py); the ranks' summaries land in the returned directory. Call
    in a process of its own (run_engine_isolated): the settings stay in its environment."""
    directory = Path(tempfile.mkdtemp(prefix="mla_worker_check_"))
    os.environ.update(checked_env(directory, spec.backend, spec.kv_cache_dtype, corrupt))
    # A spawned worker takes its parent's sys.path, not PYTHONPATH.
    sys.path.insert(0, str(directory / "plugin"))
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # fresh workers read PYTHONPATH and load the plugin
    return directory


def target_layers(model: str) -> int | None:
    """The target's decoder layers (its config.json, or params.json in Mistral's format; None where
    there is neither): vLLM numbers a drafter's layers after them."""
    config, params = Path(model) / "config.json", Path(model) / "params.json"
    if config.exists():
        fields = json.loads(config.read_text())
        return fields.get("text_config", fields).get("num_hidden_layers")
    if params.exists():
        return json.loads(params.read_text()).get("n_layers")
    return None


def spec_decode_counts(metrics) -> dict:
    """vLLM's speculative-decoding counters (drafts, draft tokens, accepted tokens) and the acceptance rate."""
    counts = {
        m.name.removeprefix("vllm:spec_decode_"): m.value
        for m in metrics
        if m.name.startswith("vllm:spec_decode_num") and isinstance(getattr(m, "value", None), (int, float))
    }
    if counts.get("num_draft_tokens"):
        counts["acceptance_rate"] = counts.get("num_accepted_tokens", 0) / counts["num_draft_tokens"]
    return counts


def run_engine_isolated(
    spec: EngineSpec, model: str, prompts: list[list[int]], max_model_len: int = 2048, **kwargs
) -> dict:
    """run_engine in a fresh process: a compiled engine (torch.compile'd n-gram proposer) keeps
    memory that makes the next engine's memory profiler in the same process fail, and vLLM 0.26's V2
    model runner trips the CUDA caching allocator when a second engine starts in the same process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        job = pool.submit(_set_up_then_run, spec, model, prompts, max_model_len=max_model_len, **kwargs)
        return job.result()


SETUP_ENV = "MLA_E2E_ENGINE_SETUP"  # "module:function" that an isolated engine's process calls first


def _set_up_then_run(*args, **kwargs) -> dict:
    """run_engine after the patches the parent process applied (a spawned process has none of them)."""
    import importlib

    for target in filter(None, os.environ.get(SETUP_ENV, "").split(",")):
        module, name = target.split(":")
        getattr(importlib.import_module(module), name)()
    return run_engine(*args, **kwargs)


def top2_gap(step_logprobs: dict) -> float:
    values = sorted((lp.logprob for lp in step_logprobs.values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else float("inf")


def release_engine() -> None:
    """Free the engine's GPU memory and wait until free memory stops changing: the next engine's
    memory profiler fails if memory is released while it measures."""
    from vllm.distributed import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    previous = -1
    for _ in range(30):
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        if free == previous:
            return
        previous = free
        time.sleep(1.0)


def decode_tokens_per_s(spec: EngineSpec, model: str, batch: int, context: int, new_tokens: int) -> dict:
    """Decode throughput of one backend (see mla_backend.tools.demo.decode_throughput)."""
    from vllm import LLM

    from mla_backend.tools.demo import decode_throughput, random_prompts

    assert spec.graphs and not spec.spec_tokens, "throughput is measured with full graphs, no speculation"
    kwargs = engine_kwargs(replace(spec, max_num_seqs=batch), model, context + new_tokens + 16, memory_fraction=0.3)
    try:
        llm = LLM(**kwargs)
        rate = decode_throughput(llm, random_prompts(batch, context, 2048), new_tokens)
        del llm
    finally:
        release_engine()
    return {"name": spec.name, "batch": batch, "context": context, "new_tokens": new_tokens, "tokens_per_s": rate}
