"""BatchMLAPagedAttentionWrapper on the bundled kernels against the float64 judge (GPU only).

FlashInfer's own wrapper grid (tests/attention/test_deepseek_mla.py: test_batch_mla_page_attention,
test_batch_mla_oob_kv_nan), trimmed to run in about two minutes and in bf16 (the kernels' dtype for
FlashInfer's fp16): batch sizes, kv lengths incl. 0, page sizes incl. 1, causal and not, query
lengths around the kernels' 8, return_lse, caller buffers, CUDA-graph capture and replay after a
re-plan. Every key a request may not read holds NaN (wrapper_cases.make_batch), every output buffer
starts NaN, and causal rows that see no key (qo_len > kv_len, which FlashInfer skips) must be 0 / -inf.
"""

import math

import pytest
import torch
from peer_grids import assert_lse_exact
from wrapper_cases import LOG2E, assert_matches, documentation_example, make_batch, reference

from mla_backend import BatchMLAPagedAttentionWrapper
from mla_backend.reference import ROW_ERROR_TOLERANCE

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace
FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def workspace():
    return torch.empty(WORKSPACE_BYTES, dtype=torch.int8, device="cuda")


def nan_like(shape, dtype) -> torch.Tensor:
    return torch.full(shape, math.nan, dtype=dtype, device="cuda")


def judge(batch, out, lse, causal, base_e=True, tolerance=ROW_ERROR_TOLERANCE[torch.bfloat16], **reference_inputs):
    """Rows within the kernels' tolerance of the float64 judge, 0 where a row sees no key; the LSE by
    the exact rule (-inf exactly where a row sees nothing, FlashMLA's bound elsewhere)."""
    want, want_lse = reference(batch, causal, **reference_inputs)
    assert_matches(out, want, tolerance=tolerance)
    assert not (out[torch.isneginf(want_lse)] != 0).any(), "a row that sees no key must be 0"
    if lse is not None:
        assert_lse_exact(lse.double() if base_e else lse.double() / LOG2E, want_lse)


def uniform_batch(batch_size, qo_len, kv_len, page_size, heads=16, seed=0):
    return make_batch([qo_len] * batch_size, [kv_len] * batch_size, page_size, heads, device="cuda", seed=seed)


def test_flashinfers_documentation_example_keyword_by_keyword():
    """The class docstring's example as FlashInfer writes it (128 heads, 114 requests of 999 tokens,
    page size 1, not causal), on random rope parts instead of its zeros so the rope dims count."""
    batch, o, sm_scale = documentation_example("cuda")
    judge(batch, o, None, False, sm_scale=sm_scale)


@pytest.mark.parametrize("batch_size", [1, 7, 61])
@pytest.mark.parametrize("kv_len", [0, 17, 97, 1024])
@pytest.mark.parametrize("qo_len", [1, 3, 9, 17])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfers_page_attention_grid(workspace, batch_size, kv_len, qo_len, causal, page_size):
    batch = uniform_batch(batch_size, qo_len, kv_len, page_size)
    wrapper = BatchMLAPagedAttentionWrapper(workspace, backend="fa2")
    wrapper.plan(*batch.plan_args(causal))
    out = nan_like(batch.q_nope.shape, torch.bfloat16)
    lse = nan_like(batch.q_nope.shape[:2], torch.float32)
    got = wrapper.run(
        batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, out=out, lse=lse, return_lse=True, return_lse_base_on_e=True
    )
    assert got[0] is out and got[1] is lse
    judge(batch, out, lse, causal)
    # FlashInfer's default: base 2, buffers allocated by the wrapper.
    out2, lse2 = wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True)
    judge(batch, out2, lse2, causal, base_e=False)


@pytest.mark.parametrize("page_size", [3, 64, 128])
@pytest.mark.parametrize("qo_lens", [[1, 5, 2, 8], [11, 1, 20, 4]])
def test_ragged_lengths_and_other_page_sizes(workspace, page_size, qo_lens):
    batch = make_batch(qo_lens, [0, 300, 33, 2049], page_size, 128, device="cuda", seed=page_size)
    wrapper = BatchMLAPagedAttentionWrapper(workspace)
    wrapper.plan(*batch.plan_args(True))
    out, lse = wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True, return_lse_base_on_e=True)
    judge(batch, out, lse, True)


