#!/usr/bin/env bash
# DeepGEMM for the lent GPU (dev/install_deepgemm_on_gpu.sh unpacks it): the copy vendored in the
# vllm-0.26.0 wheel (DeepGEMM 2.5.0, its CUTLASS headers for the JIT included), as top-level deep_gemm,
# with the CPython 3.12 extension only (the GPU image's Python). Read from the vllm 0.26.0 installed in
# VENV (the wheel carries one extension per CPython).
#
#   bash dev/make_deepgemm_part.sh [OUTDIR] [VENV]     # defaults: .gpu-deepgemm, .venv
set -euo pipefail
OUT=${1:-.gpu-deepgemm}
VENV=${2:-.venv}
SRC=$(echo "$VENV"/lib/python3*/site-packages/vllm/third_party/deep_gemm)
[ -f "$SRC/_C.cpython-312-x86_64-linux-gnu.so" ] || { echo "no vLLM-vendored DeepGEMM with a CPython 3.12 extension under $VENV" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/site" "$OUT"
cp -r "$SRC" "$WORK/site/deep_gemm"
find "$WORK/site/deep_gemm" -name '_C.cpython-*.so' ! -name '_C.cpython-312-*' -delete
find "$WORK/site/deep_gemm" -name '__pycache__' -type d -prune -exec rm -rf {} +
tar -C "$WORK" -cJf "$OUT/deepgemm_vllm026_cp312.tar.xz" site
(cd "$OUT" && sha256sum deepgemm_vllm026_cp312.tar.xz > SHA256SUMS)
ls -l "$OUT"
