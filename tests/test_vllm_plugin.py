"""The vLLM plugin against the real vLLM (CI runs it under the oldest and the newest supported
release), on CPU: discovery, registration, vLLM's own backend selection and validation, config
sources, routing, and forward_mqa through the op (whose CPU path is the float64 reference)."""

import json
import logging
from types import SimpleNamespace

import pytest
import torch
import vllm
from oracle import assert_rounded_from, naive_decode, naive_decode_problem
from packaging.version import Version
from pydantic import ValidationError
from vllm.config import AttentionConfig, DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.platforms.interface import DeviceCapability
from vllm.plugins import load_plugins_by_group
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.attention.selector import AttentionSelectorConfig

import mla_backend.vllm as plugin
from mla_backend import mla_decode, shapes
from mla_backend.config import BackendUnavailableError
from mla_backend.inputs import make_paged_problem
from mla_backend.vllm import backend, compat
from mla_backend.vllm.fallback import per_token_requests

pytestmark = pytest.mark.vllm

BACKEND_PATH = "mla_backend.vllm.backend.MLABackend"


VLLM_VERSION = Version(vllm.__version__).release


@pytest.fixture
def clean_registry():
    """Each test starts with nothing registered as CUSTOM and leaves it that way."""
    AttentionBackendEnum.CUSTOM.clear_override()
    yield
    AttentionBackendEnum.CUSTOM.clear_override()


def vllm_config(additional=None, model_config=None) -> VllmConfig:
    extra = {} if model_config is None else {"model_config": model_config}
    return VllmConfig(device_config=DeviceConfig(device="cuda"), additional_config=additional or {}, **extra)


@pytest.fixture(scope="module")
def deepseek_model_config(tmp_path_factory):
    return small_deepseek_model_config(tmp_path_factory.mktemp("dsv3"))


def small_deepseek_model_config(path) -> ModelConfig:
    """A real vLLM ModelConfig of a small DeepSeek-V3 checkpoint config (16 heads, no MoE layer).
    model_type and architectures are written out: once vLLM has parsed a DeepSeek-V3.2 config in this
    process, DeepseekV3Config.model_type reads "deepseek_v32"."""
    from transformers import DeepseekV3Config

    fields = DeepseekV3Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        first_k_dense_replace=2,
        n_routed_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=4096,
    ).to_dict()
    fields |= {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(fields))
    return ModelConfig(model=str(path), tokenizer=None, skip_tokenizer_init=True, dtype="bfloat16")


# --- discovery and registration -------------------------------------------------------------


def test_vllm_discovers_the_entry_point():
    plugins = load_plugins_by_group("vllm.general_plugins")
    assert plugins.get("mla_backend") is plugin.register


def test_register_is_idempotent_and_custom_resolves_to_our_backend(clean_registry):
    plugin.register()
    plugin.register()
    assert AttentionBackendEnum.CUSTOM.get_path() == BACKEND_PATH
    cls = AttentionBackendEnum.CUSTOM.get_class()
    assert cls is backend.MLABackend
    # vLLM maps a backend class back to its enum member by name (MLA_BACKEND where it exists).
    assert AttentionBackendEnum[cls.get_name()].get_path() == BACKEND_PATH
    assert cls.get_impl_cls() is backend.MLABackendImpl and cls.get_builder_cls() is backend.MLABackendMetadataBuilder


def test_named_registration_follows_the_vllm_release():
    """vLLM 0.32 added named out-of-tree backends: there MLA_BACKEND is ours too, before only CUSTOM."""
    assert compat.has_named_registration() == (VLLM_VERSION >= (0, 32))
    plugin.register()
    plugin.register()  # a second registration under the same name must not raise
    assert compat.backend_names() == (["CUSTOM", "MLA_BACKEND"] if VLLM_VERSION >= (0, 32) else ["CUSTOM"])


@pytest.mark.parametrize("spelling", [str.upper, str.lower])
def test_every_documented_flag_value_selects_our_backend(spelling, clean_registry):
    plugin.register()
    for name in compat.backend_names():
        member = AttentionConfig(backend=spelling(name)).backend  # how --attention-backend is parsed
        assert member.get_path() == BACKEND_PATH
        cls = member.get_class()
        assert AttentionBackendEnum[cls.get_name()].get_path() == BACKEND_PATH


