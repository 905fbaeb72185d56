#!/usr/bin/env bash
# CI stage: SGLang 0.5.23, the newest release (it pins torch 2.14.1), in a venv of its own with the
# checkout: the SGLang adapter's tests and the SGLang checks' (-m sglang tests/test_sglang_*.py), as the
# SGLang 0.5.17 stage runs them. Usage: .ci/stage_sglang_newest.sh [VENV] (default .venv-sglang-newest,
# relative to the repository root).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
source .ci/run_tests.sh
VENV=${1:-.venv-sglang-newest}
[[ $VENV = /* ]] || VENV=$REPO/$VENV
export HF_HUB_OFFLINE=1  # tests build their model configs locally

echo "== SGLang 0.5.23 + torch 2.14.1 + the checkout, the SGLang adapter's and SGLang checks' tests"
python3 -m pip install -q uv
[ -x "$VENV/bin/python" ] || uv venv -q --seed -p 3.11 "$VENV"
VIRTUAL_ENV=$VENV uv pip install -q torch==2.14.1 sglang==0.5.23 -e ".[test]"
"$VENV/bin/python" -c 'import sglang, torch; print(f"sglang {sglang.__version__}, torch {torch.__version__}")'
run_tests env VIRTUAL_ENV="$VENV" "$VENV/bin/python" -m pytest -p no:cacheprovider -m sglang tests/test_sglang_*.py
