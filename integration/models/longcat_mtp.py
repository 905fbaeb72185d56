"""LongCat-Flash's MTP layer in a seeded checkpoint, named as LongCat's released checkpoints hold it and
as vLLM's LongCatFlashMTP (models/longcat_flash_mtp.py, ``load_weights``) reads it: one MLA block and a
dense MLP under ``model.mtp.layers.0`` (``self_attn``, ``transformer_layer.mlp``, the two layer norms,
``enorm.m`` / ``hnorm.m`` and ``eh_proj``), ``model.mtp.embed_tokens`` and ``model.mtp.norm``. Its
attention and MLP take the shapes of the main blocks' first sublayers; LongCat's main model skips every
``.mtp.`` weight. Projections use the checkpoint's wide normal init, norms start at one.
"""

from __future__ import annotations

from pathlib import Path

import torch

MTP = "model.mtp."
LAYER = MTP + "layers.0."
# The main model's first block -> the MTP layer: its first MLA sublayer, its first dense MLP.
FROM_MAIN = {
    "model.layers.0.self_attn.0.": LAYER + "self_attn.",
    "model.layers.0.mlps.0.": LAYER + "transformer_layer.mlp.",
}


def add_longcat_mtp_layer(path: Path, settings: dict, seed: int) -> None:
    """Append the MTP layer to the LongCat checkpoint at ``path`` written with ``settings`` (whose
    ``num_nextn_predict_layers``, 1, vLLM reads for the drafter's depth)."""
    from integration.models.tiny_model import edited_weights

    hidden, std = settings["hidden_size"], settings["initializer_range"]
    generator = torch.Generator().manual_seed(seed + 1)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * std).to(torch.bfloat16)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch.bfloat16)

    with edited_weights(path) as tensors:
        for name, tensor in sorted(tensors.items()):
            for source, target in FROM_MAIN.items():
                if name.startswith(source):
                    suffix = name.removeprefix(source)
                    tensors[target + suffix] = ones(tensor.shape[0]) if "layernorm" in suffix else normal(*tensor.shape)
        for norm in ("input_layernorm", "post_attention_layernorm", "enorm.m", "hnorm.m"):
            tensors[f"{LAYER}{norm}.weight"] = ones(hidden)
        tensors[LAYER + "eh_proj.weight"] = normal(hidden, 2 * hidden)
        tensors[MTP + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
        tensors[MTP + "norm.weight"] = ones(hidden)
