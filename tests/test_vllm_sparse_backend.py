"""The sparse MLA backend (DeepSeek-V3.2, GLM-5) against the real vLLM, on CPU: the CUSTOM flag hands
vLLM our sparse backend for a model whose config names an indexer top-k (and the dense one otherwise),
vLLM's selector accepts what the sparse kernels serve and refuses the rest with what to do, the cache
shapes vLLM allocates, and the kernel call on vLLM's physical slots (the op's CPU path is the float64
reference; the loop here is a second, independent one)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

import mla_backend.vllm as plugin
from mla_backend.config import default_config
from mla_backend.route import sparse_route
from mla_backend.sparse_cache import pack_fp8_ds_mla, unpack_fp8_ds_mla
from mla_backend.vllm import backend, kv_dtype_hook, sparse_backend
from mla_backend.vllm.sparse_backend import MLASparseBackend, MLASparseImpl, slot_rows

pytestmark = pytest.mark.vllm


@pytest.fixture
def clean_registry():
    AttentionBackendEnum.CUSTOM.clear_override()
    plugin.register()
    yield
    AttentionBackendEnum.CUSTOM.clear_override()


def family_model_config(tmp_path_factory, name: str) -> ModelConfig:
    """vLLM's ModelConfig of the zoo's small checkpoint config of ``name`` (published attention fields)."""
    from integration.models.families import FAMILIES

    family = next(f for f in FAMILIES if f.name == name)
    path = tmp_path_factory.mktemp("".join(c for c in name if c.isalnum()))
    (path / "config.json").write_text(json.dumps(family.config()))
    return ModelConfig(model=str(path), tokenizer=None, skip_tokenizer_init=True, dtype="bfloat16")


@pytest.fixture(scope="module", params=["DeepSeek-V3.2", "GLM-5"])
def sparse_model(request, tmp_path_factory) -> ModelConfig:
    return family_model_config(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory) -> ModelConfig:
    return family_model_config(tmp_path_factory, "DeepSeek-V3 / R1")


def engine_config(model_config: ModelConfig | None, additional=None) -> VllmConfig:
    extra = {} if model_config is None else {"model_config": model_config}
    return VllmConfig(device_config=DeviceConfig(device="cuda"), additional_config=additional or {}, **extra)


def select(model_config, capability=(12, 0), kv_cache_dtype="auto", block_size=64, use_sparse=True, additional=None):
    """What vLLM's selector does for --attention-backend CUSTOM: validate the class CUSTOM names, then
    build layers with the class its full_cls_name gives. Returns (reasons, that class's path)."""
    selector = AttentionSelectorConfig(
        head_size=576,
        dtype=torch.bfloat16,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        use_mla=True,
        use_sparse=use_sparse,
    )
    with set_current_vllm_config(engine_config(model_config, additional)):
        cls = AttentionBackendEnum.CUSTOM.get_class()
        reasons = cls.validate_configuration(device_capability=DeviceCapability(*capability), **selector._asdict())
        return reasons, ".".join(cls.full_cls_name())


SPARSE_PATH = "mla_backend.vllm.sparse_backend.MLASparseBackend"


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "fp8_ds_mla"])
@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (12, 0)])
def test_custom_serves_sparse_models_with_the_sparse_backend(sparse_model, kv_cache_dtype, capability, clean_registry):
    reasons, path = select(sparse_model, capability, kv_cache_dtype)
    assert reasons == [] and path == SPARSE_PATH
    assert MLASparseBackend.is_sparse() and MLASparseBackend.is_mla()
    assert MLASparseBackend.get_impl_cls() is MLASparseImpl
    assert MLASparseBackend.get_builder_cls() is sparse_backend.MLASparseMetadataBuilder
    # vLLM maps a class to its enum member by name: the flag the user gave.
    assert AttentionBackendEnum[MLASparseBackend.get_name()].get_path() == plugin.BACKEND_PATH


def test_dense_models_keep_the_dense_backend(dense_model, clean_registry):
    reasons, path = select(dense_model, use_sparse=False)
    assert reasons == [] and path == plugin.BACKEND_PATH


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"block_size": 16}, "--block-size 64"),
        ({"capability": (7, 5)}, "sparse MLA decode (backend='auto') needs compute capability"),
        ({"additional": {"mla_backend": {"backend": "trtllm-gen"}}}, "no sparse path"),
    ],
)
def test_sparse_selection_refuses_with_what_to_do(sparse_model, change, reason, clean_registry):
    reasons, _ = select(sparse_model, **change)
    ours = [r for r in reasons if r.startswith("mla_backend:")]  # beside vLLM's own, for a block size
    assert len(ours) == 1 and reason in ours[0]


