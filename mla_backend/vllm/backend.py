"""vLLM MLA attention backend on mla_backend's decode kernels (prefill stays vLLM's), vLLM 0.26-0.33.

Enabled with ``--attention-backend CUSTOM`` (and ``MLA_BACKEND`` from vLLM 0.32; registered by
:func:`mla_backend.vllm.register`; release differences live in :mod:`mla_backend.vllm.compat`),
configured with ``--additional-config '{"mla_backend": {...}}'`` or ``MLA_BACKEND_*`` variables.
Decode runs the engine's route (mla_backend/route.py, resolved once per engine): ``bundled`` (our
kernels), ``trtllm-gen`` (FlashInfer on SM100/103), ``flashmla`` (vLLM's, with ``auto`` on SM90 for
the shape classes it is measured faster at) or ``fallback`` (vLLM's portable Triton MLA decode).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from pydantic import ValidationError
from vllm.config import VllmConfig, get_current_vllm_config, get_current_vllm_config_or_none
from vllm.config.cache import CacheDType
from vllm.logger import init_logger
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    QueryLenSupport,
    get_mla_dims,
)
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import AttentionCGSupport, AttentionLayer, AttentionType, MultipleOf
from vllm.v1.worker.workspace import current_workspace_manager, is_workspace_manager_initialized

from .. import shapes
from ..checks import query_layout_problem
from ..config import MLABackendConfig, format_validation_error
from ..decode import mla_decode
from ..launcher import DecodePlan
from ..route import DecodeShape, Engine, Route, gpu_route, resolve_route
from ..step_plan import plan_buffer, plan_decode
from . import compat, fallback, flashmla, sparse_backend
from .drafter import drafter_hint

logger = init_logger(__name__)

# Split-KV scratch of the bundled kernels, taken from vLLM's shared workspace. The split choice
# never asks for more than this (it caps the split count by the workspace it is given).
DECODE_WORKSPACE_BYTES = 128 << 20
MIN_CAPABILITY = DeviceCapability(8, 0)  # the portable fallback's floor (bf16)


def plugin_config(vllm_config: VllmConfig | None) -> MLABackendConfig:
    """Settings from ``additional_config["mla_backend"]`` over the environment, validated."""
    additional = vllm_config.additional_config if vllm_config is not None else None
    try:
        return MLABackendConfig.from_additional_config(additional)
    except ValidationError as err:  # one readable line per bad setting, for vLLM's start-up error
        raise ValueError(format_validation_error(err)) from None


def vllm_engine() -> Engine:
    """What vLLM offers beside our kernels: its Triton MLA decode, and FlashMLA's where it ships one."""
    return Engine("vLLM", "vLLM's Triton MLA decode", "vLLM's Triton MLA kernel", flashmla.available())


def query_tokens_per_request(vllm_config: VllmConfig) -> int:
    spec = vllm_config.speculative_config
    return 1 + (spec.num_speculative_tokens if spec is not None else 0)


def max_decode_tokens(vllm_config: VllmConfig) -> int:
    """Most query tokens one decode step can carry: requests x (1 + speculative tokens)."""
    return vllm_config.scheduler_config.max_num_seqs * query_tokens_per_request(vllm_config)


def engine_shape(vllm_config: VllmConfig, page_size: int | None, local_heads: int | None = None) -> DecodeShape:
    """What this engine decodes all its life: the model's attention shape, heads per GPU (gathered
    over decode context parallelism, before forward_mqa), query tokens per request, KV dtype, page."""
    dcp = vllm_config.parallel_config.decode_context_parallel_size
    kv_fp8 = compat.is_quantized_kv_cache(vllm_config.cache_config.cache_dtype)
    model_config = getattr(vllm_config, "model_config", None)
    if local_heads is None:
        local_heads = model_config.get_num_attention_heads(vllm_config.parallel_config)
    shape = DecodeShape(local_heads * dcp, query_tokens_per_request(vllm_config), kv_fp8, page_size, dcp=dcp)
    if model_config is None:
        return shape
    try:
        dims = get_mla_dims(model_config)
    except AttributeError:  # not an MLA model: the route refuses it
        return replace(shape, kv_lora_rank=None)
    return replace(
        shape, kv_lora_rank=dims.kv_lora_rank, rope_dim=dims.qk_rope_head_dim, qk_nope_head_dim=dims.qk_nope_head_dim
    )


def engine_route(vllm_config: VllmConfig | None, detected: tuple[int, int], page_size: int | None = None) -> Route:
    """The route of this engine's decode (route.py's rules, a pure function of these values: the
    engine's builder and impls get the same one); raises BackendUnavailableError for an impossible
    explicit choice."""
    config = plugin_config(vllm_config)
    capability = config.capability(detected)
    has_model = vllm_config is not None and vllm_config.model_config is not None
    # The model's shape is read only where the GPU's route leaves the kernel to weigh it.
    weighs_model = has_model and gpu_route(config, capability).kernel != "fallback"
    shape = engine_shape(vllm_config, page_size) if weighs_model else None
    return resolve_route(config, capability, shape, vllm_engine())


