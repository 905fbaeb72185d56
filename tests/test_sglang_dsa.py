"""mla_backend as the decode of SGLang's DeepSeek Sparse Attention backend (mla_backend/sglang/dsa.py),
against SGLang's own classes on CPU (-m sglang: 0.5.17 and 0.5.23 in CI): the flag's new value parses,
SGLang's registry and drafter build our subclass, and its decode and verification read SGLang's pool,
index maps and lengths as SGLang's sub-backends do, judged by a float64 attention over the slots
SGLang's reference index map names (a wrong slot fails it)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from types import SimpleNamespace

import pytest
import torch
from sglang_fakes import keep_indexer_modules

from mla_backend.config import BackendUnavailableError
from mla_backend.reference import sparse_mla_reference
from mla_backend.sglang import NAME, dsa, register

# CI runs them in its SGLang venvs (-m sglang); elsewhere skipped rather than failing on SGLang's imports.
pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs SGLang"),
]


@pytest.fixture(scope="module", autouse=True)
def plugins_loaded():
    register()


def test_dsa_decode_backend_takes_mla_backend_on_the_command_line():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", "--dsa-decode-backend", NAME])
    assert args.dsa_decode_backend == NAME
    register()  # twice: the choice once
    action = next(a for a in parser._actions if a.dest == "dsa_decode_backend")
    assert list(action.choices).count(NAME) == 1


def test_sglang_builds_our_subclass_wherever_it_builds_its_dsa_backend():
    from sglang.srt.layers.attention import attention_registry as registry

    for name in ("dsa", "nsa"):
        assert getattr(registry.ATTENTION_BACKENDS[name], "swaps_dsa_class", False)
    cls = dsa.ensure_subclass()
    module = importlib.import_module(dsa.DSA_MODULE)
    assert module.DeepseekSparseAttnBackend is cls and cls.mla_backend_subclass
    assert dsa.ensure_subclass() is cls
    assert issubclass(cls, cls.__mro__[1]) and cls.__mro__[1].__name__ == "DeepseekSparseAttnBackend"


HEADS, TOPK, SLOTS, SCALING = 4, 64, 300, 0.09


class Pool:
    """The pool's two calls the backend makes: writes land in the buffer SGLang returns."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.writes = []

    def set_mla_kv_buffer(self, layer, loc, k, k_rope):
        self.writes.append(loc)

    def get_key_buffer(self, layer_id):
        return self.buffer


def backend_for(cache, page_table, lengths, fp8=False):
    cls = dsa.ensure_subclass()
    module = importlib.import_module(dsa.DSA_MODULE)
    backend = cls.__new__(cls)  # SGLang's __init__ needs a model runner on a GPU
    backend.mla_serves = True
    backend.mla_config = dsa.MLABackendConfig()
    backend.mla_workspace = torch.empty(0, dtype=torch.uint8)
    backend.use_fused_topk = False
    backend.dsa_kv_cache_store_fp8 = fp8
    backend.token_to_kv_pool = Pool(cache)
    backend.forward_metadata = SimpleNamespace(page_table_1=page_table, dsa_cache_seqlens_int32=lengths)
    return backend, module


def index_map(page_table, topk_indices, page_size=1, **unused):
    """SGLang's transform_index_page_table_{decode,prefill} at page size 1 for rows already one a token
    (its kernels' rule: page_table[t, i] where i >= 0, else -1), in torch on CPU."""
    assert page_size == 1
    slots = torch.gather(page_table, 1, topk_indices.clamp(min=0).long()).to(torch.int32)
    return torch.where(topk_indices >= 0, slots, -1)


def close_to_float64(out, query, cache, slots):
    """Token t over cache rows slots[t] (entries < 0 skipped), in float64."""
    want, _ = sparse_mla_reference(query, cache.view(SLOTS, 576), slots, SCALING)
    torch.testing.assert_close(out.double(), want, atol=4e-3, rtol=1e-2)