def test_register_leaves_another_custom_backend_alone(clean_registry, caplog):
    register_backend(AttentionBackendEnum.CUSTOM, "someone.else.Backend")
    with caplog.at_level(logging.WARNING, logger="mla_backend"):
        plugin.register()
    assert AttentionBackendEnum.CUSTOM.get_path() == "someone.else.Backend"
    assert "someone.else.Backend" in caplog.text


# --- vLLM's own backend selection and validation ---------------------------------------------


def invalid_reasons(
    capability,
    additional=None,
    dtype=torch.bfloat16,
    kv_cache_dtype="auto",
    block_size=64,
    use_mla=True,
    use_sparse=False,
    **newer_fields,
) -> list[str]:
    """vLLM's check of an explicitly selected backend (what CudaPlatform.get_attn_backend_cls runs for
    --attention-backend CUSTOM: it stops start-up with these reasons when the list is not empty)."""
    selector = AttentionSelectorConfig(
        head_size=576,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        use_mla=use_mla,
        use_sparse=use_sparse,
        **newer_fields,
    )
    with set_current_vllm_config(vllm_config(additional)):
        cls = AttentionBackendEnum.CUSTOM.get_class()
        return cls.validate_configuration(device_capability=capability, **selector._asdict())


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_selection_accepts_supported_combinations(capability, clean_registry):
    plugin.register()
    for kv_cache_dtype in ("auto", "bfloat16", "fp8", "fp8_e4m3"):
        for block_size in (16, 32, 64, 128):
            assert (
                invalid_reasons(DeviceCapability(*capability), kv_cache_dtype=kv_cache_dtype, block_size=block_size)
                == []
            )


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"capability": DeviceCapability(7, 5)}, "compute capability not supported"),
        ({"dtype": torch.float16}, "dtype not supported"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype not supported"),
        ({"block_size": 8}, "block_size not supported"),
        ({"block_size": 24}, "block_size not supported"),  # vLLM splits larger multiples of 16 into kernel blocks
        (
            {"additional": {"mla_backend": {"backend": "xqa"}}, "capability": DeviceCapability(8, 0)},
            "backend='xqa' needs compute capability",
        ),
        ({"additional": {"mla_backend": {"backend": "trtllm-gen"}}}, "backend='trtllm-gen' needs compute capability"),
        ({"additional": {"mla_backend": {"backend": "flashmla"}}}, "mla_backend.backend"),
        ({"additional": {"mla_backend": {"num_kv_splits": 0}}}, "num_kv_splits"),
    ],
)
def test_selection_rejects_with_the_reason(change, reason, clean_registry):
    plugin.register()
    capability = change.pop("capability", DeviceCapability(9, 0))
    reasons = invalid_reasons(capability, **change)
    assert len(reasons) == 1 and reason in reasons[0]


def test_standard_attention_models_are_refused_with_what_to_do(clean_registry):
    """MiniCPM3 and other models vLLM runs as standard attention: vLLM's reason and ours, which says
    how to start the model instead."""
    plugin.register()
    reasons = invalid_reasons(DeviceCapability(12, 0), use_mla=False)
    assert "non-MLA not supported" in reasons
    (ours,) = [r for r in reasons if r.startswith("mla_backend:")]
    assert "standard attention" in ours and "without --attention-backend" in ours


def test_decode_context_parallelism_is_accepted(clean_registry):
    """Our LSE is what DCP merges; vLLM 0.30+ asks the impl (supports_dcp, default False there)."""
    plugin.register()
    assert backend.MLABackendImpl.supports_dcp is True
    # vLLM asks for the decode LSE only where the impl can return it (need_to_return_lse_for_decode)
    assert backend.MLABackendImpl.can_return_lse_for_decode is True
    if "use_dcp" in AttentionSelectorConfig._fields:  # selection checks it (vLLM 0.33)
        assert invalid_reasons(DeviceCapability(9, 0), use_dcp=True) == []


def test_builder_lets_vllm_send_speculative_batches_to_decode_under_full_graphs():
    """UNIFORM: vLLM raises its decode threshold to 1 + k and sends uniform verification batches to
    forward_mqa; UNIFORM_BATCH: it captures full CUDA graphs for them (the e2e spec run checks both)."""
    from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport
    from vllm.v1.attention.backend import AttentionCGSupport

    builder = backend.MLABackendMetadataBuilder
    assert builder.query_len_support == QueryLenSupport.UNIFORM
    assert builder._cudagraph_support == AttentionCGSupport.UNIFORM_BATCH


