"""mla_backend: fast MLA (DeepSeek-V3/R1) decode for vLLM, SM120 first.

The ops mirror FlashInfer's, so switching is a change of import.
"""

from .config import BackendUnavailableError, MLABackendConfig, Resolution, resolve_backend
from .decode import trtllm_batch_decode_with_kv_cache_mla, xqa_batch_decode_with_kv_cache_mla
from .reference import mla_decode_reference

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "MLABackendConfig",
    "Resolution",
    "mla_decode_reference",
    "resolve_backend",
    "trtllm_batch_decode_with_kv_cache_mla",
    "xqa_batch_decode_with_kv_cache_mla",
]
