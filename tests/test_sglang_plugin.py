"""The SGLang adapter against real SGLang objects on CPU (CI: a venv of its own for each of SGLang 0.5.17
and 0.5.23, -m sglang; sglang_release.py says what differs).

The pools, the request-to-token map and the forward batch are SGLang's own; the backend's decode runs
the op's float64 path on them and is judged against an attention computed here from the pool's slots
directly (not through pages), at one bf16 rounding.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang_release import release, resolved_server_args, server_args_fields, server_args_like

from mla_backend.config import BackendUnavailableError, MLABackendConfig
from mla_backend.route import Route
from mla_backend.sglang import NAME, backend, compat, register

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the model zoo: integration/models

pytestmark = pytest.mark.sglang

HEADS = 16
SCALING = 0.07
CONTEXT = 512


@pytest.fixture(scope="module", autouse=True)
def plugins_loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


def server_args(page_size=64, **changes):
    values = dict(
        page_size=page_size,
        attention_backend=None,
        prefill_attention_backend="triton",
        decode_attention_backend=NAME,
        speculative_algorithm=None,
        speculative_num_draft_tokens=None,
        speculative_eagle_topk=None,
        speculative_num_steps=None,
        speculative_draft_attention_backend=None,
        speculative_attention_mode="prefill",
    )
    values.update(changes)
    return server_args_like(**values)


def make_runner(dtype, page_size=64, pool_pages=24, layers=1, **args):
    pool = MLATokenToKVPool(
        size=pool_pages * page_size,
        page_size=page_size,
        dtype=dtype,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
    )
    model = SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, context_len=CONTEXT)
    return SimpleNamespace(
        model_config=model,
        server_args=server_args(page_size, **args),
        req_to_token_pool=ReqToTokenPool(size=8, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False),
        token_to_kv_pool=pool,
        page_size=page_size,
        device="cpu",
        kv_cache_dtype=dtype,
        kv_index_translator=None,  # SGLang 0.5.23's HybridAttnBackend reads it (none: slots are the pool's)
    )


def place_requests(runner, lengths, seed=0):
    """Give each request random pages of the pool and fill its slots with random KV; returns pool indices."""
    gen = torch.Generator().manual_seed(seed)
    p = runner.page_size
    pool = runner.token_to_kv_pool
    free = torch.randperm(pool.size // p, generator=gen) + 1  # page 0 holds SGLang's padding slots
    indices, taken = [], 0
    for i, length in enumerate(lengths):
        row = i + 1
        pages = free[taken : taken + math.ceil(length / p)]
        taken += len(pages)
        slots = (pages[:, None] * p + torch.arange(p)).flatten()[:length]
        runner.req_to_token_pool.req_to_token[row, :length] = slots.to(torch.int32)
        indices.append(row)
    values = torch.randn(pool.kv_buffer[0].shape, generator=gen) * 0.5
    pool.kv_buffer[0].copy_(values.to(pool.dtype).view(pool.store_dtype))
    return torch.tensor(indices)


def layer(k_scale=None):
    return SimpleNamespace(
        tp_q_head_num=HEADS, head_dim=576, v_head_dim=512, scaling=SCALING, k_scale=k_scale, layer_id=0
    )


def make_backend(runner):
    return backend.MLADecodeBackend(
        runner, MLABackendConfig(), Route("bundled", "test", "SGLang's triton decode", "sm_90a")
    )


def decode_batch(indices, lengths, mode=ForwardMode.DECODE, spec=None):
    seq = torch.tensor(lengths)
    tokens = len(lengths) * (spec.draft_token_num if spec else 1)
    return ForwardBatch(
        forward_mode=mode,
        batch_size=len(lengths),
        input_ids=torch.zeros(tokens, dtype=torch.long),
        req_pool_indices=indices,
        seq_lens=seq,
        out_cache_loc=torch.zeros(tokens, dtype=torch.long),
        seq_lens_sum=int(seq.sum()),
        seq_lens_cpu=seq.clone(),
        spec_info=spec,
    )


def absorbed_query(tokens, dtype, seed=1):
    """q_nope as DeepSeek's absorbed bmm leaves it (a transposed [H, T, 512] buffer) and q_rope."""
    gen = torch.Generator().manual_seed(seed)
    nope = (torch.randn(HEADS, tokens, 512, generator=gen)).to(torch.bfloat16).transpose(0, 1)
    rope = torch.randn(tokens, HEADS, 64, generator=gen).to(torch.bfloat16)
    return nope, rope


def expected_attention(runner, indices, kv_lens, q_nope, q_rope, q_len, k_scale=1.0):
    """float64 attention over each request's slots, causal over its q_len newest tokens."""
    cache = runner.token_to_kv_pool.get_key_buffer(0)[:, 0].double() * k_scale
    fp8 = runner.kv_cache_dtype == torch.float8_e4m3fn
    cast = (lambda t: t.clamp(-448, 448).to(torch.float8_e4m3fn)) if fp8 else (lambda t: t)
    query = torch.cat([cast(q_nope).double(), cast(q_rope).double()], -1)
    out = []
    for b, (row, length) in enumerate(zip(indices.tolist(), kv_lens)):
        slots = runner.req_to_token_pool.req_to_token[row, :length].long()
        keys = cache[slots]
        for t in range(q_len):
            visible = length - q_len + t + 1
            q = query[b * q_len + t]
            logits = (q @ keys[:visible].T) * SCALING
            out.append(torch.softmax(logits, -1) @ keys[:visible, :512])
    return torch.stack(out).reshape(len(out), -1)