def test_kernel_block_sizes_take_the_newer_signature():
    sizes = list(shapes.VLLM_PAGE_SIZES)
    assert backend.MLABackend.get_supported_kernel_block_sizes() == sizes
    assert backend.MLABackend.get_supported_kernel_block_sizes(kv_cache_spec=None) == sizes  # vLLM 0.31+


def model_problem(config) -> str | None:
    """Why the engine's route (on an RTX 5090) sends decode away from the kernels, or None."""
    route = backend.engine_route(config, (12, 0), 64)
    return None if route.kernel == "bundled" else route.reason


def test_model_shapes_are_checked(deepseek_model_config, monkeypatch):
    config = vllm_config(model_config=deepseek_model_config)
    assert model_problem(config) is None
    hf = deepseek_model_config.hf_text_config
    with monkeypatch.context() as m:
        m.setattr(deepseek_model_config.model_arch_config, "total_num_attention_heads", 256)
        assert "1..128 query heads" in model_problem(config)
    with monkeypatch.context() as m:  # DCP all-gathers the query heads: 16 x 16 reach forward_mqa
        m.setattr(config.parallel_config, "decode_context_parallel_size", 16)
        assert "this setup gives 256" in model_problem(config)
    for attribute, value, words in [
        ("kv_lora_rank", 256, "kv_lora_rank 512"),
        ("qk_rope_head_dim", 32, "qk_rope_head_dim 64"),
        ("qk_nope_head_dim", 64, "qk_nope_head_dim in"),
    ]:
        with monkeypatch.context() as m:
            m.setattr(hf, attribute, value)
            assert words in model_problem(config)


def test_auto_hands_shapes_the_kernels_do_not_take_to_the_fallback(deepseek_model_config, monkeypatch):
    """An MLA model with a 256 + 32 latent (no family vLLM serves as MLA has one today): `auto` decodes
    it with vLLM's Triton MLA kernel and says why in its route; an explicit backend stops start-up."""
    monkeypatch.setattr(deepseek_model_config.hf_text_config, "kv_lora_rank", 256)
    monkeypatch.setattr(deepseek_model_config.hf_text_config, "qk_rope_head_dim", 32)
    auto = vllm_config(model_config=deepseek_model_config)
    route = backend.engine_route(auto, (12, 0))
    assert route.kernel == "fallback" and "kv_lora_rank 512" in route.reason and "has 256 and 32" in route.reason
    with set_current_vllm_config(auto):
        assert (
            backend.MLABackend.supports_combination(
                288, torch.bfloat16, "auto", 64, True, False, False, False, DeviceCapability(12, 0)
            )
            is None
        )
    forced = vllm_config({"mla_backend": {"backend": "xqa"}}, model_config=deepseek_model_config)
    with pytest.raises(BackendUnavailableError, match="has 256 and 32; backend='auto' decodes such models"):
        backend.engine_route(forced, (12, 0))
    with set_current_vllm_config(forced):
        reason = backend.MLABackend.supports_combination(
            288, torch.bfloat16, "auto", 64, True, False, False, False, DeviceCapability(12, 0)
        )
    assert reason.startswith("mla_backend: mla_backend needs kv_lora_rank 512")
    assert backend.engine_route(vllm_config(model_config=None), (12, 0)).kernel == "bundled"


# --- config sources ---------------------------------------------------------------------------


def test_config_from_additional_config_overrides_environment(monkeypatch):
    monkeypatch.setenv("MLA_BACKEND", "trtllm-gen")
    monkeypatch.setenv("MLA_BACKEND_NUM_KV_SPLITS", "4")
    config = backend.plugin_config(vllm_config({"mla_backend": {"backend": "xqa", "enable_pdl": False}}))
    assert (config.backend, config.num_kv_splits, config.enable_pdl) == ("xqa", 4, False)
    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", "8.0")
    assert backend.plugin_config(vllm_config()).device_capability == "8.0"


@pytest.mark.parametrize(
    "bad", [{"mla_backend": {"backnd": "xqa"}}, {"mla_backend": {"device_capability": "9"}}, {"mla_backend": "xqa"}]
)
def test_bad_additional_config_is_rejected(bad):
    with pytest.raises((ValidationError, ValueError)):
        backend.plugin_config(vllm_config(bad))


def test_unknown_environment_variable_is_rejected(monkeypatch):
    monkeypatch.setenv("MLA_BACKEND_SPLITS", "4")
    with pytest.raises(ValueError, match="MLA_BACKEND_SPLITS"):
        backend.plugin_config(vllm_config())