def decode_case(seed=0):
    gen = torch.Generator().manual_seed(seed)
    cache = (torch.randn(SLOTS, 1, 576, generator=gen) * 0.5).to(torch.bfloat16)
    tokens = 3
    page_table = torch.stack([torch.randperm(SLOTS, generator=gen)[:200] for _ in range(tokens)]).to(torch.int32)
    topk = torch.stack([torch.randperm(150, generator=gen)[:TOPK] for _ in range(tokens)]).to(torch.int32)
    topk[1, 40:] = -1  # a short list: valid entries first
    q = (torch.randn(tokens, HEADS, 576, generator=gen) * 0.5).to(torch.bfloat16)
    lengths = torch.tensor([TOPK, 40, TOPK], dtype=torch.int32)
    return cache, page_table, topk, q, lengths


def test_decode_reads_sglang_s_pool_and_index_map(monkeypatch):
    cache, page_table, topk, q, lengths = decode_case()
    backend, module = backend_for(cache, page_table, lengths)
    monkeypatch.setattr(module, "transform_index_page_table_decode", index_map)
    layer = SimpleNamespace(tp_q_head_num=HEADS, layer_id=3, scaling=SCALING)
    batch = SimpleNamespace(out_cache_loc=torch.tensor([7, 8, 9]))
    k, k_rope = torch.zeros(3, 1, 512), torch.zeros(3, 1, 64)
    latent, rope = q[..., :512], q[..., 512:]
    out = backend.forward_decode(latent, k, None, layer, batch, q_rope=rope, k_rope=k_rope, topk_indices=topk)
    slots = index_map(page_table, topk)
    assert out.shape == (3, HEADS, 512) and out.dtype == torch.bfloat16
    close_to_float64(out, q, cache, slots)
    assert len(backend.token_to_kv_pool.writes) == 1  # this step's KV went into the pool first
    wrong = slots.clone()
    wrong[0, 0] = (wrong[0, 0] + 1) % SLOTS
    with pytest.raises(AssertionError):
        close_to_float64(out, q, cache, wrong)


def test_verification_reads_the_prefill_index_map_per_draft_token(monkeypatch):
    cache, page_table, topk, q, lengths = decode_case(1)
    backend, module = backend_for(cache, page_table, lengths)
    backend.forward_metadata.dsa_extend_seq_lens_list = [3]
    backend.forward_metadata.cu_seqlens_q = torch.tensor([0, 3], dtype=torch.int32)
    seen = {}

    def prefill_map(page_table, topk_indices, extend_lens_cpu, page_size, output_num_tokens, **flags):
        seen.update(extend_lens_cpu=extend_lens_cpu, output_num_tokens=output_num_tokens, **flags)
        return index_map(page_table, topk_indices, page_size)

    monkeypatch.setattr(module, "transform_index_page_table_prefill", prefill_map)
    layer = SimpleNamespace(tp_q_head_num=HEADS, layer_id=0, scaling=SCALING)
    mode = SimpleNamespace(is_target_verify=lambda: True, is_draft_extend_v2=lambda: False)
    batch = SimpleNamespace(out_cache_loc=torch.tensor([1, 2, 3]), forward_mode=mode)
    out = backend.forward_extend(q, None, None, layer, batch, topk_indices=topk)  # q already joined
    close_to_float64(out, q, cache, index_map(page_table, topk))
    assert seen["output_num_tokens"] == 3 and seen["page_table_is_expanded"] and seen["extend_lens_cpu"] == [3]
    assert backend.token_to_kv_pool.writes == []  # no new KV passed: nothing written


def test_other_sub_backends_stay_sglang_s(monkeypatch):
    cls = dsa.ensure_subclass()
    base = cls.__mro__[1]
    calls = []
    monkeypatch.setattr(base, "forward_decode", lambda self, *a, **k: calls.append("decode"))
    backend = cls.__new__(cls)
    backend.mla_serves = False
    backend.forward_decode(None, None, None, None, None)
    assert calls == ["decode"]


