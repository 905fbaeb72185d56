"""A small decode sweep (split-KV included) to run under compute-sanitizer memcheck/racecheck:
    compute-sanitizer --tool memcheck python tests/sanitize_decode.py
Exits non-zero if any result is wrong, so the sanitizer run also checks correctness."""

import torch

from mla_backend import MLABackendConfig, mla_decode_reference
import mla_backend.decode as decode_module
from mla_backend.inputs import make_paged_problem

workspace = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
worst = 0.0
for splits, dtype, heads, q_len, lengths in [
    (1, torch.bfloat16, 16, 1, [70, 1, 0]),
    (3, torch.bfloat16, 32, 2, [300, 45]),
    (1, torch.float8_e4m3fn, 8, 2, [129, 2]),
    (4, torch.float8_e4m3fn, 128, 1, [700, 0, 33]),
    (2, torch.float8_e4m3fn, 16, 4, [90, 5]),  # 64 rows: two-fragment tiles with the causal mask
]:
    decode_module.default_config = lambda s=splits: MLABackendConfig(num_kv_splits=s)
    p = make_paged_problem(lengths, q_len, heads, 16, dtype, "cuda", seed=splits)
    out = decode_module.xqa_batch_decode_with_kv_cache_mla(
        p.query, p.kv_cache, workspace, 128, 512, 64, p.block_tables, p.seq_lens, p.max_seq_len, bmm1_scale=0.07)
    want, _ = mla_decode_reference(p.query, p.kv_cache, p.block_tables, p.seq_lens, 0.07, 1.0)
    err = ((out.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
    worst = max(worst, err)
print(f"sanitize sweep: worst relative error {worst:.2e}")
raise SystemExit(0 if worst < 2e-2 else 1)