# --- routing ----------------------------------------------------------------------------------


def decode_metadata(problem, num_decodes: int, **extra) -> SimpleNamespace:
    """The parts of vLLM's MLA metadata forward_mqa reads, for a pure-decode batch of ``problem``."""
    decode = SimpleNamespace(block_table=problem.block_tables, seq_lens=problem.seq_lens)
    return SimpleNamespace(num_decodes=num_decodes, max_seq_len=problem.max_seq_len, decode=decode, **extra)


def make_impl(kv_cache_dtype="auto", additional=None, heads=16, **unsupported):
    """Our impl as vLLM builds it; ``unsupported`` sets alibi_slopes, sliding_window, logits_soft_cap or
    attn_type to values a DeepSeek layer never has."""
    fields = {"alibi_slopes": None, "sliding_window": None, "logits_soft_cap": None, "attn_type": "decoder"}
    fields.update(unsupported)
    with set_current_vllm_config(vllm_config(additional)):
        return backend.MLABackendImpl(
            heads,
            576,
            0.1,
            1,
            fields["alibi_slopes"],
            fields["sliding_window"],
            kv_cache_dtype,
            fields["logits_soft_cap"],
            fields["attn_type"],
            None,
            q_lora_rank=None,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            qk_head_dim=192,
            v_head_dim=128,
            kv_b_proj=None,
        )


@pytest.mark.parametrize(
    "unsupported, message",
    [
        (dict(alibi_slopes=[0.5] * 16), "alibi slopes"),
        (dict(sliding_window=128), "sliding window"),
        (dict(logits_soft_cap=30.0), "soft-capping"),
        (dict(attn_type="encoder_only"), "decoder self-attention only"),
        (dict(attn_type="encoder_decoder"), "decoder self-attention only"),
    ],
)
def test_the_impl_refuses_attention_features_it_does_not_compute(unsupported, message, monkeypatch):
    """ALiBi, sliding windows, soft-capped logits and non-decoder attention would be computed as plain
    causal attention: the impl stops at construction instead."""
    monkeypatch.setattr(backend, "detected_capability", lambda: (9, 0))
    make_impl()  # the defaults construct
    with pytest.raises(NotImplementedError, match=message):
        make_impl(**unsupported)


@pytest.mark.parametrize(
    "detected, additional, has_flashinfer, kernel",
    [
        ((9, 0), None, False, "bundled"),
        ((12, 0), None, False, "bundled"),
        ((10, 0), None, True, "trtllm-gen"),
        ((10, 0), None, False, "bundled"),
        ((8, 0), None, False, "fallback"),
        ((9, 0), {"mla_backend": {"device_capability": "8.0"}}, False, "fallback"),
    ],
)
def test_impl_routes_by_the_resolved_kernel(detected, additional, has_flashinfer, kernel, monkeypatch):
    monkeypatch.setattr(backend, "detected_capability", lambda: detected)
    monkeypatch.setattr("mla_backend.route.flashinfer_available", lambda: has_flashinfer)
    monkeypatch.setattr(backend.current_platform, "num_compute_units", lambda device_id=0: 132, raising=False)
    impl = make_impl("fp8", additional)
    assert impl.route.kernel == kernel
    # The public record of it: each route a model's attention layers hold, once (LLM.apply_model).
    layers = [torch.nn.Module() for _ in range(3)]
    for layer in layers[:2]:
        layer.impl = impl
    assert backend.model_routes(torch.nn.Sequential(*layers)) == [impl.route]
    # fp8 queries for our kernels and trtllm-gen; Triton wants bf16 queries and dequantises KV itself.
    assert impl.supports_quant_query_input == (kernel != "fallback")


def test_impossible_explicit_backend_stops_start_up(monkeypatch):
    monkeypatch.setattr(backend, "detected_capability", lambda: (8, 0))
    with pytest.raises(BackendUnavailableError, match="backend='xqa' needs compute capability 8.9"):
        make_impl(additional={"mla_backend": {"backend": "xqa"}})


def test_fallback_logs_why_once(monkeypatch, caplog):
    backend.announce.cache_clear()
    monkeypatch.setattr(backend, "detected_capability", lambda: (7, 5))
    monkeypatch.setattr(backend.current_platform, "num_compute_units", lambda device_id=0: 132, raising=False)
    with caplog.at_level(logging.WARNING):
        make_impl()
        make_impl()
    lines = [r for r in caplog.records if "Triton MLA kernel" in r.getMessage()]
    assert len(lines) == 1 and "SM 7.5" in lines[0].getMessage()