def detected_capability() -> tuple[int, int]:
    capability = current_platform.get_device_capability()
    if capability is None:
        raise RuntimeError("mla_backend's vLLM backend needs a CUDA GPU (no device capability found)")
    return (capability.major, capability.minor)


@functools.cache
def announce(route: Route) -> None:
    """One log line per process and route: which kernel serves MLA decode and why."""
    if route.kernel == "fallback":
        logger.warning("mla_backend: MLA decode runs vLLM's Triton MLA kernel: %s", route.reason)
    else:
        logger.info("mla_backend: MLA decode route: %s", route.describe())


@functools.cache
def announce_drafter(hint: str) -> None:
    """Once per process: the drafter's MLA layers decode elsewhere, and how to bring them here."""
    logger.warning(hint)


def model_routes(model: torch.nn.Module) -> list[Route]:
    """The routes a worker's model decodes with (its attention layers' impls), each once: for logs,
    the demo and engine checks (``LLM.apply_model(model_routes)``)."""
    routes = {m.impl.route for m in model.modules() if isinstance(getattr(m, "impl", None), MLABackendImpl)}
    return sorted(routes, key=Route.describe)


def step_route(impl: MLABackendImpl, attn_metadata: MLACommonMetadata) -> Route:
    """The route a step's decode runs: the builder's, handed down in the step's metadata; the impl's
    own where the metadata carries none."""
    return getattr(attn_metadata.decode, "route", None) or impl.route


