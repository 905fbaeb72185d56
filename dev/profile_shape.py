"""One decode shape, two warm-up calls and one in the NVTX range "profile", for Nsight Compute.

    ncu --nvtx --nvtx-include "profile/" python dev/profile_shape.py ours 16 128 16384
    ncu --nvtx --nvtx-include "profile/" python dev/profile_shape.py flashmla 16 64 8192 4

heads, batch, context and q_len (default 1: 4 is MTP at k = 3); FP8 cache, page 64, drawn in place on
the GPU (a fresh allocation: docs/performance.md).
"""

from __future__ import annotations

import sys

import torch

from mla_backend.inputs import make_paged_problem
from mla_backend.tools.bench import ours
from mla_backend.tools.peers import SM_SCALE, flashmla


def main(kernel: str, heads: int, batch: int, seq: int, q_len: int = 1) -> int:
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    problem = make_paged_problem([seq] * batch, q_len, heads, 64, torch.float8_e4m3fn, "cuda", extra_pages=0)
    call = ours(problem, workspace) if kernel == "ours" else flashmla(problem, SM_SCALE)
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("profile"):
        call()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], *(int(a) for a in sys.argv[2:6])))
