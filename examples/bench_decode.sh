#!/usr/bin/env bash
# Kernel benchmark: CUDA-graph replay against vLLM's FlashMLA and TRITON_MLA when importable;
# writes bench_decode.json and bench_decode.png.
set -euo pipefail
python -m mla_backend bench "$@"
# Engine level (vLLM + a small seeded DeepSeek-V3), decode tokens/s against FLASHMLA/TRITON_MLA:
#   python integration/run_e2e.py --heads 128 --parts throughput
