"""Where the GPU puts the first CTAs of a grid whose tail CTAs exit at once (a planned decode grid
past its items): SMs used by the working CTAs and the kernel's time, for grids of several sizes.

    python dev/dispatch_probe.py
"""

from __future__ import annotations

import collections

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
__device__ long long now() { long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__global__ void probe(int* sm, int valid, long long spin_ns) {
  extern __shared__ char smem[];
  unsigned id; asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  if (threadIdx.x == 0) sm[blockIdx.x] = id;
  if ((int)blockIdx.x >= valid) return;
  const long long start = now();
  while (now() - start < spin_ns) {}
  smem[threadIdx.x] = 1;
}
void run(torch::Tensor sm, int64_t grid, int64_t valid, int64_t spin_ns, int64_t smem) {
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<<<grid, 128, smem>>>(sm.data_ptr<int>(), valid, spin_ns);
}
"""

ext = load_inline(
    "dispatch_probe",
    cpp_sources="void run(torch::Tensor, int64_t, int64_t, int64_t, int64_t);",
    cuda_sources=SOURCE,
    functions=["run"],
    verbose=False,
)
VALID = 114
for smem in (70 << 10, 100 << 10):
    for grid in (116, 121, 133, 200, 265, 397, 793):
        sm = torch.full((grid,), -1, dtype=torch.int32, device="cuda")
        ext.run(sm, grid, VALID, 10_000, smem)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        ext.run(sm, grid, VALID, 10_000, smem)
        end.record()
        end.synchronize()
        per_sm = collections.Counter(sm[:VALID].tolist())
        print(
            f"smem {smem >> 10}K grid {grid}: working CTAs on {len(per_sm)} SMs, at most {max(per_sm.values())} "
            f"on one; {start.elapsed_time(end) * 1e3:.1f} us (10 us of work)",
            flush=True,
        )
