"""The MLA model families people serve, as small configs built from each family's published config.json.

Every attention field (heads, q_lora present or not, kv_lora, qk_nope / rope / v dims, rope scaling,
the sparse indexer's fields) comes from ``published_configs.json`` in this folder, which records where
each value was read. A family's small config keeps those fields and shrinks only what the attention
backend never sees: hidden size, layer count, vocabulary, expert count. ``heads`` is the count one GPU
decodes in the layout users run (Kimi-K2 at TP8: 64 / 8 = 8), since a checkpoint built with that many
heads gives the backend the shapes a TP rank gets.

``expect`` is what mla_backend does with the family under ``--attention-backend CUSTOM``:
- ``bundled``: the bundled kernels decode it;
- ``fallback``: `auto` hands decode to vLLM's Triton MLA kernel (MLA shapes the kernels do not take:
  Mistral Small 4's 256 + 64 latent); an explicit ``backend`` stops start-up with the reason;
- ``sparse``: DeepSeek Sparse Attention (an indexer picks each token's top-k keys): vLLM runs it on our
  sparse kernels (sparse_e2e.py), SGLang through its dsa backend with ``--dsa-decode-backend mla_backend``
  (sglang_sparse_e2e.py); SGLang's dense flag (``--decode-attention-backend mla_backend``) refuses it with
  ``refusal``;
- ``refused``: start-up stops with our reason;
- ``own``: vLLM runs the model's own attention whatever the flag says; mla_backend is never called.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

PUBLISHED = Path(__file__).with_name("published_configs.json")

Expect = Literal["bundled", "fallback", "sparse", "refused", "own"]

# What the backend never sees, shrunk so a checkpoint fits the lent GPU and builds in seconds.
SMALL = dict(
    vocab_size=2048,
    hidden_size=512,
    intermediate_size=1024,
    moe_intermediate_size=256,
    num_hidden_layers=2,
    max_position_embeddings=8192,
    initializer_range=0.1,  # with the usual 0.02, attention is nearly uniform and hides decode errors
    tie_word_embeddings=False,
    # within the small vocabulary (transformers' Kimi-Linear defaults are the released tokenizer's ids,
    # past it, and its embedding refuses a padding id outside the table)
    pad_token_id=None,
    bos_token_id=0,
    eos_token_id=1,
)
# The published attention fields a small config keeps, when the family's config has them.
ATTENTION_FIELDS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "rope_scaling",
    "rope_theta",
    "max_position_embeddings",  # YaRN's factor is read against it
    "index_topk",
    "index_head_dim",
    "index_n_heads",
    "mla_use_nope",  # Kimi-Linear: the rope slice is cached but never rotated (vLLM's layer asserts it)
    "mla_scale_q_lora",  # LongCat: the latent query and KV rescaled after their norms
    "mla_scale_kv_lora",
)


@cache
def published(name: str) -> dict:
    """The family's entry in published_configs.json (its ``source`` says where it was read)."""
    return json.loads(PUBLISHED.read_text())["families"][name]


