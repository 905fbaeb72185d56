"""The zoo's families (families.py) as SGLang 0.5.17 serves them: the model module SGLang runs each
architecture with, the config keys its model code reads that the family's small config lacks, and the
seeded checkpoint written with them (checkpoints.save_checkpoint; Kimi-Linear's KDA layer as kimi_linear.py
writes it for both engines).

Every key below cites the line of SGLang 0.5.17 (``sglang/srt/...``) that reads it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .checkpoints import save_checkpoint, save_config
from .families import FAMILIES, Family, pick, published

# The module of sglang/srt/models/ whose EntryClass serves each architecture of the zoo.
SGLANG_MODULES = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v2",
    "DeepseekV32ForCausalLM": "deepseek_v2",
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite",
    "GlmMoeDsaForCausalLM": "glm4_moe",
    "LongcatFlashForCausalLM": "longcat_flash",
    "KimiLinearForCausalLM": "kimi_linear",
    "MiniCPM3ForCausalLM": "minicpm3",
    "MistralLarge3ForCausalLM": "mistral_large_3",  # DeepSeek-V3's class, loading Mistral's names (mistral_format.py)
    "KimiVLForConditionalGeneration": "kimi_vl",  # its text model is DeepSeek-V2's class (text_config)
    "KimiK25ForConditionalGeneration": "kimi_k25",  # its text model is DeepSeek-V3's class (text_config)
}
# models/deepseek_v2.py:2406: DeepseekV2DecoderLayer._is_layer_sparse reads it for the layer after
# each one, so past the last dense layer too; transformers' DeepSeek and GLM-5 configs do not write it.
# (models/glm4_moe_lite.py:534 sets it itself; GLM-5's class is DeepSeek's, models/glm4_moe.py:1461.)
DEEPSEEK_LAYERS = {"moe_layer_freq": 1}
# SGLang builds DeepSeek's NextN (MTP) layer routed over experts whatever first_k_dense_replace says
# (models/deepseek_v2.py:2403, `is_nextn or ...`), and its router reads these two keys
# (models/deepseek_v2.py:474 and :665), which transformers' DeepseekV3Config does not write; the values
# are DeepSeek-V3's published ones.
DEEPSEEK_NEXTN = {"mtp_moe": True, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
# LongCat-Flash has no dense-only layer: each block routes (models/longcat_flash.py:427), so its experts
# are shrunk (families.LONGCAT_SMALL; SGLang reads them at configs/longcat_flash.py:95, :107, :96, its
# blocks as num_hidden_layers at :82, its dense MLPs as intermediate_size at :85 and its experts as
# expert_ffn_hidden_size at :87, each the same value as transformers' key).
LONGCAT = {
    # models/longcat_flash.py:384 asks `"rope_theta" in config.rope_parameters`, which transformers 5.12.1
    # leaves None where config.json has no rope_scaling (as published): a TypeError while the model is
    # built. Plain RoPE spelled as rope_scaling gets past it; SGLang then runs it as DeepSeek's YaRN with
    # factor 1 (models/deepseek_v2.py:1783), the same rotation.
    "rope_scaling": {"rope_type": "default", "rope_theta": published("LongCat-Flash-Chat")["rope_theta"]},
}
SGLANG_KEYS: dict[str, dict] = {
    **dict.fromkeys(
        (
            "DeepseekV2ForCausalLM",
            "DeepseekV3ForCausalLM",
            "DeepseekV32ForCausalLM",
            "GlmMoeDsaForCausalLM",
            "MistralLarge3ForCausalLM",
            "KimiVLForConditionalGeneration",  # into its text_config (families.Family.text_config)
            "KimiK25ForConditionalGeneration",
        ),
        DEEPSEEK_LAYERS,
    ),
    "LongcatFlashForCausalLM": LONGCAT,
}


def for_sglang(family: Family) -> Family:
    """The family with the keys SGLang's model code reads added to its config."""
    return dataclasses.replace(family, extra={**family.extra, **SGLANG_KEYS.get(family.architecture, {})})


def served(family: Family) -> bool:
    return family.architecture in SGLANG_MODULES and family.expect in ("bundled", "sparse", "refused")


def pick_served(names: str, every_layout: bool) -> list[tuple[Family, str]]:
    """(family, layout) pairs as zoo_e2e picks them (``all``: every family SGLang serves on our kernels);
    a family SGLang does not serve, or one mla_backend leaves to the engine, stops the run."""
    if names == "all":
        bundled = [f for f in FAMILIES if served(f) and f.expect == "bundled"]
        chosen = [(f, layout) for f in bundled for layout in list(f.heads)[: None if every_layout else 1]]
    else:
        chosen = pick(names, every_layout)
    unserved = sorted({f.name for f, _ in chosen if not served(f)})
    if unserved:
        raise SystemExit(f"SGLang 0.5.17 does not run {unserved} with mla_backend")
    return chosen


def refusal(family: Family) -> str:
    """What our factory's start-up error says for a refused family (tests/test_sglang_plugin.py pins it)."""
    return "this model's attention is sparse" if "index_topk" in family.config() else "needs kv_lora_rank 512"


def refusal_env(family: Family) -> dict[str, str]:
    """The settings a refused family's engine starts with: a sparse model is refused whatever the backend;
    a latent the kernels do not take only where the bundled kernels are named (under `auto`, SGLang's
    triton decodes it)."""
    return {} if "index_topk" in family.config() else {"MLA_BACKEND": "xqa"}


def save_sglang_config(family: Family, path: str | Path, layout: str | None = None) -> Path:
    """config.json only (a refused family's engine starts on dummy weights)."""
    return save_config(for_sglang(family), path, layout)


def save_sglang_checkpoint(family: Family, path: str | Path, layout: str | None = None, seed: int = 0) -> Path:
    """The family's seeded bf16 checkpoint (checkpoints.save_checkpoint) with SGLang's keys."""
    return save_checkpoint(for_sglang(family), path, layout, seed)


def save_sglang_tiny_deepseek(path: Path, heads: int, mtp_layers: int = 0) -> Path:
    """The seeded tiny DeepSeek-V3 (tiny_model.py) as SGLang serves it, with its MTP
    layer as SGLang's NextN drafter builds it where ``mtp_layers``."""
    from integration.models.tiny_model import save_tiny_deepseek_v3

    nextn = DEEPSEEK_NEXTN if mtp_layers else {}
    return save_tiny_deepseek_v3(path, heads=heads, mtp_layers=mtp_layers, **DEEPSEEK_LAYERS, **nextn)
