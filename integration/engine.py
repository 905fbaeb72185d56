"""One vLLM engine run for the end-to-end checks: greedy generation with logprobs, plus, for our
backend, a check of forward_mqa's output on the real paged cache against the float64 reference.

Engines run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the check can wrap the impl."""

from __future__ import annotations

import gc
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from mla_backend.reference import ROW_ERROR_TOLERANCE, mla_decode_reference  # noqa: E402

KV_DTYPES = {"fp8": torch.float8_e4m3fn, "auto": torch.bfloat16}  # vLLM's --kv-cache-dtype -> torch, bf16 model


@dataclass
class EngineSpec:
    backend: str  # CUSTOM (ours), FLASHMLA, FLASH_ATTN_MLA, TRITON_MLA
    kv_cache_dtype: str = "auto"  # auto (= bf16 model dtype) or fp8
    block_size: int = 64
    graphs: bool = True  # full CUDA graphs for decode; False = enforce_eager
    spec_tokens: int = 0  # n-gram speculative tokens
    mla_backend: dict = field(default_factory=dict)  # additional_config["mla_backend"]
    max_num_seqs: int = 16

    @property
    def name(self) -> str:
        parts = [self.backend, "fp8" if self.kv_cache_dtype == "fp8" else "bf16", f"b{self.block_size}",
                 "graph" if self.graphs else "eager"]
        if self.spec_tokens:
            parts.append(f"ngram{self.spec_tokens}")
        parts += [f"{k}={v}" for k, v in self.mla_backend.items()]
        return " ".join(parts)


class DecodeChecker:
    """Wraps an MLA impl's forward_mqa (ours, or a reference backend's): counts query lengths and
    compares a few eager calls per query length with the float64 reference on the real KV cache."""

    def __init__(self, impl_cls, checks_per_q_len: int = 3):
        self.impl_cls = impl_cls
        self.checks_per_q_len = checks_per_q_len
        self.q_lens: Counter = Counter()
        self.checked: Counter = Counter()
        self.worst: dict[int, float] = {}
        self.problems: set[str] = set()
        self._original = None

    def __enter__(self):
        self._original = original = self.impl_cls.forward_mqa
        checker = self

        def forward_mqa(impl, q, kv_cache, metadata, layer):
            out, lse = original(impl, q, kv_cache, metadata, layer)
            try:
                checker.observe(impl, q, kv_cache, metadata, layer, out)
            except Exception as err:  # a checker problem is reported, never hidden
                checker.problems.add(repr(err)[:200])
            return out, lse

        self.impl_cls.forward_mqa = forward_mqa
        return self

    def __exit__(self, *exc):
        self.impl_cls.forward_mqa = self._original

    def observe(self, impl, q, kv_cache, metadata, layer, out):
        query = torch.cat(q, dim=-1) if isinstance(q, tuple) else q
        tokens, heads, dim = query.shape
        if tokens % metadata.num_decodes:  # a varlen batch (FLASH_ATTN_MLA decodes short prefills)
            return
        q_len = tokens // metadata.num_decodes
        self.q_lens[q_len] += 1
        # Graph capture cannot sync; warm-up batches (every request only its new tokens) prove nothing.
        if torch.cuda.is_current_stream_capturing() or metadata.max_seq_len <= q_len \
                or self.checked[q_len] >= self.checks_per_q_len:
            return
        fp8_kv = impl.kv_cache_dtype.startswith("fp8")
        k_scale = layer._k_scale_float if fp8_kv else 1.0
        q_scale = layer._q_scale_float if query.dtype == torch.float8_e4m3fn else 1.0
        decode = metadata.decode
        want, _ = mla_decode_reference(
            query.view(metadata.num_decodes, q_len, heads, dim), kv_cache, decode.block_table, decode.seq_lens,
            impl.scale * q_scale * k_scale, k_scale,
        )
        want = want.reshape(tokens, heads, -1)
        got = out.reshape(tokens, heads, -1).double()
        norms = want.norm(dim=-1)
        seen = norms > 0  # rows of empty requests (warm-up and padding) are zero in both
        if not seen.any():
            return
        self.checked[q_len] += 1
        error = ((got - want).norm(dim=-1)[seen] / norms[seen]).max().item()
        if not torch.isfinite(got).all():
            error = float("inf")
        self.worst[q_len] = max(self.worst.get(q_len, 0.0), error)


