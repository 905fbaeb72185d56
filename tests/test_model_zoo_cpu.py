"""Each MLA family of the model zoo (integration/models/families.py) through vLLM's own backend
selection with ``--attention-backend CUSTOM``, on CPU, under the installed vLLM (CI: the oldest and
the newest supported release): the family's small config.json is parsed by vLLM as the engine
parses it, the selector gets the fields vLLM's MLA layers pass it, and the platform's selection of an
explicitly chosen backend runs on a GPU of the given capability. The family is then served by the
route the zoo expects, or start-up stops with our reason."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from vllm.config import AttentionConfig, DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

import mla_backend.vllm as plugin
from mla_backend.vllm import backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from integration.models.checkpoints import text_of  # noqa: E402
from integration.models.families import ATTENTION_FIELDS, FAMILIES, Family, published  # noqa: E402

pytestmark = pytest.mark.vllm

CAPABILITIES = [(12, 0), (9, 0)]  # RTX 5090 / PRO 6000, H100


def family_id(family: Family) -> str:
    return family.published  # unique, unlike the first word of the name (Mistral Large 3, Mistral Small 4)


def layouts():
    return [pytest.param(f, layout, id=f"{family_id(f)}-{layout}") for f in FAMILIES for layout in f.heads]


def engine_config(family: Family, layout: str, tmp_path: Path, mla_backend: dict | None = None) -> VllmConfig:
    return config_of(family.config(layout), tmp_path, mla_backend)


def config_of(hf_config: dict, tmp_path: Path, mla_backend: dict | None = None) -> VllmConfig:
    """The engine's config for a checkpoint directory holding ``hf_config``, with the flag set."""
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    model = ModelConfig(model=str(tmp_path), tokenizer=None, skip_tokenizer_init=True, dtype="bfloat16")
    return VllmConfig(
        model_config=model,
        device_config=DeviceConfig(device="cuda"),
        attention_config=AttentionConfig(backend="CUSTOM"),
        additional_config={"mla_backend": mla_backend} if mla_backend else {},
    )


def select(config: VllmConfig, capability: tuple[int, int], kv_cache_dtype: str = "auto") -> str:
    """What CudaPlatform.get_attn_backend_cls answers for the engine's MLA layers with the flag set
    (its selected-backend branch, written out: vllm.platforms.cuda needs libcuda to import): the
    selected class's path, or the ValueError that stops start-up."""
    model = config.model_config
    selector = AttentionSelectorConfig(
        head_size=model.get_head_size(),
        dtype=torch.bfloat16,
        kv_cache_dtype=kv_cache_dtype,
        block_size=64,
        use_mla=model.use_mla,
        use_sparse=hasattr(model.hf_text_config, "index_topk"),  # how vLLM's DeepSeek/GLM-5 layers decide
    )

    selected = config.attention_config.backend
    with set_current_vllm_config(config):
        backend_class = selected.get_class()
        reasons = backend_class.validate_configuration(
            device_capability=DeviceCapability(*capability), **selector._asdict()
        )
        if reasons:
            raise ValueError(f"Selected backend {selected} is not valid for this configuration. Reason: {reasons}")
        return ".".join(backend_class.full_cls_name())  # the class vLLM then builds the layers with


@pytest.fixture(autouse=True)
def registered():
    AttentionBackendEnum.CUSTOM.clear_override()
    plugin.register()
    yield
    AttentionBackendEnum.CUSTOM.clear_override()


@pytest.mark.parametrize("family, layout", layouts())
def test_small_config_keeps_the_published_attention_fields(family, layout):
    config, text = family.config(layout), family.text_config(layout)
    source = published(family.published)
    for key in ATTENTION_FIELDS:
        value = source.get(key, (source.get("index_fields") or {}).get(key))
        if value is not None and key not in family.fills:
            assert text[key] == value, key
    assert config["architectures"] == [family.architecture]
    assert text["num_attention_heads"] == family.heads[layout]


