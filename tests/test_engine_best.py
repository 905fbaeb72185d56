"""`auto` on SM90 hands decode to vLLM's FlashMLA where the route table says it is faster: the
route's rule (route.py, rule 4), the shipped table, the builder's per-batch plan and forward_mqa's
dispatch, on CPU (vLLM's FlashMLA ops are replaced by fakes that record what they were given)."""

import inspect
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from test_vllm_plugin import make_impl, small_deepseek_model_config
from vllm.config import CUDAGraphMode, DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder
from vllm.v1.attention.ops import flashmla as vllm_flashmla_ops
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from mla_backend import sm90_table
from mla_backend.config import MLABackendConfig
from mla_backend.route import DecodeShape, Engine, Route, resolve_route
from mla_backend.tools import route_table
from mla_backend.vllm import backend, flashmla

pytestmark = pytest.mark.vllm

TABLE = {
    "device": "test GPU",
    "date": "2026-11-24",
    "entries": [
        {"kv": "fp8", "heads": 16, "q_len": 1, "speedup": 1.2, "flashmla_correct": True},
        {"kv": "fp8", "heads": 128, "q_len": 1, "speedup": 2.5, "flashmla_correct": True},
        {"kv": "fp8", "heads": 128, "q_len": 4, "speedup": 2.0, "flashmla_correct": False},
        {"kv": "bf16", "heads": 16, "q_len": 1, "speedup": 0.9, "flashmla_correct": True},
    ],
}
AVAILABLE = (True, None)


def choose(
    heads=128, q_len=1, page=64, fp8=True, backend_name="auto", capability=(9, 0), ok=AVAILABLE, dcp=1, table=TABLE
):
    """The route of a vLLM engine of this shape class, with ``table`` as the measured table (None: the shipped one)."""
    shape = DecodeShape(heads, q_len, fp8, page, dcp=dcp)
    engine = Engine("vLLM", "vLLM's Triton MLA decode", "vLLM's Triton MLA kernel", ok)
    config = MLABackendConfig(backend=backend_name)
    with mock.patch.object(sm90_table, "load_table", (lambda: table) if table is not None else sm90_table.load_table):
        return resolve_route(config, capability, shape, engine, has_flashinfer=False)


def weighed(route: Route) -> bool:
    """FlashMLA was weighed for this route (auto, the bundled kernels, SM90): its reason says so."""
    return "FlashMLA" in route.reason


def test_flashmla_serves_the_classes_it_is_faster_for():
    best = choose()
    assert best.kernel == "flashmla" and weighed(best)
    assert "2.50x" in best.reason and "test GPU" in best.reason


@pytest.mark.parametrize(
    "heads, q_len, measured_heads",
    [(96, 1, 128), (64, 1, 128), (8, 1, 16), (24, 1, 16)],
)
def test_a_class_borrows_the_nearest_measurement_within_a_factor_of_two(heads, q_len, measured_heads):
    best = choose(heads=heads, q_len=q_len)
    assert best.kernel == "flashmla"
    assert f"measured at {measured_heads} heads" in best.reason


def test_under_decode_context_parallelism_the_class_is_the_gathered_heads():
    # vLLM's FlashMLA plans DCP's all-gathered heads over each rank's share of the cache, as our
    # builder does (checked end to end: run_e2e.py --parts enginebest_parallel).
    assert choose(heads=128, dcp=2).kernel == "flashmla"
    best = choose(heads=4, dcp=2)
    assert best.kernel == "bundled" and "4 heads (gathered over DCP 2)" in best.reason


@pytest.mark.parametrize("dcp, spec_tokens", [(1, 0), (2, 0), (4, 3)])
def test_the_engine_shape_counts_gathered_heads_and_draft_tokens(dcp, spec_tokens):
    speculative = SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
    vllm_config = SimpleNamespace(
        parallel_config=SimpleNamespace(decode_context_parallel_size=dcp),
        speculative_config=speculative,
        cache_config=SimpleNamespace(cache_dtype="fp8"),
    )
    shape = backend.engine_shape(vllm_config, 64, local_heads=16)
    assert shape == DecodeShape(16 * dcp, 1 + spec_tokens, True, 64, dcp=dcp)