# --- forward_mqa through the op -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("q_len", [1, 4])
def test_forward_mqa_matches_the_reference(dtype, q_len, monkeypatch):
    monkeypatch.setattr(backend, "detected_capability", lambda: (9, 0))
    fp8 = dtype == torch.float8_e4m3fn
    impl = make_impl("fp8" if fp8 else "auto")
    impl.need_to_return_lse_for_decode = True  # as with decode context parallelism
    heads = 16
    problem = make_paged_problem([37, 130, 5], q_len, heads, 16, dtype=dtype, seed=q_len)
    tokens = 3 * q_len
    q = problem.query.reshape(tokens, heads, 576)
    if not fp8:  # vLLM hands bf16 queries over as (ql_nope, q_pe)
        q = (q[..., :512], q[..., 512:])
    layer = SimpleNamespace(_q_scale_float=0.5, _k_scale_float=0.25)
    metadata = decode_metadata(problem, 3)
    out, lse = impl.forward_mqa(q, problem.kv_cache, metadata, layer)
    bmm1, bmm2 = (0.1 * 0.5 * 0.25, 0.25) if fp8 else (0.1, 1.0)
    want, want_lse = naive_decode_problem(problem, bmm1, bmm2)
    assert out.shape == (tokens, heads, 512) and out.dtype == torch.bfloat16
    assert_rounded_from(out, lse, want, want_lse)


def spy_on_the_op(monkeypatch) -> list:
    """The calls forward_mqa makes to the op, as (args, kwargs); each runs the real op, without the
    step's plan (a CPU call plans nothing)."""
    calls = []
    real_op = backend.mla_decode

    def op(*args, **kwargs):
        calls.append((args, kwargs))
        return real_op(*args, **(kwargs | {"plan": None}))

    monkeypatch.setattr(backend, "mla_decode", op)
    return calls


def test_forward_mqa_hands_the_steps_plan_to_the_op(monkeypatch):
    """Every layer's call reads the plan the builder made once for the step (None: the call plans)."""
    monkeypatch.setattr(backend, "detected_capability", lambda: (9, 0))
    calls = spy_on_the_op(monkeypatch)
    impl = make_impl("auto")
    problem = make_paged_problem([37, 130], 1, 16, 16, seed=2)
    q = problem.query.reshape(2, 16, 576)
    for plan in ("the step's plan", None):
        metadata = decode_metadata(problem, 2)
        metadata.decode.plan = plan
        impl.forward_mqa(q, problem.kv_cache, metadata, SimpleNamespace())
    impl.forward_mqa(q, problem.kv_cache, decode_metadata(problem, 2), SimpleNamespace())  # vLLM's own metadata
    assert [kwargs["plan"] for _, kwargs in calls] == ["the step's plan", None, None]


@pytest.mark.parametrize("aligned", [True, False], ids=["in-place", "misaligned"])
def test_bf16_query_pair_goes_to_the_kernel_as_a_pair_when_it_can(aligned, monkeypatch):
    monkeypatch.setattr(backend, "detected_capability", lambda: (9, 0))
    calls = spy_on_the_op(monkeypatch)
    impl = make_impl("auto")
    problem = make_paged_problem([37, 130], 1, 16, 16, seed=2)
    wide = torch.cat([problem.query, problem.query], dim=-1).reshape(2, 16, 1152)
    q = wide[..., :576] if aligned else wide[..., 1:577]  # one bf16 element off: not 16-byte aligned
    metadata = decode_metadata(problem, 2)
    out, _ = impl.forward_mqa((q[..., :512], q[..., 512:]), problem.kv_cache, metadata, SimpleNamespace())
    want, _ = naive_decode(q.reshape(2, 1, 16, 576), problem.kv_cache, problem.block_tables, problem.seq_lens, 0.1, 1.0)
    assert_rounded_from(out, None, want, None)
    assert isinstance(calls[0][0][0], tuple) == aligned  # not readable in place: concatenated once


