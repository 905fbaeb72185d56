"""One SGLang engine for the end-to-end check (integration/sglang_e2e.py): greedy tokens with top-2
logprobs, then decode tokens/s; each engine in a process of its own (run_isolated runs this file,
which reads its settings as JSON on stdin and prints its result as one JSON line). Where FlashInfer or
DeepGEMM is not installed, the process gets its stand-in package from stand_ins/ (stand_in_env). A sparse
engine (``sparse``: DeepSeek-V3.2, GLM-5) runs SGLang's dsa backend with ``decode`` as its decode
sub-backend (sparse_settings). start_refused starts one that our backend must stop at start-up, and
reports how it ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # run_isolated's engine process: the checkout's integration after the installed
    sys.path.append(str(Path(__file__).resolve().parents[2]))  # packages, so that mla_backend stays the wheel's

from integration.engines.entry_point_dir import path_with  # noqa: E402
from integration.engines.text_only import has_vision_tower  # noqa: E402

NEW_TOKENS = 32
PAGE_SIZE = 64  # the servers' (sglang_server.py); engines take theirs from engine_args, SGLang's default (1) without
THROUGHPUT = dict(batch=32, context=2048, new_tokens=128)
REFUSAL_TIMEOUT_S = 300  # start-up to the backend's factory: config, dummy weights, memory pools
DSA_PAGE_SIZE = 64  # SGLang's DSA pool and indexer assert it


def run_engine(
    model: str,
    prompts: list[list[int]],
    decode: str,
    kv: str,
    graphs: bool,
    greedy_only: bool = False,
    engine_args: dict | None = None,
    sparse: bool = False,
    also_alone: bool = False,
) -> dict:
    """One engine (this process): greedy tokens with top-2 logprobs, then decode tokens/s.
    ``engine_args``: further sglang.Engine arguments (a refused family's ``load_format``, a page size:
    without one the engine runs SGLang's default page of 1). ``sparse``: a DSA model (sparse_settings).
    ``also_alone``: then each prompt again in a batch of its own (``alone_tokens``): where the two part,
    the engine's own tokens hang on the batch's rounding (a tie for the tie rule)."""
    import sglang
    import torch

    settings = sparse_settings if sparse else engine_settings
    engine = sglang.Engine(**{**settings(model, decode, kv, graphs), **(engine_args or {})})
    try:
        greedy = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=greedy, return_logprob=True, top_logprobs_num=2)
        tokens = [o["output_ids"] for o in outs]
        gaps = [[step[0][0] - step[1][0] for step in o["meta_info"]["output_top_logprobs"]] for o in outs]
        greedy_run = {"tokens": tokens, "gaps": gaps}
        if also_alone:
            alone = [engine.generate(input_ids=[p], sampling_params=greedy)[0] for p in prompts]
            greedy_run["alone_tokens"] = [o["output_ids"] for o in alone]
        if greedy_only:
            return greedy_run
        gen = torch.Generator().manual_seed(7)
        batch = [
            torch.randint(0, 2048, (THROUGHPUT["context"],), generator=gen).tolist() for _ in range(THROUGHPUT["batch"])
        ]
        rate = decode_throughput(engine, batch, THROUGHPUT["new_tokens"])
    finally:
        engine.shutdown()
    return {**greedy_run, "tokens_per_s": rate}


def engine_settings(model: str, decode: str, kv: str, graphs: bool) -> dict:
    """sglang.Engine arguments of one engine of the run; no page size (SGLang's default) unless the run's
    engine_args give one."""
    return dict(
        model_path=model,
        skip_tokenizer_init=True,
        prefill_attention_backend="triton",
        decode_attention_backend=decode,
        kv_cache_dtype=kv,
        disable_cuda_graph=not graphs,
        cuda_graph_max_bs_decode=THROUGHPUT["batch"],
        disable_radix_cache=True,
        sampling_backend="pytorch",
        grammar_backend="none",
        mem_fraction_static=0.5,
        log_level="warning",
        enable_multimodal=False if has_vision_tower(model) else None,  # the prompts are token ids: text alone
    )


def sparse_settings(model: str, decode: str, kv: str, graphs: bool) -> dict:
    """sglang.Engine arguments of one engine of a DSA model: SGLang's dsa backend with ``decode`` as its
    decode sub-backend (``--dsa-decode-backend``; ``mla_backend`` for ours), its prefill sub-backend
    SGLang's default (on SM90 flashmla_sparse for a bf16 cache, flashmla_kv for fp8: the same for every
    engine of a run), page 64; otherwise engine_settings'."""
    dense = engine_settings(model, decode, kv, graphs)
    del dense["prefill_attention_backend"], dense["decode_attention_backend"]
    return {**dense, "attention_backend": "dsa", "dsa_decode_backend": decode, "page_size": DSA_PAGE_SIZE}


def decode_throughput(engine, prompts: list[list[int]], new_tokens: int, repeats: int = 3) -> float:
    """Decode tokens/s of an ``sglang.Engine``, measured as under vLLM (mla_backend.tools.demo's
    paired_decode_rate; the radix cache is off, so each run recomputes the prefill that cancels out)."""
    from mla_backend.tools.demo import paired_decode_rate

    def seconds(n: int) -> float:
        params = {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}
        begun = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=params)
        return time.perf_counter() - begun

    return paired_decode_rate(seconds, len(prompts), new_tokens, repeats)