@pytest.mark.parametrize(
    "kwargs, reason, candidate",
    [
        (dict(heads=4), "no measurement near 4 heads", True),
        (dict(heads=48), "no measurement near 48 heads", True),  # 16 and 128 are both over 2x away
        (dict(heads=128, q_len=4), "failed the float64 check", True),
        (dict(heads=16, fp8=False), "bundled kernels are 1.11x FlashMLA's speed", True),
        (dict(page=16), "pages of 64 tokens, the cache has 16", True),
        (dict(ok=(False, "no _flashmla_C")), "unavailable: no _flashmla_C", True),
        (dict(backend_name="xqa"), "backend='xqa' requested", False),
        (dict(capability=(8, 0)), "not served by the bundled kernels", False),
        (dict(capability=(12, 0)), "SM 12.0 -> bundled", False),
    ],
)
def test_everything_else_stays_on_ours_with_the_reason(kwargs, reason, candidate):
    best = choose(**kwargs)
    assert best.kernel != "flashmla"
    assert reason in best.reason
    assert weighed(best) == candidate


def test_doctor_lists_the_classes_flashmla_serves():
    want = "fp8: 16 heads q_len 1, 128 heads q_len 1; bf16: none (measured on test GPU, 2026-11-24)"
    assert sm90_table.summary(TABLE) == want  # 128 heads q_len 4 failed its check, bf16 16 is slower


def test_the_shipped_table_covers_the_measured_grid():
    table = sm90_table.load_table()
    assert table["device"] and table["date"] and table["vllm"]
    classes = {(e["kv"], e["heads"], e["q_len"]) for e in table["entries"]}
    want = {(kv, h, q) for kv in route_table.DTYPES for h in route_table.HEADS for q in route_table.Q_LENS}
    assert classes == want
    for entry in table["entries"]:
        assert isinstance(entry["flashmla_correct"], bool) and entry["speedup"] >= 0
        assert len(entry["times_us"]) == len(route_table.BATCHES) * len(route_table.CONTEXTS)
        assert [name for name, _, _ in entry["mixed_us"]] == list(route_table.MIXES)
    assert table["grid"]["mixes"] == route_table.MIXES
    assert all(len(set(lengths)) > 1 for lengths in route_table.MIXES.values())  # unequal, as named


def test_the_shipped_table_routes_an_h100_as_the_readme_says():
    """The route reading the installed sm90_routes.json (no table passed), for every measured class:
    FlashMLA for every FP8 class; for BF16 at 64 heads and more, at 32 heads with draft tokens and at
    16 heads with three."""
    flashmla_bf16 = {(64, 1), (64, 2), (64, 4), (128, 1), (128, 2), (128, 4), (32, 2), (32, 4), (16, 4)}
    for fp8 in (True, False):
        for heads in route_table.HEADS:
            for q_len in route_table.Q_LENS:
                best = choose(heads, q_len, fp8=fp8, table=None)
                want = fp8 or (heads, q_len) in flashmla_bf16
                assert (best.kernel == "flashmla") == want, (fp8, heads, q_len, best.reason)
                assert "NVIDIA H100" in best.reason and f"measured at {heads} heads, {q_len} query" in best.reason


def test_the_nearest_measurement_is_taken_heads_first():
    """Of the measured classes within a factor of two, the closest in heads wins, then in query tokens."""
    table = {
        "device": "test GPU",
        "date": "2026-11-25",
        "entries": [
            {"kv": "fp8", "heads": 16, "q_len": 1, "speedup": 0.5, "flashmla_correct": True},
            {"kv": "fp8", "heads": 32, "q_len": 1, "speedup": 2.0, "flashmla_correct": True},
            {"kv": "fp8", "heads": 16, "q_len": 2, "speedup": 3.0, "flashmla_correct": True},
            {"kv": "bf16", "heads": 28, "q_len": 1, "speedup": 9.0, "flashmla_correct": True},
        ],
    }

    def pick(heads, q_len):
        return choose(heads, q_len, table=table)

    assert "measured at 32 heads, 1 query" in pick(28, 1).reason  # 32 is nearer 28 than 16 is; never bf16's 28
    assert "measured at 16 heads, 2 query" in pick(16, 2).reason  # the exact class
    assert "measured at 16 heads, 1 query" in pick(20, 1).reason  # heads decide first: 16 (q 1) before 16 (q 2)
    assert "measured at 16 heads, 2 query" in pick(20, 2).reason  # then query tokens: 16 (q 2) before 16 (q 1)
    del table["entries"][1:3]
    table["entries"].append({"kv": "fp8", "heads": 32, "q_len": 2, "speedup": 2.0, "flashmla_correct": True})
    assert "measured at 16 heads, 1 query" in pick(20, 2).reason  # nearer in heads beats nearer in query tokens


# --- the builder's plan and forward_mqa's dispatch -------------------------------------------------


