"""DeepGEMM's indexer functions, as SGLang's DeepSeek Sparse Attention indexer calls them, served by
mla_backend.indexer (Triton kernels on the GPU) where DeepGEMM is not installed.

Handed to SGLang's indexer in place of the ``deep_gemm`` module (dsa.py's ``indexer_without_deep_gemm``),
never registered as ``deep_gemm`` for other code to find: SGLang probes that name to enable DeepGEMM's
GEMMs, which this does not have.
"""

from __future__ import annotations

import functools

import torch

from ..indexer import fp8_mqa_logits, fp8_paged_mqa_logits, get_paged_mqa_logits_metadata


@functools.cache
def get_num_sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def set_num_sms(count: int) -> None:
    """DeepGEMM's GEMMs' SM budget; the indexer's kernels here size themselves."""


__all__ = ["fp8_mqa_logits", "fp8_paged_mqa_logits", "get_num_sms", "get_paged_mqa_logits_metadata", "set_num_sms"]
