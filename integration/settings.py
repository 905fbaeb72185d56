"""Settings more than one room of integration/ reads. A leaf: it imports nothing from integration."""

from __future__ import annotations

import torch

KV_DTYPES = {"fp8": torch.float8_e4m3fn, "auto": torch.bfloat16}  # vLLM's --kv-cache-dtype -> torch, bf16 model
# Per KV dtype: the references the tie rule is applied against, then a second vLLM backend that
# calibrates the rule (does vLLM agree with itself under it on this model?).
REFERENCES = {"fp8": ["FLASHMLA"], "auto": ["FLASH_ATTN_MLA", "TRITON_MLA"]}
PEERS = {"fp8": ("TRITON_MLA", "FLASHMLA"), "auto": ("TRITON_MLA", "FLASH_ATTN_MLA")}
SPEC_MAX_MODEL_LEN = 4096  # the speculative prompts are the whole 2048-token vocabulary
SELFTEST_CORRUPTION = 1.05  # outputs x 1.05 and LSE + 0.5: the check must fail
# Drafters vLLM builds without MLA layers although the target has them: LongCat-Flash's MTP block
# (longcat_flash_mtp is not among vLLM's MLA model types, 0.26 to 0.33), so its attention is not ours.
NON_MLA_DRAFTERS = ("longcat_flash_mtp",)


def drafter_has_mla_layers(method: str) -> bool:
    """vLLM builds this speculative method's drafter with MLA layers: a checkpoint's MTP layer (``mtp``,
    ``*_mtp``) but NON_MLA_DRAFTERS, the zoo's Eagle drafters (``eagle``: Mistral Large 3's, DeepSeek-V2
    decoder layers; ``eagle3``: one MLA draft layer); the n-gram proposer has none."""
    return (method in ("mtp", "eagle", "eagle3") or method.endswith("_mtp")) and method not in NON_MLA_DRAFTERS
