"""The library core (config -> checks -> op -> launcher -> kernels, and the engine adapters) does not
depend on the tools users run beside it (mla_backend.tools)."""

import subprocess
import sys

import pytest


@pytest.mark.vllm
def test_the_core_and_the_vllm_adapter_import_no_tool():
    code = (
        "import sys, mla_backend, mla_backend.decode, mla_backend.launcher, mla_backend.jit, mla_backend.vllm.backend\n"
        "tools = sorted(m for m in sys.modules if m.startswith('mla_backend.tools'))\n"
        "assert not tools, tools\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
