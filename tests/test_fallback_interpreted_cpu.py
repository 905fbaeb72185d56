"""The Triton fallback against the REAL vLLM Triton MLA decode, run by Triton's interpreter on CPU.

``mla_backend.vllm.fallback.triton_mla_decode`` and the impl's fallback route (``forward_mqa``) call
vLLM's ``decode_attention_fwd``; here that op runs under ``TRITON_INTERPRET=1`` on CPU tensors and
its output and LSE are judged against the float64 reference on fresh random inputs: paged caches
with shuffled block tables (junk page ids past each request's length), ragged lengths long enough
for two KV splits, one and three query tokens per request (causal), a bf16 cache and an fp8 e4m3
cache with a scale of 0.375 (judged on the dequantised values).

What the interpreter forces on the setup, all in the child process that runs the op:

* ``TRITON_INTERPRET=1`` must be set before anything imports triton, and the pytest process has
  usually imported it already (vLLM does), so the op runs in a child: this file run as a script.
* vLLM swaps triton for a placeholder when triton finds no active GPU driver, unless
  ``CUDA_VISIBLE_DEVICES`` is set and empty (its lenient path for distributed start-up): the child
  runs with it empty, which also keeps it on CPU tensors on a machine with a GPU.
* The interpreter stores bf16 as uint16 and has no bf16 arithmetic (Triton's debugging guide: "It does
  not support operations on bfloat16 numeric types"): its ``tl.dot`` multiplies the bit patterns. The
  child converts bf16 ``tl.dot`` operands to float32 first (what the GPU's tensor cores compute: exact
  bf16 products, float32 sums); the kernel code is vLLM's, unchanged. The interpreter's float32 -> bf16
  conversions truncate instead of rounding to nearest, so bf16 results are held to one bf16 ulp, not half.
* With one query head vLLM runs its MHA kernel (``_fwd_kernel_stage1``), whose bf16 elementwise
  products the interpreter cannot compute: those cases take float32 queries holding bf16 values (the
  cache is the real bf16 or fp8 tensor). They matter: with more than one head and ``is_mla=True`` the
  grouped kernel reads V as the transpose of the K tile it already loaded and never touches
  ``v_buffer``'s data or ``v_scale``; only the one-head kernel reads the V slice the fallback passes
  (``cache[..., :kv_lora_rank]``) and applies ``v_scale``, so only those cases can catch a V slice at
  the wrong offset or a missing ``v_scale``.

Routes: "op" calls ``triton_mla_decode`` with no workspace manager (the split-KV scratch is its own
allocation); "impl" builds ``MLABackendImpl`` on the fallback route (SM 8.0, as tests/test_vllm_plugin.py
does) and calls ``forward_mqa`` the way vLLM does (bf16 queries as the (ql_nope, q_pe) pair of strided
views, the layer's ``_k_scale``), with vLLM's workspace manager set up on CPU, sized by the backend's own
``reserve_decode_workspace`` for a worst-case batch (max_num_seqs requests x (1 + speculative tokens),
max_model_len keys), locked, and filled with NaN bytes before the call.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")
# One child process interprets every case's Triton kernels (slow); the kernels are vLLM's Triton MLA decode.
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

from oracle import naive_decode  # noqa: E402

from mla_backend.inputs import make_paged_problem, vllm_bf16_query_layout  # noqa: E402
from mla_backend.reference import mla_decode_reference  # noqa: E402

KV_LORA_RANK = 512
HEAD_DIM = 576
PAGE_SIZE = 16
SM_SCALE = 1 / math.sqrt(192)  # DeepSeek's softmax scale (qk_nope 128 + rope 64)
SM_COUNT = 132
FP8_SCALE = 0.375  # != 1; fp8 e4m3 x 0.375 is exact in bf16, so dequantising rounds nothing
# Ragged, one request long enough that decode_attention_fwd splits KV in two (vLLM picks
# next_power_of_2(max_seq_len // 512) splits), one shorter than a page; every length >= q_len.
SEQ_LENS = [1030, 37, 5, 200]
WORKSPACE_POISON = 0xFF  # every float32 of the scratch reads NaN

# (route, query heads, KV cache dtype, query tokens per request): the impl route over the whole grid,
# the bare op (no workspace manager) on one case of each kernel.
CASES = [
    *[("impl", heads, kv, q_len) for heads in (8, 1) for kv in ("bf16", "fp8") for q_len in (1, 3)],
    ("op", 8, "fp8", 3),
    ("op", 1, "bf16", 1),
]


def case_id(case) -> str:
    route, heads, kv, q_len = case
    return f"{route}-h{heads}-{kv}-q{q_len}"


# Tolerances by output dtype. bf16: the interpreter truncates to bf16 (error < 1 ulp = 2^-7 relative)
# and feeds the kernel's bf16 P to the PV product; float32: the kernel's float32 arithmetic.
ROW_TOLERANCE = {torch.bfloat16: 1.2e-2, torch.float32: 1e-5}
LSE_TOLERANCE = {torch.bfloat16: (1e-2, 2.0**-7), torch.float32: (1e-5, 1e-5)}  # abs + rel x |reference|


def make_inputs(case, seed: int) -> dict:
    route, heads, kv, q_len = case
    problem = make_paged_problem(SEQ_LENS, q_len, heads, PAGE_SIZE, seed=seed)  # bf16 query and cache
    # bf16 queries for the grouped kernel; float32 ones (holding the bf16 values) for the one-head kernel.
    query = problem.query if heads > 1 else problem.query.float()
    cache = problem.kv_cache if kv == "bf16" else problem.kv_cache.to(torch.float8_e4m3fn)
    return dict(
        route=route,
        heads=heads,
        q_len=q_len,
        query=query,  # [requests, q_len, heads, 576]
        kv_cache=cache,  # [pages, page, 576]
        block_tables=problem.block_tables,
        seq_lens=problem.seq_lens,
        max_seq_len=problem.max_seq_len,
        k_scale=1.0 if kv == "bf16" else FP8_SCALE,
        kv_cache_dtype="auto" if kv == "bf16" else "fp8",
    )


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """Every case's inputs, and what the real vLLM op returned for them under the interpreter."""
    workdir = tmp_path_factory.mktemp("fallback_interpreted")
    inputs = {case_id(case): make_inputs(case, seed=100 + i) for i, case in enumerate(CASES)}
    torch.save(inputs, workdir / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    child = subprocess.run(
        [sys.executable, __file__, str(workdir)], env=env, capture_output=True, text=True, timeout=600
    )
    if child.returncode != 0:  # -11: a kernel read past its buffers (a page id past a request's length?)
        pytest.fail(f"the interpreted run failed (rc {child.returncode}):\n{child.stderr[-6000:]}")
    return inputs, torch.load(workdir / "results.pt")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fallback_matches_the_float64_reference(case, interpreted):
    inputs, results = interpreted
    name = case_id(case)
    given, got = inputs[name], results[name]
    assert "error" not in got, f"{name} raised in the interpreted run:\n{got.get('error')}"
    query, heads, q_len = given["query"], given["heads"], given["q_len"]
    requests = query.shape[0]
    tokens = requests * q_len
    out, lse = got["out"], got["lse"]
    assert out.shape == (tokens, heads, KV_LORA_RANK) and out.dtype == query.dtype
    assert lse.shape == (tokens, heads) and lse.dtype == torch.float32  # exact enough for DCP's merge
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()

    cache = given["kv_cache"].double() * given["k_scale"]  # fp8: the dequantised values
    want, want_lse = mla_decode_reference(
        query, cache, given["block_tables"], given["seq_lens"], SM_SCALE, 1.0, kv_lora_rank=KV_LORA_RANK
    )
    want, want_lse = want.reshape(tokens, heads, KV_LORA_RANK), want_lse.reshape(tokens, heads)
    if heads == 1:  # cheap enough for the independent loop oracle too
        loop, loop_lse = naive_decode(query, cache, given["block_tables"], given["seq_lens"], SM_SCALE, 1.0)
        torch.testing.assert_close(want, loop.reshape(want.shape), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(want_lse, loop_lse.reshape(want_lse.shape), rtol=1e-10, atol=1e-10)

    row_error = (out.double() - want).norm(dim=-1) / want.norm(dim=-1)  # [tokens, heads]
    worst = int(row_error.argmax())
    assert row_error.max() <= ROW_TOLERANCE[out.dtype], (
        f"{name}: output row (token {worst // heads}, head {worst % heads}) is {row_error.max():.3g} "
        f"off the reference (relative L2); {(row_error > ROW_TOLERANCE[out.dtype]).sum()} of {row_error.numel()} rows"
    )
    # decode_attention_fwd writes the natural-log LSE of the scaled logits; the impl passes it on as is.
    absolute, relative = LSE_TOLERANCE[lse.dtype]
    lse_error = (lse.double() - want_lse).abs()
    allowed = absolute + relative * want_lse.abs()
    assert (lse_error <= allowed).all(), (
        f"{name}: LSE is up to {lse_error.max():.3g} off the reference (natural log), "
        f"{(lse_error > allowed).sum()} of {lse.numel()} rows past the tolerance"
    )
    if given["route"] == "impl":  # the split-KV scratch came from vLLM's (poisoned, locked) workspace
        assert got["workspace_written"], f"{name}: forward_mqa never wrote vLLM's workspace"


# --- the child: runs the real op under TRITON_INTERPRET=1 -------------------------------------------


def _convert_bf16_dot_operands_to_float32() -> None:
    """The interpreter multiplies the uint16 bit patterns of bf16 ``tl.dot`` operands; give it their values."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def as_float32(handle):
        if handle.dtype != tl.bfloat16:
            return handle
        return interpreter.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot_on_values(self, a, b, *rest):
        return create_dot(self, as_float32(a), as_float32(b), *rest)

    interpreter.InterpreterBuilder.create_dot = create_dot_on_values


def _fallback_impl(backend, heads: int, kv_cache_dtype: str):
    """Our impl as vLLM builds it, on the fallback route."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    config = VllmConfig(device_config=DeviceConfig(device="cuda"), additional_config={})
    with set_current_vllm_config(config):
        impl = backend.MLABackendImpl(
            heads,
            HEAD_DIM,
            SM_SCALE,
            1,
            None,
            None,
            kv_cache_dtype,
            None,
            "decoder",
            None,
            q_lora_rank=None,
            kv_lora_rank=KV_LORA_RANK,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            qk_head_dim=192,
            v_head_dim=128,
            kv_b_proj=None,
        )
    assert impl.route.kernel == "fallback", impl.route
    return impl


def _run_impl(backend, workspace, case: dict) -> dict:
    from vllm.v1.attention.backends.mla.triton_mla import _compute_num_kv_splits

    query, heads, q_len = case["query"], case["heads"], case["q_len"]
    requests = query.shape[0]
    tokens = requests * q_len
    impl = _fallback_impl(backend, heads, case["kv_cache_dtype"])
    # The fields of vLLM's config the backend's reservation reads, for the worst batch this call is.
    engine = SimpleNamespace(
        additional_config={},
        model_config=SimpleNamespace(max_model_len=case["max_seq_len"]),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        scheduler_config=SimpleNamespace(max_num_seqs=requests),
        speculative_config=SimpleNamespace(num_speculative_tokens=q_len - 1) if q_len > 1 else None,
    )
    workspace.reset_workspace_manager()
    workspace.init_workspace_manager(torch.device("cpu"))
    try:
        backend.reserve_decode_workspace(engine, heads, KV_LORA_RANK)
        workspace.lock_workspace()  # as vLLM does after profiling: growing it now raises
        # The scratch vLLM's own split rule asks for this batch: raises if the reservation is smaller.
        splits = _compute_num_kv_splits(case["max_seq_len"], SM_COUNT)
        needed = tokens * heads * splits * (KV_LORA_RANK + 1) * torch.float32.itemsize
        (scratch,) = workspace.current_workspace_manager().get_simultaneous(((needed,), torch.uint8))
        scratch.fill_(WORKSPACE_POISON)
        if query.dtype == torch.bfloat16:  # vLLM hands bf16 queries over as (ql_nope, q_pe) strided views
            parts = tuple(p.reshape(tokens, heads, -1) for p in vllm_bf16_query_layout(query))
        else:
            parts = (
                query[..., :KV_LORA_RANK].reshape(tokens, heads, -1),
                query[..., KV_LORA_RANK:].reshape(tokens, heads, -1),
            )
        decode = SimpleNamespace(block_table=case["block_tables"], seq_lens=case["seq_lens"])
        metadata = SimpleNamespace(num_decodes=requests, max_seq_len=case["max_seq_len"], decode=decode)
        layer = SimpleNamespace(
            _k_scale=torch.tensor(case["k_scale"], dtype=torch.float32),
            _k_scale_float=case["k_scale"],
            _q_scale=torch.tensor(1.0, dtype=torch.float32),
            _q_scale_float=1.0,
        )
        out, lse = impl.forward_mqa(parts, case["kv_cache"], metadata, layer)
        written = bool((scratch != WORKSPACE_POISON).any())
    finally:
        workspace.reset_workspace_manager()
    return dict(out=out, lse=lse, workspace_written=written)


def _run_op(fallback, case: dict) -> dict:
    query, heads, q_len = case["query"], case["heads"], case["q_len"]
    tokens = query.shape[0] * q_len
    out, lse = fallback.triton_mla_decode(
        query.reshape(tokens, heads, HEAD_DIM),
        case["kv_cache"],
        case["block_tables"],
        case["seq_lens"],
        case["max_seq_len"],
        q_len,
        SM_SCALE,
        torch.tensor(case["k_scale"], dtype=torch.float32),
        SM_COUNT,
        KV_LORA_RANK,
    )
    return dict(out=out, lse=lse)


def _run_interpreted(workdir: Path) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("run with TRITON_INTERPRET=1 set before triton is imported")
    _convert_bf16_dot_operands_to_float32()
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        raise RuntimeError("vLLM replaced triton with its placeholder (run with CUDA_VISIBLE_DEVICES='')")
    from vllm.v1.worker import workspace

    from mla_backend.vllm import backend, fallback

    backend.detected_capability = lambda: (8, 0)  # an SM 8.0 GPU: the bundled kernels do not serve it
    backend.current_platform.num_compute_units = lambda device_id=0: SM_COUNT
    results = {}
    for name, case in torch.load(workdir / "cases.pt").items():
        try:
            results[name] = _run_impl(backend, workspace, case) if case["route"] == "impl" else _run_op(fallback, case)
        except Exception:
            results[name] = dict(error=traceback.format_exc())
    torch.save(results, workdir / "results.pt")


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