def test_fallback_route_gets_the_whole_query(monkeypatch):
    """vLLM hands bf16 queries over as (ql_nope, q_pe); the Triton route takes one [tokens, H, 576] tensor."""
    monkeypatch.setattr(backend, "detected_capability", lambda: (8, 0))
    monkeypatch.setattr(backend.current_platform, "num_compute_units", lambda device_id=0: 132, raising=False)
    seen = []
    monkeypatch.setattr(backend.fallback, "triton_mla_decode", lambda q, *args: seen.append(q) or (q, None))
    impl = make_impl("auto")
    problem = make_paged_problem([37, 130], 1, 16, 16, seed=2)
    q = problem.query.reshape(2, 16, 576)
    metadata = decode_metadata(problem, 2)
    impl.forward_mqa((q[..., :512], q[..., 512:]), problem.kv_cache, metadata, SimpleNamespace(_k_scale=None))
    assert isinstance(seen[0], torch.Tensor) and torch.equal(seen[0], q)


def test_impl_reserves_the_decode_workspace_when_vllm_asks(monkeypatch):
    """vLLM 0.33 calls impl.reserve_workspace() in the memory-profiling run, before sizing the KV cache."""
    monkeypatch.setattr(backend, "detected_capability", lambda: (9, 0))
    impl = make_impl("fp8")
    asked = []
    monkeypatch.setattr(backend, "is_workspace_manager_initialized", lambda: True)
    monkeypatch.setattr(
        backend,
        "current_workspace_manager",
        lambda: SimpleNamespace(get_simultaneous=lambda *specs: asked.append(specs)),
    )
    impl.reserve_workspace()
    assert asked == [(((backend.DECODE_WORKSPACE_BYTES,), torch.uint8),)]


def test_non_causal_decode_blocks_are_refused(monkeypatch):
    monkeypatch.setattr(backend, "detected_capability", lambda: (9, 0))
    impl = make_impl()
    problem = make_paged_problem([20, 20], 2, 16, 16)
    metadata = decode_metadata(problem, 2, causal=False)
    q = problem.query.reshape(4, 16, 576)
    with pytest.raises(NotImplementedError, match="causal"):
        impl.forward_mqa(q, problem.kv_cache, metadata, SimpleNamespace())


def test_forward_mqa_rejects_ragged_query_lengths(monkeypatch):
    monkeypatch.setattr(backend, "detected_capability", lambda: (9, 0))
    impl = make_impl()
    problem = make_paged_problem([20, 20], 1, 16, 16)
    metadata = decode_metadata(problem, 2)
    q = torch.randn(3, 16, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="uniform query length"):
        impl.forward_mqa(q, problem.kv_cache, metadata, SimpleNamespace())


def test_fallback_gives_each_query_token_its_own_causal_length():
    table = torch.tensor([[3, 1, 7], [2, 0, 5]], dtype=torch.int32)
    seq_lens = torch.tensor([10, 2], dtype=torch.int32)
    rows, lens = per_token_requests(table, seq_lens, 3)
    assert lens.tolist() == [8, 9, 10, 0, 1, 2]
    assert rows.tolist() == [[3, 1, 7]] * 3 + [[2, 0, 5]] * 3


def test_cross_layer_kv_cache_layout_is_served():
    """With the layer dimension (vLLM's cross-layer cache for KV connectors) the logical shape is
    [layers, blocks, page, 576]; our order (1, 0, 2, 3) allocates it blocks first, as vLLM's
    uses_num_blocks_first_layout() expects of a backend whose order does not start at 0, so one block
    holds every layer's page. Each layer's view then has a page stride of layers x page x 576: the op
    accepts it and reads the same values as from a compact cache."""
    assert backend.MLABackend.get_kv_cache_stride_order() == (0, 1, 2)
    order = backend.MLABackend.get_kv_cache_stride_order(include_num_layers_dimension=True)
    assert order == (1, 0, 2, 3)
    problem = make_paged_problem([37, 130], 2, 8, 16, seed=5)
    blocks = problem.kv_cache.shape[0]
    logical = (3, blocks, 16, 576)
    physical = torch.zeros(tuple(logical[i] for i in order), dtype=problem.kv_cache.dtype)  # as vLLM allocates
    cache = physical.permute(*[order.index(i) for i in range(4)])
    cache[1].copy_(problem.kv_cache)
    layer = cache[1]
    assert not layer.is_contiguous() and layer.stride(0) == 3 * 16 * 576
    got = mla_decode(
        problem.query, layer, None, problem.block_tables, problem.seq_lens, problem.max_seq_len, bmm1_scale=0.1
    )
    want, _ = naive_decode_problem(problem, 0.1, 1.0)
    assert_rounded_from(got, None, want, None)