def build_decode(builder, requests=3, q_len=2):
    """Call the builder's _build_decode with the keywords this vLLM release passes."""
    values = dict(
        block_table_tensor=torch.zeros(requests, 4, dtype=torch.int32),
        seq_lens_device=torch.tensor([37, 130, 5][:requests], dtype=torch.int32),
        max_seq_len=130,
        query_start_loc_cpu=torch.arange(requests + 1) * q_len,
        query_start_loc_device=torch.arange(requests + 1) * q_len,
        num_decode_tokens=requests * q_len,
        max_query_len=q_len,
        dcp_tot_seq_lens_device=None,
    )
    accepted = inspect.signature(MLACommonMetadataBuilder._build_decode).parameters
    return builder._build_decode(**{k: v for k, v in values.items() if k in accepted})


def make_builder(
    tmp_path, monkeypatch, block_size=64, detected=(9, 0), kv="fp8", use_flashmla=False, graphs=None
) -> tuple:
    """The builder's own __init__ (vLLM's MLA builder under it), with `auto`'s choice of FlashMLA set."""
    model = small_deepseek_model_config(tmp_path)
    config = VllmConfig(model_config=model, device_config=DeviceConfig(device="cuda"))
    if graphs is not None:
        config.compilation_config.cudagraph_mode = graphs
    config.cache_config.cache_dtype = kv
    text = model.hf_text_config
    # What vLLM's MLA builders read off the attention layer (0.26: the prefill backend; 0.33: the dims).
    layer = SimpleNamespace(
        prefill_backend=SimpleNamespace(clone=lambda: "prefill backend"),
        q_lora_rank=text.q_lora_rank,
        kv_lora_rank=text.kv_lora_rank,
        qk_nope_head_dim=text.qk_nope_head_dim,
        qk_rope_head_dim=text.qk_rope_head_dim,
        v_head_dim=text.v_head_dim,
    )
    config.compilation_config.static_forward_context["model.layers.0.self_attn.attn"] = layer
    # FlashMLA weighed as available, with a table that hands it (or not) this engine's class.
    table = {**TABLE, "entries": [{"kv": kv if kv == "fp8" else "bf16", "heads": 16, "q_len": 1,
                                   "speedup": 2.0 if use_flashmla else 0.5, "flashmla_correct": True}]}  # fmt: skip
    monkeypatch.setattr(sm90_table, "load_table", lambda: table)
    monkeypatch.setattr(backend.flashmla, "available", lambda: AVAILABLE)
    monkeypatch.setattr(backend, "detected_capability", lambda: detected)
    monkeypatch.setattr(backend.current_platform, "num_compute_units", lambda *args: 132)
    spec = MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    with set_current_vllm_config(config):
        builder = backend.MLABackendMetadataBuilder(
            spec, ["model.layers.0.self_attn.attn"], config, torch.device("cpu")
        )
    return builder, config


@pytest.mark.parametrize("graphs", [CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.PIECEWISE])
@pytest.mark.parametrize("kv", ["fp8", "auto"])
def test_builder_makes_flashmla_plan_buffers_for_every_batch_a_graph_can_replay(tmp_path, kv, graphs, monkeypatch):
    """Where `auto` gives decode to FlashMLA: under full CUDA graphs the fp8 plan's buffers hold one
    tile row per SM and one split entry per request of the largest batch (max_num_seqs), since a
    captured graph replays any smaller batch."""
    builder, config = make_builder(tmp_path, monkeypatch, kv=kv, use_flashmla=True, graphs=graphs)
    scheduler = builder.flashmla_scheduler
    assert scheduler is not None and scheduler.heads == 16 and scheduler.kv_fp8 == (kv == "fp8")
    assert builder.plan_buffer is None  # FlashMLA plans for itself
    if kv == "fp8" and graphs.has_full_cudagraphs():
        assert scheduler.tile_buffer.shape == (132, flashmla.TILE_METADATA_WIDTH)
        assert scheduler.splits_buffer.shape == (config.scheduler_config.max_num_seqs + 1,)
    else:
        assert scheduler.tile_buffer is None and scheduler.splits_buffer is None


def test_builder_keeps_a_plan_buffer_for_the_largest_step_where_the_bundled_kernels_serve(tmp_path, monkeypatch):
    """One buffer, made before any graph is captured, holds the plan of any step up to max_num_seqs
    requests (vLLM captures no larger graph), so every captured graph reads the plan at one address
    (step_plan.plan_buffer sizes it: tests/test_schedule_seam_gpu.py)."""
    asked = []
    buffer = torch.zeros(3, dtype=torch.int32)
    monkeypatch.setattr(
        backend, "plan_buffer", lambda max_batch, device, config: asked.append((max_batch, device, config)) or buffer
    )
    builder, config = make_builder(tmp_path, monkeypatch)
    assert builder.flashmla_scheduler is None
    assert builder.plan_shape is not None and (builder.plan_shape.heads, builder.plan_shape.kv_fp8) == (16, True)
    assert builder.plan_buffer is buffer
    # Sized by the library of the engine's kernel variant (additional_config may name another).
    assert asked == [(config.scheduler_config.max_num_seqs, builder.device, backend.plugin_config(config))]


