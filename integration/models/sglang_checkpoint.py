"""The zoo's families (families.py) as SGLang 0.5.17 serves them: the model module SGLang runs each
architecture with, the config keys its model code reads that the family's small config lacks, and the
seeded checkpoint written with them (checkpoints.save_checkpoint, plus Kimi-Linear's linear-attention
layer, which no transformers SGLang 0.5.17 works with can write).

Every key below cites the line of SGLang 0.5.17 (``sglang/srt/...``) that reads it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from .checkpoints import dense_config, save_checkpoint, save_config
from .families import FAMILIES, LONGCAT_EXPERTS, SMALL, Family, pick, published

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
# are shrunk (families.LONGCAT_EXPERTS; SGLang reads them at configs/longcat_flash.py:95, :107, :96).
# Where transformers (which writes the weights) and SGLang read different keys, both get the same value.
LONGCAT = {
    # blocks of two MLA layers: transformers counts num_layers, SGLang num_hidden_layers (configs/longcat_flash.py:82)
    "num_layers": SMALL["num_hidden_layers"],
    "ffn_hidden_size": SMALL["intermediate_size"],  # transformers' dense MLPs; SGLang's: intermediate_size (:85)
    "expert_ffn_hidden_size": SMALL["moe_intermediate_size"],  # both (:87 for SGLang)
    **LONGCAT_EXPERTS,
    # models/longcat_flash.py:384 asks `"rope_theta" in config.rope_parameters`, which transformers 5.12.1
    # leaves None where config.json has no rope_scaling (as published): a TypeError while the model is
    # built. Plain RoPE spelled as rope_scaling gets past it; SGLang then runs it as DeepSeek's YaRN with
    # factor 1 (models/deepseek_v2.py:1783), the same rotation.
    "rope_scaling": {"rope_type": "default", "rope_theta": published("LongCat-Flash-Chat")["rope_theta"]},
}
SGLANG_KEYS: dict[str, dict] = {
    **dict.fromkeys(
        ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"),
        DEEPSEEK_LAYERS,
    ),
    "LongcatFlashForCausalLM": LONGCAT,
}


def kimi_linear_keys(family: Family) -> dict:
    """Every Kimi-Linear config is served as a hybrid of KDA (linear attention) and MLA layers
    (configs/hybrid_arch.py:103), whose state shape configs/kimi_linear.py:175-177 reads from
    ``linear_attn_config``: the published one, with one KDA layer and then one MLA layer (1-based lists,
    as published: MLA on 7 of 27 layers, KDA first)."""
    linear = dict(published(family.published)["mla_layer_marker"]["linear_attn_config"])
    return {"linear_attn_config": {**linear, "kda_layers": [1], "full_attn_layers": [2]}}


def for_sglang(family: Family) -> Family:
    """The family with the keys SGLang's model code reads added to its config."""
    keys = kimi_linear_keys(family) if family.model_type == "kimi_linear" else SGLANG_KEYS.get(family.architecture, {})
    return dataclasses.replace(family, extra={**family.extra, **keys})


def served(family: Family) -> bool:
    return family.architecture in SGLANG_MODULES and family.expect in ("bundled", "refused")


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


def save_sglang_config(family: Family, path: str | Path, layout: str | None = None) -> Path:
    """config.json only (a refused family's engine starts on dummy weights)."""
    return save_config(for_sglang(family), path, layout)


def save_sglang_checkpoint(family: Family, path: str | Path, layout: str | None = None, seed: int = 0) -> Path:
    """The family's seeded bf16 checkpoint (checkpoints.save_checkpoint) with SGLang's keys."""
    family = for_sglang(family)
    if family.model_type != "kimi_linear":
        return save_checkpoint(family, path, layout, seed)
    # transformers 5.12.1 has no Kimi-Linear: DeepSeek-V3's classes write its MLA layers and dense MLPs,
    # under the names models/kimi_linear.py:759 loads (q_proj without q_lora, kv_a_proj_with_mqa, ...).
    path = save_checkpoint(family, path, layout, seed, transformers_type="deepseek_v3")
    config = dense_config(family, layout)
    (path / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}, indent=1))  # no DeepSeek keys
    add_kda_layers(path, config, seed)
    return path


def add_kda_layers(path: Path, config: dict, seed: int) -> None:
    """Replace the attention of each KDA layer by seeded KDA weights under the released checkpoints'
    names (models/kimi_linear.py:759, load_weights, maps them; transformers' conversion_mapping "kimi_linear"
    names the same), initialised as transformers' KimiLinear initialises them."""
    from safetensors.torch import load_file, save_file

    (weights_file,) = path.glob("*.safetensors")  # one shard at these sizes
    tensors = load_file(weights_file)
    linear = config["linear_attn_config"]
    heads, head_dim, hidden = linear["num_heads"], linear["head_dim"], config["hidden_size"]
    width, std = heads * head_dim, config["initializer_range"]
    gen = torch.Generator().manual_seed(seed + 2)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    for layer in (n - 1 for n in linear["kda_layers"]):
        prefix = f"model.layers.{layer}.self_attn."
        if prefix + "A_log" in tensors:
            continue  # written before
        for name in [n for n in tensors if n.startswith(prefix)]:
            del tensors[name]
        kda = {f"{p}_proj.weight": normal(width, hidden) for p in "qkv"}
        kda |= {"b_proj.weight": normal(heads, hidden), "o_proj.weight": normal(hidden, width)}
        kda |= {f"{g}_a_proj.weight": normal(head_dim, hidden) for g in "fg"}
        kda |= {f"{g}_b_proj.weight": normal(width, head_dim) for g in "fg"}
        bound = linear["short_conv_kernel_size"] ** -0.5  # torch's default init of a depthwise conv
        conv = [(torch.rand(width, 1, linear["short_conv_kernel_size"], generator=gen) * 2 - 1) * bound for _ in "qkv"]
        kda |= {f"{p}_conv1d.weight": c.to(torch.bfloat16) for p, c in zip("qkv", conv)}
        kda["A_log"] = (torch.rand(1, 1, heads, 1, generator=gen) * 15 + 1).log()  # decay rates in [1, 16]
        low, high = math.log(1e-3), math.log(0.1)
        dt = torch.exp(torch.rand(width, generator=gen) * (high - low) + low)
        kda["dt_bias"] = dt + torch.log(-torch.expm1(-dt))  # the inverse softplus of a step in [1e-3, 0.1]
        kda["o_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)
        tensors.update({prefix + k: v.contiguous() for k, v in kda.items()})
    save_file(tensors, weights_file, metadata={"format": "pt"})


def save_sglang_tiny_deepseek(path: Path, heads: int, mtp_layers: int = 0) -> Path:
    """The seeded tiny DeepSeek-V3 (mla_backend.tools.tiny_model) as SGLang serves it, with its MTP
    layer as SGLang's NextN drafter builds it where ``mtp_layers``."""
    from mla_backend.tools.tiny_model import save_tiny_deepseek_v3

    nextn = DEEPSEEK_NEXTN if mtp_layers else {}
    return save_tiny_deepseek_v3(path, heads=heads, mtp_layers=mtp_layers, **DEEPSEEK_LAYERS, **nextn)
