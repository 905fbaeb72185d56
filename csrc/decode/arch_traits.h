// How the decode runs on the architecture a library is built for (one a library, named by
// __CUDA_ARCH_LIST__ in host and device code alike): which kernel each tile shape runs, and the shared
// memory a CTA asks for. The dispatch (api/dispatch.cuh) reads them; nothing else chooses a kernel.
#pragma once

namespace mla {

// Where two v1 CTAs (mainloop.cuh) fit an SM (SM89, SM90, SM100): they hold twice the rows of one
// warp-specialized CTA, which does not match them at that occupancy (docs/performance.md), so every
// tile runs v1.
struct TwoCtasPerSmTraits {
  static constexpr bool warp_specialized(bool /*fp8*/, int /*row_groups*/, int /*rf*/) { return false; }
  static constexpr int kSmemFloorBytes = 0;  // a CTA asks for what its tile uses
};

// Where one CTA fills an SM (SM120: 100 KB of shared memory): every tile (FP8 at 16 and 32 rows, BF16 at
// 16 and at 32 in two row groups) runs the warp-specialized kernel (mainloop_ws.cuh), whose math warps
// are two (four at two row groups) per sub-partition and whose loader warpgroup keeps the ring full.
struct OneCtaPerSmTraits {
  static constexpr bool warp_specialized(bool /*fp8*/, int /*row_groups*/, int /*rf*/) { return true; }
  static constexpr int kSmemFloorBytes = 0;
};

#if defined(__CUDA_ARCH_LIST__) && __CUDA_ARCH_LIST__ >= 1200
using TargetArchTraits = OneCtaPerSmTraits;
#else
using TargetArchTraits = TwoCtasPerSmTraits;
#endif

}  // namespace mla