class MLABackend(MLACommonBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto", "bfloat16", "fp8", "fp8_e4m3"]

    @staticmethod
    def get_name() -> str:
        # vLLM maps the class back to its enum member by this name: ours where vLLM names backends.
        return compat.registered_name()

    @staticmethod
    def get_impl_cls() -> type[MLABackendImpl]:
        return MLABackendImpl

    @staticmethod
    def get_builder_cls() -> type[MLABackendMetadataBuilder]:
        return MLABackendMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        # Any latent width: supports_combination names the model shapes the bundled kernels do not
        # take, and `auto` serves those with the Triton fallback (engine_route).
        return []

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return list(shapes.VLLM_PAGE_SIZES)

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        # Where the user names no --block-size, vLLM asks the backend; its default (16) is a page our
        # kernels take but are not measured at, and `auto` on SM90 can hand decode to FlashMLA only at 64.
        return shapes.PREFERRED_PAGE_SIZE

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        return (1, 0, 2, 3) if include_num_layers_dimension else (0, 1, 2)

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        # The bundled kernels serve targets.ARCH_BY_CAPABILITY; `auto` sends the rest to the fallback.
        return capability >= MIN_CAPABILITY

    @classmethod
    def validate_configuration(cls, **selection) -> list[str]:  # type: ignore[override]
        """vLLM's selector calls this with keywords only. A sparse layer (DeepSeek Sparse Attention) is
        validated as MLASparseBackend, the class full_cls_name then hands vLLM to build it with."""
        sparse_model = sparse_backend.serves_sparse_model(get_current_vllm_config_or_none())
        if selection.get("use_sparse", False) != sparse_model:
            return [
                f"mla_backend: vLLM selects {'sparse' if selection.get('use_sparse') else 'dense'} MLA for a model "
                f"whose config {'names' if sparse_model else 'has no'} index_topk"
            ]
        if sparse_model:
            return sparse_backend.MLASparseBackend.validate_configuration(**selection)
        return super().validate_configuration(**selection)

    @classmethod
    def full_cls_name(cls) -> tuple[str, str]:
        """The class vLLM resolves after selecting CUSTOM: the sparse backend for a sparse model."""
        if sparse_backend.serves_sparse_model(get_current_vllm_config_or_none()):
            return sparse_backend.MLASparseBackend.full_cls_name()
        return super().full_cls_name()

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
        if not use_mla:
            return (
                "mla_backend: mla_backend decodes MLA attention; vLLM runs this model's attention layers as "
                "standard attention: start it without --attention-backend so vLLM picks a backend for them"
            )
        try:
            engine_route(
                get_current_vllm_config_or_none(), (device_capability.major, device_capability.minor), block_size
            )
        except ValueError as err:  # a bad setting, or an explicit backend this GPU or model cannot run
            return f"mla_backend: {err}"
        return None


@dataclass
class RoutedDecodeMetadata(MLACommonDecodeMetadata):
    route: Route | None = None  # the engine's route, as the builder resolved it
    flashmla: flashmla.Schedule | None = None  # FlashMLA's plan where it serves this engine's decode
    plan: DecodePlan | None = None  # the bundled kernels' split plan of this step, read by every layer


class MLABackendMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    # Decode metadata is vLLM's own block_table / seq_lens (persistent buffers) plus max_seq_len, and
    # the step's split-KV plan: made here once a step on the GPU from seq_lens, into a buffer made once,
    # so a full CUDA graph replays with the plan written before its replay (vLLM hands builders the
    # graph's padded batch). Where FlashMLA serves decode, its plan is built here per batch instead,
    # as vLLM's FLASHMLA builds it.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM
    flashmla_scheduler: flashmla.Scheduler | None = None
    plan_shape: DecodeShape | None = None  # the engine's decode where the bundled kernels serve it
    plan_buffer: torch.Tensor | None = None
    plan_config: MLABackendConfig | None = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        reserve_decode_workspace(vllm_config, self.num_heads, self.mla_dims.kv_lora_rank)
        if hint := drafter_hint(vllm_config):
            announce_drafter(hint)
        self.route = engine_route(vllm_config, detected_capability(), kv_cache_spec.block_size)
        announce(self.route)
        shape = engine_shape(vllm_config, kv_cache_spec.block_size, self.num_heads)
        if self.route.kernel == "flashmla":
            full_graphs = self.compilation_config.cudagraph_mode.has_full_cudagraphs()
            graph_buffers = (
                (current_platform.num_compute_units(), vllm_config.scheduler_config.max_num_seqs)
                if full_graphs
                else None
            )
            self.flashmla_scheduler = flashmla.Scheduler(shape.heads, shape.kv_fp8, graph_buffers, self.device)
        # A block size the kernels do not read is cut into kernel pages by vLLM: those calls plan themselves.
        if self.route.kernel == "bundled" and shape.page_size in shapes.VLLM_PAGE_SIZES:
            self.plan_shape = shape
            # vLLM captures graphs of at most max_num_seqs requests, and no step decodes more.
            self.plan_config = plugin_config(vllm_config)
            self.plan_buffer = plan_buffer(vllm_config.scheduler_config.max_num_seqs, self.device, self.plan_config)

    def _build_decode(self, **kwargs) -> MLACommonDecodeMetadata:
        # vLLM passes keywords only; the set differs between releases (0.33 adds max_query_len).
        decode = super()._build_decode(**kwargs)
        requests = kwargs["block_table_tensor"].shape[0]
        q_len = kwargs["num_decode_tokens"] // max(1, requests)
        routed = functools.partial(
            RoutedDecodeMetadata, decode.block_table, decode.seq_lens, decode.dcp_tot_seq_lens, self.route
        )
        if self.flashmla_scheduler is not None:
            return routed(flashmla=self.flashmla_scheduler(kwargs["seq_lens_device"], q_len))
        if self.plan_shape is None or requests == 0:
            return routed()
        plan = plan_decode(
            decode.seq_lens,
            decode.block_table,
            self.plan_shape.page_size,
            heads=self.plan_shape.heads,
            q_len=q_len,
            kv_dtype=torch.float8_e4m3fn if self.plan_shape.kv_fp8 else torch.bfloat16,
            workspace_buffer=decode_workspace(self.device),
            buffer=self.plan_buffer,
            config=self.plan_config,
            route=self.route,
        )
        return routed(plan=plan)


def reserve_decode_workspace(vllm_config: VllmConfig, local_heads: int, kv_lora_rank: int) -> None:
    """Size vLLM's shared workspace for decode's scratch before vLLM locks it (growing it later raises).
    Called by the builder and, where vLLM asks during memory profiling (0.33+), by the impl."""
    if not is_workspace_manager_initialized():
        return
    if engine_route(vllm_config, detected_capability()).kernel == "fallback":
        # Decode context parallelism all-gathers the query heads before forward_mqa.
        heads = local_heads * vllm_config.parallel_config.decode_context_parallel_size
        fallback.reserve_workspace(
            max_decode_tokens(vllm_config),
            heads,
            vllm_config.model_config.max_model_len,
            current_platform.num_compute_units(),
            kv_lora_rank,
        )
    else:
        request_decode_workspace()


def request_decode_workspace() -> tuple[torch.Tensor]:
    """The bundled kernels' split scratch from vLLM's shared workspace (initialized): asking before
    vLLM locks the workspace sizes it, asking later hands it over."""
    return current_workspace_manager().get_simultaneous(((DECODE_WORKSPACE_BYTES,), torch.uint8))


@functools.cache
def _private_workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)


def decode_workspace(device: torch.device) -> torch.Tensor:
    """vLLM's shared workspace when the model runner set one up, else a private buffer (unit tests)."""
    if is_workspace_manager_initialized():
        (workspace,) = request_decode_workspace()
        return workspace
    return _private_workspace(device)