def engine_kwargs(spec: EngineSpec, model: str, max_model_len: int, memory_fraction: float) -> dict:
    """vLLM LLM(...) arguments for one engine of the matrix."""
    kwargs = dict(
        model=model, skip_tokenizer_init=True, dtype="bfloat16", seed=0, max_model_len=max_model_len,
        max_num_seqs=spec.max_num_seqs, gpu_memory_utilization=memory_fraction, kv_cache_dtype=spec.kv_cache_dtype,
        block_size=spec.block_size, attention_backend=spec.backend, enforce_eager=not spec.graphs,
        additional_config={"mla_backend": spec.mla_backend} if spec.mla_backend else {},
        enable_prefix_caching=False,
    )
    if spec.graphs:  # full graphs for decode without an inductor compile: quick to start
        kwargs["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    if spec.spec_tokens:
        # A random model does not copy its prompt: a 1-token lookup still finds drafts in long prompts.
        kwargs["speculative_config"] = {"method": "ngram_gpu", "num_speculative_tokens": spec.spec_tokens,
                                        "prompt_lookup_min": 1, "prompt_lookup_max": 3}
        if spec.graphs:  # the GPU n-gram proposer is a torch.compile'd module
            kwargs["compilation_config"] = {"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"}
    return kwargs


def run_engine(spec: EngineSpec, model: str, prompts: list[list[int]], max_tokens: int = 32,
               logprobs: int = 2, max_model_len: int = 2048) -> dict:
    """Generate greedily; returns tokens, top-2 logprob gaps, timings and the decode check."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = engine_kwargs(spec, model, max_model_len, memory_fraction=0.15)
    result: dict = {"spec": asdict(spec), "name": spec.name}
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    load_general_plugins()  # what the engine does first: registers CUSTOM through our entry point
    checker = DecodeChecker(AttentionBackendEnum[spec.backend].get_class().get_impl_cls())
    started = time.perf_counter()
    try:
        from mla_backend.vllm import backend as ours

        ours.ROUTES_CHOSEN.clear()
        with checker:
            llm = LLM(**kwargs)
            result["init_s"] = time.perf_counter() - started
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, ignore_eos=True)
            begun = time.perf_counter()
            outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            result["generate_s"] = time.perf_counter() - begun
            del llm
        result["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
        result["gaps"] = [[top2_gap(step) for step in o.outputs[0].logprobs] for o in outputs]
        result["routes"] = sorted(ours.ROUTES_CHOSEN)
        result["q_lens"] = dict(checker.q_lens)
        result["checked"] = dict(checker.checked)
        result["max_rel_error"] = checker.worst
        result["tolerance"] = ROW_ERROR_TOLERANCE[KV_DTYPES[spec.kv_cache_dtype]]
        result["check_problems"] = sorted(checker.problems)
    finally:
        release_engine()
    return result


def run_engine_isolated(spec: EngineSpec, model: str, prompts: list[list[int]]) -> dict:
    """run_engine in a fresh process: a compiled engine (torch.compile'd n-gram proposer) keeps
    memory that makes the next engine's memory profiler in the same process fail."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_engine, spec, model, prompts).result()


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
    """Decode throughput of one backend (see mla_backend.demo.decode_throughput)."""
    from vllm import LLM

    from mla_backend.demo import decode_throughput, random_prompts

    assert spec.graphs and not spec.spec_tokens, "throughput is measured with full graphs, no speculation"
    kwargs = engine_kwargs(replace(spec, max_num_seqs=batch), model, context + new_tokens + 16, memory_fraction=0.3)
    try:
        llm = LLM(**kwargs)
        rate = decode_throughput(llm, random_prompts(batch, context, 2048), new_tokens)
        del llm
    finally:
        release_engine()
    return {"name": spec.name, "batch": batch, "context": context, "new_tokens": new_tokens, "tokens_per_s": rate}
