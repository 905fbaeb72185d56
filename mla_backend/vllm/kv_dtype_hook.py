"""``--kv-cache-dtype fp8`` for a sparse model on our backend means DeepSeek's fp8_ds_mla cache, as it
does for vLLM's own sparse backends.

vLLM (0.26-0.33) picks a sparse model's cache format in ``MLAAttention`` by the selected backend's
*name* (``_canonicalize_sparse_mla_kv_cache_dtype``: FLASHMLA_SPARSE's fp8 becomes fp8_ds_mla), and
ours is named CUSTOM (or MLA_BACKEND). ``install()`` (run by the plugin's ``register()``) wraps that
function when vLLM imports its module: for a backend that declares ``serves_fp8_as_ds_mla``, fp8 and
fp8_e4m3 become fp8_ds_mla; every other backend gets vLLM's answer. Where vLLM has no such function,
nothing is patched and the sparse backend refuses fp8 with what to pass instead.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType

from .import_patches import patch_when_imported

log = logging.getLogger("mla_backend")

MODULE = "vllm.model_executor.layers.attention.mla_attention"
FUNCTION = "_canonicalize_sparse_mla_kv_cache_dtype"
FP8_NAMES = ("fp8", "fp8_e4m3")
DS_MLA = "fp8_ds_mla"
PATCHED = "__mla_backend_kv_dtype__"


def install() -> None:
    patch_when_imported(MODULE, patch)


def patch(module: ModuleType) -> None:
    original = getattr(module, FUNCTION, None)
    if original is None:
        log.warning("mla_backend: %s has no %s; sparse models need --kv-cache-dtype %s", MODULE, FUNCTION, DS_MLA)
        return
    if getattr(original, PATCHED, False):
        return

    def canonicalize(attn_backend, kv_cache_dtype):
        if kv_cache_dtype in FP8_NAMES and getattr(attn_backend, "serves_fp8_as_ds_mla", False):
            return DS_MLA
        return original(attn_backend, kv_cache_dtype)

    setattr(canonicalize, PATCHED, True)
    setattr(module, FUNCTION, canonicalize)


def installed() -> bool:
    """Whether vLLM will hand our sparse backend fp8_ds_mla for fp8: its module is imported (it is by
    the time a layer is being selected) and its cache-format choice wrapped."""
    module = sys.modules.get(MODULE)
    return module is not None and getattr(getattr(module, FUNCTION, None), PATCHED, False)


__all__ = ["FP8_NAMES", "install", "installed", "patch"]
