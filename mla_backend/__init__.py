"""mla_backend: fast MLA (DeepSeek-V3/R1) decode for vLLM, SM120 first.

FlashInfer's MLA decode functions and its ``BatchMLAPagedAttentionWrapper`` are here under their own
names, signatures and conventions, so switching is a change of import; ``mla_decode`` is the package's own
op (natural-log LSE), ``sparse_mla_decode`` its sparse op (DeepSeek Sparse Attention: per-token
top-k index lists over a bf16 or fp8_ds_mla cache), and ``plan_decode`` plans a step's split-KV once
for all its layers' calls; ``fp8_fp4_mqa_logits`` and ``fp8_fp4_paged_mqa_logits`` score the sparse
indexer's tokens as DeepGEMM's functions of those names do, in torch (``mla_backend.indexer``);
``resolve_route`` says which kernel serves a decode, and why.
"""

from .config import BackendUnavailableError, MLABackendConfig
from .decode import mla_decode
from .flashinfer_api import (
    batch_mla_paged_attention,
    trtllm_batch_decode_with_kv_cache_mla,
    xqa_batch_decode_with_kv_cache_mla,
)
from .flashinfer_wrapper import BatchMLAPagedAttentionWrapper
from .indexer import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits
from .launcher import DecodePlan
from .reference import mla_decode_reference
from .route import DecodeShape, Route, resolve_route
from .sparse import sparse_mla_decode
from .step_plan import plan_buffer, plan_decode

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "BatchMLAPagedAttentionWrapper",
    "DecodePlan",
    "DecodeShape",
    "MLABackendConfig",
    "Route",
    "batch_mla_paged_attention",
    "fp8_fp4_mqa_logits",
    "fp8_fp4_paged_mqa_logits",
    "mla_decode",
    "mla_decode_reference",
    "plan_buffer",
    "plan_decode",
    "resolve_route",
    "sparse_mla_decode",
    "trtllm_batch_decode_with_kv_cache_mla",
    "xqa_batch_decode_with_kv_cache_mla",
]
