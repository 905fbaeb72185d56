"""Error of each FP8 kernel variant against the float64 reference, on the same seeded sweep: the
measurement that picks an architecture's default for fp8_pv and fp8_qk (docs/performance.md).

    python dev/variant_error.py                 # on a GPU; one fresh process per variant

Each variant is one kernel library, and a process loads one, so every variant runs in a child
process with its MLA_BACKEND_FP8_* variables. The sweep covers heads 16-128, query lengths 1-4, page
sizes 16 and 64, contexts to 8k with split KV forced and automatic; the inputs are random FP8
(never zeros), and the reference runs on the dequantised FP8 values. Prints per variant the worst
and median relative L2 error of a call, and the worst row's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

VARIANTS = {
    "default": {},
    "fp8_pv=f16": {"MLA_BACKEND_FP8_PV": "f16"},
    "fp8_qk=e4m3": {"MLA_BACKEND_FP8_QK": "e4m3"},
    "fp8_qk=e4m3, fp8_pv=f16": {"MLA_BACKEND_FP8_QK": "e4m3", "MLA_BACKEND_FP8_PV": "f16"},
}
HEADS = (16, 32, 64, 128)
Q_LENS = (1, 2, 4)
PAGE_SIZES = (16, 64)
CONTEXTS = ([1, 37, 300], [1500, 4096], [8192])
SPLITS = (None, 4)


def sweep() -> dict:
    """In the child: every shape of the sweep through the op; errors against float64."""
    import torch

    from mla_backend import MLABackendConfig, mla_decode_reference, xqa_batch_decode_with_kv_cache_mla
    from mla_backend.inputs import make_paged_problem

    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    calls, rows = [], []
    seed = 0
    for heads in HEADS:
        for q_len in Q_LENS:
            if heads * q_len > 128:
                continue
            for page_size in PAGE_SIZES:
                for lengths in CONTEXTS:
                    for splits in SPLITS:
                        seed += 1
                        config = MLABackendConfig.from_sources({"num_kv_splits": splits} if splits else {})
                        p = make_paged_problem(lengths, q_len, heads, page_size, torch.float8_e4m3fn, "cuda", seed)
                        out = xqa_batch_decode_with_kv_cache_mla(
                            p.query, p.kv_cache, workspace, 128, 512, 64,
                            p.block_tables, p.seq_lens, p.max_seq_len, bmm1_scale=0.07, config=config,
                        )  # fmt: skip
                        want, _ = mla_decode_reference(p.query, p.kv_cache, p.block_tables, p.seq_lens, 0.07, 1.0)
                        got = out.double().reshape(want.shape)
                        calls.append(((got - want).norm() / want.norm().clamp_min(1e-30)).item())
                        row_err = (got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)
                        rows.append(row_err[want.norm(dim=-1) > 0].max().item())
    variant = MLABackendConfig.from_sources().kernel_variant
    return {"variant": str(variant), "calls": calls, "worst_row": max(rows)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(sweep()))
        return 0
    print(f"{'variant':26} {'calls':>6} {'worst':>9} {'median':>9} {'worst row':>10}")
    for name, env in VARIANTS.items():
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("MLA_BACKEND_FP8_")} | env
        result = subprocess.run([sys.executable, __file__, "--child"], env=child_env, capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{name:26} failed: {result.stderr[-800:]}")
            continue
        data = json.loads(result.stdout.strip().splitlines()[-1])
        calls = data["calls"]
        print(f"{name:26} {len(calls):6d} {max(calls):9.2e} {statistics.median(calls):9.2e} {data['worst_row']:10.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
