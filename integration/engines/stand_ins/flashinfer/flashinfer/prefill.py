"""The prefill name SGLang 0.5.17's vision attention imports on CUDA (see the package docstring); the
server's OpenAI transcription endpoint pulls that module in, so `sglang.launch_server` needs it."""

from . import _absent as cudnn_batch_prefill_with_kv_cache

__all__ = ["cudnn_batch_prefill_with_kv_cache"]
