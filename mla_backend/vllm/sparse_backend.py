"""vLLM sparse MLA backend (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5) on mla_backend's sparse
kernels, for the same flag as dense MLA (``--attention-backend CUSTOM``, or ``MLA_BACKEND``).

vLLM keeps everything around the kernel: the indexer fills the shared top-k buffer (per-request token
positions, -1 for none; indexer_hook.py scores it where DeepGEMM cannot), vLLM's sparse metadata
builder gives each token its request, vLLM writes the cache (bf16 rows of 576, or fp8_ds_mla rows of
656 bytes) and runs short prefills as dense attention. Every token vLLM hands ``forward_mqa`` (decode,
MTP drafts, long prefills) goes through :func:`mla_backend.sparse.sparse_mla_decode` over the physical
slots its list names. The dense backend's class hands vLLM this one for sparse models (backend.py).
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
from vllm.config import VllmConfig, get_current_vllm_config, get_current_vllm_config_or_none
from vllm.config.cache import CacheDType
from vllm.logger import init_logger
from vllm.model_executor.layers.attention.sparse_mla_attention import (
    SparseMLACommonImpl,
    SparseMLACommonMetadataBuilder,
)
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport, AttentionLayer, AttentionType, MultipleOf
from vllm.v1.attention.backends.mla.sparse_utils import triton_convert_req_index_to_global_index
from vllm.v1.worker.workspace import is_workspace_manager_initialized

from ..config import BackendUnavailableError, MLABackendConfig
from ..route import Route, sparse_route
from ..sparse import sparse_mla_decode
from ..sparse_cache import DS_MLA_ROW_BYTES
from . import compat, kv_dtype_hook

logger = init_logger(__name__)

SPARSE_PAGE_SIZE = 64  # the indexer's cache and vLLM's slot conversion address pages of 64 tokens
LATENT_WITH_ROPE = 576  # DeepSeek Sparse Attention's MLA: 512 latent + 64 rope
# The cache dtypes vLLM hands a sparse backend: bf16 rows (auto / bfloat16) or DeepSeek's fp8_ds_mla.
SPARSE_KV_CACHE_DTYPES: list[CacheDType] = ["auto", "bfloat16", "fp8_ds_mla"]


def serves_sparse_model(vllm_config: VllmConfig | None) -> bool:
    """Whether the engine's model has DeepSeek Sparse Attention: its config names an indexer top-k,
    the field vLLM's DeepSeek-V2 family reads to build sparse MLA layers."""
    model_config = getattr(vllm_config, "model_config", None)
    return model_config is not None and hasattr(model_config.hf_text_config, "index_topk")


def sparse_refusal(
    kv_cache_dtype: str | None, block_size: int | None, capability: tuple[int, int], vllm_config: VllmConfig | None
) -> str | None:
    """Why our sparse kernels cannot serve this engine, or None."""
    from .backend import plugin_config  # the dense backend owns the settings' reading

    if kv_cache_dtype in kv_dtype_hook.FP8_NAMES and not kv_dtype_hook.installed():
        return (
            "mla_backend: sparse MLA reads fp8 KV as DeepSeek's fp8_ds_mla rows (per-128 scales, bf16 rope), "
            "which this vLLM does not choose for fp8 here: start it with --kv-cache-dtype fp8_ds_mla "
            "(or auto for bf16 KV)"
        )
    if block_size is not None and block_size != SPARSE_PAGE_SIZE:
        return f"mla_backend: sparse MLA needs --block-size {SPARSE_PAGE_SIZE} (the indexer's page), got {block_size}"
    if vllm_config is not None and vllm_config.parallel_config.decode_context_parallel_size > 1:
        return "mla_backend: sparse MLA does not take decode context parallelism (--decode-context-parallel-size 1)"
    try:
        sparse_route(plugin_config(vllm_config), capability)
    except BackendUnavailableError as err:
        return f"mla_backend: {err}"
    return None


