"""vLLM plugin: registers the mla_backend MLA decode backend as ``AttentionBackendEnum.CUSTOM``
and, where vLLM names out-of-tree backends (0.32+), as ``AttentionBackendEnum.MLA_BACKEND``; and
gives DeepSeek Sparse Attention's indexer logits where DeepGEMM cannot (indexer_hook.py), and an
fp8_ds_mla cache for ``--kv-cache-dtype fp8`` on our sparse backend (kv_dtype_hook.py).

vLLM calls :func:`register` in every process through the ``vllm.general_plugins`` entry point;
users select the backend with ``--attention-backend CUSTOM`` (or ``MLA_BACKEND``).
"""

from __future__ import annotations

import logging

BACKEND_PATH = "mla_backend.vllm.backend.MLABackend"

log = logging.getLogger("mla_backend")


def register() -> None:
    """Register the backend under ``CUSTOM`` and our own name where vLLM has named registration:
    cheap and idempotent.

    Imports nothing heavy (no CUDA, no kernel build): it runs in every vLLM process, including
    ones that never use attention. A CUSTOM backend registered by another plugin is left alone."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from . import indexer_hook, kv_dtype_hook
    from .compat import register_named

    indexer_hook.install()  # the sparse-attention indexer where DeepGEMM cannot score it
    kv_dtype_hook.install()  # --kv-cache-dtype fp8 is fp8_ds_mla for sparse models, as for vLLM's own
    register_named(BACKEND_PATH)
    current = registered_custom_backend()
    if current not in (None, BACKEND_PATH):
        log.warning("mla_backend: AttentionBackendEnum.CUSTOM is already %s; not replacing it", current)
        return
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)


def registered_custom_backend() -> str | None:
    """The class path registered as CUSTOM, or None."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    try:
        return AttentionBackendEnum.CUSTOM.get_path()
    except ValueError:  # nothing registered yet
        return None


__all__ = ["BACKEND_PATH", "register", "registered_custom_backend"]