def assert_close_to(result, want):
    assert torch.isfinite(result.float()).all()
    err = (result.double() - want).abs() / want.abs().clamp_min(1e-3)
    assert err.max() <= 2**-7, err.max()


def test_the_entry_point_registers_everything_sglang_looks_up():
    from importlib.metadata import entry_points

    from sglang.srt import server_args as sa
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.models.deepseek_common import attention_backend_handler, utils

    (entry,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == NAME]
    assert entry.load() is register
    assert ATTENTION_BACKENDS[NAME] is backend.create_backend
    assert NAME in sa.ATTENTION_BACKEND_CHOICES
    assert NAME in utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS
    handler = attention_backend_handler.AttentionBackendRegistry.get_handler(NAME)
    assert handler is attention_backend_handler.handle_attention_triton
    register()  # again: nothing doubles
    assert sa.ATTENTION_BACKEND_CHOICES.count(NAME) == 1
    assert utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.count(NAME) == 1


def test_the_cli_accepts_the_name_and_rejects_others():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(
        ["--model-path", "m", "--decode-attention-backend", NAME, "--prefill-attention-backend", "triton"]
    )
    assert args.decode_attention_backend == NAME
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "m", "--decode-attention-backend", "mla_backendx"])


@pytest.mark.parametrize("page_size", [1, 16, 64, 128])
def test_page_table_from_the_request_to_token_map(page_size):
    runner = make_runner(torch.bfloat16, page_size, pool_pages=24 * 64 // page_size)
    lengths = [1, page_size + 3, 3 * page_size]
    indices = place_requests(runner, lengths)
    bk = make_backend(runner)
    batch = decode_batch(indices, lengths)
    bk.init_forward_metadata(batch)
    meta = bk.forward_metadata
    r2t = runner.req_to_token_pool.req_to_token
    for b, (row, length) in enumerate(zip(indices.tolist(), lengths)):
        for page in range(math.ceil(length / page_size)):
            assert meta.block_tables[b, page] == r2t[row, page * page_size] // page_size
    assert meta.seq_lens.tolist() == lengths and meta.seq_lens.dtype == torch.int32
    assert meta.max_seq_len == max(lengths) and meta.q_len == 1
    assert meta.block_tables.dtype == torch.int32 and meta.block_tables.shape[1] == math.ceil(max(lengths) / page_size)
    if page_size == 1:  # SGLang's default: the token map's rows are the table, slot for slot
        assert torch.equal(meta.block_tables, r2t[indices, : max(lengths)])


def test_the_graph_table_at_page_size_1_is_the_token_map_s_width_filled_in_place():
    """SGLang's default page: a graph's table holds every slot of the token map's rows (as SGLang's own
    MLA backends size their graph kv_indices), and each refill writes the rows into it, not a copy of
    a copy; a table at page 64 holds a 64th of that."""
    runner = make_runner(torch.bfloat16, 1, pool_pages=1024)
    bk = make_backend(runner)
    bk.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    assert bk.graph_block_tables.shape == (4, CONTEXT) and bk.graph_block_tables.dtype == torch.int32
    lengths = [3, 300, 512]
    indices = place_requests(runner, lengths)
    buffer = bk.graph_block_tables.data_ptr()
    bk.init_forward_metadata_out_graph(decode_batch(indices, lengths), in_capture=True)
    bk.init_forward_metadata_in_graph(decode_batch(indices, lengths))
    assert bk.graph_block_tables.data_ptr() == buffer
    assert bk.forward_metadata.block_tables.data_ptr() == buffer
    assert torch.equal(bk.graph_block_tables[:3], runner.req_to_token_pool.req_to_token[indices])
    assert make_backend(make_runner(torch.bfloat16, 64)).max_pages == CONTEXT // 64


@pytest.mark.parametrize("page_size", [64, 1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_forward_decode_on_sglangs_pool_matches_attention_over_its_slots(dtype, page_size):
    runner = make_runner(dtype, page_size, pool_pages=24 * 64 // page_size)
    lengths = [5, 130, 300]
    indices = place_requests(runner, lengths)
    bk = make_backend(runner)
    batch = decode_batch(indices, lengths)
    bk.init_forward_metadata(batch)
    q_nope, q_rope = absorbed_query(len(lengths), dtype)
    k_scale = torch.tensor(2.0) if dtype == torch.float8_e4m3fn else None
    out = bk.forward_decode(q_nope, None, None, layer(k_scale), batch, save_kv_cache=False, q_rope=q_rope)
    assert out.shape == (3, HEADS * 512) and out.dtype == torch.bfloat16
    want = expected_attention(runner, indices, lengths, q_nope, q_rope, 1, k_scale=2.0 if k_scale is not None else 1.0)
    assert_close_to(out.view(-1, 512), want.view(-1, 512))


def test_the_comparison_fails_on_a_wrong_result():
    runner = make_runner(torch.bfloat16)
    lengths = [40, 90]
    indices = place_requests(runner, lengths)
    bk = make_backend(runner)
    batch = decode_batch(indices, lengths)
    bk.init_forward_metadata(batch)
    q_nope, q_rope = absorbed_query(2, torch.bfloat16)
    out = bk.forward_decode(q_nope, None, None, layer(), batch, save_kv_cache=False, q_rope=q_rope)
    want = expected_attention(runner, indices, lengths, q_nope, q_rope, 1)
    with pytest.raises(AssertionError):
        assert_close_to(out.view(-1, 512) * 1.02, want.view(-1, 512))
    shorter = expected_attention(runner, indices, [39, 90], q_nope, q_rope, 1)  # one key too few
    with pytest.raises(AssertionError):
        assert_close_to(out.view(-1, 512), shorter.view(-1, 512))


def test_target_verify_attends_causally_over_prefix_and_drafts():
    runner = make_runner(torch.bfloat16, speculative_algorithm="EAGLE", speculative_num_draft_tokens=3)
    prefixes, drafts = [20, 70], 3
    indices = place_requests(runner, [n + drafts for n in prefixes])
    bk = make_backend(runner)
    spec = SimpleNamespace(draft_token_num=drafts)
    batch = decode_batch(indices, prefixes, ForwardMode.TARGET_VERIFY, spec)
    bk.init_forward_metadata(batch)
    assert bk.forward_metadata.q_len == drafts
    assert bk.forward_metadata.seq_lens.tolist() == [n + drafts for n in prefixes]
    q_nope, q_rope = absorbed_query(len(prefixes) * drafts, torch.bfloat16)
    out = bk.forward_extend(q_nope, None, None, layer(), batch, save_kv_cache=False, q_rope=q_rope)
    want = expected_attention(runner, indices, [n + drafts for n in prefixes], q_nope, q_rope, drafts)
    assert_close_to(out.view(-1, 512), want.view(-1, 512))


@pytest.mark.parametrize("page_size", [64, 1])
@pytest.mark.parametrize("hooks", ["0.5.16+", "0.5.12"])
def test_graph_buffers_are_refilled_for_each_replayed_batch(hooks, page_size):
    runner = make_runner(torch.bfloat16, page_size, pool_pages=24 * 64 // page_size)
    bk = make_backend(runner)
    bk.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    first, second = [30, 200, 64], [129, 7, 400]
    indices = place_requests(runner, first)
    batch = decode_batch(indices, first)
    if hooks == "0.5.16+":
        bk.init_forward_metadata_out_graph(batch, in_capture=True)
        bk.init_forward_metadata_in_graph(batch)  # recorded in the graph
    else:
        bk.init_forward_metadata_capture_cuda_graph(3, 3, indices, batch.seq_lens, None, ForwardMode.DECODE, None)
    captured = bk.forward_metadata
    assert captured.max_seq_len == CONTEXT  # the token map's width: the split plan holds for any replayed batch
    q_nope, q_rope = absorbed_query(3, torch.bfloat16)
    out = bk.forward_decode(q_nope, None, None, layer(), batch, save_kv_cache=False, q_rope=q_rope)
    assert_close_to(out.view(-1, 512), expected_attention(runner, indices, first, q_nope, q_rope, 1).view(-1, 512))

    indices = place_requests(runner, second, seed=5)  # a new batch in the same buffers
    batch = decode_batch(indices.flip(0), second[::-1])
    if hooks == "0.5.16+":
        bk.init_forward_metadata_out_graph(batch)  # replay preparation: the captured metadata stays
        bk.init_forward_metadata_in_graph(batch)  # what the replayed graph runs
    else:
        bk.init_forward_metadata_replay_cuda_graph(
            3, batch.req_pool_indices, batch.seq_lens, None, None, ForwardMode.DECODE, None
        )
    assert bk.forward_metadata is captured
    out = bk.forward_decode(q_nope, None, None, layer(), batch, save_kv_cache=False, q_rope=q_rope)
    want = expected_attention(runner, indices.flip(0), second[::-1], q_nope, q_rope, 1)
    assert_close_to(out.view(-1, 512), want.view(-1, 512))


@pytest.mark.parametrize("graphs", [True, False])
def test_the_first_layer_of_each_step_plans_the_split_for_all_its_layers(graphs, monkeypatch):
    """The step's split plan (step_plan.plan_decode) is made by the call of the layer each forward
    reaches first, from the step's lengths and page table, into the graph's buffer under graphs (a
    captured forward then plans once a replay), and the other layers reuse it; the next step's first
    layer plans again, in the same metadata as a replay has it."""
    calls = []
    monkeypatch.setattr(backend, "plan_decode", lambda *args, **kwargs: calls.append((args, kwargs)))  # None: unplanned
    runner = make_runner(torch.float8_e4m3fn, layers=3)
    bk = make_backend(runner)
    lengths = [30, 200, 64, 9]
    indices = place_requests(runner, lengths)
    batch = decode_batch(indices, lengths)
    if graphs:
        bk.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
        bk.init_forward_metadata_out_graph(batch, in_capture=True)
        bk.init_forward_metadata_in_graph(batch)
    else:
        bk.init_forward_metadata(batch)
    q_nope, q_rope = absorbed_query(len(lengths), torch.float8_e4m3fn)
    layers = [layer() for _ in range(3)]
    for layer_id, each in enumerate(layers):
        each.layer_id = layer_id
    for step in range(2):
        for each in layers:
            bk.forward_decode(q_nope, None, None, each, batch, save_kv_cache=False, q_rope=q_rope)
        assert len(calls) == step + 1
    args, kwargs = calls[0]
    meta = bk.forward_metadata
    assert args[0] is meta.seq_lens and args[1] is meta.block_tables and args[2] == runner.page_size
    assert (kwargs["heads"], kwargs["q_len"], kwargs["kv_dtype"]) == (HEADS, 1, torch.float8_e4m3fn)
    assert kwargs["workspace_buffer"] is bk.workspace and kwargs["route"] is bk.route  # the runner's route
    assert kwargs["buffer"] is (bk.graph_plan_buffer if graphs else None)


def test_a_gpu_it_cannot_serve_gets_sglangs_triton_and_says_why(monkeypatch, caplog):
    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", "8.0")
    from mla_backend.sglang import fallback

    monkeypatch.setattr(fallback, "triton_backend", lambda runner: ("triton", runner))
    runner = make_runner(torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="mla_backend"):
        made = backend.create_backend(runner)
    assert made == ("triton", runner)
    assert "triton backend" in caplog.text and "8.0" in caplog.text


class PrefillStandIn(AttentionBackend):
    """SGLang's triton backend as the combined backend's prefill side: records what reaches it."""

    def __init__(self):
        self.calls = []

    def init_forward_metadata(self, forward_batch):
        self.calls.append(("metadata", forward_batch.forward_mode))

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self.calls.append(("extend", forward_batch.forward_mode, sorted(kwargs)))
        return q


def one_flag_runner(monkeypatch, page_size=64, **args):
    """A model runner started with ``--attention-backend mla_backend`` alone, SGLang's triton stood in."""
    from mla_backend.sglang import fallback

    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", "9.0")
    prefill = PrefillStandIn()
    monkeypatch.setattr(fallback, "triton_backend", lambda runner: prefill)
    one_flag = dict(attention_backend=NAME, prefill_attention_backend=None, decode_attention_backend=None)
    runner = make_runner(torch.bfloat16, page_size, pool_pages=24 * 64 // page_size, **(one_flag | args))
    if release() >= (0, 5, 23):  # its HybridAttnBackend reads the settings SGLang published
        from sglang.srt.layers.attention import hybrid_attn_backend

        settings = runner.server_args
        spec = SimpleNamespace(
            **{k: getattr(settings, k) for k in ("speculative_attention_mode", "speculative_algorithm")}
        )
        monkeypatch.setattr(hybrid_attn_backend, "get_spec", lambda: spec)
        monkeypatch.setattr(
            hybrid_attn_backend, "get_exec", lambda: SimpleNamespace(dllm=SimpleNamespace(dllm_algorithm=None))
        )
    return runner, prefill


@pytest.mark.parametrize("page_size", [64, 1])
def test_one_flag_for_both_decodes_on_ours_and_prefills_on_sglangs_triton(monkeypatch, page_size):
    """``--attention-backend mla_backend``: SGLang asks our factory for one backend and hands it every
    forward mode. Decode (eager and its graph buffers) reaches our kernels and matches attention over
    the pool's slots; prefill and extend reach SGLang's triton, with the query parts DeepSeek's layers
    hand a backend named ours."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend

    runner, prefill = one_flag_runner(monkeypatch, page_size)
    made = backend.create_backend(runner)
    assert isinstance(made, HybridAttnBackend) and made.prefill_backend is prefill
    ours = made.decode_backend
    assert isinstance(ours, backend.MLADecodeBackend)

    lengths = [5, 130, 300]
    indices = place_requests(runner, lengths)
    batch = decode_batch(indices, lengths)
    made.init_forward_metadata(batch)
    q_nope, q_rope = absorbed_query(len(lengths), torch.bfloat16)
    out = made.forward(q_nope, None, None, layer(), batch, save_kv_cache=False, q_rope=q_rope)
    want = expected_attention(runner, indices, lengths, q_nope, q_rope, 1)
    assert_close_to(out.view(-1, 512), want.view(-1, 512))
    made.init_cuda_graph_state(4, 4)
    assert ours.graph_block_tables is not None and made.get_cuda_graph_seq_len_fill_value() == 1
    assert prefill.calls == []

    extend = decode_batch(indices, lengths, ForwardMode.EXTEND)
    made.init_forward_metadata(extend)
    assert made.forward(q_nope, None, None, layer(), extend, save_kv_cache=False, q_rope=q_rope) is q_nope
    assert prefill.calls == [("metadata", ForwardMode.EXTEND), ("extend", ForwardMode.EXTEND, ["q_rope"])]


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_one_flag_verifies_drafts_where_sglang_s_attention_mode_sends_them(monkeypatch, mode):
    args = dict(speculative_algorithm="NEXTN", speculative_num_draft_tokens=4, speculative_num_steps=3)
    args |= dict(speculative_eagle_topk=1, speculative_draft_attention_backend="triton")
    runner, prefill = one_flag_runner(monkeypatch, speculative_attention_mode=mode, **args)
    made = backend.create_backend(runner)
    verify = made._select_backend(ForwardMode.TARGET_VERIFY)
    assert verify is (made.decode_backend if mode == "decode" else prefill)


def test_prefill_alone_named_gets_sglang_s_triton(monkeypatch):
    """``--prefill-attention-backend mla_backend`` with another decode backend: SGLang asks our factory
    for its prefill side only, which our kernels do not serve: SGLang's triton it is."""
    runner, prefill = one_flag_runner(monkeypatch, decode_attention_backend="flashmla")
    assert backend.create_backend(runner) is prefill


def test_the_fallback_joins_the_absorbed_query_and_key():
    from mla_backend.sglang.fallback import _joined

    q_nope, q_rope = absorbed_query(3, torch.bfloat16)
    k, k_rope = torch.randn(3, 1, 512), torch.randn(3, 64)
    q, key = _joined(q_nope, k, q_rope, k_rope, layer())
    assert q.shape == (3, HEADS, 576) and torch.equal(q[..., :512], q_nope) and torch.equal(q[..., 512:], q_rope)
    assert key.shape == (3, 1, 576) and torch.equal(key[:, 0, 512:], k_rope)


@pytest.mark.parametrize(
    "env, args, message",
    [
        ({"MLA_BACKEND": "nope"}, {}, "mla_backend: bad settings in the environment: mla_backend.backend"),
        ({"MLA_BACKEND": "xqa", "MLA_BACKEND_DEVICE_CAPABILITY": "7.5"}, {}, "backend='xqa' needs compute capability"),
        (
            {"MLA_BACKEND_DEVICE_CAPABILITY": "9.0"},
            {"page_size": 48},
            "pages of a power of two from 1 to 1024 tokens: --page-size in (1, 2, 4, 8, 16, 32, 64, 128, 256, "
            "512, 1024) (SGLang's default, 1, included), got 48",
        ),
        ({"MLA_BACKEND_DEVICE_CAPABILITY": "9.0"}, {"page_size": 2048}, "--page-size in (1, 2, 4"),
        (
            {"MLA_BACKEND_DEVICE_CAPABILITY": "9.0"},
            {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 4},
            "not trees",
        ),
        (
            {"MLA_BACKEND_DEVICE_CAPABILITY": "9.0"},
            {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1, "speculative_num_steps": 3},
            "add --speculative-draft-attention-backend triton",
        ),
        (
            {"MLA_BACKEND_DEVICE_CAPABILITY": "9.0"},
            {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_attention_mode": "decode"},
            "add --speculative-draft-attention-backend triton",
        ),
    ],
)
def test_bad_settings_stop_start_up_with_our_message(monkeypatch, env, args, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    runner = make_runner(torch.bfloat16, **args)
    with pytest.raises(Exception, match=re.escape(message)) as info:
        backend.create_backend(runner)
    assert "mla_backend" in str(info.value) or "backend='xqa'" in str(info.value)


def test_the_checks_read_the_settings_sglang_resolved(tmp_path, caplog):
    """Real server arguments for DeepSeek-V3 with NEXTN drafting and no --page-size: SGLang resolves the
    page size to 1 and the drafter to three steps of four draft tokens, on the record's fields as it is
    built (0.5.17), or beside the operator's input, which stays unset (0.5.23); the checks read what SGLang
    resolved, and its (prefill, decode) backends. The page SGLang resolves to (1) is served."""
    from integration.models.families import FAMILIES
    from integration.models.sglang_checkpoint import save_sglang_config

    model = str(save_sglang_config(FAMILIES[0], tmp_path))
    given = dict(model_path=model, device="cpu", skip_tokenizer_init=True, speculative_algorithm="NEXTN")
    given |= dict(prefill_attention_backend="triton", decode_attention_backend=NAME)
    args = resolved_server_args(**given)
    settings = compat.resolved(args)
    newer = release() >= (0, 5, 23)
    assert (settings is args) != newer
    assert (args.page_size, args.speculative_num_steps, args.speculative_num_draft_tokens) == (
        (None, None, None) if newer else (1, 3, 4)
    )
    resolved = (settings.page_size, settings.speculative_num_steps, settings.speculative_num_draft_tokens)
    assert resolved == (1, 3, 4) and settings.speculative_eagle_topk == 1
    assert compat.attention_backends(settings) == ("triton", NAME)
    # SGLang's default page (1) is served: what stops these settings is the drafter's attention
    with pytest.raises(ValueError, match="add --speculative-draft-attention-backend triton"):
        backend.check_server_args(args)
    given |= dict(speculative_draft_attention_backend="triton", speculative_attention_mode="decode")
    served = resolved_server_args(**given)  # still no --page-size: SGLang's 1
    assert compat.resolved(served).page_size == 1
    caplog.clear()  # SGLang's own warnings as it resolved the settings
    with caplog.at_level(logging.WARNING, logger="mla_backend"):
        backend.check_server_args(served)
    assert not caplog.records


@pytest.mark.parametrize(
    "args",
    [
        {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1, "speculative_num_steps": 1},
        {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_draft_attention_backend": "triton"},
    ],
    ids=["one draft step", "drafter on triton"],
)
def test_speculative_settings_whose_drafter_sglang_can_build_start(monkeypatch, args):
    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", "9.0")
    assert isinstance(backend.create_backend(make_runner(torch.bfloat16, **args)), backend.MLADecodeBackend)


def test_registration_survives_an_sglang_without_the_draft_backend_factory(monkeypatch):
    """The stamping is a fix for one SGLang generation's factory: where SGLang has no such factory (an
    import that fails), registering still makes the backend known."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.draft_utils", None)  # import raises ImportError
    register()
    assert NAME in ATTENTION_BACKENDS


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_speculation_verifying_on_the_prefill_backend_says_ours_decodes_nothing(monkeypatch, caplog, mode):
    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", "9.0")
    args = dict(speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_draft_attention_backend="triton")
    with caplog.at_level(logging.WARNING, logger="mla_backend"):
        backend.create_backend(make_runner(torch.bfloat16, speculative_attention_mode=mode, **args))
    warned = [r.getMessage() for r in caplog.records if "verifies drafts on the prefill backend" in r.getMessage()]
    assert len(warned) == (mode == "prefill")
    assert all("--speculative-attention-mode decode" in w for w in warned)


def test_the_speculative_settings_read_are_sglang_s():
    read = {"speculative_num_steps", "speculative_draft_attention_backend", "speculative_attention_mode"}
    assert read <= server_args_fields() and read <= set(vars(server_args()))


def test_the_drafter_s_backends_carry_the_drafter_s_name(monkeypatch):
    """DeepSeek's layers take the forward path of the backend name stamped on the backend they run under,
    ours where none is: each per-step backend of a three-step drafter on triton, and its draft-extend
    backend (verification in decode mode), must name triton. SGLang 0.5.17's own factory (unwrapped)
    leaves them unstamped, which sent triton our q_rope keyword on the GPU; 0.5.23's stamps them itself
    (DraftBackendFactory._create_backend), and the wrapped factory keeps its names."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.speculative import draft_utils
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    class Drafting(AttentionBackend):  # the name fields, as SGLang's backends inherit them
        pass

    Drafting.__abstractmethods__ = frozenset()
    steps, extend = SimpleNamespace(attn_backends=[Drafting() for _ in range(3)]), Drafting()
    if release() >= (0, 5, 23):  # SGLang's _create_backend, handed these by its triton creators
        sglang_stamps = "triton"
        monkeypatch.setattr(draft_utils, "attention_backends", lambda: ("triton", NAME))
        monkeypatch.setattr(DraftBackendFactory, "_create_triton_decode_backend", lambda self: ("triton", steps))
        monkeypatch.setattr(DraftBackendFactory, "_create_triton_prefill_backend", lambda self: ("triton", extend))
    else:
        sglang_stamps = None
        built = {"decode_attention_backend": steps, "prefill_attention_backend": extend}
        monkeypatch.setattr(DraftBackendFactory, "_create_backend", lambda self, name, *args, **kwargs: built[name])
    monkeypatch.setattr(draft_utils, "get_spec", lambda: SimpleNamespace(speculative_attention_mode="prefill"))
    factory = DraftBackendFactory.__new__(DraftBackendFactory)
    vars(factory).update(draft_attn_backend="triton", speculative_num_steps=3, topk=1, qsa_profile=None)
    model_config = SimpleNamespace(hf_config=object(), hf_text_config=object())  # no model-specific wrapper
    factory.draft_model_runner = SimpleNamespace(model_config=model_config)
    register()
    assert DraftBackendFactory.create_decode_backend.__wrapped__(factory) is steps
    assert DraftBackendFactory.create_draft_extend_backend.__wrapped__(factory) is extend
    assert {b.decode_attention_backend_str for b in [*steps.attn_backends, extend]} == {sglang_stamps}
    assert factory.create_decode_backend() is steps and factory.create_draft_extend_backend() is extend
    for drafting in [*steps.attn_backends, extend]:
        assert (drafting.prefill_attention_backend_str, drafting.decode_attention_backend_str) == ("triton", "triton")
    register()  # again: wrapped once
    for create in (DraftBackendFactory.create_decode_backend, DraftBackendFactory.create_draft_extend_backend):
        assert not hasattr(create.__wrapped__, "__wrapped__")


@pytest.mark.parametrize("capability", ["9.0", "8.0"])  # our kernels, and SGLang's triton where they do not run
def test_sparse_models_are_refused_whatever_kernel_would_decode(monkeypatch, capability):
    """DeepSeek-V3.2 / GLM-5: an indexer picks the top-k tokens; a dense decode would ignore them."""
    from mla_backend.sglang import fallback

    monkeypatch.setattr(fallback, "triton_backend", lambda runner: "triton")
    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", capability)
    runner = make_runner(torch.bfloat16)
    runner.model_config.hf_text_config = SimpleNamespace(index_topk=2048)
    with pytest.raises(BackendUnavailableError, match="this model's attention is sparse"):
        backend.create_backend(runner)
    runner.model_config.hf_text_config = SimpleNamespace(index_topk=None)  # dense: served
    assert backend.create_backend(runner) is not None


def zoo_layouts():
    from integration.models.families import FAMILIES

    return [pytest.param(f, layout, id=f"{f.published}-{layout}") for f in FAMILIES for layout in f.heads]


@pytest.mark.parametrize("family, layout", zoo_layouts())
def test_each_zoo_family_is_served_or_refused_as_the_zoo_says(family, layout, tmp_path, monkeypatch):
    """The family's small config.json as SGLang parses it (its ModelConfig), through the backend's factory on
    an RTX 5090: dense 512 + 64 latents get our kernels, sparse ones and other latents stop start-up."""
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", "12.0")
    config = family.config(layout)
    runner = make_runner(torch.bfloat16)
    if family.model_type == "minicpm3":  # the transformers SGLang 0.5.17 pins reads it only with its remote code
        runner.model_config = SimpleNamespace(
            **{k: config[k] for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim")}, context_len=CONTEXT
        )
    else:
        (tmp_path / "config.json").write_text(json.dumps(config))
        runner.model_config = ModelConfig(str(tmp_path))
        assert runner.model_config.attention_arch == AttentionArch.MLA
        assert runner.model_config.num_attention_heads == family.heads[layout]
    if family.expect == "bundled":
        assert isinstance(backend.create_backend(runner), backend.MLADecodeBackend)
        return
    if "index_topk" in config:  # sparse: refused whatever the backend
        with pytest.raises(BackendUnavailableError, match="this model's attention is sparse"):
            backend.create_backend(runner)
        return
    # a latent the kernels do not take (MiniCPM3's 256 + 32, Mistral Small 4's 256 + 64): SGLang's triton
    # under `auto`, a stop at start-up with the bundled kernels named
    from mla_backend.sglang import fallback

    monkeypatch.setattr(fallback, "triton_backend", lambda runner: ("triton", runner))
    assert backend.create_backend(runner) == ("triton", runner)
    monkeypatch.setenv("MLA_BACKEND", "xqa")
    with pytest.raises(BackendUnavailableError, match="needs kv_lora_rank 512.*SGLang's triton"):
        backend.create_backend(runner)


def test_kimi_vl_s_multimodal_wrapper_gets_our_kernels_for_its_text_model(tmp_path, monkeypatch):
    """Kimi-VL as SGLang reads it: KimiVLForConditionalGeneration around Moonlight's MLA text model
    (published_configs.json: its text_config has Moonlight's attention fields) and a MoonViT tower, as
    the zoo's family writes its config.json; SGLang's ModelConfig takes the text model's MLA, and the
    factory serves it on an RTX 5090."""
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    from integration.models.families import FAMILIES

    monkeypatch.setenv("MLA_BACKEND_DEVICE_CAPABILITY", "12.0")
    kimi_vl = next(f for f in FAMILIES if f.architecture == "KimiVLForConditionalGeneration")
    (tmp_path / "config.json").write_text(json.dumps(kimi_vl.config()))
    runner = make_runner(torch.bfloat16)
    runner.model_config = ModelConfig(str(tmp_path))
    assert runner.model_config.hf_config.architectures == ["KimiVLForConditionalGeneration"]
    assert runner.model_config.attention_arch == AttentionArch.MLA
    assert (runner.model_config.num_attention_heads, runner.model_config.kv_lora_rank) == (16, 512)
    assert isinstance(backend.create_backend(runner), backend.MLADecodeBackend)


@pytest.mark.parametrize("corruption, within", [(1.0, True), (1.05, False)])
def test_the_engine_check_passes_ours_and_fails_a_corrupted_output(monkeypatch, tmp_path, corruption, within):
    """integration/engines/sglang_decode_check.py, the float64 check the GPU end-to-end run installs in
    SGLang's scheduler through a test-only entry point, and its verdict (judges/decode_verdict.py)."""
    import json
    from importlib.metadata import entry_points

    from integration.engines import sglang_decode_check as check
    from integration.judges.decode_verdict import judge_sglang_check

    monkeypatch.syspath_prepend(str(check.plugin_dir(tmp_path / "plugin")))
    found = [e.value for e in entry_points(group="sglang.srt.plugins")]
    assert "integration.engines.sglang_decode_check:install" in found

    summary = tmp_path / "summary.json"
    monkeypatch.setenv(check.ENV, json.dumps({"corruption": corruption, "summary": str(summary)}))
    monkeypatch.setattr(backend.MLADecodeBackend, "_attend", backend.MLADecodeBackend._attend)  # undone after
    check.install()
    runner = make_runner(torch.float8_e4m3fn)
    lengths = [20, 130, 300]
    indices = place_requests(runner, lengths)
    bk = make_backend(runner)
    batch = decode_batch(indices, lengths)
    bk.init_forward_metadata(batch)
    q_nope, q_rope = absorbed_query(len(lengths), torch.float8_e4m3fn)
    bk.forward_decode(q_nope, None, None, layer(torch.tensor(2.0)), batch, save_kv_cache=False, q_rope=q_rope)
    result = check.read_summary(summary)
    assert result["calls"] == 1 and result["rows"] == len(lengths) * HEADS and result["processes"] == 1
    assert judge_sglang_check(result, fp8=True)[0] is within


def test_the_flashinfer_stand_in_defines_what_sglang_imports_unguarded():
    """The GPU run's engine and server processes (no FlashInfer on the lent GPU's image): every name the
    DeepSeek engine's modules, and the vision attention the server's transcription endpoint imports,
    take from flashinfer at module level, outside a FlashInfer-availability test or a try (SGLang takes
    those under ``if is_cuda():``), exists in the stand-in package. SGLang 0.5.23 imports FlashInfer in
    those modules only behind such tests (and installs it: the stand-in serves 0.5.17's GPU image)."""
    import ast
    import subprocess

    import sglang

    from integration.engines.sglang_engine import STAND_INS

    def unguarded(statements, guarded=False):
        for statement in statements:
            if isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith("flashinfer"):
                if not guarded:
                    yield from ((statement.module, alias.name) for alias in statement.names)
            elif isinstance(statement, ast.If):
                yield from unguarded(statement.body, guarded or "flashinfer" in ast.unparse(statement.test))
                yield from unguarded(statement.orelse, guarded)

    srt = Path(sglang.__file__).parent / "srt"
    wanted = set()
    # the engine's import path, then sglang.launch_server's (http_server -> ... -> qwen3_asr -> vision)
    for module in ("layers/sampler.py", "layers/quantization/fp8_utils.py", "layers/attention/vision.py"):
        wanted |= set(unguarded(ast.parse((srt / module).read_text(encoding="utf-8-sig")).body))
    if release() >= (0, 5, 23):
        assert wanted == set()
    else:
        assert ("flashinfer.sampling", "min_p_sampling_from_probs") in wanted and ("flashinfer", "bmm_fp8") in wanted
        assert ("flashinfer.prefill", "cudnn_batch_prefill_with_kv_cache") in wanted
    probe = f"import importlib\nfor m, n in {sorted(wanted)!r}:\n    getattr(importlib.import_module(m), n)\n"
    stand_in = {"PYTHONPATH": str(STAND_INS / "flashinfer")}
    done = subprocess.run([sys.executable, "-c", probe], env=stand_in, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_the_fp8_query_reference_rounds_only_mla_queries_and_only_where_asked(monkeypatch):
    """integration/sglang_e2e.py's FP8 token reference: SGLang's own triton decode, with the query rounded
    to FP8 as our kernels read it; other layers and engines started without the variable are untouched."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from integration.engines import sglang_quantized_query

    seen = []
    monkeypatch.setattr(TritonAttnBackend, "forward_decode", lambda self, q, *args, **kwargs: seen.append(q) or q)
    monkeypatch.setattr(TritonAttnBackend, "forward_extend", TritonAttnBackend.forward_extend)  # restored after
    monkeypatch.delenv(sglang_quantized_query.ENV, raising=False)
    sglang_quantized_query.install()
    assert not getattr(TritonAttnBackend.forward_decode, "_rounds_query_to_fp8", False)

    monkeypatch.setenv(sglang_quantized_query.ENV, "1")
    sglang_quantized_query.install()
    sglang_quantized_query.install()  # a second load must not round twice or wrap twice
    q = torch.randn(3, 2 * 576, dtype=torch.bfloat16) * 300  # some values beyond e4m3's 448
    TritonAttnBackend.forward_decode(SimpleNamespace(use_mla=True), q, None, None, None, None)
    TritonAttnBackend.forward_decode(SimpleNamespace(use_mla=False), q, None, None, None, None)
    rounded, untouched = seen
    want = q.float().clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.bfloat16)
    assert torch.equal(rounded, want) and not torch.equal(rounded, q)
    assert untouched is q


def test_the_fp8_query_reference_verifies_drafts_on_what_the_fp8_cache_holds(monkeypatch):
    """With speculation, triton verifies drafts in forward_extend with the verified tokens' own keys taken
    from the bf16 inputs: the reference rounds the query and those keys and values to FP8 (over the layer's
    k_scale where it has one), in target-verify batches of MLA layers only."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from integration.engines import sglang_quantized_query

    seen = []
    monkeypatch.setattr(TritonAttnBackend, "forward_decode", lambda self, q, *args, **kwargs: q)
    monkeypatch.setattr(TritonAttnBackend, "forward_extend", lambda self, q, k, v, *rest, **kw: seen.append((q, k, v)))
    monkeypatch.setenv(sglang_quantized_query.ENV, "1")
    sglang_quantized_query.install()
    q = torch.randn(4, 2 * 576, dtype=torch.bfloat16) * 300
    k = torch.randn(4, 1, 576, dtype=torch.bfloat16) * 3
    verify, prefill = (SimpleNamespace(forward_mode=mode) for mode in (ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND))
    mla, other = SimpleNamespace(use_mla=True), SimpleNamespace(use_mla=False)
    TritonAttnBackend.forward_extend(mla, q, k, k[..., :512], SimpleNamespace(k_scale=None), verify)
    TritonAttnBackend.forward_extend(mla, q, k, k[..., :512], SimpleNamespace(k_scale=0.5), verify)
    TritonAttnBackend.forward_extend(mla, q, k, k[..., :512], SimpleNamespace(k_scale=None), prefill)
    TritonAttnBackend.forward_extend(other, q, k, k[..., :512], SimpleNamespace(k_scale=None), verify)
    (q1, k1, v1), (_, k2, _), untouched_prefill, untouched_other = seen
    assert torch.equal(q1, q.float().clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.bfloat16))
    assert torch.equal(k1, k.to(torch.float8_e4m3fn).to(torch.bfloat16)) and not torch.equal(k1, k)
    assert torch.equal(v1, k1[..., :512])
    assert torch.equal(k2, (k / 0.5).to(torch.float8_e4m3fn).to(torch.bfloat16) * 0.5)
    assert all(a is b for a, b in zip(untouched_prefill, (q, k)))
    assert untouched_other[0] is q and untouched_other[1] is k