STAND_INS = Path(__file__).with_name("stand_ins")  # stand_ins/<package>/<package>/
STAND_IN_PACKAGES = ("flashinfer", "deep_gemm")
# A sparse engine's indexer scores with mla_backend's plugin where deep_gemm cannot be found
# (mla_backend/sglang/dsa.py's indexer_without_deep_gemm asks find_spec): the stand-in would be found and
# leave SGLang's indexer calling kernels it lacks. The plugin's shim also takes the stand-in's place where
# SGLang 0.5.17's DSA backend module imports deep_gemm; nothing else on a DSA model's path imports it
# without a guard.
SPARSE_STAND_IN_PACKAGES = ("flashinfer",)


def stand_in_env(environ: dict[str, str], packages: tuple[str, ...] = STAND_IN_PACKAGES) -> dict[str, str]:
    """Variables an engine process needs where FlashInfer or DeepGEMM is not installed (the lent GPU's
    image): each absent package of ``packages``' stand-in on its path, and SGLang told not to use an absent
    one (its JIT DeepGEMM imports deep_gemm's submodules wherever deep_gemm imports); none where all are
    installed."""
    import importlib.util

    absent = [name for name in STAND_IN_PACKAGES if importlib.util.find_spec(name) is None]
    if not absent:
        return {}
    env = {"PYTHONPATH": environ.get("PYTHONPATH", "")}
    for name in reversed([name for name in absent if name in packages]):
        env["PYTHONPATH"] = path_with(STAND_INS / name, env)
    if "flashinfer" in absent:
        env["SGLANG_IS_FLASHINFER_AVAILABLE"] = "false"
    if "deep_gemm" in absent:
        env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "false"
    return env


def engine_env(extra: dict[str, str], packages: tuple[str, ...] = STAND_IN_PACKAGES) -> dict[str, str]:
    """An engine process's environment: ours with ``extra`` (whose PYTHONPATH, where given, already
    holds ours), then the stand-ins of ``packages`` ahead of that path where FlashInfer or DeepGEMM is absent."""
    env = {**os.environ, **extra}
    return {**env, **stand_in_env(env, packages)}


def run_isolated(
    model: str,
    prompts: list[list[int]],
    decode: str,
    kv: str,
    graphs: bool,
    log: Path,
    greedy_only: bool = False,
    env: dict | None = None,
    engine_args: dict | None = None,
    sparse: bool = False,
    also_alone: bool = False,
) -> dict:
    """run_engine in a process of its own, its stderr appended to ``log``; {"error": ...} where it failed.
    ``engine_args``: further sglang.Engine arguments (a parallel layout); ``sparse``: a DSA model, served
    by SGLang's dsa backend with ``decode`` its decode sub-backend, without the DeepGEMM stand-in;
    ``also_alone``: run_engine's."""
    spec = {"model": model, "prompts": prompts, "decode": decode, "kv": kv, "graphs": graphs}
    spec |= {"engine_args": engine_args, "sparse": sparse, "also_alone": also_alone}
    packages = SPARSE_STAND_IN_PACKAGES if sparse else STAND_IN_PACKAGES
    with open(log, "a") as sink:
        done = subprocess.run(
            [sys.executable, __file__],
            input=json.dumps({**spec, "greedy_only": greedy_only}),
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
            env=engine_env(env or {}, packages),
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}; see {log.name}"}
    return json.loads(lines[-1])


def start_refused(
    model: str, log: Path, env: dict[str, str] | None = None, timeout_s: float = REFUSAL_TIMEOUT_S
) -> dict:
    """An engine with our decode backend (``env``: its settings) on dummy weights, in a process session
    of its own, its stderr written to ``log``; once it ends (or is killed at ``timeout_s``): its exit
    status, whether it timed out or served (printed tokens), and the processes of its session still
    alive (none, where SGLang took down what it started). Those are then killed."""
    spec = {"model": model, "prompts": [[1, 2, 3]], "decode": "mla_backend", "kv": "auto", "graphs": False}
    spec |= {"greedy_only": True, "engine_args": {"load_format": "dummy"}}
    # Its output to a file, not a pipe: a process it leaves behind would hold a pipe open, and the wait
    # is for the engine's own process.
    with open(log, "w") as sink, tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=sink,
            text=True,
            env=engine_env(env or {}),
            start_new_session=True,  # its processes share its id as their group: found and killed by it
        )
        assert child.stdin is not None  # stdin=PIPE
        with contextlib.suppress(BrokenPipeError), child.stdin as spec_in:  # an engine may die unread
            spec_in.write(json.dumps(spec))
        try:
            child.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            timed_out = True
        out.seek(0)
        served = any(line.startswith("{") for line in out.read().splitlines())
    left_over = session_processes(child.pid)
    if left_over:
        os.killpg(child.pid, signal.SIGKILL)
        session_processes(child.pid)  # until they are gone
    return {"returncode": child.returncode, "timed_out": timed_out, "served": served, "left_over": left_over}


def session_processes(session: int, grace_s: float = 10.0) -> list[str]:
    """Live processes (zombies left out) of a process group, after up to ``grace_s`` for them to end."""
    import psutil

    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for proc in psutil.process_iter(["name", "status"]):
            try:
                if os.getpgid(proc.pid) == session and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    alive.append(f"{proc.pid} {proc.info['name']}")
            except (ProcessLookupError, psutil.Error):
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


if __name__ == "__main__":
    spec = json.loads(sys.stdin.read())
    run = run_engine(
        spec["model"],
        spec["prompts"],
        spec["decode"],
        spec["kv"],
        spec["graphs"],
        spec["greedy_only"],
        spec.get("engine_args"),
        spec.get("sparse", False),
        spec.get("also_alone", False),
    )
    print(json.dumps(run), flush=True)