@dataclass(frozen=True)
class Family:
    name: str  # the family as users know it
    published: str  # its key in published_configs.json
    architecture: str  # vLLM's model class (config.json "architectures")
    model_type: str
    heads: dict[str, int]  # layout -> query heads one GPU decodes
    expect: Expect
    # vLLM's speculative method for the family's drafter: its MTP layer's, or eagle (Mistral Large 3's
    # Eagle drafter, mistral_eagle_drafter.py)
    drafter: str | None = None
    # Eagle3 drafters with an MLA draft layer (vLLM's deepseek_eagle3) are run with this family
    eagle3_mla: bool = False
    fills: dict = field(default_factory=dict)  # published values the copies read lack (with why)
    extra: dict = field(default_factory=dict)  # config keys this architecture's loader needs
    # how its checkpoints are released: "hf" (config.json, transformers' names) or "mistral"
    # (params.json, consolidated.safetensors under Mistral's names: mistral_format.py)
    checkpoint_format: Literal["hf", "mistral"] = "hf"
    # A multimodal wrapper's text model type: config() nests the text model's fields under text_config,
    # beside the published vision_config, and the checkpoint holds the text model under language_model.
    text_model_type: str | None = None
    vision: dict = field(default_factory=dict)  # its published vision_config, shrunk (the backend never sees it)
    why: str = ""  # for fallback / refused / own: the reason users read
    # for refused (and fallback with an explicit backend; sparse on SGLang): what mla_backend's start-up error says
    refusal: str = ""

    def attention(self) -> dict:
        """The published attention fields, completed by ``fills``."""
        source = published(self.published)
        fields = {k: source[k] for k in ATTENTION_FIELDS if source.get(k) is not None}
        fields.update((k, v) for k, v in (source.get("index_fields") or {}).items())
        fields.update(self.fills)
        if "q_lora_rank" not in fields:
            fields["q_lora_rank"] = None  # no query compression (V2-Lite, Moonlight, Kimi-VL/Linear)
        return fields

    def config(self, layout: str | None = None) -> dict:
        """config.json of the family's small checkpoint with the heads of ``layout`` (the first by default)."""
        if self.text_model_type is None:
            return self.text_config(layout)
        return {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "text_config": self.text_config(layout),
            "vision_config": {**published(self.published)["vision_config"], **self.vision},
        }

    def text_config(self, layout: str | None = None) -> dict:
        """The text model's fields: the whole config.json, or a multimodal wrapper's text_config."""
        heads = self.heads[layout or next(iter(self.heads))]
        model = {"architectures": [self.architecture], "model_type": self.model_type}
        if self.text_model_type is not None:  # the wrapper names the architecture; its text model too, if published
            model = {"model_type": self.text_model_type}
            text = published(self.published).get("text_config") or {}
            if "architectures" in text:
                model["architectures"] = text["architectures"]
        return {
            **SMALL,
            **model,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            **self.attention(),
            **self.extra,
        }


