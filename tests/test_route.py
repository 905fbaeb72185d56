"""route.py: the one place that decides which kernel serves decode, from settings, GPU, model shape,
KV, heads, query tokens and engine; its docs table; and the op and step plan using the route they
are handed without resolving another."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from mla_backend import mla_decode, plan_decode
from mla_backend.config import BackendUnavailableError, MLABackendConfig
from mla_backend.inputs import make_paged_problem
from mla_backend.route import OP, DecodeShape, Engine, Route, resolve_route, routes_table, sparse_route

CAPABILITIES = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]
XQA = {(8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)}
TRTLLM = {(10, 0), (10, 3)}
VLLM = Engine("vLLM", "vLLM's Triton MLA decode", "vLLM's Triton MLA kernel", (False, "not in this test"))
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def expected(backend, cc, has_fi):
    """The resolution table of the foundation issue, written out independently."""
    if backend == "xqa":
        return "bundled" if cc in XQA else "error"
    if backend == "trtllm-gen":
        return "trtllm-gen" if cc in TRTLLM and has_fi else "error"
    if cc[0] == 10:
        return "trtllm-gen" if has_fi else "bundled"
    return "bundled" if cc in XQA else "fallback"


@pytest.mark.parametrize("cc", CAPABILITIES)
@pytest.mark.parametrize("backend", ["auto", "xqa", "trtllm-gen"])
@pytest.mark.parametrize("has_fi", [True, False])
def test_resolution_matrix(cc, backend, has_fi):
    config = MLABackendConfig(backend=backend)
    want = expected(backend, cc, has_fi)
    if want == "error":
        with pytest.raises(BackendUnavailableError) as info:
            resolve_route(config, cc, has_flashinfer=has_fi)
        message = str(info.value)
        assert f"{cc[0]}.{cc[1]}" in message and "backend='auto'" in message and backend in message
    else:
        route = resolve_route(config, cc, has_flashinfer=has_fi)
        assert route.kernel == want
        assert f"{cc[0]}.{cc[1]}" in route.reason


@pytest.mark.parametrize("cc", CAPABILITIES)
@pytest.mark.parametrize("has_fi", [True, False])
def test_an_automatic_route_is_the_one_its_backend_value_forces(cc, has_fi):
    route = resolve_route(MLABackendConfig(), cc, has_flashinfer=has_fi)
    if route.kernel == "fallback":  # no backend value names the engine's own kernel
        with pytest.raises(BackendUnavailableError, match="no mla_backend kernel serves this decode"):
            route.backend
        return
    forced = resolve_route(MLABackendConfig(backend=route.backend), cc, has_flashinfer=has_fi)
    assert forced.kernel == route.kernel


def test_an_rtx_5090_at_16_heads_4_query_tokens_fp8_runs_the_sm120a_e4m3_kernel_with_f16_pv():
    """The issue's question, answered from route.py: e4m3 QK^T (native QMMA) and f16-accumulated P.V
    (kernel_build's default on sm_120a), in the 32-row FP8 tile (64 rows take two of them)."""
    route = resolve_route(MLABackendConfig(), (12, 0), DecodeShape(16, 4, kv_fp8=True, page_size=64), VLLM)
    assert (route.kernel, route.arch, route.variant) == ("bundled", "sm_120a", "fp8: e4m3 QK^T, f16 P.V, 32-row tile")
    assert route.fallback == "vLLM's Triton MLA decode"
    forced_f32 = resolve_route(MLABackendConfig(fp8_pv="f32"), (12, 0), DecodeShape(16, 4, kv_fp8=True), VLLM)
    assert forced_f32.variant == "fp8: e4m3 QK^T, f32 P.V, 32-row tile"
    h100 = resolve_route(MLABackendConfig(), (9, 0), DecodeShape(16, 1, kv_fp8=True, page_size=16), VLLM)
    assert h100.variant == "fp8: f16 QK^T, f32 P.V, 16-row tile"
    assert resolve_route(MLABackendConfig(), (8, 9), DecodeShape(128, 1)).variant == "bf16, 32-row tile"


PROBLEMS = [
    (dict(kv_lora_rank=256, rope_dim=32), "kv_lora_rank 512 and qk_rope_head_dim 64, the model has 256 and 32"),
    (dict(kv_lora_rank=None), "serves MLA models"),
    (dict(qk_nope_head_dim=64), "qk_nope_head_dim in (128, 192), the model has 64"),
    (dict(heads=256), "1..128 query heads per GPU, this setup gives 256"),
    (dict(heads=0), "this setup gives 0"),
]


@pytest.mark.parametrize("fields, problem", PROBLEMS)
def test_a_model_the_kernels_do_not_take_goes_to_the_engines_decode_under_auto(fields, problem):
    shape = dataclasses.replace(DecodeShape(16), **fields)
    route = resolve_route(MLABackendConfig(), (12, 0), shape, VLLM)
    assert route.kernel == "fallback" and problem in route.reason and "vLLM's Triton MLA decode" in route.reason
    with pytest.raises(BackendUnavailableError, match="backend='auto' decodes such models with vLLM's Triton"):
        resolve_route(MLABackendConfig(backend="xqa"), (12, 0), shape, VLLM)


def test_the_model_is_not_weighed_where_the_gpu_already_sends_decode_elsewhere():
    shape = DecodeShape(16, kv_lora_rank=256)
    assert "SM 8.0 is not served" in resolve_route(MLABackendConfig(), (8, 0), shape, VLLM).reason


def test_routes_are_values_the_same_inputs_give_equal_routes_in_any_order():
    """Resolving is pure: an engine's builder and impls, resolving apart, run the same route."""
    shapes = [DecodeShape(h, q, fp8, 64) for h in (16, 128) for q in (1, 4) for fp8 in (True, False)]
    first = [resolve_route(MLABackendConfig(), (12, 0), s, VLLM) for s in shapes]
    again = [resolve_route(MLABackendConfig(), (12, 0), s, VLLM) for s in reversed(shapes)][::-1]
    assert first == again
    with pytest.raises(dataclasses.FrozenInstanceError):
        first[0].kernel = "fallback"
    assert len({hash(route) for route in first}) > 1  # hashable values, which the shapes set apart


def test_the_op_alone_names_no_fallback_it_refuses():
    assert resolve_route(MLABackendConfig(), (8, 0), engine=OP).kernel == "fallback"
    assert resolve_route(MLABackendConfig(), (12, 0), engine=OP).fallback == "the engine's portable MLA decode"


def table_in_design_doc() -> list[str]:
    text = DESIGN.read_text()
    block = re.search(r"<!-- routes-table -->\n(.*?)\n<!-- /routes-table -->", text, re.S)
    assert block is not None, "docs/design.md has no <!-- routes-table --> block"
    return block.group(1).splitlines()


def test_the_design_docs_table_is_the_one_route_py_makes():
    """docs/design.md's "which kernel runs" table is `python -m mla_backend doctor --routes` verbatim:
    a change of rule that misses the doc fails here."""
    assert table_in_design_doc() == routes_table()


def test_the_op_runs_the_route_it_is_handed_and_resolves_none(monkeypatch):
    """A route handed to the op decides: no second resolution (here one would raise), and a route the op
    cannot run is refused by name."""
    import mla_backend.decode as decode_module

    def no_resolution(*args, **kwargs):
        raise AssertionError("the op resolved a route it was handed")

    monkeypatch.setattr(decode_module, "op_route", no_resolution)
    p = make_paged_problem([40, 70], q_len=1, heads=16, page_size=16, seed=3)
    route = resolve_route(MLABackendConfig(), (12, 0))
    args = (p.query, p.kv_cache, None, p.block_tables, p.seq_lens, p.max_seq_len)
    out = mla_decode(*args, route=route)  # CPU tensors: the float64 reference, whatever the route
    assert out.shape == (2, 1, 16, 512) and torch.isfinite(out.float()).all()
    with pytest.raises(ValueError, match="not both"):
        mla_decode(*args, route=route, backend="xqa")
    with pytest.raises(TypeError, match="route must come from"):
        mla_decode(*args, route="bundled")
    plan = plan_decode(p.seq_lens, p.block_tables, 16, heads=16, kv_dtype=torch.bfloat16, workspace_buffer=None)
    assert plan is None  # CPU tensors plan nothing


def test_the_op_refuses_a_route_it_cannot_run_on_a_gpu_tensor(monkeypatch):
    from mla_backend.decode import call_kernel

    flashmla = Route("flashmla", "auto: SM 9.0 -> vLLM's FlashMLA", "the bundled kernels")
    with pytest.raises(BackendUnavailableError, match="flashmla"):
        call_kernel(torch.device("cuda", 0), MLABackendConfig(), "auto", flashmla)
    bundled = resolve_route(MLABackendConfig(), (12, 0))
    assert call_kernel(torch.device("cuda", 0), MLABackendConfig(), "auto", bundled) == "bundled"


@pytest.mark.parametrize("page_size", [1, 8, 256])
def test_a_page_trtllm_gen_does_not_read_decodes_on_the_bundled_kernels_under_auto(page_size):
    """SGLang's default page (1) on a B200 with FlashInfer: trtllm-gen reads pages of 16 to 128 tokens, so
    auto takes the bundled kernels and says why; an explicit trtllm-gen stops, naming the pages."""
    shape = DecodeShape(16, 1, kv_fp8=True, page_size=page_size)
    route = resolve_route(MLABackendConfig(), (10, 0), shape, has_flashinfer=True)
    assert (route.kernel, route.arch) == ("bundled", "sm_100a") and route.variant
    assert f"the cache has {page_size}" in route.reason
    with pytest.raises(BackendUnavailableError, match=rf"\(16, 32, 64, 128\) tokens, the cache has {page_size}"):
        resolve_route(MLABackendConfig(backend="trtllm-gen"), (10, 0), shape, has_flashinfer=True)
    served = resolve_route(MLABackendConfig(), (10, 0), dataclasses.replace(shape, page_size=64), has_flashinfer=True)
    assert served.kernel == "trtllm-gen"


@pytest.mark.parametrize(
    "cc, arch", [((8, 9), "sm_89"), ((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((12, 0), "sm_120a")]
)
@pytest.mark.parametrize("backend", ["auto", "xqa"])
def test_sparse_lists_run_the_bundled_kernels_wherever_they_are_built(cc, arch, backend):
    """Rule 6: even where auto sends dense decode to FlashInfer's trtllm-gen (SM 10.0), whose sparse
    path reads no fp8_ds_mla cache."""
    route = sparse_route(MLABackendConfig(backend=backend), cc)
    assert (route.kernel, route.arch, route.fallback) == ("bundled", arch, "none")


@pytest.mark.parametrize("backend, cc, message", [("trtllm-gen", (10, 0), "no sparse path"), ("auto", (8, 0), "8.0")])
def test_sparse_lists_are_refused_where_no_bundled_kernel_serves_them(backend, cc, message):
    with pytest.raises(BackendUnavailableError, match=message):
        sparse_route(MLABackendConfig(backend=backend), cc)


def test_doctor_says_which_kernel_serves_sparse_models(monkeypatch):
    from mla_backend.tools import doctor

    assert doctor.sparse_line(MLABackendConfig(), (9, 0)).startswith("bundled (sm_90a)")
    assert doctor.sparse_line(MLABackendConfig(), (12, 0)).startswith("bundled (sm_120a)")
    assert doctor.sparse_line(MLABackendConfig(), (8, 0)).startswith("ERROR: sparse MLA decode (backend='auto')")
    monkeypatch.setattr(doctor, "importable", lambda module: module != "triton")
    assert "torch loops (Triton not installed" in doctor.indexer_line()
