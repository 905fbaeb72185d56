"""The seeded checkpoints of the end-to-end runs: with an MTP layer, its weights are named as vLLM's
DeepSeek-V3 MTP drafter loads them and skipped by the main model; the decoder layers stay dense."""

import json
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the integration package, from the checkout
from integration.models.tiny_model import TINY_DEFAULTS, save_tiny_deepseek_v3  # noqa: E402

LAYERS = TINY_DEFAULTS["num_hidden_layers"]
MTP_ONLY = {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight"}


@pytest.fixture(scope="module")
def mtp_checkpoint(tmp_path_factory):
    path = save_tiny_deepseek_v3(tmp_path_factory.mktemp("mtp"), heads=16, mtp_layers=1)
    config = json.loads((path / "config.json").read_text())
    with safe_open(str(next(path.glob("*.safetensors"))), "pt") as weights:
        shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    return config, shapes


def test_the_mtp_layer_follows_the_decoder_layers_and_is_dense(mtp_checkpoint):
    config, _ = mtp_checkpoint
    assert config["num_nextn_predict_layers"] == 1 and config["num_hidden_layers"] == LAYERS
    # vLLM builds a MoE block for any layer index >= first_k_dense_replace; the MTP layer is index LAYERS.
    assert config["first_k_dense_replace"] > LAYERS


def test_mtp_weights_are_a_decoder_layer_plus_the_mtp_projections(mtp_checkpoint):
    _, shapes = mtp_checkpoint
    hidden, vocab = TINY_DEFAULTS["hidden_size"], TINY_DEFAULTS["vocab_size"]
    decoder = {n.removeprefix("model.layers.0.") for n in shapes if n.startswith("model.layers.0.")}
    mtp = {n.removeprefix(f"model.layers.{LAYERS}.") for n in shapes if n.startswith(f"model.layers.{LAYERS}.")}
    assert mtp == decoder | MTP_ONLY | {"embed_tokens.weight"}
    for name in decoder:
        assert shapes[f"model.layers.{LAYERS}.{name}"] == shapes[f"model.layers.0.{name}"], name
    prefix = f"model.layers.{LAYERS}."
    assert shapes[prefix + "eh_proj.weight"] == (hidden, 2 * hidden)
    assert shapes[prefix + "shared_head.head.weight"] == (vocab, hidden)
    assert shapes[prefix + "embed_tokens.weight"] == (vocab, hidden)


@pytest.mark.vllm
def test_vllm_routes_every_mtp_weight_to_the_drafter_and_none_to_the_main_model(mtp_checkpoint):
    from types import SimpleNamespace

    from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP
    from vllm.model_executor.models.utils import get_spec_layer_idx_from_weight_name

    config, shapes = mtp_checkpoint
    hf = SimpleNamespace(**config)
    spec = {n for n in shapes if get_spec_layer_idx_from_weight_name(hf, n) == LAYERS}
    assert spec == {n for n in shapes if n.startswith(f"model.layers.{LAYERS}.")}
    renamed = {DeepSeekMTP._rewrite_spec_layer_name(None, LAYERS, n) for n in spec}
    assert "model.embed_tokens.weight" in renamed  # the drafter's shared embedding
    assert {f"model.layers.{LAYERS}.{n}" for n in MTP_ONLY} <= renamed
    block = {n for n in renamed if ".mtp_block." in n}
    assert len(block) == len(spec) - len(MTP_ONLY) - 1  # the rest is the drafter's decoder block


def test_without_mtp_the_checkpoint_has_only_the_decoder_layers(tmp_path):
    path = save_tiny_deepseek_v3(tmp_path, heads=16)
    config = json.loads((path / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 0  # no MTP layer, and the config says so
    with safe_open(str(next(path.glob("*.safetensors"))), "pt") as weights:
        assert not [n for n in weights.keys() if n.startswith(f"model.layers.{LAYERS}.")]
