#!/usr/bin/env bash
# Wheels the vLLM 0.26 bundle (../shared/gpu/make_vllm_bundle.sh) lacks for some zoo families, into
# .gpu/extra/, which dev/gpu_session.sh installs beside the bundle on every call (pure Python, ~0.3 MiB):
#   compressed-tensors (vLLM's pin) and its loguru: Kimi-Linear's KDA layers take vLLM's GDN metadata
#   builder, whose module imports vLLM's quantization oracles, which import compressed_tensors; vLLM's
#   kimi_k25.py (Kimi-K2.5 / K2.6) imports its compressed-tensors quantization config at the top.
# Their other requirements (pydantic, torch, transformers) are in the bundle or on the GPU image.
#
#   bash dev/make_gpu_extras.sh [OUTDIR]     # default .gpu/extra
set -euo pipefail
OUT=${1:-.gpu/extra}
mkdir -p "$OUT"
"${PY:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d "$OUT" compressed-tensors==0.17.0 loguru==0.7.3
ls -l "$OUT"