SPARSE_REFUSAL = "mla_backend decodes dense MLA; this model's attention is sparse"
# LongCat-Flash routes in every block (no dense-only layer), so its experts are shrunk, keeping the
# identity ("zero") experts the published config has (512 + 256, top 12; zero_expert_type as published,
# which vLLM's LongCat MoE asserts and transformers' config leaves unset); transformers, vLLM and SGLang
# read these keys alike. Its sizes go under the published names too: transformers 5.17 (the GPU image's)
# reads only those, and its defaults (28 blocks, experts of 2048) are not what vLLM builds from the
# generic intermediate_size / moe_intermediate_size.
LONGCAT_SMALL = {
    "n_routed_experts": 8,
    "zero_expert_num": 4,
    "moe_topk": 2,
    "zero_expert_type": "identity",
    "num_layers": SMALL["num_hidden_layers"],  # blocks of two MLA sublayers
    "ffn_hidden_size": SMALL["intermediate_size"],
    "expert_ffn_hidden_size": SMALL["moe_intermediate_size"],
}
DEEPSEEK_V2_V_HEAD = {"v_head_dim": 128}  # the copies read cut off before v_head_dim; DeepSeek-V2's value
# Kimi-Linear is a hybrid of KDA (linear attention) and MLA layers, and both engines build it as one
# (vLLM sizes its cache pages from the KDA state): the published linear_attn_config (1-based lists, MLA on
# 7 of 27 layers, KDA first) cut to one KDA layer and then one MLA layer.
KIMI_LINEAR_HYBRID = {
    "linear_attn_config": {
        **published("Kimi-Linear-48B-A3B")["mla_layer_marker"]["linear_attn_config"],
        "kda_layers": [1],
        "full_attn_layers": [2],
    }
}
# Mistral Large 3 and Mistral Small 4 ship Mistral's own params.json, which vLLM maps onto a DeepSeek-V3
# config (architecture MistralLarge3ForCausalLM; the published fields and vLLM's mapping in
# published_configs.json). config() gives that mapped config; the zoo's checkpoint is written in
# Mistral's format (mistral_format.py). Their query takes a position-dependent scale (llama_4_scaling)
# in the engines' attention layer, before the decode backend.
# Kimi-VL's MoonViT, shrunk as the text model is: the published patch size, position grid and 2 x 2
# merge; a small width (a multiple of its heads) and one block.
KIMI_VL_VISION = {"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 128}
# Kimi-K2.5's, shrunk the same way. Its config names the tower's sizes vt_* (SGLang's config class reads
# those); vLLM's class reads hidden_size and the like, so the shrunk sizes go under both names.
KIMI_K25_VISION = {
    "vt_hidden_size": 64,
    "vt_num_attention_heads": 2,
    "vt_num_hidden_layers": 1,
    "vt_intermediate_size": 128,
    "mm_hidden_size": 64,
    "text_hidden_size": SMALL["hidden_size"],
    **KIMI_VL_VISION,
}
MISTRAL_LARGE_3_QUERY_SCALE = {"llama_4_scaling": published("Mistral-Large-3")["llama_4_scaling"]}
MISTRAL_SMALL_4_QUERY_SCALE = {"llama_4_scaling": published("Mistral-Small-4")["llama_4_scaling"]}
# What start-up says when a backend is named for a model whose MLA shapes only vLLM's Triton MLA takes
# (mla_backend/vllm/backend.py, engine_route).
FALLBACK_REFUSAL = "backend='auto' decodes such models with vLLM's Triton MLA kernel"

FAMILIES: tuple[Family, ...] = (
    Family(
        "DeepSeek-V3 / R1",
        "DeepSeek-V3",
        "DeepseekV3ForCausalLM",
        "deepseek_v3",
        heads={"TP8": 16, "TP1 or DP attention": 128},
        expect="bundled",
        drafter="deepseek_mtp",
        eagle3_mla=True,
    ),
    Family(
        "DeepSeek-V2-Lite",
        "DeepSeek-V2-Lite",
        "DeepseekV2ForCausalLM",
        "deepseek_v2",
        heads={"TP1": 16},
        expect="bundled",
        fills=DEEPSEEK_V2_V_HEAD,
    ),
    Family(
        "Moonlight",
        "Moonlight-16B-A3B",
        "DeepseekV3ForCausalLM",
        "deepseek_v3",
        heads={"TP1": 16},
        expect="bundled",
        fills=DEEPSEEK_V2_V_HEAD,
    ),
    Family(
        "Kimi-K2 / K2.5 (text)",
        "Kimi-K2-Instruct",
        "DeepseekV3ForCausalLM",
        "kimi_k2",
        heads={"TP8": 8, "TP1": 64},
        expect="bundled",
        eagle3_mla=True,
    ),
    Family(
        "GLM-4.7-Flash",
        "GLM-4.7-Flash",
        "Glm4MoeLiteForCausalLM",
        "glm4_moe_lite",
        heads={"TP1": 20},
        expect="bundled",
        drafter="glm4_moe_lite_mtp",
    ),
    Family(
        "LongCat-Flash",
        "LongCat-Flash-Chat",
        "LongcatFlashForCausalLM",
        "longcat_flash",
        heads={"TP8": 8, "TP1": 64},
        expect="bundled",
        drafter="longcat_flash_mtp",
        extra=LONGCAT_SMALL,
    ),
    Family(
        "Kimi-Linear",
        "Kimi-Linear-48B-A3B",
        "KimiLinearForCausalLM",
        "kimi_linear",
        heads={"TP1": 32},
        expect="bundled",
        fills=DEEPSEEK_V2_V_HEAD,
        extra=KIMI_LINEAR_HYBRID,
    ),
    Family(
        "Mistral Large 3",
        "Mistral-Large-3",
        "MistralLarge3ForCausalLM",
        "deepseek_v3",
        heads={"TP8": 16, "TP1 or DP attention": 128},
        expect="bundled",
        drafter="eagle",
        extra=MISTRAL_LARGE_3_QUERY_SCALE,
        checkpoint_format="mistral",
    ),
    # Mistral Small 4: Mistral Large 3's architecture with a 256 + 64 latent, which only vLLM's Triton MLA
    # takes; users run it on one GPU (32 heads) or two (TP2: 16).
    Family(
        "Mistral Small 4",
        "Mistral-Small-4",
        "MistralLarge3ForCausalLM",
        "deepseek_v3",
        heads={"TP2": 16, "TP1": 32},
        expect="fallback",
        extra=MISTRAL_SMALL_4_QUERY_SCALE,
        checkpoint_format="mistral",
        why="its latent is 256 + 64; the bundled kernels take 512 + 64",
        refusal=FALLBACK_REFUSAL,
    ),
    # Kimi-VL: the kimi_vl wrapper (vLLM's and SGLang's own config class) around Moonlight's text model,
    # which both build from text_config as DeepseekV2ForCausalLM; the published text_config has
    # Moonlight's attention fields. Its MoonViT tower is written shrunk (models/moonvit.py); vLLM runs
    # it text-only (engines.vllm_spec), SGLang builds and loads the tower.
    Family(
        "Kimi-VL",
        "Kimi-VL-A3B",
        "KimiVLForConditionalGeneration",
        "kimi_vl",
        heads={"TP1": 16},
        expect="bundled",
        text_model_type="deepseek_v3",
        vision=KIMI_VL_VISION,
    ),
    # Kimi-K2.5 / K2.6: the kimi_k25 wrapper (vLLM's and SGLang's own config class) around a DeepSeek-V3
    # text model with Kimi-K2's attention (its own YaRN), which both build from text_config; a MoonViT
    # tower and mm_projector written shrunk (models/moonvit.py). vLLM runs it text-only.
    Family(
        "Kimi-K2.5 / K2.6",
        "Kimi-K2.5",
        "KimiK25ForConditionalGeneration",
        "kimi_k25",
        heads={"TP8": 8, "TP1": 64},
        expect="bundled",
        eagle3_mla=True,
        text_model_type="deepseek_v3",
        vision=KIMI_K25_VISION,
    ),
    Family(
        "MiniCPM3",
        "MiniCPM3-4B",
        "MiniCPM3ForCausalLM",
        "minicpm3",
        heads={"TP1": 40},
        expect="refused",
        fills={"v_head_dim": 64, "rope_scaling": None},  # the copy's v_head_dim and long/short factors were cut off
        extra={"hidden_size": 640},  # a multiple of its 40 heads, as its config class requires
        why="vLLM runs its attention as standard attention (not MLA); its latent is 256 + 32 besides",
        refusal="vLLM runs this model's attention layers as standard attention",
    ),
    Family(
        "DeepSeek-V3.2",
        "DeepSeek-V3.2",
        "DeepseekV32ForCausalLM",
        "deepseek_v32",
        heads={"TP8": 16, "TP2": 64},  # 64: where auto on SM90 hands fp8_ds_mla decode to FlashMLA
        expect="sparse",
        fills={"rope_scaling": None},  # published as the inference format's fields, not HF's
        why="DeepSeek Sparse Attention: an indexer picks the top-k tokens, with a cache of its own",
        refusal=SPARSE_REFUSAL,
    ),
    Family(
        "GLM-5",
        "GLM-5",
        "GlmMoeDsaForCausalLM",
        "glm_moe_dsa",
        heads={"TP8": 8, "TP1": 64},
        expect="sparse",
        why="DeepSeek Sparse Attention (an indexer and a cache of its own)",
        refusal=SPARSE_REFUSAL,
    ),
)


def pick(names: str, every_layout: bool) -> list[tuple[Family, str]]:
    """(family, layout) pairs for names like ``GLM-4.7-Flash`` (its first layout, or all of them) or
    ``DeepSeek-V3@128`` (the layout with that many heads per GPU)."""
    chosen = []
    for wanted in (n.strip() for n in names.split(",")):
        name, _, heads = wanted.partition("@")
        family = next((f for f in FAMILIES if f.name.lower().startswith(name.lower())), None)
        if family is None:
            raise SystemExit(f"unknown family {name!r}; the zoo has {[f.name for f in FAMILIES]}")
        layouts = [layout for layout, n in family.heads.items() if not heads or n == int(heads)]
        if not layouts:
            raise SystemExit(f"{family.name} has no layout with {heads} heads: {family.heads}")
        chosen += [(family, layout) for layout in (layouts if every_layout or heads else layouts[:1])]
    return chosen