def slot_rows(kv_cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """The cache as the rows vLLM's slot ids count: block id x the block's stride in rows + offset
    (from 0.33 another layer's pages may sit between two blocks of this one; those rows are never named)."""
    blocks, _, width = kv_cache.shape
    if kv_cache.stride(0) % width:
        raise ValueError(f"kv_cache blocks are not a whole number of rows apart (strides {kv_cache.stride()})")
    stride_rows = kv_cache.stride(0) // width
    return kv_cache.as_strided(((blocks - 1) * stride_rows + block_size, width), (width, 1))


def reserve_workspace() -> None:
    """Size vLLM's shared workspace for the split partials before vLLM locks it (growing it later
    raises); calls that would need more take fewer splits (launcher.choose_num_splits)."""
    from .backend import request_decode_workspace

    if is_workspace_manager_initialized():
        request_decode_workspace()


@functools.cache
def announce(route: Route) -> None:
    logger.info("mla_backend: sparse MLA route: %s", route.describe())


class MLASparseBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16]
    # fp8 / fp8_e4m3 are served as fp8_ds_mla, which vLLM then allocates (kv_dtype_hook.py).
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [*SPARSE_KV_CACHE_DTYPES, "fp8", "fp8_e4m3"]
    serves_fp8_as_ds_mla: ClassVar[bool] = True

    @staticmethod
    def get_name() -> str:
        return compat.registered_name()

    @staticmethod
    def get_impl_cls() -> type[MLASparseImpl]:
        return MLASparseImpl

    @staticmethod
    def get_builder_cls() -> type[MLASparseMetadataBuilder]:
        return MLASparseMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [LATENT_WITH_ROPE]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [SPARSE_PAGE_SIZE]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return True  # supports_combination names the GPUs the sparse kernels do not serve, with the reason

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: CacheDType | None,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        use_mm_prefix: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        capability = (device_capability.major, device_capability.minor)
        return sparse_refusal(kv_cache_dtype, block_size, capability, get_current_vllm_config_or_none())

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, cache_dtype_str: str = "auto"
    ) -> tuple[int, ...]:
        if cache_dtype_str == "fp8_ds_mla":
            return (num_blocks, block_size, DS_MLA_ROW_BYTES)
        return (num_blocks, block_size, head_size)


class MLASparseMetadataBuilder(SparseMLACommonMetadataBuilder):
    # vLLM's sparse metadata as it is (each token's request, the block table); our kernels plan each
    # call from its token count alone, so a full CUDA graph of a uniform decode batch replays as captured.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    metadata_cls = compat.sparse_metadata_cls()

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        reserve_workspace()
        # Speculative tokens decode as query tokens of their request (each token has its own list).
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)


class MLASparseImpl(SparseMLACommonImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.kv_cache_dtype not in SPARSE_KV_CACHE_DTYPES:  # fp8 reaches here only if vLLM kept the name
            raise ValueError(
                f"mla_backend: the sparse backend reads {SPARSE_KV_CACHE_DTYPES} caches, got {self.kv_cache_dtype!r}: "
                "start vLLM with --kv-cache-dtype fp8_ds_mla (or auto)"
            )
        attn_type = kwargs.get("attn_type", AttentionType.DECODER)
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError("mla_backend serves decoder self-attention only")
        from .backend import decode_workspace, detected_capability, plugin_config

        self.vllm_config = get_current_vllm_config()
        self.config: MLABackendConfig = plugin_config(self.vllm_config)
        self.route = sparse_route(self.config, detected_capability())
        announce(self.route)
        self._workspace = decode_workspace

    def reserve_workspace(self) -> None:  # vLLM >= 0.33 asks during memory profiling
        reserve_workspace()

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if compat.sparse_base_converts_indices():  # vLLM >= 0.33: the base converts, then calls the kernel below
            return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)
        tokens = (q[0] if isinstance(q, tuple) else q).shape[0]
        assert self.topk_indices_buffer is not None
        topk = self.topk_indices_buffer[:tokens]
        slots, valid_counts = triton_convert_req_index_to_global_index(
            attn_metadata.req_id_per_token[:tokens],
            attn_metadata.block_table,
            topk,
            BLOCK_SIZE=attn_metadata.block_size,
            NUM_TOPK_TOKENS=topk.shape[1],
            return_valid_counts=True,
        )
        return self._forward_mqa_kernel(
            q, kv_c_and_k_pe_cache, slots, valid_counts, layer=layer, block_size=attn_metadata.block_size
        )

    def _forward_mqa_kernel(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        topk_indices: torch.Tensor,
        valid_counts: torch.Tensor,
        *,
        layer: AttentionLayer,
        block_size: int,
        is_decode: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every token's list of physical slots (-1: none; vLLM's top-k writes its valid entries first,
        the count of which bounds each list) through the sparse kernels: (out [T, H, 512], LSE or None)."""
        query = torch.cat(q, dim=-1) if isinstance(q, tuple) else q
        return_lse = bool(getattr(self, "need_to_return_lse_for_decode", False))
        result = sparse_mla_decode(
            query,
            slot_rows(kv_cache, block_size),
            topk_indices,
            self.scale,
            topk_lens=valid_counts,
            return_lse=return_lse,
            workspace_buffer=self._workspace(query.device),
            config=self.config,
        )
        return result if return_lse else (result, None)


__all__ = ["MLASparseBackend", "MLASparseImpl", "MLASparseMetadataBuilder", "serves_sparse_model"]
