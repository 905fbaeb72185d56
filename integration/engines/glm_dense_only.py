"""vLLM 0.26's GLM-4.7-Flash with the zoo's dense-only checkpoints (integration/models/checkpoints.py)."""

from __future__ import annotations


def allow_dense_only_glm() -> None:
    """vLLM 0.26's GLM-4.7-Flash describes its experts for EPLB from its first MoE layer and raises
    where there is none; the zoo's checkpoints are dense (no MoE kernel is needed), so the description
    is skipped. Call it in each process that builds an engine (vllm_engine.SETUP_ENV for isolated ones)."""
    from vllm.model_executor.models.glm4_moe import Glm4MixtureOfExperts

    original = Glm4MixtureOfExperts.extract_moe_parameters

    def extract_moe_parameters(self, example_moe) -> None:
        if example_moe is not None:
            return original(self, example_moe)
        for name in ("logical", "physical", "local_physical", "routed", "shared", "redundant"):
            setattr(self, f"num_{name}_experts", 0)

    Glm4MixtureOfExperts.extract_moe_parameters = extract_moe_parameters
