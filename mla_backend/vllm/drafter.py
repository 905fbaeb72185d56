"""The drafter's attention under speculative decoding.

vLLM (0.26 to 0.33) never hands ``--attention-backend`` to the drafter: it picks the drafter's attention
backend itself unless ``--speculative-config`` names one (``attention_backend``). A drafter with MLA
layers (DeepSeek's and GLM's MTP layers, Eagle3 drafters with an MLA draft layer, Mistral Large 3's
Eagle drafter) then decodes its draft steps on vLLM's own MLA backend, Triton MLA on SM120, while our
kernels verify.
"""

from __future__ import annotations

from vllm.config import VllmConfig


def drafter_hint(vllm_config: VllmConfig | None) -> str | None:
    """What to add so that our kernels decode the drafter's MLA layers too, or None where they do or
    the drafter has none (n-gram, or a drafter with standard attention)."""
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None or getattr(speculative, "attention_backend", None) is not None:
        return None
    draft = getattr(speculative, "draft_model_config", None)
    if draft is None or not draft.use_mla:
        return None
    return (
        "mla_backend: vLLM picks the drafter's attention backend itself; add "
        '"attention_backend": "CUSTOM" to --speculative-config for mla_backend to decode the drafter\'s MLA '
        "layers too"
    )
