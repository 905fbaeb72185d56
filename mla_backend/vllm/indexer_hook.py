"""DeepSeek Sparse Attention's lightning indexer in vLLM where DeepGEMM cannot score it.

vLLM (0.26-0.33) scores the indexer (DeepSeek-V3.2, GLM-5) through ``vllm.utils.deep_gemm``: its
``fp8_fp4_mqa_logits``, ``fp8_fp4_paged_mqa_logits`` and ``get_paged_mqa_logits_metadata`` each run
``_lazy_init()`` (which imports DeepGEMM once) and then call an ``_*_impl`` global. And its
``SparseAttnIndexer`` refuses to be built on CUDA where ``has_deep_gemm()`` is False. DeepGEMM comes
inside vLLM's wheel (``vllm.third_party.deep_gemm``), but a vLLM without it, or a GPU below SM 9.0
(SM89: DeepGEMM's kernels need Hopper or newer), has no indexer at all.

``install()`` (the plugin's ``register()`` runs it in every process) patches two vLLM modules when
vLLM imports them, so that it costs nothing in processes that never build a sparse model:

- ``vllm.utils.deep_gemm``: ``_lazy_init`` runs as vLLM's, then, where DeepGEMM left the indexer
  impls unset or the GPU is below SM 9.0, sets them to ``mla_backend.indexer``'s functions (which
  take DeepGEMM's calls: 0.26 calls them as DeepGEMM 2.5.0 is called; 0.33 passes ``max_seqlen_k``
  where 0.26 passed ``clean_logits``, for which ``_compressed_mqa_logits`` adapts);
- ``vllm.model_executor.layers.sparse_attn_indexer``: its ``has_deep_gemm`` (imported there by name)
  answers True, since the indexer is now served either way. vLLM's own ``has_deep_gemm`` elsewhere
  (DeepGEMM's GEMMs for linear and MoE layers) is left alone.

Where vLLM's names differ from these, nothing is patched and a warning says so.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .import_patches import patch_when_imported

log = logging.getLogger("mla_backend")

DEEP_GEMM_MODULE = "vllm.utils.deep_gemm"
INDEXER_MODULE = "vllm.model_executor.layers.sparse_attn_indexer"
IMPL_NAMES = ("_fp8_fp4_mqa_logits_impl", "_fp8_fp4_paged_mqa_logits_impl", "_get_paged_mqa_logits_metadata_impl")
PATCHED = "__mla_backend_indexer__"  # set on a module once patched: install() is idempotent


def install() -> None:
    """Patch vLLM's DeepGEMM wrappers and its indexer's DeepGEMM check, now for modules already
    imported, else when vLLM imports them."""
    patch_when_imported(DEEP_GEMM_MODULE, patch_deep_gemm)
    patch_when_imported(INDEXER_MODULE, patch_indexer_module)


def indexer_impls(deep_gemm: ModuleType) -> tuple[Callable[..., Any], ...] | None:
    """Ours for the three impl globals, called as this vLLM calls them; None for a vLLM whose
    wrappers this does not know."""
    from mla_backend import indexer

    if not all(hasattr(deep_gemm, name) for name in (*IMPL_NAMES, "_lazy_init", "fp8_fp4_mqa_logits")):
        return None
    params = inspect.signature(deep_gemm.fp8_fp4_mqa_logits).parameters
    if "clean_logits" in params:  # 0.26: DeepGEMM 2.5.0's calls
        mqa = indexer.fp8_fp4_mqa_logits
    elif "max_seqlen_k" in params:  # 0.33: (q, kv, weights, ks, ke, max_seqlen_k)
        mqa = _compressed_mqa_logits
    else:
        return None
    return mqa, indexer.fp8_fp4_paged_mqa_logits, indexer.get_paged_mqa_logits_metadata


def _compressed_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k):
    """vLLM 0.33's call: logits [M, max_seqlen_k], row i's positions from column 0."""
    from mla_backend import indexer

    return indexer.fp8_fp4_mqa_logits(
        q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=False, max_seqlen_k=max_seqlen_k
    )


def deep_gemm_cannot_score(deep_gemm: ModuleType) -> bool:
    """After vLLM's _lazy_init: DeepGEMM left the indexer impls unset (not importable, or without
    them), or the GPU is below SM 9.0, where its kernels do not run."""
    if any(getattr(deep_gemm, name) is None for name in IMPL_NAMES):
        return True
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0)


def patch_deep_gemm(deep_gemm: ModuleType) -> None:
    """Wrap ``_lazy_init``: vLLM's first, then ours where DeepGEMM cannot score (decided once)."""
    if getattr(deep_gemm, PATCHED, False):
        return
    ours = indexer_impls(deep_gemm)
    if ours is None:
        log.warning("mla_backend: vLLM's DeepGEMM wrappers are not the ones known here; the indexer is vLLM's")
        return
    original = deep_gemm._lazy_init
    decided = False

    def lazy_init() -> None:
        nonlocal decided
        original()
        if decided:
            return
        decided = True
        if deep_gemm_cannot_score(deep_gemm):
            for name, impl in zip(IMPL_NAMES, ours):
                setattr(deep_gemm, name, impl)
            log.info("mla_backend: the sparse-attention indexer's logits are mla_backend's (no DeepGEMM for them)")

    deep_gemm._lazy_init = lazy_init
    setattr(deep_gemm, PATCHED, True)


def patch_indexer_module(module: ModuleType) -> None:
    """The indexer's DeepGEMM check answers True: its logits are DeepGEMM's or ours."""
    if getattr(module, PATCHED, False):
        return
    if not hasattr(module, "has_deep_gemm"):
        log.warning("mla_backend: %s has no has_deep_gemm; left as it is", INDEXER_MODULE)
        return
    deep_gemm = importlib.import_module(DEEP_GEMM_MODULE)
    patch_deep_gemm(deep_gemm)
    if getattr(deep_gemm, PATCHED, False):
        module.has_deep_gemm = indexer_served
        setattr(module, PATCHED, True)


def indexer_served() -> bool:
    """The sparse-attention indexer's ``has_deep_gemm``: its logits have an implementation."""
    return True
