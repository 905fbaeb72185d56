"""One vLLM engine of the end-to-end matrix (EngineSpec) and its ``LLM(...)`` arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

from integration.engines.text_only import has_vision_tower
from integration.settings import drafter_has_mla_layers


@dataclass
class EngineSpec:
    backend: str  # CUSTOM (ours), FLASHMLA, FLASH_ATTN_MLA, TRITON_MLA
    kv_cache_dtype: str = "auto"  # auto (= bf16 model dtype) or fp8
    block_size: int = 64
    graphs: bool = True  # full CUDA graphs for decode; False = enforce_eager
    spec_tokens: int = 0  # speculative tokens per step
    # ngram (vLLM's GPU n-gram proposer), mtp (DeepSeek-V3's: the checkpoint's MTP layer) or a family's
    # own MTP method as vLLM names it (glm4_moe_lite_mtp, ...; models/families.py's drafter)
    spec_method: str = "ngram"
    draft_model: str | None = None  # the drafter's checkpoint, for spec_method eagle or eagle3
    mla_backend: dict = field(default_factory=dict)  # additional_config["mla_backend"]
    max_num_seqs: int = 16
    tp: int = 1  # tensor parallel size (heads split over GPUs)
    dcp: int = 1  # decode context parallel size (KV split over GPUs; our LSE merges the parts)

    @property
    def is_mtp(self) -> bool:
        """The drafter is the checkpoint's own MTP layer (not the n-gram proposer)."""
        return self.spec_method == "mtp" or self.spec_method.endswith("_mtp")

    @property
    def name(self) -> str:
        parts = [
            self.backend,
            "fp8" if self.kv_cache_dtype == "fp8" else "bf16",
            f"b{self.block_size}",
            "graph" if self.graphs else "eager",
        ]
        if self.spec_tokens:
            parts.append(f"{self.spec_method} k={self.spec_tokens}")  # "eagle3 k=3", never "eagle33"
        parts += [f"tp{self.tp}"] if self.tp > 1 else []
        parts += [f"dcp{self.dcp}"] if self.dcp > 1 else []
        parts += [f"{k}={v}" for k, v in self.mla_backend.items()]
        return " ".join(parts)


def engine_kwargs(spec: EngineSpec, model: str, max_model_len: int, memory_fraction: float) -> dict:
    """vLLM LLM(...) arguments for one engine of the matrix."""
    kwargs = dict(
        model=model,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
        max_model_len=max_model_len,
        max_num_seqs=spec.max_num_seqs,
        gpu_memory_utilization=memory_fraction,
        kv_cache_dtype=spec.kv_cache_dtype,
        block_size=spec.block_size,
        attention_backend=spec.backend,
        enforce_eager=not spec.graphs,
        additional_config={"mla_backend": spec.mla_backend} if spec.mla_backend else {},
        enable_prefix_caching=False,
        tensor_parallel_size=spec.tp,
        decode_context_parallel_size=spec.dcp,
    )
    if has_vision_tower(model):  # the prompts are token ids: the text model alone
        kwargs["language_model_only"] = True
    if spec.graphs:  # full graphs for decode without an inductor compile: quick to start
        kwargs["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    if spec.spec_tokens:
        kwargs["disable_log_stats"] = False  # keeps the speculative-decoding counters
    # vLLM picks a drafter's attention backend itself unless the speculative config names one: named,
    # the drafter's MLA layers decode on the engine's backend (ours, or the reference's) as its own do.
    if spec.spec_tokens and spec.spec_method in ("eagle", "eagle3"):
        # A drafter checkpoint of its own with MLA layers (models/mistral_eagle_drafter.py, eagle3_drafter.py).
        assert spec.draft_model, "an Eagle run names its drafter's checkpoint"
        kwargs["speculative_config"] = {
            "method": spec.spec_method,
            "model": spec.draft_model,
            "num_speculative_tokens": spec.spec_tokens,
            "attention_backend": spec.backend,
        }
    elif spec.spec_tokens and spec.is_mtp:
        # The model's own drafter: the checkpoint's MTP layer, run k times.
        method = "deepseek_mtp" if spec.spec_method == "mtp" else spec.spec_method
        kwargs["speculative_config"] = {"method": method, "num_speculative_tokens": spec.spec_tokens}
        if drafter_has_mla_layers(method):
            kwargs["speculative_config"]["attention_backend"] = spec.backend
    elif spec.spec_tokens:
        # A random model does not copy its prompt: a 1-token lookup still finds drafts in long prompts.
        kwargs["speculative_config"] = {
            "method": "ngram_gpu",
            "num_speculative_tokens": spec.spec_tokens,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        }
        if spec.graphs:  # the GPU n-gram proposer is a torch.compile'd module
            kwargs["compilation_config"] = {"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"}
    return kwargs
