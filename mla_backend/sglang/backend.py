"""SGLang attention backend on mla_backend's decode kernels: decode and speculative verification.

Prefill stays with the backend SGLang runs for it (``--prefill-attention-backend``). Per step the
backend builds the page table of the batch from SGLang's ``req_to_token`` map (a page's tokens sit
in consecutive slots, so page i of a request is its token i's slot divided by the page size) and
calls the op, which reads SGLang's MLA pool in place: ``[slots, 1, 576]`` viewed as pages.
CUDA graphs: the page table and lengths live in buffers allocated once; the graph records the ops
that refill them, so a replay sees the batch of the step (SGLang >= 0.5.16 records
``init_forward_metadata_in_graph``; the older capture/replay hooks refill them before each replay).
The first layer's call of a step plans the split-KV of all its layers (step_plan.py), into a buffer
of the graph's under graphs, so each replay plans once and its layers read the plan.

FP8 caches hold K / k_scale (k_scale is the layer's, 1.0 when it has none); the query is cast to
e4m3 as it is, so logits = q'.k' * (k_scale * scaling) and out = P.v' * k_scale.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
from pydantic import ValidationError
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from .. import shapes
from ..config import BackendUnavailableError, MLABackendConfig, format_validation_error
from ..decode import mla_decode
from ..launcher import DecodePlan
from ..route import DecodeShape, Engine, Route, resolve_route
from ..step_plan import plan_buffer, plan_decode
from . import NAME, WORKSPACE_BYTES, compat

logger = logging.getLogger("mla_backend")

FP8_MAX = 448.0


@dataclass
class DecodeMetadata:
    block_tables: torch.Tensor  # int32 [B, pages]
    seq_lens: torch.Tensor  # int32 [B]: KV length including this step's query tokens
    max_seq_len: int  # host bound on seq_lens (plans the splits; fixed for a captured graph)
    q_len: int  # query tokens per request (1, or the verified draft tokens)
    plan_buffer: torch.Tensor | None = None  # where a graph's step plan lives (None: eager, a new one)
    plans: dict[int, DecodePlan | None] = field(default_factory=dict)  # the step's split plans, by heads


def page_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_size: int,
    pages: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """int32 [B, pages]: page ids of each request's first ``pages`` pages, gathered once from SGLang's
    int32 token map (into ``out`` where given: a graph's buffer). At page size 1 (SGLang's default) a
    slot is its page: the table is the map's rows as they are, the one copy SGLang's own backends make
    of them too (their kv_indices)."""
    if page_size == 1:
        return torch.index_select(req_to_token[:, :pages], 0, req_pool_indices, out=out)
    first_slots = req_to_token[:, : pages * page_size : page_size]
    return torch.index_select(first_slots, 0, req_pool_indices, out=out).floor_divide_(page_size)


def configured() -> MLABackendConfig:
    """Settings from the MLA_BACKEND_* variables (SGLang has no per-backend configuration), validated."""
    try:
        return MLABackendConfig.from_sources()
    except ValidationError as err:  # one readable line per bad setting, for SGLang's start-up error
        raise ValueError(f"mla_backend: bad settings in the environment: {format_validation_error(err)}") from None


SGLANG = Engine("SGLang", "SGLang's triton decode", "SGLang's triton backend")


def model_shape(runner) -> DecodeShape:
    """What this model runner decodes: the model's latent, its draft tokens per verification, the KV
    dtype and page. Heads per GPU are the layers' own (attention data parallelism changes them)."""
    model, server_args = runner.model_config, compat.resolved(runner.server_args)
    spec = getattr(server_args, "speculative_num_draft_tokens", None)
    q_len = int(spec) if getattr(server_args, "speculative_algorithm", None) is not None and spec else 1
    return DecodeShape(
        heads=None,
        q_len=q_len,
        kv_fp8=runner.kv_cache_dtype == torch.float8_e4m3fn,
        page_size=runner.page_size,
        kv_lora_rank=model.kv_lora_rank,
        rope_dim=model.qk_rope_head_dim,
        qk_nope_head_dim=getattr(model, "qk_nope_head_dim", 128),
    )


def resolve(config: MLABackendConfig, device: torch.device, shape: DecodeShape | None = None) -> Route:
    """The route of a model runner's decode (route.py's rules)."""
    overridden = config.device_capability is not None
    capability = config.capability((0, 0) if overridden else torch.cuda.get_device_capability(device))
    return resolve_route(config, capability, shape, SGLANG)