SERVED = [f for f in FAMILIES if f.expect != "refused"]
SPARSE_BACKEND_PATH = "mla_backend.vllm.sparse_backend.MLASparseBackend"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Each served family's seeded checkpoint (its first layout), written once for the tests that read it."""
    from integration.models.checkpoints import save_checkpoint

    root, written = tmp_path_factory.mktemp("zoo"), {}

    def write(family: Family) -> Path:
        if family.name not in written:
            written[family.name] = save_checkpoint(family, root / family.published)
        return written[family.name]

    return write


@pytest.mark.parametrize("family", SERVED, ids=family_id)
def test_each_served_family_writes_its_seeded_checkpoint(family, checkpoint):
    """zoo_e2e.py writes each checkpoint with the installed transformers on the GPU machine: a config
    it cannot build (a token id past the small vocabulary) stops the whole zoo run there."""
    path = checkpoint(family)
    heads = next(iter(family.heads.values()))
    if family.checkpoint_format == "mistral":  # Mistral's own format, as released
        assert not (path / "config.json").exists() and (path / "consolidated.safetensors").exists()
        assert json.loads((path / "params.json").read_text())["n_heads"] == heads
        return
    written = text_of(json.loads((path / "config.json").read_text()))
    assert written["num_attention_heads"] == heads
    vocab = written["vocab_size"]
    assert all(written.get(key) is None or 0 <= written[key] < vocab for key in ("pad_token_id", "bos_token_id"))
    assert (path / "model.safetensors").exists()


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("family, layout", layouts())
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_the_flag_serves_each_family_as_the_zoo_says(family, layout, capability, kv_cache_dtype, tmp_path):
    config = engine_config(family, layout, tmp_path)
    if family.expect == "sparse":  # our sparse backend; fp8 KV is DeepSeek's fp8_ds_mla (kv_dtype_hook.py)
        for kv in (kv_cache_dtype, "fp8_ds_mla"):
            assert select(config, capability, kv) == SPARSE_BACKEND_PATH
        return
    if family.expect == "refused":
        with pytest.raises(ValueError, match=family.refusal):
            select(config, capability, kv_cache_dtype)
        return
    assert select(config, capability, kv_cache_dtype) == plugin.BACKEND_PATH
    route = backend.engine_route(config, capability)
    assert route.kernel == family.expect, route.reason
    if family.expect == "fallback":  # `auto` hands it to vLLM's Triton MLA; a named backend stops start-up
        named = engine_config(family, layout, tmp_path, {"backend": "xqa"})
        with pytest.raises(ValueError, match=family.refusal):
            backend.engine_route(named, capability)


def test_every_published_family_of_the_zoo_is_classified():
    """A family added to published_configs.json is either in the zoo or named here with why not."""
    not_in_zoo = {
        "DeepSeek-R1": "DeepSeek-V3's attention fields (its row covers R1)",
        "DeepSeek-V3.1": "no config found; DeepSeek-V3's architecture",
        "DeepSeek-V4": "vLLM runs its own compressed sparse attention; the flag never reaches mla_backend",
        "Eagle3-drafters": "Llama attention (not MLA)",
    }
    zoo = {f.published for f in FAMILIES}
    every = set(
        json.loads(
            Path(__file__).resolve().parents[1].joinpath("integration/models/published_configs.json").read_text()
        )["families"]
    )
    assert every == zoo | set(not_in_zoo)


KIMI_VL = next(f for f in FAMILIES if f.architecture == "KimiVLForConditionalGeneration")
KIMI_K25 = next(f for f in FAMILIES if f.architecture == "KimiK25ForConditionalGeneration")
# Each wrapper: the family whose attention its text model has, and its projector's top-level name.
WRAPPED = {
    KIMI_VL.name: ("Moonlight", "multi_modal_projector"),
    KIMI_K25.name: ("Kimi-K2 / K2.5 (text)", "mm_projector"),
}