@pytest.mark.parametrize("fp8", ["fp8", "fp8_e4m3"])
def test_fp8_is_served_as_fp8_ds_mla_as_vllm_does_for_its_own_sparse_backends(sparse_model, fp8, clean_registry):
    """The plugin wraps vLLM's cache-format choice (kv_dtype_hook.py): our sparse backend's fp8 becomes
    fp8_ds_mla, which vLLM then allocates; every other backend keeps vLLM's answer."""
    from vllm.model_executor.layers.attention import mla_attention

    reasons, path = select(sparse_model, kv_cache_dtype=fp8)
    assert reasons == [] and path == SPARSE_PATH
    canonicalize = mla_attention._canonicalize_sparse_mla_kv_cache_dtype
    assert canonicalize(MLASparseBackend, fp8) == "fp8_ds_mla"
    for kv in ("auto", "bfloat16", "fp8_ds_mla"):
        assert canonicalize(MLASparseBackend, kv) == kv
    assert canonicalize(backend.MLABackend, fp8) == fp8  # dense: a plain e4m3 cache, as before
    flashmla_sparse = type("FlashMLASparse", (), {"get_name": staticmethod(lambda: "FLASHMLA_SPARSE")})
    assert canonicalize(flashmla_sparse, fp8) == "fp8_ds_mla"  # vLLM's own rule, kept


def test_fp8_is_refused_with_the_fix_where_vllms_choice_is_not_wrapped(sparse_model, clean_registry, monkeypatch):
    from vllm.model_executor.layers.attention import mla_attention

    monkeypatch.setattr(mla_attention, "_canonicalize_sparse_mla_kv_cache_dtype", lambda b, kv: kv)
    assert not kv_dtype_hook.installed()
    reasons, _ = select(sparse_model, kv_cache_dtype="fp8")
    assert len(reasons) == 1 and "--kv-cache-dtype fp8_ds_mla" in reasons[0]
    kv_dtype_hook.patch(mla_attention)  # the hook wraps whatever vLLM has, once
    assert kv_dtype_hook.installed()
    kv_dtype_hook.patch(mla_attention)
    assert mla_attention._canonicalize_sparse_mla_kv_cache_dtype(MLASparseBackend, "fp8") == "fp8_ds_mla"


def test_a_selection_that_disagrees_with_the_model_is_refused(sparse_model, dense_model, clean_registry):
    """Sparse layers of a model without index_topk (or dense layers of one with it) would be built
    with the wrong class: refused, never run."""
    for model, use_sparse in ((dense_model, True), (sparse_model, False)):
        reasons, _ = select(model, use_sparse=use_sparse)
        assert len(reasons) == 1 and "index_topk" in reasons[0]


def test_cache_shapes_follow_the_cache_dtype():
    assert MLASparseBackend.get_kv_cache_shape(10, 64, 1, 576, "fp8_ds_mla") == (10, 64, 656)
    for dtype in ("auto", "bfloat16"):
        assert MLASparseBackend.get_kv_cache_shape(10, 64, 1, 576, dtype) == (10, 64, 576)


# --- the kernel call on vLLM's slots ------------------------------------------------------------


def naive_sparse(query, rows, slots, counts, scale):
    """float64 loop: token t attends to rows[slots[t, :counts[t]]] (entries < 0 skipped)."""
    query, rows = query.double(), rows.double()
    out = torch.zeros(query.shape[0], query.shape[1], 512, dtype=torch.float64)
    lse = torch.full(query.shape[:2], float("-inf"), dtype=torch.float64)
    for t in range(query.shape[0]):
        chosen = [int(s) for s in slots[t, : counts[t]] if s >= 0]
        if not chosen:
            continue
        keys = rows[chosen]
        logits = query[t] @ keys.T * scale
        out[t] = torch.softmax(logits, -1) @ keys[:, :512]
        lse[t] = torch.logsumexp(logits, -1)
    return out, lse


def kernel_caller(return_lse: bool) -> SimpleNamespace:
    """What _forward_mqa_kernel reads of the impl (building a real impl needs vLLM's distributed state)."""
    return SimpleNamespace(
        scale=0.07,
        config=default_config(),
        route=sparse_route(default_config(), (9, 0)),
        need_to_return_lse_for_decode=return_lse,
        _workspace=lambda device: torch.empty(0, dtype=torch.uint8),
    )


