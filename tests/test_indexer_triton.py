"""mla_backend.indexer_triton's kernels without a GPU: run by Triton's interpreter (the cases are in
interpreted_indexer_triton.py, run here in a child process), and compiled by Triton for every
architecture the package ships (its own ptxas), their dots on the tensor cores.

``TRITON_INTERPRET=1`` must be set before triton is first imported (it decides at decoration time,
triton.language's own helpers included), and pytest's process may have imported it already, so the
child runs with the interpreter on and no GPU visible; this test passes when every case there does."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed")
CASES = Path(__file__).with_name("interpreted_indexer_triton.py")


@pytest.mark.slow  # the interpreter runs every program of every launch in numpy
def test_every_case_passes_under_triton_s_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", str(CASES)]
    child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1500, cwd=CASES.parent)
    report = child.stdout[-6000:] + child.stderr[-2000:]
    assert child.returncode == 0, report
    assert " passed" in child.stdout and "failed" not in child.stdout and "skipped" not in child.stdout, report


# The kernels' arguments as Triton types (pointers by what they point at).
POINTERS = {"q_ptr": "*fp8e4nv", "cache_ptr": "*u8", "k_ptr": "*fp8e4nv", "lens_ptr": "*i32", "table_ptr": "*i32"}
POINTERS |= {"starts_ptr": "*i32", "ends_ptr": "*i32", "weights_ptr": "*fp32", "scale_ptr": "*fp32", "out_ptr": "*fp32"}
PAGED = {"CAUSAL": False, "NEXT_N": 2, "GROUP": 2, "SLOTS": 2, "DIM": 128, "PAGE": 64, "DOT_DTYPE": None}
RAGGED = {"COMPRESSED": True, "DIM": 128, "KEYS": 64, "DOT_DTYPE": None}


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["paged", "ragged"])
@pytest.mark.parametrize("heads", [64, 32])  # DeepSeek-V3.2's index heads, GLM-5's
@pytest.mark.parametrize("keys_major", [False, True])
def test_the_kernels_compile_to_tensor_core_code_for_every_shipped_architecture(kernel, heads, keys_major):
    """Triton (its own ptxas, no GPU) builds both kernels for each compute capability the package
    ships kernels for, with the e4m3 dot on the tensor cores (mma.sync, wgmma or tcgen05)."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mla_backend import indexer_triton
    from mla_backend.targets import ARCH_BY_CAPABILITY

    fn = indexer_triton._paged_logits_kernel if kernel == "paged" else indexer_triton._ragged_logits_kernel
    constexprs = {**(PAGED if kernel == "paged" else RAGGED), "HEADS": heads, "KEYS_MAJOR": keys_major}
    if kernel == "ragged":
        constexprs["SLOTS"] = indexer_triton.ROW_TARGET // heads
    signature = {name: POINTERS.get(name, "constexpr" if name in constexprs else "i32") for name in fn.arg_names}
    for major, minor in ARCH_BY_CAPABILITY:
        target = GPUTarget("cuda", 10 * major + minor, 32)
        compiled = triton.compile(ASTSource(fn, signature, constexprs), target=target, options={"num_warps": 8})
        assert compiled.asm.get("cubin"), (major, minor)
        assert re.search(r"\b(mma\.sync|wgmma\.mma_async|tcgen05\.mma)", compiled.asm["ptx"]), (major, minor)
