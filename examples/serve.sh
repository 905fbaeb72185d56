#!/usr/bin/env bash
# Serve a DeepSeek-V3-class model with mla_backend's MLA decode kernels: one flag.
# pip install 'mla-backend[vllm]' registers the backend (entry point vllm.general_plugins).
set -euo pipefail
MODEL=${1:-deepseek-ai/DeepSeek-V3}
# vLLM 0.32+ also accepts our own name: --attention-backend MLA_BACKEND
vllm serve "$MODEL" \
  --attention-backend CUSTOM \
  --kv-cache-dtype fp8 \
  --additional-config '{"mla_backend": {"backend": "auto"}}'
# Settings can also come from the environment, e.g. MLA_BACKEND=xqa or MLA_BACKEND_NUM_KV_SPLITS=8.
# To try the portable fallback (vLLM's Triton MLA decode) on a GPU our kernels serve:
#   --additional-config '{"mla_backend": {"device_capability": "8.0"}}'
