#!/usr/bin/env bash
# Adds to the SGLang bundle (../shared/gpu/make_sglang_bundle.sh) what `sglang.launch_server` imports
# and the bundle leaves out: jsonschema and its dependencies (SGLang's OpenAI chat endpoint) and
# soundfile with cffi (its realtime audio endpoint; the wheel carries libsndfile). Found by following
# the module-level imports of sglang.launch_server. Written as a fourth part, which the bundle's
# install_sglang_on_gpu.sh unpacks with the others.
#
#   bash dev/sglang_server_extras.sh .gpu-sglang
set -euo pipefail
OUT=$(cd "${1:?usage: sglang_server_extras.sh BUNDLE_DIR}" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PY=${PY:-python3}
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$WORK/dl" \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 \
  soundfile==0.13.1 cffi==2.0.0 pycparser==2.23
mkdir -p "$WORK/site"
for w in "$WORK"/dl/*.whl; do unzip -q -o "$w" -d "$WORK/site"; done
( cd "$WORK" && tar --owner=0 --group=0 --sort=name -cf - site | xz -9 -T2 > "$OUT/sglang0517_part4_server.tar.xz" )
du -b "$OUT/sglang0517_part4_server.tar.xz"
