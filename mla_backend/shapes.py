"""Layout constants of DeepSeek-V3-class MLA and the paged cache views shared by op and reference."""

import torch

from .kernel_constants import LATENT_DIM, MAX_PAGE_SIZE, MAX_ROWS, ROPE_DIM

KV_LORA_RANK = LATENT_DIM
HEAD_DIM = KV_LORA_RANK + ROPE_DIM  # 576: q/k = concat(nope 512, rope 64); v = k[..., :512]
QK_NOPE_HEAD_DIMS = (128, 192)  # the model's pre-absorption nope dim; FlashInfer accepts these
# Pages the kernels read: powers of two from 1 (a token-indexed cache, one slot id a token) to MAX_PAGE_SIZE.
PAGE_SIZES = tuple(1 << i for i in range(MAX_PAGE_SIZE.bit_length()))
# The block sizes the vLLM adapter offers vLLM's block-size choice.
VLLM_PAGE_SIZES = (16, 32, 64, 128)
PREFERRED_PAGE_SIZE = 64  # what the kernels are measured at, and the one page FlashMLA reads
MAX_HEADS = 128
MAX_Q_LEN = 8
assert MAX_HEADS * MAX_Q_LEN <= MAX_ROWS, "the kernels' row bound"
DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


def pages_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """[P, page, 576] view of a [P, page, 576] or [P, 1, page, 576] cache."""
    return kv_cache.squeeze(1) if kv_cache.dim() == 4 else kv_cache


def ragged_rows(block_tables: torch.Tensor, kv_indptr: torch.Tensor | None) -> list[torch.Tensor]:
    """Each request's page ids: its row of a [B, max_pages] table, or its range of FlashInfer's ragged
    ``kv_indices`` (``block_tables``, 1-D) given ``kv_indptr`` [B + 1]. Reads kv_indptr on the host."""
    if kv_indptr is None:
        return list(block_tables)
    bounds = kv_indptr.tolist()
    return [block_tables[start:end] for start, end in zip(bounds, bounds[1:])]