@pytest.mark.parametrize("block_size, detected", [(256, (9, 0)), (64, (8, 0))], ids=["kernel-pages", "fallback"])
def test_builder_plans_nothing_where_the_bundled_kernels_do_not_read_the_pages(
    tmp_path, monkeypatch, block_size, detected
):
    """vLLM cuts a block size the kernels do not read into kernel pages (those calls plan for
    themselves); vLLM's Triton MLA, where it serves, needs no plan."""
    builder, _ = make_builder(tmp_path, monkeypatch, block_size, detected)
    assert builder.plan_shape is None and builder.plan_buffer is None
    decode = build_decode(builder)
    assert decode.route is builder.route and decode.plan is None and decode.flashmla is None


@pytest.mark.parametrize("kv_fp8", [True, False])
def test_builder_plans_each_step_once_for_every_layer(kv_fp8, monkeypatch):
    """The step's plan is made from vLLM's decode seq_lens and block table, for the engine's heads (all
    of them under DCP, which gathers them), the step's query tokens and the workspace forward_mqa
    passes, into the builder's buffer; every layer reads it off the metadata."""
    builder = object.__new__(backend.MLABackendMetadataBuilder)
    builder.plan_shape = DecodeShape(heads=32, q_len=2, kv_fp8=kv_fp8, page_size=64, dcp=2)
    builder.route = Route("bundled", "test", "vLLM's Triton MLA decode", "sm_90a")
    builder.plan_buffer = torch.zeros(10, dtype=torch.int32)
    builder.plan_config = MLABackendConfig()
    builder.device = torch.device("cpu")
    workspace = torch.zeros(8, dtype=torch.uint8)
    monkeypatch.setattr(backend, "decode_workspace", lambda device: workspace)
    calls = []
    monkeypatch.setattr(backend, "plan_decode", lambda *args, **kwargs: calls.append((args, kwargs)) or "the plan")
    decode = build_decode(builder, requests=3, q_len=2)
    assert isinstance(decode, backend.RoutedDecodeMetadata) and decode.plan == "the plan"
    ((args, kwargs),) = calls
    assert args[0] is decode.seq_lens and args[1] is decode.block_table and args[2] == 64
    assert kwargs["heads"] == 32 and kwargs["q_len"] == 2
    assert kwargs["kv_dtype"] == (torch.float8_e4m3fn if kv_fp8 else torch.bfloat16)
    assert kwargs["workspace_buffer"] is workspace and kwargs["buffer"] is builder.plan_buffer
    assert kwargs["config"] is builder.plan_config and kwargs["route"] is builder.route
    assert decode.route is builder.route  # every layer runs the route the builder resolved


def test_builder_plans_each_batch_for_flashmla_where_it_serves():
    builder = object.__new__(backend.MLABackendMetadataBuilder)
    builder.route = Route("flashmla", "test", "the bundled kernels")
    calls = []
    builder.flashmla_scheduler = lambda seq_lens, q_len: calls.append((seq_lens.tolist(), q_len)) or "plan"
    decode = build_decode(builder, requests=3, q_len=2)
    assert isinstance(decode, backend.RoutedDecodeMetadata)
    assert decode.flashmla == "plan" and calls == [([37, 130, 5], 2)]
    assert decode.block_table.shape == (3, 4)

    builder.flashmla_scheduler = None
    plain = build_decode(builder)
    assert plain.flashmla is None and plain.plan is None


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("need_lse", [True, False])
def test_forward_mqa_hands_a_planned_batch_to_flashmla(fp8, need_lse, monkeypatch):
    monkeypatch.setattr(backend, "detected_capability", lambda: (9, 0))
    impl = make_impl("fp8" if fp8 else "auto")
    impl.need_to_return_lse_for_decode = need_lse
    requests, q_len, heads = 3, 2, 16
    seen = {}

    def fake_decode(query, cache, block_table, seq_lens, schedule, scale, q_descale, k_descale, rank):
        seen.update(query=query, schedule=schedule, scale=scale, descales=(q_descale, k_descale))
        tokens = requests * q_len
        return torch.full((tokens, heads, rank), 2.0), torch.full((tokens, heads), 3.0)

    monkeypatch.setattr(backend.flashmla, "decode", fake_decode)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    q = torch.randn(requests * q_len, heads, 576).to(dtype)
    query = q if fp8 else (q[..., :512], q[..., 512:])  # vLLM hands bf16 queries over as a pair
    route = Route("flashmla", "test", "the bundled kernels")
    decode = SimpleNamespace(
        block_table=torch.zeros(requests, 4), seq_lens=torch.ones(requests), flashmla="plan", route=route
    )
    metadata = SimpleNamespace(num_decodes=requests, max_seq_len=8, decode=decode)
    layer = SimpleNamespace(_q_scale="q scale", _k_scale="k scale", _q_scale_float=1.0, _k_scale_float=1.0)
    out, lse = impl.forward_mqa(query, torch.zeros(4, 64, 576), metadata, layer)
    assert seen["schedule"] == "plan" and seen["scale"] == impl.scale
    assert seen["query"].shape == (requests, q_len, heads, 576)
    assert torch.equal(seen["query"].reshape(-1, heads, 576).float(), q.float())
    assert seen["descales"] == ("q scale", "k scale")
    assert out.shape == (requests * q_len, heads, 512) and (out == 2).all()
    assert (lse is not None) == need_lse


