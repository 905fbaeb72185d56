"""Seeded small checkpoints of the zoo's families (families.py), written with transformers' own model
classes so the weight names are the ones the released checkpoints use.

Dense layers only (first_k_dense_replace and mlp_layer_types past the last layer): MoE never reaches
the attention backend, and no MoE kernel or expert layout is needed. The config.json that is written
is the family's (its model_type included: vLLM maps ``kimi_k2`` onto DeepSeek-V3's class), so vLLM
parses what users' checkpoints give it. Weights use a wide normal init (families.SMALL): with the usual
0.02 attention is nearly uniform and hides decode errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .families import Family
from .kimi_linear import TRANSFORMERS_TYPE as KIMI_LINEAR_WRITER
from .kimi_linear import add_kda_layers
from .mistral_format import to_mistral_format
from .moonvit import vision_weights

# transformers' model_type whose classes write a family's weights, where it is not the family's own:
# Kimi-K2's is only known to vLLM; not every transformers here has Kimi-Linear (kimi_linear.py).
TRANSFORMERS_TYPE = {"kimi_k2": "deepseek_v3", "kimi_linear": KIMI_LINEAR_WRITER}


def dense_config(family: Family, layout: str | None = None, mtp_layers: int = 0) -> dict:
    """The family's config with every layer dense, the ``mtp_layers`` MTP layers after them included."""
    config = family.config(layout)
    text = text_of(config)
    layers = text["num_hidden_layers"]
    text["first_k_dense_replace"] = layers + mtp_layers
    text["mlp_layer_types"] = ["dense"] * layers  # transformers' GLM-4.7-Flash config reads this instead
    text["num_nextn_predict_layers"] = mtp_layers  # transformers' default (1) would claim an MTP layer
    return config


def text_of(config: dict) -> dict:
    """The text model's part of a config.json: a multimodal wrapper's text_config, else the whole."""
    return config.get("text_config", config)


def transformers_model(model_type: str, config: dict) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k != "model_type"}
    fields["mlp_layer_types"] = ["dense"] * fields["num_hidden_layers"]  # deeper models (MTP) too
    if model_type == "longcat_flash":
        # transformers counts LongCat's MLA sublayers (two a block) in num_hidden_layers and its blocks
        # in num_layers; 5.17 derives the first from the second, 5.24 the second from the first, so
        # both are given as they agree. The engines read the blocks from config.json's num_hidden_layers.
        fields["num_hidden_layers"] = 2 * fields["num_layers"]
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))


def save_checkpoint(
    family: Family,
    path: str | Path,
    layout: str | None = None,
    seed: int = 0,
    mtp_layers: int = 0,
) -> Path:
    """Write a bf16 checkpoint of ``family`` with the heads of ``layout`` to ``path`` (reused if the
    same family, layout and seed wrote it), by the transformers classes of TRANSFORMERS_TYPE.
    ``mtp_layers``: the family's multi-token-prediction layers after the decoder layers, as its
    released checkpoints hold them (tiny_model.add_mtp_layers)."""
    from integration.models.tiny_model import add_mtp_layers

    from .longcat_mtp import add_longcat_mtp_layer

    path = Path(path)
    config = dense_config(family, layout, mtp_layers)
    stamp = {"family": family.name, "seed": seed, **config}
    stamp_file = path / "mla_backend_stamp.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return path
    kimi_linear = family.model_type == "kimi_linear"
    text_type = family.text_model_type or family.model_type
    model_type = TRANSFORMERS_TYPE.get(text_type, text_type)
    torch.manual_seed(seed)
    transformers_model(model_type, text_of(config)).to(torch.bfloat16).save_pretrained(path)
    if kimi_linear:
        add_kda_layers(path, config, seed)
    if family.model_type == "longcat_flash":
        drop_identity_expert_weights(path, config["n_routed_experts"])
        if mtp_layers:  # LongCat's own layout (longcat_mtp.py)
            assert mtp_layers == 1, "LongCat-Flash ships one MTP layer"
            add_longcat_mtp_layer(path, config, seed)
    elif mtp_layers:
        add_mtp_layers(path, config, mtp_layers, seed, lambda deeper: transformers_model(model_type, deeper))
    if family.checkpoint_format == "mistral":
        to_mistral_format(path, family.published, config)
    elif family.text_model_type is not None:
        wrap_text_model(path, config, seed)
    else:  # Kimi-Linear: the family's config only, none of the keys DeepSeek-V3's classes add.
        written = {"dtype": "bfloat16"} if kimi_linear else json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**written, **config}, indent=1))
    stamp_file.write_text(json.dumps(stamp))
    return path


def wrap_text_model(path: Path, config: dict, seed: int) -> None:
    """A multimodal wrapper's checkpoint around the text model transformers wrote: its tensors under
    language_model. (where vLLM's and SGLang's wrappers hand them to the text model), the seeded
    vision tower and projector beside them (moonvit.py), and the wrapper's config.json, the text
    model's written config as its text_config."""
    from integration.models.tiny_model import edited_weights

    text = config["text_config"]
    with edited_weights(path) as tensors:
        for name in list(tensors):
            tensors[f"language_model.{name}"] = tensors.pop(name)
        tensors |= vision_weights(
            config["model_type"], config["vision_config"], text["hidden_size"], text["initializer_range"], seed
        )
    written = json.loads((path / "config.json").read_text())
    written.pop("architectures", None)  # the wrapper names the model
    wrapped = {**config, "text_config": {**written, **text}}
    (path / "config.json").write_text(json.dumps(wrapped, indent=1))


def drop_identity_expert_weights(path: Path, routed: int) -> None:
    """transformers writes LongCat's identity ("zero") experts as weights after the routed ones;
    released checkpoints hold the routed experts only, and vLLM's loader stops on any other index."""
    from integration.models.tiny_model import edited_weights

    with edited_weights(path) as tensors:
        for name in [n for n in tensors if ".experts." in n]:
            if int(name.split(".experts.")[1].split(".")[0]) >= routed:
                del tensors[name]


def save_config(family: Family, path: str | Path, layout: str | None = None) -> Path:
    """config.json only: enough for vLLM's config parsing, backend selection and refusals."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(dense_config(family, layout), indent=1))
    return path


def save_sparse_checkpoint(family_name: str, model_dir: Path) -> tuple[Family, Path]:
    """(family, checkpoint) of a sparse family of the zoo (DeepSeek-V3.2, GLM-5) named like ``pick``'s
    names, written under ``model_dir`` in its first layout (``DeepSeek-V3.2@64``: the 64-head one).
    Raises ValueError for a family that is not sparse."""
    from .families import pick

    (family, layout), *_ = pick(family_name, every_layout=False)
    if family.expect != "sparse":
        raise ValueError(f"--family takes a sparse family; {family.name} is {family.expect!r}")
    return family, save_checkpoint(family, model_dir / family.model_type, layout)
