#!/usr/bin/env bash
# On the GPU box, after .gpu/install_on_gpu.sh (which empties TARGET): add DeepGEMM to the vLLM 0.26
# bundle's site dir, so that vLLM's DSA indexer (fp8_fp4_paged_mqa_logits, get_paged_mqa_logits_metadata,
# fp8_fp4_mqa_logits) runs, and dev/indexer_vs_deepgemm.py can compare it with ours.
#
#   bash dev/install_deepgemm_on_gpu.sh [BUNDLE_DIR] [TARGET]   (defaults: .gpu-deepgemm, /tmp/site)
#   source /tmp/site/env.sh
#
# The bundle (bash dev/make_deepgemm_part.sh, on a CPU machine) is DeepGEMM 2.5.0 as vendored in the
# vllm-0.26.0 wheel, as top-level `deep_gemm` (vLLM imports that before its own third_party copy), with
# the CPython 3.12 extension only (torch 2.11, CUDA 13). Its kernels are JIT-compiled on first use with
# $CUDA_HOME/bin/nvcc, so the env file sets CUDA_HOME to a real toolkit (not the dir of a wrapper script
# like /usr/local/bin/nvcc) and a cache under /tmp.
# Set VLLM_USE_DEEP_GEMM=0 to keep vLLM's FP8 GEMMs/MoE off DeepGEMM: the indexer uses it regardless.
set -euo pipefail
B=${1:-$(cd "$(dirname "$0")/.." && pwd)/.gpu-deepgemm}
T=${2:-/tmp/site}
PY=${PY:-python3}
ARCHIVE="$B/deepgemm_vllm026_cp312.tar.xz"
[ -f "$ARCHIVE" ] || { echo "missing $ARCHIVE" >&2; exit 1; }
if [ -f "$B/SHA256SUMS" ] && command -v sha256sum >/dev/null; then
  (cd "$B" && sha256sum --ignore-missing -c SHA256SUMS)
fi

# A CUDA toolkit with bin/nvcc and include/cuda.h: $CUDA_HOME, the toolkit the nvcc on PATH runs
# (nvcc --dryrun names it, through wrappers too), or /usr/local/cuda*.
toolkit() {
  local c top
  if command -v nvcc >/dev/null; then
    top=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
    [ -n "$top" ] && top=$(cd "$top" 2>/dev/null && pwd)
  fi
  for c in "${CUDA_HOME:-}" "$top" "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /x/x)")")")" \
           /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13*; do
    if [ -n "$c" ] && [ -x "$c/bin/nvcc" ] && { [ -f "$c/include/cuda.h" ] \
        || [ -f "$c/targets/x86_64-linux/include/cuda.h" ]; }; then
      echo "$c"; return 0
    fi
  done
  return 1
}
CUDA_DIR=$(toolkit) || { echo "no CUDA toolkit found (nvcc + include/cuda.h); set CUDA_HOME" >&2; exit 1; }
command -v g++ >/dev/null || echo "WARNING: no g++ on PATH; DeepGEMM's nvcc JIT needs a host compiler" >&2

mkdir -p "$T"
rm -rf "$T/deep_gemm"
xz -dc "$ARCHIVE" | tar -x -C "$T" --strip-components=1 --no-same-owner
mkdir -p /tmp/deep_gemm_jit

# Append (once) to the env file install_on_gpu.sh wrote; create one if there is none.
[ -f "$T/env.sh" ] || echo "export PYTHONPATH=\"$T\${PYTHONPATH:+:\$PYTHONPATH}\"" > "$T/env.sh"
sed -i '/^# >>> deep_gemm/,/^# <<< deep_gemm/d' "$T/env.sh"
cat >> "$T/env.sh" <<ENV
# >>> deep_gemm (dev/install_deepgemm_on_gpu.sh)
export CUDA_HOME="$CUDA_DIR"
export DG_JIT_CACHE_DIR=/tmp/deep_gemm_jit
# <<< deep_gemm
ENV

echo "deep_gemm into $T/deep_gemm ($(du -sh "$T/deep_gemm" | cut -f1)); CUDA_HOME=$CUDA_DIR; now: source $T/env.sh"
# Smoke test: imports, the indexer's functions, vLLM's detection; then one tiny JIT-compiled call.
PYTHONPATH="$T${PYTHONPATH:+:$PYTHONPATH}" CUDA_HOME="$CUDA_DIR" DG_JIT_CACHE_DIR=/tmp/deep_gemm_jit \
  VLLM_NO_USAGE_STATS=1 "$PY" - <<'PYEOF'
import torch

import deep_gemm

names = ("fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata", "fp8_fp4_mqa_logits",
         "fp8_paged_mqa_logits", "fp8_mqa_logits")
missing = [n for n in names if not hasattr(deep_gemm, n)]
assert not missing, missing
line = f"deep_gemm {deep_gemm.__version__} from {deep_gemm.__file__} | torch {torch.__version__}"
try:
    from vllm.utils import deep_gemm as vdg
    from vllm.utils.import_utils import has_deep_gemm

    vdg._lazy_init()
    line += f" | vllm has_deep_gemm {has_deep_gemm()} paged {vdg._fp8_fp4_paged_mqa_logits_impl is not None}"
except Exception as e:  # vLLM bundle absent or broken: DeepGEMM alone still counts
    line += f" | vllm check failed: {e!r}"
if torch.cuda.is_available():
    lens = torch.full((2, 1), 100, dtype=torch.int32, device="cuda")
    sms = deep_gemm.get_num_sms()
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, sms)
    torch.cuda.synchronize()
    line += f" | {torch.cuda.get_device_name()} {sms} SMs, JIT ok (metadata {tuple(meta.shape)})"
print("DEEPGEMM OK:", line)
PYEOF