def check_server_args(server_args) -> None:
    """Refuse settings the backend cannot serve, before any weight is loaded."""
    server_args = compat.resolved(server_args)
    page_size = server_args.page_size
    if page_size not in shapes.PAGE_SIZES:
        raise ValueError(
            f"mla_backend reads pages of a power of two from 1 to {shapes.PAGE_SIZES[-1]} tokens: --page-size in "
            f"{shapes.PAGE_SIZES} (SGLang's default, 1, included), got {page_size}"
        )
    prefill, decode = compat.attention_backends(server_args)
    if server_args.speculative_algorithm is not None and (server_args.speculative_eagle_topk or 1) > 1:
        raise ValueError("mla_backend verifies draft chains (speculative_eagle_topk 1), not trees")
    if server_args.speculative_algorithm is not None and not getattr(
        server_args, "speculative_draft_attention_backend", None
    ):
        # SGLang builds the drafter's multi-step decode (and, in decode mode, its draft extend) only from
        # its own backends; without a drafter backend named it stops later, naming ours.
        multi_step = (getattr(server_args, "speculative_num_steps", None) or 1) > 1
        if multi_step or getattr(server_args, "speculative_attention_mode", "prefill") == "decode":
            raise ValueError(
                "mla_backend verifies the drafts; SGLang runs the drafter's own attention only on its built-in "
                "backends: add --speculative-draft-attention-backend triton (or flashmla)"
            )
    if server_args.speculative_algorithm is not None and server_args.speculative_attention_mode != "decode":
        # With speculation every decode step is a verification, which SGLang runs on the prefill backend.
        logger.warning(
            "mla_backend: SGLang verifies drafts on the prefill backend (%s), so mla_backend decodes nothing "
            "while speculation is on: add --speculative-attention-mode decode for mla_backend to verify them",
            "SGLang's triton, mla_backend's prefill" if prefill == NAME else prefill,
        )


def check_model(model_config) -> None:
    """Refuse a model whose attention is not dense MLA, whatever kernel would serve it: DeepSeek-V3.2 and
    GLM-5 carry an indexer (``index_topk``) whose top-k tokens a dense decode would ignore."""
    hf = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    if getattr(hf, "index_topk", None) is not None:
        raise BackendUnavailableError(
            "mla_backend decodes dense MLA; this model's attention is sparse (an indexer picks the top-k tokens, "
            "with a cache of its own): start SGLang with its dsa backend and mla_backend as that backend's "
            "decode: --attention-backend dsa --dsa-decode-backend mla_backend"
        )


def create_backend(runner) -> AttentionBackend:
    """Factory SGLang calls per model runner: our backend, or SGLang's triton on a GPU we do not serve
    and, under `auto`, for a model the kernels do not take (a named backend stops start-up there).
    Named for prefill too (``--attention-backend mla_backend``), prefill and extend run SGLang's triton
    beside our decode (prefill.py); named for prefill alone, SGLang's triton is all it is asked for."""
    from .fallback import triton_backend

    check_model(runner.model_config)
    prefill, decode = compat.attention_backends(compat.resolved(runner.server_args))
    if decode != NAME:
        logger.info("mla_backend: our kernels decode only; prefill runs SGLang's triton backend")
        return triton_backend(runner)
    config = configured()
    route = resolve(config, torch.device(runner.device), model_shape(runner))
    if route.kernel == "fallback":
        logger.warning("mla_backend: MLA decode runs SGLang's triton backend: %s", route.reason)
        return triton_backend(runner)
    check_server_args(runner.server_args)
    logger.info("mla_backend: MLA decode route: %s", route.describe())
    ours = MLADecodeBackend(runner, config, route)
    if prefill != NAME:  # SGLang composes ours with its prefill backend
        return ours
    from .prefill import with_triton_prefill

    logger.info("mla_backend: prefill and extend run SGLang's triton backend, decode our kernels")
    return with_triton_prefill(runner, ours)