@pytest.mark.parametrize("kv", ["bfloat16", "fp8_ds_mla"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["own-pages", "pages-between"])
def test_forward_mqa_kernel_reads_vllms_slots(kv, interleaved):
    """Slots are block id x the block's stride in rows + offset; a list is read up to its valid count
    (vLLM's top-k writes valid entries first); q arrives as (ql_nope, q_pe)."""
    torch.manual_seed(7)
    blocks, page, tokens, heads, topk = 6, 64, 5, 8, 96
    stride_pages = 2 if interleaved else 1  # another layer's page between two of ours
    values = torch.randn(blocks * stride_pages, page, 576) * 0.5
    if kv == "fp8_ds_mla":
        storage = pack_fp8_ds_mla(values, "pow2_fp32")
        dequantised = unpack_fp8_ds_mla(storage)
    else:
        storage = values.to(torch.bfloat16)
        dequantised = storage.double()
    cache = storage[::stride_pages]  # [blocks, page, width], block stride = stride_pages pages
    rows = slot_rows(cache, page)
    assert rows.shape[0] == (blocks - 1) * stride_pages * page + page
    slot_of = torch.arange(blocks * stride_pages * page).view(blocks * stride_pages, page)[::stride_pages].reshape(-1)
    slots = slot_of[torch.randint(0, blocks * page, (tokens, topk))].to(torch.int32)
    counts = torch.tensor([topk, 40, 1, 0, 77], dtype=torch.int32)
    slots[1, 50] = -1  # a -1 inside the valid prefix is skipped too
    q_full = (torch.randn(tokens, heads, 576) * 0.5).to(torch.bfloat16)
    q = (q_full[..., :512], q_full[..., 512:])
    out, lse = MLASparseImpl._forward_mqa_kernel(
        kernel_caller(True), q, cache, slots, counts, layer=SimpleNamespace(), block_size=page
    )
    want, want_lse = naive_sparse(q_full, dequantised.reshape(-1, 576), slots, counts, 0.07)
    assert out.shape == (tokens, heads, 512) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), want, atol=4e-3, rtol=1e-2)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    # without DCP vLLM asks for no LSE
    out_only, none = MLASparseImpl._forward_mqa_kernel(
        kernel_caller(False), q, cache, slots, counts, layer=SimpleNamespace(), block_size=page
    )
    assert none is None and torch.equal(out_only, out)


def test_the_check_sees_a_wrong_slot():
    """The comparison above fails when one list names a different row (a check that can fail)."""
    torch.manual_seed(3)
    cache = (torch.randn(2, 64, 576) * 0.5).to(torch.bfloat16)
    slots = torch.randint(0, 128, (2, 32), dtype=torch.int32)
    counts = torch.full((2,), 32, dtype=torch.int32)
    q = (torch.randn(2, 4, 576) * 0.5).to(torch.bfloat16)
    out, _ = MLASparseImpl._forward_mqa_kernel(
        kernel_caller(False), q, cache, slots, counts, layer=SimpleNamespace(), block_size=64
    )
    wrong = slots.clone()
    wrong[0, 0] = (wrong[0, 0] + 1) % 128
    want, _ = naive_sparse(q, cache.reshape(-1, 576), wrong, counts, 0.07)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out.double(), want, atol=4e-3, rtol=1e-2)


def test_slot_rows_refuses_blocks_that_are_not_whole_rows_apart():
    cache = torch.zeros(3, 64, 577, dtype=torch.bfloat16)[..., :576]
    with pytest.raises(ValueError, match="whole number of rows"):
        slot_rows(cache, 64)


def test_the_worker_check_wraps_the_sparse_impl_for_a_sparse_server(tmp_path):
    """integration/engines/vllm_worker_check.py in a sparse model's server: the settings' ``sparse``
    starts the sparse checker (our sparse impl's forward_mqa wrapped), not the dense one."""
    import sys
    from pathlib import Path

    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from integration.engines.vllm_sparse_checker import SparseChecker
    from integration.engines.vllm_worker_check import start_checker

    original = MLASparseImpl.forward_mqa
    checker = start_checker({"backend": "CUSTOM", "kv": "auto", "dir": str(tmp_path), "sparse": True, "max_calls": 40})
    try:
        assert isinstance(checker, SparseChecker) and checker.max_calls == 40 and not checker.armed
        assert MLASparseImpl.forward_mqa is not original
    finally:
        checker.__exit__(None, None, None)
    assert MLASparseImpl.forward_mqa is original


def test_the_sparse_checker_wraps_a_reference_backends_impl_and_ours_stays():
    """sparse_e2e --check-references: the checker on vLLM's own sparse impl (its forward_mqa wrapped and
    restored, ours untouched; the summary names whose calls it judged); a backend it cannot wrap is
    refused up front. (FLASH_ATTN_MLA_SPARSE's module imports vLLM's FlashAttention extension, which a
    CPU install lacks: wrapped the same way on the GPU.)"""
    backend = "FLASHMLA_SPARSE"
    import importlib
    import sys
    from pathlib import Path

    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from integration.engines.vllm_sparse_checker import IMPLS, SparseChecker

    module, name = IMPLS[backend]
    impl = getattr(importlib.import_module(module), name)
    original, ours = impl.forward_mqa, MLASparseImpl.forward_mqa
    with SparseChecker(torch.bfloat16, backend=backend) as checker:
        assert impl.forward_mqa is not original and MLASparseImpl.forward_mqa is ours
        assert checker.summary()["backend"] == backend
    assert impl.forward_mqa is original
    with pytest.raises(ValueError, match="TRITON_MLA"):
        SparseChecker(torch.bfloat16, backend="TRITON_MLA")