@pytest.mark.parametrize("qo_lens", [[1, 1, 1, 1], [4, 4, 4, 4], [2, 7, 1, 3], [11, 11, 11, 11]])
@pytest.mark.parametrize("page_size", [1, 16])
def test_cuda_graph_replay_after_replan(workspace, qo_lens, page_size):
    """FlashInfer's graph test: plan a warm-up batch (kv_len 0), capture run, re-plan the real
    lengths, replay: the graph reads the new plan."""
    kv_lens = [17, 0, 514, 97]
    batch = make_batch(qo_lens, kv_lens, page_size, 16, device="cuda")
    n = len(qo_lens)

    def buffer(size):
        return torch.empty(size, dtype=torch.int32, device="cuda")

    wrapper = BatchMLAPagedAttentionWrapper(
        workspace, True, buffer(n + 1), buffer(n + 1), buffer(1 << 16), buffer(n), backend="fa2"
    )
    warmup = torch.zeros(n, dtype=torch.int32, device="cuda")
    wrapper.plan(
        batch.qo_indptr, torch.zeros_like(batch.kv_indptr), batch.kv_indices[:1], warmup, *batch.plan_args(True)[4:]
    )
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True)
    # The real lengths, then another plan over the same caches with other lengths in the same layout:
    # the same graph serves both.
    for kv_lens in (batch.kv_lens, torch.tensor([5, 0, 300, 96], dtype=torch.int32, device="cuda")):
        batch.kv_lens = kv_lens
        wrapper.plan(*batch.plan_args(True))
        out.fill_(math.nan)
        lse.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        judge(batch, out, lse, True, base_e=False)


@pytest.mark.parametrize("qo_len", [1, 4, 11])
def test_fp8_kv_with_scales(workspace, qo_len):
    ckv_scale, kpe_scale = 0.05, 0.2
    batch = uniform_batch(5, qo_len, 700, 64)
    batch.ckv, batch.kpe = batch.ckv.float().to(FP8), batch.kpe.float().to(FP8)
    wrapper = BatchMLAPagedAttentionWrapper(workspace)
    wrapper.plan(*batch.plan_args(True, kv_dtype=FP8))
    out = wrapper.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, ckv_scale=ckv_scale, kpe_scale=kpe_scale)
    cache = torch.cat((batch.ckv.double() * ckv_scale, batch.kpe.double() * kpe_scale), -1)
    # Judged on the dequantised caches with the bf16 query: the query's e4m3 rounding is inside the
    # fp8 tolerance (see test_mla_wrapper_cpu.test_fp8_kv_with_flashinfers_scales).
    judge(batch, out, None, True, tolerance=ROW_ERROR_TOLERANCE[FP8], cache=cache)


def test_slot_ids_beyond_4_gib(workspace):
    """Page size 1 with slot ids near the end of a > 4 GiB bf16 cache: byte offsets past 2**32."""
    small = make_batch([1, 3, 9], [40, 700, 129], 1, 16, device="cuda", spare_pages=0)
    slots = small.ckv.shape[0]
    total = (4 << 30) // (512 * 2) + 4096 + slots  # > 4 GiB of ckv
    ckv = torch.full((total, 1, 512), math.nan, dtype=torch.bfloat16, device="cuda")
    kpe = torch.full((total, 1, 64), math.nan, dtype=torch.bfloat16, device="cuda")
    base = total - slots
    ckv[base:] = small.ckv
    kpe[base:] = small.kpe
    assert (base + int(small.kv_indices.min())) * 512 * 2 >= 1 << 32
    far = small.kv_indices + base
    wrapper = BatchMLAPagedAttentionWrapper(workspace)
    wrapper.plan(small.qo_indptr, small.kv_indptr, far, *small.plan_args(True)[3:])
    out, lse = wrapper.run(small.q_nope, small.q_pe, ckv, kpe, return_lse=True, return_lse_base_on_e=True)
    judge(small, out, lse, True)
