"""The one place that knows how the supported vLLM releases (0.26 through 0.33) differ.

Feature detection, not version numbers, so a release in between gets whatever its API offers:
- ``is_quantized_kv_cache`` lives in ``vllm.utils.torch_utils`` up to 0.32, in
  ``vllm.v1.kv_cache_interface`` from 0.33;
- named registration of out-of-tree backends (``AttentionBackendEnum.register``) exists from
  0.32: there the backend is also selectable as ``--attention-backend MLA_BACKEND``;
- ``supports_dcp`` defaults to False from 0.30 (an opt-in the impl sets on every version);
- ``reserve_workspace()`` on the impl is called during memory profiling from 0.33;
- ``get_supported_kernel_block_sizes`` takes ``kv_cache_spec`` from 0.31;
- non-causal multi-token decode metadata (``causal=False``) exists from 0.27, sent only to
  builders that opt in, which this one does not;
- sparse MLA: the metadata dataclass (``SparseMLACommonMetadata``) and the impl base's own
  ``forward_mqa`` (top-k to physical slots, then ``_forward_mqa_kernel``) exist from 0.33; before,
  each sparse backend declares its metadata and converts the indices itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Our own name for --attention-backend where vLLM registers out-of-tree backends by name.
NAMED_BACKEND = "MLA_BACKEND"


def has_named_registration() -> bool:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return callable(getattr(AttentionBackendEnum, "register", None))


def register_named(class_path: str) -> bool:
    """Register ``class_path`` as ``AttentionBackendEnum.MLA_BACKEND``; False where vLLM cannot."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if not has_named_registration():
        return False
    if NAMED_BACKEND in AttentionBackendEnum.__members__:  # registered before: point it at us again
        register_backend(AttentionBackendEnum[NAMED_BACKEND], class_path)
    else:
        register_backend(NAMED_BACKEND, class_path)
    return True


def registered_name() -> str:
    """The enum member our backend class maps back to: MLA_BACKEND where it was registered, else CUSTOM."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return NAMED_BACKEND if NAMED_BACKEND in AttentionBackendEnum.__members__ else "CUSTOM"


def backend_names() -> list[str]:
    """What ``--attention-backend`` accepts for this backend in the running vLLM."""
    return ["CUSTOM", NAMED_BACKEND] if has_named_registration() else ["CUSTOM"]


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    try:
        from vllm.v1.kv_cache_interface import is_quantized_kv_cache as quantized
    except ImportError:  # vLLM <= 0.32
        from vllm.utils.torch_utils import is_quantized_kv_cache as quantized
    return quantized(kv_cache_dtype)


def is_non_causal(attn_metadata) -> bool:
    """True for a non-causal multi-token decode block (vLLM >= 0.27), which our kernels do not compute."""
    return getattr(attn_metadata, "causal", True) is False


@functools.cache  # asked on every forward_mqa
def sparse_base_converts_indices() -> bool:
    """True where vLLM's sparse MLA impl base converts the top-k to slots and calls ``_forward_mqa_kernel``."""
    from vllm.model_executor.layers.attention.sparse_mla_attention import SparseMLACommonImpl

    return hasattr(SparseMLACommonImpl, "_forward_mqa_kernel")


@functools.cache
def sparse_metadata_cls() -> type:
    """The metadata class vLLM's sparse builder base fills: vLLM's own where it has one, else the
    fields its ``build`` passes (0.26-0.32)."""
    from vllm.model_executor.layers.attention import sparse_mla_attention

    common = getattr(sparse_mla_attention, "SparseMLACommonMetadata", None)
    if common is not None:
        return common
    from vllm.model_executor.layers.attention.mla_attention import MLACommonPrefillMetadata
    from vllm.v1.attention.backend import AttentionMetadata

    @dataclass
    class SparseMLAMetadata(AttentionMetadata):
        num_reqs: int
        max_query_len: int
        max_seq_len: int
        num_actual_tokens: int
        query_start_loc: torch.Tensor
        slot_mapping: torch.Tensor
        block_table: torch.Tensor
        req_id_per_token: torch.Tensor
        block_size: int = 64
        topk_tokens: int = 2048
        num_decodes: int = 0
        num_prefills: int = 0
        num_decode_tokens: int = 0
        seq_lens: torch.Tensor | None = None
        prefill_max_seq_len: int = 0
        prefill: MLACommonPrefillMetadata | None = None
        cp_kv_cache_interleave_size: int = 1

    return SparseMLAMetadata


__all__ = [
    "NAMED_BACKEND",
    "backend_names",
    "has_named_registration",
    "is_non_causal",
    "is_quantized_kv_cache",
    "register_named",
    "registered_name",
    "sparse_base_converts_indices",
    "sparse_metadata_cls",
]
