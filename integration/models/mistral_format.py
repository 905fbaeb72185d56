"""Mistral Large 3's and Mistral Small 4's zoo checkpoints in Mistral's own format, as they are released
and as the engines load them: params.json (the published one, shrunk as the zoo shrinks every family) and
consolidated.safetensors under Mistral's tensor names, no config.json. vLLM takes a folder with
params.json and consolidated*.safetensors as Mistral's format and maps it onto DeepSeek-V3
(MistralLarge3ForCausalLM); SGLang 0.5.17 does so for a path that names mistral-large-3, and its class
loads only Mistral's names (it skips any other).

The tensor names are those of the released FP8 shards' headers (dense layers; quoted in a public
unsloth test, LARGE3_TEXT_KEYS, next to the params.json cited in published_configs.json), written out
here independently of either engine's mapper; tests/test_model_zoo_cpu.py holds them to vLLM's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .families import published

# transformers' DeepSeek-V3 name -> Mistral's; per layer, the part after "model.layers.N.".
LAYER_NAMES = {
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_a_proj": "attention.wq_a",
    "self_attn.q_a_layernorm": "attention.q_a_norm",
    "self_attn.q_b_proj": "attention.wq_b",
    "self_attn.kv_a_proj_with_mqa": "attention.wkv_a_with_mqa",
    "self_attn.kv_a_layernorm": "attention.kv_a_norm",
    "self_attn.kv_b_proj": "attention.wkv_b",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def mistral_name(name: str) -> str:
    """A dense DeepSeek-V3 tensor's name in Mistral's checkpoints; a name with no Mistral form raises."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    match = LAYER.fullmatch(name)
    if match is None or match.group(2) not in LAYER_NAMES:
        raise KeyError(f"{name}: no Mistral name for it (dense layers only)")
    layer, module, kind = match.groups()
    return f"layers.{layer}.{LAYER_NAMES[module]}.{kind}"


def mistral_params(published_name: str, config: dict) -> dict:
    """params.json for a small config.json of the family published as ``published_name``
    (families.Family.config, every layer dense): the published params.json with the sizes and heads
    that config.json has, so that both describe the weights transformers wrote. The attention fields
    are the published ones in both."""
    params = json.loads(json.dumps(published(published_name)["mistral_params"]))
    for key in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        assert params[key] == config[key], key
    params.update(
        dim=config["hidden_size"],
        hidden_dim=config["intermediate_size"],
        n_layers=config["num_hidden_layers"],
        vocab_size=config["vocab_size"],
        n_heads=config["num_attention_heads"],
        n_kv_heads=config["num_attention_heads"],
        max_position_embeddings=config["max_position_embeddings"],
    )
    params["moe"].update(
        first_k_dense_replace=config["first_k_dense_replace"],
        expert_hidden_dim=config["moe_intermediate_size"],
        num_experts=8,  # none is built: every layer is dense
    )
    return params


def to_mistral_format(path: Path, published_name: str, config: dict) -> None:
    """The checkpoint transformers saved in ``path`` rewritten in Mistral's format."""
    from integration.models.tiny_model import edited_weights

    with edited_weights(path) as tensors:
        renamed = {mistral_name(name): tensor for name, tensor in tensors.items()}
        tensors.clear()
        tensors.update(renamed)
    (weights,) = path.glob("*.safetensors")
    weights.rename(path / "consolidated.safetensors")
    for hf_file in ("config.json", "generation_config.json"):
        (path / hf_file).unlink(missing_ok=True)
    (path / "params.json").write_text(json.dumps(mistral_params(published_name, config), indent=1))
