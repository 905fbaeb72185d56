"""SGLang's DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) decoded by mla_backend's sparse kernels.

SGLang serves DSA models through its ``dsa`` attention backend (``DeepseekSparseAttnBackend``), whose
decode sub-backend ``--dsa-decode-backend`` picks in an if/elif chain. The plugin adds ``mla_backend``
to that flag's choices and makes the class our subclass wherever SGLang builds one (its registry's
``dsa``/``nsa`` factories and the drafter's factories look the class up by name in its module), so the
backend keeps its name, metadata, CUDA-graph buffers, indexer and KV pool. With that value chosen the
subclass runs decode, target verification and draft extend (v2) on :func:`mla_backend.sparse_mla_decode`
over SGLang's own per-token slot lists; with any other value it is SGLang's class unchanged.

    --attention-backend dsa --dsa-decode-backend mla_backend [--kv-cache-dtype fp8_e4m3]

What it reads of SGLang (0.5.17 and 0.5.23): the KV pool's buffer ([slots, 1, 576] bf16, or the
fp8_ds_mla rows of 656 bytes it stores as uint8, scales amax / 448 as stored), the lists
``transform_index_page_table_{decode,prefill}`` make (int32 [T, top-k] slot ids, -1 for none, valid
entries first) and the lengths ``min(seq_len, top-k)`` per token.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import typing

import torch

from .. import shapes
from ..config import MLABackendConfig
from ..route import Route, sparse_route
from ..sparse import sparse_mla_decode
from . import NAME, WORKSPACE_BYTES

logger = logging.getLogger("mla_backend")

DSA_MODULE = "sglang.srt.layers.attention.dsa_backend"
SM120_MODULE, SM120_CHECK = "sglang.kernels.ops.attention.flash_mla_sm120", "_validate_flashinfer_sparse_mla_backend"
CLASS_NAME = "DeepseekSparseAttnBackend"
LATENT, ROPE = shapes.KV_LORA_RANK, shapes.ROPE_DIM


def add_decode_choice() -> None:
    """``mla_backend`` among ``--dsa-decode-backend``'s choices (argparse checks them, nothing else):
    0.5.17 keeps them in ``server_args.DSA_CHOICES``; 0.5.23 in the flag's ``Arg``, whose list the
    assembled ``ServerArgs`` annotation holds (the parser is built from it)."""
    from sglang.srt import server_args

    choices = getattr(server_args, "DSA_CHOICES", None)
    if choices is None:
        from sglang.srt.arg_groups.arg_utils import _unwrap_annotated

        hint = typing.get_type_hints(server_args.ServerArgs, include_extras=True)["dsa_decode_backend"]
        choices = _unwrap_annotated(hint)[1].choices
    if isinstance(choices, list) and NAME not in choices:
        choices.append(NAME)


def install() -> None:
    """Make SGLang build our subclass wherever it builds its DSA backend; idempotent. The class is
    swapped at the first build (importing SGLang's module early would import DeepGEMM in every process)."""
    from sglang.srt.layers.attention import attention_registry as registry

    for name in ("dsa", "nsa"):
        create = registry.ATTENTION_BACKENDS.get(name)
        if create is not None:
            registry.ATTENTION_BACKENDS[name] = swapping_first(create)
    try:
        from sglang.srt.speculative.draft_utils import DraftBackendFactory
    except ImportError:
        return
    for method in ("_create_dsa_decode_backend", "_create_dsa_prefill_backend"):
        create = getattr(DraftBackendFactory, method, None)
        if create is not None:
            setattr(DraftBackendFactory, method, swapping_first(create))


def swapping_first(create):
    if getattr(create, "swaps_dsa_class", False):
        return create

    @functools.wraps(create)
    def create_ours(*args, **kwargs):
        ensure_subclass()
        return create(*args, **kwargs)

    create_ours.swaps_dsa_class = True  # type: ignore[attr-defined]
    return create_ours


def ensure_subclass() -> type:
    """SGLang's module's class, now our subclass of the class it defined."""
    module = importlib.import_module(DSA_MODULE)
    current = getattr(module, CLASS_NAME)
    if getattr(current, "mla_backend_subclass", False):
        return current
    subclass = make_subclass(current, module)
    setattr(module, CLASS_NAME, subclass)
    return subclass


def make_subclass(base: type, module) -> type:
    """Our subclass of SGLang's DSA backend class ``base`` (``module``: its module, for the index maps)."""

    class MLASparseAttnBackend(base):  # type: ignore[misc, valid-type]
        mla_backend_subclass = True

        def __init__(self, model_runner, *args, **kwargs):
            with glm_sm12x_check_of_the_prefill_side():
                super().__init__(model_runner, *args, **kwargs)
            self.mla_serves = getattr(self, "dsa_decode_impl", None) == NAME
            if self.mla_serves:
                refuse_unserved(self, model_runner)
                self.mla_config = MLABackendConfig.from_sources()
                announce_route(self, self.mla_config)
                self.mla_workspace = shared_workspace(torch.device(model_runner.device))

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None,
                           topk_indices=None, **kwargs):  # fmt: skip
            if not self.mla_serves:
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, q_rope=q_rope,
                                              k_rope=k_rope, topk_indices=topk_indices, **kwargs)  # fmt: skip
            query, kv_cache = self.mla_prepare(q, k, k_rope, q_rope, layer, forward_batch, save_kv_cache, kwargs)
            topk = self._pad_topk_indices(topk_indices, query.shape[0])
            if self.use_fused_topk:
                slots = self._get_fused_topk_page_table(topk)
            else:
                slots = module.transform_index_page_table_decode(
                    page_table=self.forward_metadata.page_table_1, topk_indices=topk, page_size=1
                )
            return self.mla_attend(query, kv_cache, slots, layer)

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None,
                           topk_indices=None, **kwargs):  # fmt: skip
            mode = forward_batch.forward_mode
            verifying = mode.is_target_verify() or getattr(mode, "is_draft_extend_v2", lambda: False)()
            if not (self.mla_serves and verifying):
                return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, q_rope=q_rope,
                                              k_rope=k_rope, topk_indices=topk_indices, **kwargs)  # fmt: skip
            query, kv_cache = self.mla_prepare(q, k, k_rope, q_rope, layer, forward_batch, save_kv_cache, kwargs)
            tokens = query.shape[0]
            metadata = self.forward_metadata
            if self.use_fused_topk:
                slots = self._get_fused_topk_page_table(self._pad_topk_indices(topk_indices, tokens))
            else:
                slots = module.transform_index_page_table_prefill(
                    page_table=metadata.page_table_1,
                    topk_indices=topk_indices,
                    extend_lens_cpu=metadata.dsa_extend_seq_lens_list,
                    page_size=1,
                    output_num_tokens=tokens,
                    page_table_is_expanded=True,
                    cu_seqlens_q=metadata.cu_seqlens_q,
                )
            return self.mla_attend(query, kv_cache, slots, layer)

        def mla_prepare(self, q, k, k_rope, q_rope, layer, forward_batch, save_kv_cache, extra):
            """SGLang's own first steps: this step's KV into the pool, the layer's buffer, the query as
            [T, H, 576] (its two parts joined, as SGLang's sub-backends join them)."""
            if extra.get("attn_sink") is not None:
                raise NotImplementedError("mla_backend: attention sinks are not served (--dsa-decode-backend)")
            if k is not None and save_kv_cache:
                self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
            kv_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
            heads = layer.tp_q_head_num
            if q_rope is None:
                query = q.contiguous().view(-1, heads, LATENT + ROPE)
            else:
                query = torch.cat((q.view(-1, heads, LATENT), q_rope.view(-1, heads, ROPE)), dim=-1)
            return query, kv_cache

        def mla_attend(self, query, kv_cache, slots, layer):
            """out [T, H, 512] over the slots each token's list names (-1: none), each list's valid
            prefix the top-k of its sequence (SGLang's lengths, where they are one a token)."""
            lengths = self.forward_metadata.dsa_cache_seqlens_int32
            if lengths is None or lengths.shape[0] != query.shape[0]:
                lengths = None
            rows = kv_cache.view(torch.uint8) if self.dsa_kv_cache_store_fp8 else kv_cache
            return sparse_mla_decode(
                query,
                rows.view(rows.shape[0], -1),
                slots,
                layer.scaling,
                topk_lens=lengths,
                workspace_buffer=self.mla_workspace,
                config=self.mla_config,
            )

    MLASparseAttnBackend.__name__ = MLASparseAttnBackend.__qualname__ = f"MLASparse{base.__name__}"
    return MLASparseAttnBackend