class MLADecodeBackend(AttentionBackend):
    def __init__(self, runner, config: MLABackendConfig, route: Route):
        model = runner.model_config
        if route.kernel not in ("bundled", "trtllm-gen"):  # create_backend routes the others elsewhere
            raise BackendUnavailableError(f"mla_backend's SGLang backend runs our kernels, not {route.describe()}")
        self.config = config
        self.route = route  # resolved once per model runner; every call and step plan runs it
        self.device = torch.device(runner.device)
        self.page_size = runner.page_size
        self.req_to_token = runner.req_to_token_pool.req_to_token
        self.token_to_kv_pool = runner.token_to_kv_pool
        self.fp8 = runner.kv_cache_dtype == torch.float8_e4m3fn
        self.max_context_len = model.context_len
        self.qk_nope_head_dim = model.qk_nope_head_dim
        self.num_draft_tokens = model_shape(runner).q_len
        self.max_pages = math.ceil(self.req_to_token.shape[1] / self.page_size)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.forward_metadata: DecodeMetadata | None = None
        self.graph_block_tables: torch.Tensor | None = None
        self.graph_seq_lens: torch.Tensor | None = None
        self.graph_plan_buffer: torch.Tensor | None = None
        self.planning_layer: int | None = None  # the layer each forward reaches first

    # -- metadata ----------------------------------------------------------------------------
    def _query_tokens(self, forward_batch) -> int:
        mode = forward_batch.forward_mode
        if mode.is_decode_or_idle():
            return 1
        if mode.is_target_verify():
            spec = forward_batch.spec_info
            return int(getattr(spec, "draft_token_num", None) or self.num_draft_tokens)
        raise NotImplementedError(f"mla_backend serves decode and target verification, not {mode.name}")

    def _kv_lens(self, seq_lens: torch.Tensor, q_len: int, verify: bool) -> torch.Tensor:
        # Verification's seq_lens count the accepted prefix; the draft tokens come on top of it.
        return (seq_lens + q_len if verify else seq_lens).to(torch.int32)

    def init_forward_metadata(self, forward_batch) -> None:
        """Eager step: tables sized to this batch."""
        if forward_batch.forward_mode.is_idle():
            return
        q_len = self._query_tokens(forward_batch)
        verify = forward_batch.forward_mode.is_target_verify()
        bs = forward_batch.batch_size
        if forward_batch.seq_lens_cpu is not None:
            max_seq_len = int(forward_batch.seq_lens_cpu[:bs].max()) + (q_len if verify else 0)
        else:
            max_seq_len = self._length_bound(q_len)
        pages = min(self.max_pages, math.ceil(max_seq_len / self.page_size))
        self.forward_metadata = DecodeMetadata(
            page_table(self.req_to_token, forward_batch.req_pool_indices[:bs], self.page_size, pages),
            self._kv_lens(forward_batch.seq_lens[:bs], q_len, verify),
            max_seq_len,
            q_len,
        )

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs) -> None:
        self.graph_block_tables = torch.zeros(max_bs, self.max_pages, dtype=torch.int32, device=self.device)
        self.graph_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        # Only the bundled kernels plan their steps; the buffer is sized by their library.
        bundled = self.route.kernel == "bundled"
        self.graph_plan_buffer = plan_buffer(max_bs, self.device, self.config) if bundled else None

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def _length_bound(self, q_len: int) -> int:
        """No request is longer than the model's context (plus its query tokens) or the token map."""
        return min(self.max_context_len + q_len, self.max_pages * self.page_size)

    def _graph_metadata(self, bs: int, q_len: int) -> DecodeMetadata:
        # The step's first call plans the splits on the GPU from the graph's seq_lens, into a buffer
        # made once, so the plan is made again at every replay.
        bound = self._length_bound(q_len)
        tables, lens = self.graph_block_tables[:bs], self.graph_seq_lens[:bs]
        return DecodeMetadata(tables, lens, bound, q_len, self.graph_plan_buffer)

    def _refill_graph_buffers(self, bs: int, req_pool_indices, seq_lens, q_len: int, verify: bool) -> None:
        tables = self.graph_block_tables[:bs]
        page_table(self.req_to_token, req_pool_indices[:bs], self.page_size, self.max_pages, out=tables)
        self.graph_seq_lens[:bs].copy_(self._kv_lens(seq_lens[:bs], q_len, verify))

    # SGLang >= 0.5.16: out_graph runs before capture and before each replay; in_graph is recorded.
    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        if in_capture:
            self.forward_metadata = self._graph_metadata(forward_batch.batch_size, self._query_tokens(forward_batch))

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        self._refill_graph_buffers(
            forward_batch.batch_size,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            self._query_tokens(forward_batch),
            forward_batch.forward_mode.is_target_verify(),
        )

    # SGLang 0.5.12 - 0.5.15: both hooks run outside the graph, so the buffers are refilled here.
    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        q_len = num_tokens // bs
        self._refill_graph_buffers(bs, req_pool_indices, seq_lens, q_len, forward_mode.is_target_verify())
        self.forward_metadata = self._graph_metadata(bs, q_len)

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu=None
    ) -> None:
        q_len = self.forward_metadata.q_len if forward_mode.is_target_verify() else 1
        self._refill_graph_buffers(bs, req_pool_indices, seq_lens, q_len, forward_mode.is_target_verify())

    # -- forward -----------------------------------------------------------------------------
    def _save_kv(self, layer, forward_batch, k, v, k_rope) -> None:
        if k is None:
            return
        if layer.k_scale is not None and self.fp8:
            k = k / layer.k_scale
            k_rope = k_rope / layer.k_scale if k_rope is not None else None
        if k_rope is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        else:
            self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)

    def _query_parts(self, q: torch.Tensor, q_rope: torch.Tensor | None, layer, meta: DecodeMetadata):
        heads = layer.tp_q_head_num
        if q_rope is None:  # one [T, H * 576] query
            q = q.view(-1, heads, shapes.HEAD_DIM)
            q_nope, q_rope = q[..., : shapes.KV_LORA_RANK], q[..., shapes.KV_LORA_RANK :]
        else:
            q_nope, q_rope = q.view(-1, heads, shapes.KV_LORA_RANK), q_rope.view(-1, heads, shapes.ROPE_DIM)
        parts = [t.unflatten(0, (-1, meta.q_len)) for t in (q_nope, q_rope)]
        if self.fp8:
            parts = [t.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn) for t in parts]
        return tuple(parts)

    def _scales(self, layer):
        if self.fp8 and layer.k_scale is not None:
            k_scale = layer.k_scale.float().reshape(1)
            return k_scale * layer.scaling, k_scale
        return layer.scaling, 1.0

    def _step_plan(self, meta: DecodeMetadata, layer) -> DecodePlan | None:
        """The split plan of this step, made by its first layer's call (so a captured forward holds
        the plan kernel once, and each replay plans again) and read by the others."""
        if self.planning_layer is None:
            self.planning_layer = layer.layer_id
        if layer.layer_id == self.planning_layer:
            meta.plans.clear()
        heads = layer.tp_q_head_num
        if heads not in meta.plans:
            meta.plans[heads] = plan_decode(
                meta.seq_lens,
                meta.block_tables,
                self.page_size,
                heads=heads,
                q_len=meta.q_len,
                kv_dtype=torch.float8_e4m3fn if self.fp8 else torch.bfloat16,
                workspace_buffer=self.workspace,
                buffer=meta.plan_buffer,
                config=self.config,
                route=self.route,
            )
        return meta.plans[heads]

    def _attend(self, q, q_rope, layer, forward_batch):
        meta = self.forward_metadata
        query = self._query_parts(q, q_rope, layer, meta)
        bmm1, bmm2 = self._scales(layer)
        cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        pages = cache.view(-1, self.page_size, shapes.HEAD_DIM)
        out = mla_decode(
            query,
            pages,
            self.workspace,
            meta.block_tables,
            meta.seq_lens,
            meta.max_seq_len,
            bmm1_scale=bmm1,
            bmm2_scale=bmm2,
            config=self.config,
            route=self.route,
            qk_nope_head_dim=self.qk_nope_head_dim,
            plan=self._step_plan(meta, layer),
        )
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(
        self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None, **kwargs
    ) -> torch.Tensor:
        if save_kv_cache:
            self._save_kv(layer, forward_batch, k, v, k_rope)
        return self._attend(q, q_rope, layer, forward_batch)

    def forward_extend(
        self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None, **kwargs
    ) -> torch.Tensor:
        if not forward_batch.forward_mode.is_target_verify():
            raise NotImplementedError(
                "mla_backend's kernels serve decode only; prefill goes to the prefill backend SGLang composes "
                "ours with (--prefill-attention-backend, or triton under --attention-backend mla_backend)"
            )
        return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache, q_rope=q_rope, k_rope=k_rope)
