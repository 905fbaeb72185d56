#!/usr/bin/env bash
# CI stage: torch 2.15, the newest release, in a venv of its own holding the wheel built against torch 2.11
# (not the checkout), with nvcc off the PATH and CUDA_HOME unset: the wheel's libraries load and register
# their ops under torch 2.15 (-m wheel), then the fast CPU tests that need neither vLLM nor SGLang. No vLLM
# release takes torch 2.15, so none is installed and its tests are deselected by their marker
# (-m "not vllm"); a test that needs vLLM without the marker fails here on the import.
# Usage: .ci/stage_torch_newest.sh WHEEL [VENV] (default .venv-torch-newest, relative to the repository root).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
source .ci/run_tests.sh
WHEEL=$(realpath "${1:?usage: .ci/stage_torch_newest.sh WHEEL [VENV]}")
VENV=${2:-.venv-torch-newest}
[[ $VENV = /* ]] || VENV=$REPO/$VENV
export HF_HUB_OFFLINE=1  # tests build their model configs locally

echo "== torch 2.15.0, the installed wheel (built with torch 2.11), no CUDA toolkit, no vLLM or SGLang"
python3 -m pip install -q uv
[ -x "$VENV/bin/python" ] || uv venv -q --seed -p 3.11 "$VENV"
# The wheel over whatever the venv held (the same version number would count as installed), and the
# packages the integration harness's CPU tests import, which vLLM and SGLang bring in the other stages.
VIRTUAL_ENV=$VENV uv pip install -q --reinstall-package mla-backend torch==2.15.0 "$WHEEL[test]" \
  numpy safetensors transformers prometheus_client aiohttp openai psutil
no_toolkit_path=$(echo "$VENV/bin:$PATH" | tr ':' '\n' | grep -v -e cuda -e '^/usr/local/bin$' | paste -sd:)
in_venv=(env -u CUDA_HOME PATH="$no_toolkit_path" "$VENV/bin/python")
cd /tmp  # the checkout's mla_backend must not shadow the installed one
"${in_venv[@]}" - <<'PY'
import importlib.util, shutil
import mla_backend, torch
assert "site-packages" in mla_backend.__file__, mla_backend.__file__
assert shutil.which("nvcc") is None, "nvcc is still on the PATH"
assert torch.__version__.startswith("2.15."), torch.__version__
assert not [name for name in ("vllm", "sglang") if importlib.util.find_spec(name)], "an engine is installed"
print(f"installed mla_backend {mla_backend.__file__} under torch {torch.__version__}, no vLLM or SGLang")
PY
pytest=("${in_venv[@]}" -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" -p no:cacheprovider)
run_tests "${pytest[@]}" -m wheel "$REPO/tests"
# The slow harness tests (stand-in servers, engine processes) do not depend on torch's version: stages 1
# and 3 run them.
run_tests "${pytest[@]}" -m "not gpu and not wheel and not sglang and not vllm and not slow" "$REPO/tests" \
  --ignore "$REPO/tests/test_build.py"