def test_unserved_settings_are_refused_with_what_to_change():
    model_runner = SimpleNamespace(model_config=SimpleNamespace(kv_lora_rank=256, qk_rope_head_dim=64),
                                   kv_cache_dtype=torch.float8_e4m3fn)  # fmt: skip
    backend = SimpleNamespace(hisparse_coordinator=object(), dsa_prefill_impl=NAME, dsa_kv_cache_store_fp8=False)
    with pytest.raises(ValueError) as refused:
        dsa.refuse_unserved(backend, model_runner)
    for part in ("256 + 64", "HiSparse", "--dsa-prefill-backend mla_backend", "--dsa-prefill-backend"):
        assert part in str(refused.value)


def test_the_indexer_scores_with_mla_backend_where_deep_gemm_is_missing(monkeypatch):
    """Without DeepGEMM, SGLang's indexer gets mla_backend.indexer's functions: 0.5.23 through its
    resolvers (in every module that imported them by name), 0.5.17 as its indexer module's deep_gemm;
    nothing is registered as deep_gemm for the rest of SGLang to find."""
    import importlib.util
    import sys

    from mla_backend import indexer
    from mla_backend.sglang import deep_gemm_shim

    find_spec = importlib.util.find_spec

    def without_deep_gemm(name, *args):
        return None if name == "deep_gemm" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_deep_gemm)
    resolvers = importlib.import_module(dsa.RESOLVERS_MODULE)
    touched = [resolvers, importlib.import_module(dsa.INDEXER_MODULE), importlib.import_module(dsa.DSA_MODULE)]
    keep_indexer_modules(monkeypatch)
    assert dsa.indexer_without_deep_gemm()
    assert "deep_gemm" not in sys.modules or sys.modules["deep_gemm"] is not deep_gemm_shim
    if hasattr(resolvers, "resolve_fp8_paged_mqa_logits_fn"):  # 0.5.23
        for module in touched:
            if hasattr(module, "resolve_fp8_paged_mqa_logits_fn"):
                assert module.resolve_fp8_paged_mqa_logits_fn() is indexer.fp8_paged_mqa_logits
        assert resolvers.resolve_fp8_mqa_logits_fn() is indexer.fp8_mqa_logits
        assert resolvers.resolve_paged_mqa_logits_metadata_fn() is indexer.get_paged_mqa_logits_metadata
    else:
        assert touched[1].deep_gemm is deep_gemm_shim
        assert deep_gemm_shim.fp8_paged_mqa_logits is indexer.fp8_paged_mqa_logits


def test_glm_on_sm12x_with_fp8_is_checked_on_its_prefill_side_while_the_decode_is_ours():
    """SGLang admits only flashinfer_sparse_mla for GLM-5 with an fp8 cache on SM12x; with our decode its
    check sees the prefill side alone, which must still be SGLang's flashinfer_sparse_mla."""
    module = importlib.import_module(dsa.SM120_MODULE)
    check = getattr(module, dsa.SM120_CHECK)
    glm = dict(model_arch="GlmMoeDsaForCausalLM", device_sm_major=12, kv_cache_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError):
        check(**glm, prefill_impl="flashinfer_sparse_mla", decode_impl=NAME)
    with dsa.glm_sm12x_check_of_the_prefill_side():
        assert getattr(module, dsa.SM120_CHECK)(**glm, prefill_impl="flashinfer_sparse_mla", decode_impl=NAME)
        with pytest.raises(ValueError):
            getattr(module, dsa.SM120_CHECK)(**glm, prefill_impl="flashmla_sparse", decode_impl=NAME)
    assert getattr(module, dsa.SM120_CHECK) is check


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (12, 0)])
def test_the_route_is_the_bundled_kernels_on_every_served_gpu(capability):
    """Route rule 6 for SGLang: our kernels wherever they are built (SM90 and fp8 pools included)."""
    route = dsa.announce_route(SimpleNamespace(device_capability=capability), dsa.MLABackendConfig())
    assert route.kernel == "bundled" and route.arch is not None


def test_a_gpu_the_kernels_are_not_built_for_stops_start_up_with_the_served_list():
    with pytest.raises(BackendUnavailableError, match="needs compute capability"):
        dsa.announce_route(SimpleNamespace(device_capability=(8, 0)), dsa.MLABackendConfig())
