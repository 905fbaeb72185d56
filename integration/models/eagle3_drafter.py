"""A seeded Eagle3 drafter with an MLA draft layer for a zoo checkpoint, in the layout vLLM's
``Eagle3DeepseekV2ForCausalLM`` loads (vllm/model_executor/models/deepseek_eagle3.py; registered
under the V3 name too). One decoder layer whose MLA attention reads the token's embedding beside the
fused hidden state (inputs 2 x hidden wide), a dense MLP, ``fc`` fusing the target's auxiliary hidden
states, the target's vocabulary (no draft-vocabulary map) and its embedding (shared, so not written).
The attention fields are the target family's, so the draft layer decodes through the same backend as
the target's layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .checkpoints import text_of

# DeepSeek-V2's config type: vLLM turns a draft config of type deepseek_v3 into its MTP drafter's.
ARCHITECTURE, MODEL_TYPE = "Eagle3DeepseekV2ForCausalLM", "deepseek_v2"


def aux_layers(target_layers: int) -> list[int]:
    """The target's hidden states the drafter fuses: inputs of layer 1, of the middle layer and the
    last layer's output (vLLM reads hidden + residual at a layer's input; layer 0 has no residual)."""
    return sorted({1, max(1, target_layers // 2), target_layers})


def drafter_config(target: dict) -> dict:
    layers = aux_layers(target["num_hidden_layers"])
    keys = ("hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings", "rope_scaling", "rope_theta")
    keys += ("num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim")
    keys += ("qk_rope_head_dim", "v_head_dim", "initializer_range")
    return {
        **{k: target[k] for k in keys if k in target},
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "num_hidden_layers": 1,
        "draft_vocab_size": target["vocab_size"],
        "hidden_act": "silu",
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers},
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def drafter_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every weight the drafter holds, by checkpoint name."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    nope, rope, v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    kv_lora, q_lora = config["kv_lora_rank"], config.get("q_lora_rank")
    attn, layer = "layers.0.self_attn.", "layers.0."
    shapes: dict[str, tuple[int, ...]] = {}
    if q_lora:
        shapes[attn + "q_a_proj.weight"] = (q_lora, 2 * hidden)
        shapes[attn + "q_a_layernorm.weight"] = (q_lora,)
        shapes[attn + "q_b_proj.weight"] = (heads * (nope + rope), q_lora)
    else:
        shapes[attn + "q_proj.weight"] = (heads * (nope + rope), 2 * hidden)
    shapes[attn + "kv_a_proj_with_mqa.weight"] = (kv_lora + rope, 2 * hidden)
    shapes[attn + "kv_a_layernorm.weight"] = (kv_lora,)
    shapes[attn + "kv_b_proj.weight"] = (heads * (nope + v), kv_lora)
    shapes[attn + "o_proj.weight"] = (hidden, heads * v)
    inner = config["intermediate_size"]
    shapes |= {layer + "mlp.gate_proj.weight": (inner, hidden), layer + "mlp.up_proj.weight": (inner, hidden)}
    shapes[layer + "mlp.down_proj.weight"] = (hidden, inner)
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        shapes[f"{layer}{norm}.weight"] = (hidden,)
    aux = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    shapes["fc.weight"] = (hidden, aux * hidden)
    shapes["norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (config["draft_vocab_size"], hidden)
    return shapes


def save_seeded_weights(shapes: dict[str, tuple[int, ...]], std: float, seed: int, file: Path) -> None:
    """A drafter's weights in bf16 to ``file``: norms at one, every other weight normal with ``std``
    (drawn in ``shapes``' order from a generator seeded with ``seed``)."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=generator) * std
        for name, shape in shapes.items()
    }
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, file)


def save_eagle3_drafter(target_dir: str | Path, path: str | Path, seed: int = 0) -> Path:
    """Write the drafter of the checkpoint in ``target_dir`` to ``path`` (reused if the same target
    and seed wrote it): norms at one, every other weight normal with the target's init scale."""
    path = Path(path)
    target = json.loads((Path(target_dir) / "config.json").read_text())
    config = drafter_config(text_of(target))  # a multimodal wrapper's text model (Kimi-K2.5)
    stamp = {"seed": seed, **config}
    stamp_file = path / "mla_backend_stamp.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return path
    path.mkdir(parents=True, exist_ok=True)
    std = config.get("initializer_range", 0.02)
    save_seeded_weights(drafter_shapes(config), std, seed + 2, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(config, indent=1))
    stamp_file.write_text(json.dumps(stamp))
    return path