def refuse_unserved(backend, model_runner) -> None:
    """Settings our sparse decode does not take, refused at start-up with what to change."""
    model = model_runner.model_config
    problems = []
    if (model.kv_lora_rank, model.qk_rope_head_dim) != (LATENT, ROPE):
        problems.append(f"a latent of {model.kv_lora_rank} + {model.qk_rope_head_dim} (served: {LATENT} + {ROPE})")
    if getattr(backend, "hisparse_coordinator", None) is not None:
        problems.append("HiSparse")
    if getattr(backend, "dsa_prefill_impl", None) == NAME:
        problems.append("--dsa-prefill-backend mla_backend (it decodes; prefill stays SGLang's)")
    fp8_pool = getattr(model_runner, "kv_cache_dtype", None) == torch.float8_e4m3fn
    if fp8_pool and not backend.dsa_kv_cache_store_fp8:
        problems.append(
            "an fp8 pool without scales (a trtllm prefill backend: name another with --dsa-prefill-backend)"
        )
    if problems:
        raise ValueError(f"mla_backend (--dsa-decode-backend mla_backend) does not serve: {'; '.join(problems)}")


@contextlib.contextmanager
def glm_sm12x_check_of_the_prefill_side():
    """SGLang admits only its flashinfer_sparse_mla for GLM-5 with an fp8 cache on SM12x, prefill and
    decode alike; while its backend initialises, that check sees only the prefill side where the decode
    is ours (SGLang's __init__ imports the check from its module then)."""
    try:
        module = importlib.import_module(SM120_MODULE)
    except ImportError:
        yield
        return
    check = getattr(module, SM120_CHECK, None)
    if check is None:
        yield
        return

    @functools.wraps(check)
    def prefill_side(*, prefill_impl, decode_impl, **kwargs):
        decode_impl = prefill_impl if decode_impl == NAME else decode_impl
        return check(prefill_impl=prefill_impl, decode_impl=decode_impl, **kwargs)

    setattr(module, SM120_CHECK, prefill_side)
    try:
        yield
    finally:
        setattr(module, SM120_CHECK, check)


