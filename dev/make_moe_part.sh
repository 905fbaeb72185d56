#!/usr/bin/env bash
# vLLM 0.26's MoE kernels (vllm/_moe_C_stable_libtorch.abi3.so, which ../shared/gpu/make_vllm_bundle.sh
# leaves out) as a part of their own for the lent GPU machine: the library from the same vLLM wheel
# the bundle unpacks, stripped as the bundle strips its libraries, its non-SM 9.x kernels zeroed by
# ../shared/gpu/prune_fatbin.py as the bundle's _C_stable_libtorch is, packed with xz.
#
#   bash dev/make_moe_part.sh [OUTDIR]     # default .gpu-moe (git-ignored)
#   -> OUTDIR/vllm026_moe_C_sm90only.tar.xz (unpacks into site/vllm/, as the bundle's parts do)
#      + OUTDIR/SHA256SUMS
#
# It does not fit beside the bundle (.gpu) in one 64 MiB transfer, so it travels in a call of its own:
# dev/gpu_session.sh's PART=stash copies it into /tmp on the warm machine and the next call, carrying
# .gpu, unpacks it into /tmp/site/vllm after the bundle (see the top of gpu_session.sh).
#
# The wheel: WHEEL=path, else the bundle's download (/tmp/vllm_bundle_work/dl), else pip downloads
# vllm==0.26.0 as make_vllm_bundle.sh does. The library's sha256 is checked against the wheel's RECORD.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mkdir -p "${1:-.gpu-moe}" && cd "${1:-.gpu-moe}" && pwd)
PRUNE=${PRUNE:-$HERE/../../shared/gpu/prune_fatbin.py}
PY=${PY:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LIB=vllm/_moe_C_stable_libtorch.abi3.so
PART=vllm026_moe_C_sm90only.tar.xz

WHEEL=${WHEEL:-$(ls /tmp/vllm_bundle_work/dl/vllm-0.26.0-*.whl 2>/dev/null | head -1 || true)}
if [ -z "$WHEEL" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$WORK/dl" vllm==0.26.0
  WHEEL=$(ls "$WORK"/dl/vllm-0.26.0-*.whl)
fi
echo "wheel: $WHEEL"

mkdir -p "$WORK/site"
unzip -q -o "$WHEEL" "$LIB" -d "$WORK/site"
# RECORD lines read "path,sha256=<urlsafe base64, unpadded>,size".
want=$(unzip -p "$WHEEL" 'vllm-0.26.0.dist-info/RECORD' | awk -F, -v lib="$LIB" '$1 == lib {print $2}')
have="sha256=$("$PY" -c 'import base64, hashlib, sys
print(base64.urlsafe_b64encode(hashlib.sha256(open(sys.argv[1], "rb").read()).digest()).rstrip(b"=").decode())' \
  "$WORK/site/$LIB")"
[ "$want" = "$have" ] || { echo "$LIB does not match the wheel's RECORD ($have, want $want)" >&2; exit 1; }
echo "unpacked $LIB: $(stat -c %s "$WORK/site/$LIB") bytes, $want"

if [ "${STRIP_SO:-1}" = 1 ] && command -v strip >/dev/null; then  # STRIP_SO=0 keeps the symbol tables
  strip --strip-unneeded "$WORK/site/$LIB"
fi
"$PY" "$PRUNE" "$WORK/site/$LIB" 9

rm -f "$OUT/$PART" "$OUT/SHA256SUMS"
tar -C "$WORK" --owner=0 --group=0 --sort=name -cf - "site/$LIB" | xz -9 -T2 >"$OUT/$PART"
(cd "$OUT" && sha256sum "$PART" >SHA256SUMS)
printf '%s: %d bytes (%.1f MiB)\n' "$OUT/$PART" "$(stat -c %s "$OUT/$PART")" \
  "$(echo "$(stat -c %s "$OUT/$PART") / 1048576" | bc -l)"
