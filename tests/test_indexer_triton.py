"""mla_backend.indexer_triton's kernels run by Triton's interpreter on CPU: the cases are in
interpreted_indexer_triton.py, run here in a child process.

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