def announce_route(backend, config: MLABackendConfig) -> Route:
    """Route rule 6 for SGLang's DSA decode: the bundled kernels (logged), or a start-up error saying why not."""
    route = sparse_route(config, config.capability(tuple(backend.device_capability)))
    logger.info("mla_backend: SGLang DSA decode route: %s", route.describe())
    return route


@functools.cache
def shared_workspace(device: torch.device) -> torch.Tensor:
    """One workspace a device, shared by the target's and the drafter's backends (one stream)."""
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)


INDEXER_MODULE = "sglang.srt.layers.attention.dsa.dsa_indexer"
RESOLVERS_MODULE = "sglang.srt.layers.attention.dsa.utils"
# 0.5.23 resolves DeepGEMM's functions through these (imported by name into the indexer and the backend).
RESOLVERS = {
    "resolve_num_sms": lambda shim: shim.get_num_sms,
    "resolve_paged_mqa_logits_metadata_fn": lambda shim: lambda: shim.get_paged_mqa_logits_metadata,
    "resolve_fp8_paged_mqa_logits_fn": lambda shim: lambda: shim.fp8_paged_mqa_logits,
    "resolve_fp8_mqa_logits_fn": lambda shim: lambda: shim.fp8_mqa_logits,
}


def indexer_without_deep_gemm() -> bool:
    """Where DeepGEMM is not installed, SGLang's DSA indexer scores with mla_backend.indexer: 0.5.23's
    resolvers return ours; 0.5.17's indexer module gets our functions as its ``deep_gemm``, and its
    backend module (which imports ``deep_gemm`` unguarded on CUDA) is imported once with them in place
    of it. True where it did so."""
    import importlib.util
    import sys

    if importlib.util.find_spec("deep_gemm") is not None:
        return False
    from . import deep_gemm_shim as shim

    try:
        resolvers = importlib.import_module(RESOLVERS_MODULE)
    except ImportError:
        return False
    if hasattr(resolvers, "resolve_fp8_paged_mqa_logits_fn"):  # 0.5.23
        for module_name in (RESOLVERS_MODULE, INDEXER_MODULE, DSA_MODULE):  # those imported by now
            module = sys.modules.get(module_name)
            for name, ours in RESOLVERS.items():
                if module is not None and hasattr(module, name):
                    setattr(module, name, ours(shim))
        return True
    indexer = importlib.import_module(INDEXER_MODULE)  # 0.5.17: its deep_gemm is the ImportError it caught
    if isinstance(getattr(indexer, "deep_gemm", None), ImportError) or not hasattr(indexer, "deep_gemm"):
        indexer.deep_gemm = shim
    if DSA_MODULE not in sys.modules:
        sys.modules["deep_gemm"] = shim  # only while the backend module binds its deep_gemm
        try:
            importlib.import_module(DSA_MODULE)
        finally:
            del sys.modules["deep_gemm"]
    return True


__all__ = ["add_decode_choice", "ensure_subclass", "indexer_without_deep_gemm", "install", "make_subclass"]