class MLABackendImpl(MLACommonImpl[MLACommonMetadata]):
    can_return_lse_for_decode: bool = True  # natural-log LSE on every route
    supports_dcp: bool = True  # decode context parallelism merges our LSE (vLLM >= 0.30 asks)

    def __init__(
        self,
        num_heads,
        head_size,
        scale,
        num_kv_heads,
        alibi_slopes,
        sliding_window,
        kv_cache_dtype,
        logits_soft_cap,
        attn_type,
        kv_sharing_target_layer_name,
        **mla_args,
    ) -> None:
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            **mla_args,
        )
        if alibi_slopes is not None or sliding_window is not None or logits_soft_cap:
            raise NotImplementedError("mla_backend does not support alibi slopes, sliding window or logit soft-capping")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError("mla_backend serves decoder self-attention only")
        self.vllm_config = get_current_vllm_config()
        self.config = plugin_config(self.vllm_config)
        self.quantized_kv_cache = compat.is_quantized_kv_cache(kv_cache_dtype)
        # The engine's route (the builder resolves the same one and hands it down with each step).
        self.route = engine_route(self.vllm_config, detected_capability(), self.vllm_config.cache_config.block_size)
        announce(self.route)
        # Our kernels and trtllm-gen take the fp8 query vLLM quantises; Triton dequantises KV to bf16.
        self.supports_quant_query_input = self.route.kernel != "fallback"
        self._sm_count = current_platform.num_compute_units() if self.route.kernel == "fallback" else 0

    def reserve_workspace(self) -> None:
        reserve_decode_workspace(self.vllm_config, self.num_heads, self.kv_lora_rank)

    def _scales(self, layer: AttentionLayer) -> tuple[float, float]:
        """(bmm1, bmm2): logits = q.k * scale * q_scale * k_scale, out = p.v * k_scale (v is k's latent part)."""
        if not self.quantized_kv_cache:
            return self.scale, 1.0
        return self.scale * layer._q_scale_float * layer._k_scale_float, layer._k_scale_float

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        decode = attn_metadata.decode
        assert decode is not None
        route = step_route(self, attn_metadata)
        if compat.is_non_causal(attn_metadata):
            raise NotImplementedError("mla_backend decodes causal query blocks only")
        # bf16 comes as (ql_nope, q_pe): the bundled kernels read the parts in place (strided views).
        parts = q if isinstance(q, tuple) else (q,)
        if len(parts) == 2 and (route.kernel != "bundled" or any(query_layout_problem("q", t) for t in parts)):
            parts = (torch.cat(parts, dim=-1),)
        tokens, heads, _ = parts[0].shape
        requests = attn_metadata.num_decodes
        if tokens % requests:
            raise ValueError(
                f"mla_backend needs a uniform query length per request; got {tokens} tokens for {requests} requests"
            )
        q_len = tokens // requests
        if route.kernel == "flashmla":  # auto on SM90, where vLLM's FlashMLA is faster for this engine
            schedule = getattr(decode, "flashmla", None)
            if schedule is None:
                raise RuntimeError(f"mla_backend: no FlashMLA plan in this step's metadata ({route.describe()})")
            query = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
            out, lse = flashmla.decode(
                query.view(requests, q_len, heads, query.shape[-1]),
                kv_c_and_k_pe_cache,
                decode.block_table,
                decode.seq_lens,
                schedule,
                self.scale,
                getattr(layer, "_q_scale", None),
                getattr(layer, "_k_scale", None),
                self.kv_lora_rank,
            )
            return out, (lse if self.need_to_return_lse_for_decode else None)
        if route.kernel == "fallback":
            return fallback.triton_mla_decode(
                parts[0],
                kv_c_and_k_pe_cache,
                decode.block_table,
                decode.seq_lens,
                attn_metadata.max_seq_len,
                q_len,
                self.scale,
                layer._k_scale,
                self._sm_count,
                self.kv_lora_rank,
            )
        bmm1, bmm2 = self._scales(layer)
        return_lse = self.need_to_return_lse_for_decode
        query = tuple(part.view(requests, q_len, heads, part.shape[-1]) for part in parts)
        result = mla_decode(
            query if len(query) == 2 else query[0],
            kv_c_and_k_pe_cache,
            decode_workspace(parts[0].device),
            decode.block_table,
            decode.seq_lens,
            attn_metadata.max_seq_len,
            bmm1_scale=bmm1,
            bmm2_scale=bmm2,
            return_lse=return_lse,
            config=self.config,
            qk_nope_head_dim=self.qk_nope_head_dim,
            plan=getattr(decode, "plan", None),
            route=route,
        )
        out, lse = result if return_lse else (result, None)
        return out.view(tokens, heads, -1), (lse.view(tokens, heads) if lse is not None else None)