# --- vLLM's FlashMLA ops, in our layout ---------------------------------------------------------------


def test_flashmla_lse_comes_back_per_query_token(monkeypatch):
    """FlashMLA's LSE is [requests, H, q_len]; DCP merges [tokens, H] with token = request * q_len + i."""
    requests, q_len, heads = 2, 3, 4
    lse = torch.arange(requests * heads * q_len, dtype=torch.float32).view(requests, heads, q_len)
    out = torch.zeros(requests, q_len, heads, 512)

    monkeypatch.setattr(vllm_flashmla_ops, "flash_mla_with_kvcache", lambda **kw: (out, lse))
    schedule = flashmla.Schedule("plan", None)
    query = torch.zeros(requests, q_len, heads, 576, dtype=torch.bfloat16)
    got_out, got_lse = flashmla.decode(query, torch.zeros(2, 64, 576), None, None, schedule, 0.1)
    assert got_out.shape == (requests * q_len, heads, 512)
    for r in range(requests):
        for i in range(q_len):
            assert torch.equal(got_lse[r * q_len + i], lse[r, :, i])


def test_fp8_decode_passes_the_plan_and_the_descales(monkeypatch):
    requests, q_len, heads = 2, 1, 4
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return torch.zeros(requests, q_len, heads, 512), torch.zeros(requests, heads, q_len)

    monkeypatch.setattr(vllm_flashmla_ops, "flash_mla_with_kvcache_fp8", fake)
    splits = torch.tensor([0, 1, 2], dtype=torch.int32)
    query = torch.zeros(requests, q_len, heads, 576)
    schedule = flashmla.Schedule("tiles", splits)
    flashmla.decode(query, torch.zeros(2, 64, 576), None, None, schedule, 0.1, torch.tensor(0.5))
    assert seen["tile_scheduler_metadata"] == "tiles" and seen["num_splits"] is splits
    assert seen["descale_q"].tolist() == [0.5] and seen["descale_k"].tolist() == [1.0]  # k: none given
    assert seen["k_cache"].shape == (2, 64, 1, 576) and seen["causal"] and seen["softmax_scale"] == 0.1


def test_fp8_plans_live_in_graph_buffers(monkeypatch):
    rows = {"n": 5}

    def plan(seq_lens, query_rows, kv_heads):
        assert (query_rows, kv_heads) == (2 * 16, 1)
        return torch.full((rows["n"], 8), 7, dtype=torch.int32), torch.arange(len(seq_lens) + 1, dtype=torch.int32)

    monkeypatch.setattr(vllm_flashmla_ops, "get_mla_metadata_dense_fp8", plan)
    scheduler = flashmla.Scheduler(16, True, (8, 4), torch.device("cpu"))
    first = scheduler(torch.ones(3, dtype=torch.int32), 2)
    second = scheduler(torch.ones(3, dtype=torch.int32), 2)
    assert first.tile_metadata.data_ptr() == second.tile_metadata.data_ptr() == scheduler.tile_buffer.data_ptr()
    assert (first.tile_metadata == 7).all() and first.num_splits.tolist() == [0, 1, 2, 3]
    rows["n"] = 9  # more tiles than SMs: refused, never written past the buffer
    with pytest.raises(RuntimeError, match="exceeds its graph buffer"):
        scheduler(torch.ones(3, dtype=torch.int32), 2)