@pytest.mark.parametrize("wrapper", [KIMI_VL, KIMI_K25], ids=["Kimi-VL", "Kimi-K2.5"])
def test_a_kimi_wrapper_s_checkpoint_is_its_text_model_in_vllm_s_wrapper_run_text_only(wrapper, checkpoint):
    """Kimi-VL and Kimi-K2.5 as the zoo writes them: vLLM's kimi_vl / kimi_k25 config (its own class)
    around an MLA text model, which vLLM builds from text_config (Kimi-VL: Moonlight's attention, 16
    heads, no q_lora; Kimi-K2.5: Kimi-K2's, 64 heads over TP8); every tensor is the text model's, under
    language_model. where the wrapper's loader hands it on, beside a small seeded vision tower and
    projector. The prompts are text, so vLLM runs it text-only with language_model_only (Kimi-VL would
    not without it; for Kimi-K2.5 vLLM 0.26 finds no multimodal processor without the released
    processor files, and runs it text-only either way)."""
    from safetensors import safe_open
    from vllm.engine.arg_utils import EngineArgs

    from integration.engines.vllm_spec import EngineSpec, engine_kwargs
    from integration.models.checkpoints import dense_config, transformers_model

    same_attention, projector = WRAPPED[wrapper.name]
    text_family = next(f for f in FAMILIES if f.name == same_attention)
    for key in ("num_attention_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "q_lora_rank"):
        assert text_family.config()[key] == wrapper.text_config()[key], key
    path = checkpoint(wrapper)
    with safe_open(next(path.glob("*.safetensors")), "pt") as weights:
        shapes = {name: list(weights.get_slice(name).get_shape()) for name in weights.keys()}  # noqa: SIM118
    state = transformers_model("deepseek_v3", text_of(dense_config(wrapper))).state_dict()
    text = {name: shape for name, shape in shapes.items() if name.startswith("language_model.")}
    assert text == {f"language_model.{name}": list(tensor.shape) for name, tensor in state.items()}
    # The rest is the tower and its projector, which text-only vLLM leaves unbuilt and unloaded (SGLang
    # loads them: tests/test_sglang_zoo_e2e.py)
    assert {name.split(".")[0] for name in shapes.keys() - text.keys()} == {"vision_tower", projector}

    kwargs = engine_kwargs(EngineSpec("CUSTOM", "fp8"), str(path), 2048, 0.2)
    assert kwargs["language_model_only"] and set(kwargs) <= {f.name for f in dataclasses.fields(EngineArgs)}
    for text_only in (True, False):
        model = ModelConfig(
            model=str(path), tokenizer=None, skip_tokenizer_init=True, dtype="bfloat16", language_model_only=text_only
        )
        assert model.architecture == wrapper.architecture and model.use_mla
        assert model.hf_text_config.num_attention_heads == next(iter(wrapper.heads.values()))
        assert model.get_head_size() == 576
        if text_only or wrapper is KIMI_VL:
            assert runs_multimodal_inputs(model) is not text_only


def runs_multimodal_inputs(model: ModelConfig) -> bool:
    """vLLM's own decision whether the engine builds its multimodal input path (False: text-only,
    the vision tower not built): the registry's in 0.26, the model config's in 0.33."""
    from vllm.multimodal import MULTIMODAL_REGISTRY

    if hasattr(MULTIMODAL_REGISTRY, "supports_multimodal_inputs"):
        return MULTIMODAL_REGISTRY.supports_multimodal_inputs(model)
    return model._supports_multimodal_inputs()


MISTRAL_FORMAT = [f for f in FAMILIES if f.checkpoint_format == "mistral"]


def mistral_layouts():
    return [pytest.param(f, layout, id=f"{f.published}-{layout}") for f in MISTRAL_FORMAT for layout in f.heads]


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("family, layout", mistral_layouts())
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_a_mistral_params_json_is_routed_by_the_flag(family, layout, capability, kv_cache_dtype, tmp_path):
    """Mistral Large 3 and Small 4 as users start them (--config-format mistral): vLLM maps their
    params.json onto a DeepSeek-V3 config (MistralLarge3ForCausalLM, YaRN, the llama_4 query scale);
    the flag must select our backend, and Large 3's 512 + 64 latent the bundled kernels, Small 4's
    256 + 64 vLLM's Triton MLA (under `auto`; a named backend stops start-up)."""
    from integration.models.checkpoints import dense_config
    from integration.models.mistral_format import mistral_params

    heads, fields = family.heads[layout], published(family.published)
    (tmp_path / "params.json").write_text(json.dumps(mistral_params(family.published, dense_config(family, layout))))
    model = ModelConfig(
        model=str(tmp_path), tokenizer=None, skip_tokenizer_init=True, dtype="bfloat16", config_format="mistral"
    )
    text = model.hf_text_config
    latent = fields["kv_lora_rank"] + fields["qk_rope_head_dim"]
    assert model.architecture == "MistralLarge3ForCausalLM" and model.use_mla and model.get_head_size() == latent
    assert (text.num_attention_heads, text.kv_lora_rank, text.qk_rope_head_dim) == (
        heads,
        fields["kv_lora_rank"],
        64,
    )
    assert text.llama_4_scaling == fields["llama_4_scaling"]

    def flagged(mla_backend: dict | None = None) -> VllmConfig:
        return VllmConfig(
            model_config=model,
            device_config=DeviceConfig(device="cuda"),
            attention_config=AttentionConfig(backend="CUSTOM"),
            additional_config={"mla_backend": mla_backend} if mla_backend else {},
        )

    assert select(flagged(), capability, kv_cache_dtype) == plugin.BACKEND_PATH
    assert backend.engine_route(flagged(), capability).kernel == family.expect
    if family.expect == "fallback":
        with pytest.raises(ValueError, match=family.refusal):
            backend.engine_route(flagged({"backend": "xqa"}), capability)


# Every model type vLLM runs as MLA (vLLM 0.26 and 0.33), and what the zoo does with it. A type vLLM
# adds fails test_every_mla_model_type_vllm_knows_is_classified until it is placed here (and in
# docs/models.md). Not classified: no published config read; they still get the rules every model
# gets (a 512 + 64 dense latent is served, an indexer on the sparse backend, another latent falls back under auto).
MLA_MODEL_TYPES = {
    "deepseek_v2": "zoo: DeepSeek-V2-Lite",
    "deepseek_v3": "zoo: DeepSeek-V3 / R1, Moonlight, Mistral Large 3 and Small 4 (mapped from their params.json)",
    "kimi_k2": "zoo: Kimi-K2 (K2.5's text model)",
    "glm4_moe_lite": "zoo: GLM-4.7-Flash",
    "longcat_flash": "zoo: LongCat-Flash",
    "kimi_linear": "zoo: Kimi-Linear",
    "deepseek_v32": "zoo: DeepSeek-V3.2, sparse",
    "glm_moe_dsa": "zoo: GLM-5, sparse",
    "deepseek_mtp": "zoo: DeepSeek-V3's MTP drafter",
    "glm4_moe_lite_mtp": "zoo: GLM-4.7-Flash's MTP drafter",
    "deepseek_v4": "vLLM wires its own compressed sparse attention; the flag never reaches mla_backend",
    **dict.fromkeys(
        (
            "axk1",
            "longcat_flash_ngram",
            "pangu_ultra_moe",
            "pangu_ultra_moe_mtp",
            "bailing_hybrid",
            "bailing_hybrid_mtp",
            "bailing_hybrid_v3_mtp",
            "deepseek_v41",
            "dots3_note",
            "k3_dspark",
            "glm5_next",
            "glm5_next_text",
            "hy_v4",
            "hy_v4_mtp",
        ),
        "not classified: no published config read",
    ),
}


def vllm_mla_model_types() -> set[str]:
    """The model types the installed vLLM runs as MLA: the list in its is_deepseek_mla (read from the
    source, so a type vLLM adds shows up here)."""
    import ast

    from vllm.transformers_utils import model_arch_config_convertor

    tree = ast.parse(Path(model_arch_config_convertor.__file__).read_text())
    (method,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "is_deepseek_mla"]
    tuples = [n for n in ast.walk(method) if isinstance(n, ast.Tuple) and len(n.elts) > 4]
    return {element.value for element in tuples[0].elts}


def test_every_mla_model_type_vllm_knows_is_classified():
    known = vllm_mla_model_types()
    assert {"deepseek_v3", "kimi_k2", "glm4_moe_lite"} <= known
    assert known <= set(MLA_MODEL_TYPES), sorted(known - set(MLA_MODEL_TYPES))
    # vLLM decides MLA by the text model's type (a multimodal wrapper's text_config)
    zoo = {f.text_model_type or f.model_type for f in FAMILIES} | {"deepseek_mtp", "glm4_moe_lite_mtp"}
    assert {t for t, where in MLA_MODEL_TYPES.items() if where.startswith("zoo")} == zoo - {"minicpm3"}


def size_blocks_as_vllm_does(config: VllmConfig, monkeypatch) -> int:
    """vLLM's own block sizing for an engine whose attention layers run our backend (Platform.
    update_block_size_for_backend: the backend's preferred size unless the user named one, then a
    hybrid's alignment); the lookup of the backend, which needs a GPU platform, stood in."""
    from vllm.platforms.interface import Platform

    if hasattr(Platform, "_find_non_ssm_backends"):  # vLLM 0.33
        monkeypatch.setattr(Platform, "_find_non_ssm_backends", classmethod(lambda cls, c: [backend.MLABackend]))
    else:
        monkeypatch.setattr(Platform, "_find_non_ssm_backend", classmethod(lambda cls, c: backend.MLABackend))
    Platform.update_block_size_for_backend(config)
    return config.cache_config.block_size


@pytest.mark.parametrize("block_size", [None, 16, 128], ids=["default", "user-16", "user-128"])
def test_the_cache_is_paged_at_64_unless_the_user_names_a_size(block_size, tmp_path, monkeypatch):
    """Started with the flag and no --block-size, vLLM pages the cache as our backend prefers (64: what
    the kernels are measured at, and the only page FlashMLA reads for `auto` on SM90), not at its
    default 16; a size the user names stays."""
    from vllm.config import CacheConfig

    config = engine_config(FAMILIES[0], "TP8", tmp_path)
    config.cache_config = CacheConfig(cache_dtype="fp8", **({"block_size": block_size} if block_size else {}))
    assert size_blocks_as_vllm_does(config, monkeypatch) == (block_size or 64)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("block_size", [None, 64], ids=["default-block", "block-64"])
def test_kimi_linear_s_hybrid_pages_reach_our_kernels_at_a_page_size_they_take(
    kv_cache_dtype, block_size, tmp_path, monkeypatch
):
    """vLLM sizes a hybrid model's attention blocks so one holds a KDA layer's state (thousands of tokens,
    past our kernels' 16..128), then splits them into kernel blocks of a size every backend of the group
    takes: for Kimi-Linear that must be one of ours, else start-up stops in the model runner."""
    from vllm.config import CacheConfig
    from vllm.v1.worker.utils import select_common_block_size

    from mla_backend import shapes

    family = next(f for f in FAMILIES if f.model_type == "kimi_linear")
    config = engine_config(family, "TP1", tmp_path)
    config.cache_config = CacheConfig(cache_dtype=kv_cache_dtype, **({"block_size": block_size} if block_size else {}))
    assert config.model_config.is_hybrid
    aligned = size_blocks_as_vllm_does(config, monkeypatch)
    assert aligned > max(shapes.PAGE_SIZES)  # a KDA state's worth of tokens
    kernel_page = select_common_block_size(aligned, [backend.MLABackend])
    assert kernel_page in shapes.PAGE_SIZES and aligned % kernel_page == 0
    assert kernel_page >= shapes.PREFERRED_PAGE_SIZE  # blocks aligned to the preferred page, or the user's


def names_vllm_loads(model: ModelConfig, names: list[str]) -> list[str]:
    """A checkpoint's tensor names as the model class vLLM picks for it maps them before loading (its
    hf_to_vllm_mapper: Mistral Large 3's turns Mistral's names into DeepSeek-V3's)."""
    from vllm.model_executor.models import ModelRegistry

    model_class, _ = ModelRegistry.resolve_model_cls(model.architectures, model)
    mapper = getattr(model_class, "hf_to_vllm_mapper", None)
    names = mapper.apply_list(names) if mapper else names
    if model.hf_text_config is not model.hf_config:  # a multimodal wrapper hands these to its text model
        names = [name.removeprefix("language_model.") for name in names]
    return names


@pytest.mark.parametrize("family", MISTRAL_FORMAT, ids=lambda f: f.published)
def test_a_mistral_checkpoint_is_in_mistral_s_format_which_vllm_maps_to_its_layers(family, checkpoint):
    """The zoo writes Mistral Large 3 and Small 4 as they are released (params.json, Mistral's tensor
    names: SGLang's class loads no other); vLLM must read params.json as the family's config and map
    every tensor name onto the DeepSeek-V3 tensor transformers wrote, shape for shape."""
    from safetensors import safe_open

    from integration.models.checkpoints import dense_config, transformers_model

    path = checkpoint(family)
    with safe_open(next(path.glob("*.safetensors")), "pt") as weights:
        shapes = {name: list(weights.get_slice(name).get_shape()) for name in weights.keys()}  # noqa: SIM118
    assert "layers.0.attention.wkv_a_with_mqa.weight" in shapes and "output.weight" in shapes
    assert not [n for n in shapes if n.startswith(("model.", "lm_head."))]
    model = ModelConfig(model=str(path), tokenizer=None, skip_tokenizer_init=True, dtype="bfloat16")
    assert model.architecture == "MistralLarge3ForCausalLM"  # read from params.json, as vLLM reads it
    text, config = model.hf_text_config, family.config()
    for key in ("num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"):
        assert getattr(text, key) == config[key], key
    assert text.llama_4_scaling == config["llama_4_scaling"]
    loaded = dict(zip(names_vllm_loads(model, list(shapes)), shapes.values(), strict=True))
    state = transformers_model("deepseek_v3", dense_config(family)).state_dict()
    assert loaded == {name: list(tensor.shape) for name, tensor in state.items()}


@pytest.mark.parametrize("family", SERVED, ids=family_id)
def test_each_checkpoint_has_the_layers_and_mlp_sizes_vllm_reads_from_its_config(family, checkpoint):
    """The weights come from transformers' classes, the model from vLLM's reading of config.json: where the
    two read different keys (transformers 5.17 takes LongCat's blocks and expert size from num_layers and
    expert_ffn_hidden_size, vLLM from num_hidden_layers and moe_intermediate_size), vLLM's loader stops on
    the GPU. Blocks, dense MLPs and experts must have the sizes and the expert ids vLLM builds."""
    from safetensors import safe_open

    path = checkpoint(family)
    model = ModelConfig(model=str(path), tokenizer=None, skip_tokenizer_init=True, dtype="bfloat16")
    text = model.hf_text_config
    with safe_open(next(path.glob("*.safetensors")), "pt") as weights:
        shapes = {name: weights.get_slice(name).get_shape() for name in weights.keys()}  # noqa: SIM118
    shapes = dict(zip(names_vllm_loads(model, list(shapes)), shapes.values(), strict=True))
    blocks = {name.split(".")[2] for name in shapes if name.startswith("model.layers.")}
    assert blocks == {str(i) for i in range(text.num_hidden_layers)}
    dense = {s[1] for n, s in shapes.items() if n.endswith("down_proj.weight") and ".experts." not in n}
    experts = {s[1] for n, s in shapes.items() if n.endswith("down_proj.weight") and ".experts." in n}
    assert dense == {text.intermediate_size}
    assert experts <= {text.moe_intermediate_size}
    expert_ids = {int(n.split(".experts.")[1].split(".")[0]) for n in shapes if ".experts." in n}
    assert expert_ids <= set(range(getattr(text, "n_routed_experts", 0) or 0))  # what vLLM's loader maps


@pytest.mark.parametrize("family", SERVED, ids=family_id)
def test_the_zoo_says_when_vllm_cannot_import_a_family_s_model(family, monkeypatch):
    """Kimi-K2.5's and Kimi-Linear's vLLM modules import compressed_tensors, which the GPU bundle lacks
    unless .gpu/extra is carried: zoo_e2e.py says so per family before starting any engine."""
    import importlib

    from vllm import ModelRegistry

    from integration import zoo_e2e

    assert zoo_e2e.model_import_error(family) is None
    entry = ModelRegistry.models[family.architecture]  # lazy (vLLM 0.26 and 0.33): imported on load
    real_import = importlib.import_module

    def without_compressed_tensors(name, *args):
        if name == entry.module_name:
            raise ModuleNotFoundError("No module named 'compressed_tensors'", name="compressed_tensors")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_compressed_tensors)
    error = zoo_e2e.model_import_error(family)
    assert error is not None and "compressed_tensors" in error and entry.module_name in error
