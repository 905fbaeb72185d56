"""`python -m mla_backend demo`: decode a small seeded DeepSeek-V3 through vLLM with the plugin.

On a GPU: builds the checkpoint (transformers), starts vLLM with ``attention_backend="CUSTOM"``
and an fp8 KV cache, and prints decode tokens/s and the kernel that served decode. Without a GPU:
says so and runs the op on CPU tensors (the float64 reference path).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .doctor import importable


def paired_decode_rate(seconds: Callable[[int], float], requests: int, new_tokens: int, repeats: int = 3) -> float:
    """Decode tokens/s of any engine from ``seconds(n)``, the time to generate n new tokens for each
    of ``requests`` prompts: time(new_tokens) - time(1), so the prefill cancels out, after one warm-up
    pair; the median over ``repeats`` pairs (a single pair varies by tens of percent on a small model)."""
    seconds(1), seconds(new_tokens)  # warm-up
    rates = []
    for _ in range(repeats):
        short = seconds(1)
        rates.append(requests * (new_tokens - 1) / (seconds(new_tokens) - short))
    return statistics.median(rates)


def decode_throughput(llm, prompts, new_tokens: int, repeats: int = 3) -> float:
    """Decode tokens/s of a vLLM ``LLM`` (paired_decode_rate)."""
    from vllm import SamplingParams

    def seconds(n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        torch.cuda.synchronize()
        begun = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        return time.perf_counter() - begun

    return paired_decode_rate(seconds, len(prompts), new_tokens, repeats)


def random_prompts(batch: int, length: int, vocab: int, seed: int = 1):
    from vllm.inputs import TokensPrompt

    generator = torch.Generator().manual_seed(seed)
    return [
        TokensPrompt(prompt_token_ids=torch.randint(0, vocab, (length,), generator=generator).tolist())
        for _ in range(batch)
    ]


def run_on_gpu(batch: int, context: int, new_tokens: int, heads: int) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: we can ask it
    from vllm import LLM

    from ..vllm import backend
    from .demo_model import DEMO_MODEL_SETTINGS, save_demo_model

    model = save_demo_model(Path(tempfile.gettempdir()) / f"mla_backend_demo_h{heads}", heads=heads)
    print(f"model: seeded DeepSeek-V3, {heads} heads, 2 dense layers, kv_lora_rank 512, rope 64 ({model})")
    llm = LLM(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        attention_backend="CUSTOM",
        kv_cache_dtype="fp8",
        block_size=64,
        max_num_seqs=batch,
        max_model_len=context + new_tokens + 16,
        gpu_memory_utilization=0.3,
        enable_prefix_caching=False,
        # full CUDA graphs for decode without an inductor compile: starts in seconds
        compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"},
    )
    rate = decode_throughput(llm, random_prompts(batch, context, DEMO_MODEL_SETTINGS["vocab_size"]), new_tokens)
    print(
        f"decode: {rate:,.0f} tokens/s (batch {batch}, context {context}, {new_tokens} new tokens, fp8 KV, "
        f"CUDA graphs) on {torch.cuda.get_device_name()}"
    )
    routes = [route.describe() for worker in llm.apply_model(backend.model_routes) for route in worker]
    print(f"MLA decode route: {'; '.join(routes) or 'none (no layer runs mla_backend)'}")
    return 0


def run_on_cpu() -> int:
    from .. import mla_decode
    from ..inputs import make_paged_problem
    from ..reference import mla_decode_reference

    print("no CUDA GPU visible: running the op on CPU tensors (the float64 reference path) instead of vLLM")
    p = make_paged_problem([70, 300], q_len=2, heads=16, page_size=64, seed=0)
    out, lse = mla_decode(
        p.query,
        p.kv_cache,
        None,
        p.block_tables,
        p.seq_lens,
        p.max_seq_len,
        bmm1_scale=576**-0.5,
        return_lse=True,
    )
    want, _ = mla_decode_reference(p.query, p.kv_cache, p.block_tables, p.seq_lens, 576**-0.5)
    error = ((out.double() - want).norm() / want.norm()).item()
    print(f"op: out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}; relative error vs float64 {error:.1e}")
    return 0


def main(batch: int = 32, context: int = 2048, new_tokens: int = 128, heads: int = 16) -> int:
    if not torch.cuda.is_available():
        return run_on_cpu()
    if not importable("vllm"):
        print("vLLM is not installed: pip install 'mla-backend[vllm]'")
        return 1
    return run_on_gpu(batch, context, new_tokens, heads)
