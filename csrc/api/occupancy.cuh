// What a GPU holds at once, asked of CUDA once per device (and kernel) and kept: the merge grid of a
// planned call is one wave of its blocks.
#pragma once

#include <stdint.h>

#include "api/invariants.h"
#include "merge/merge_kernel.cuh"

namespace mla {

constexpr int kMaxDevices = 64;

inline int64_t multiprocessors(int device) {
  static int counts[kMaxDevices] = {};  // per device, asked once
  STD_TORCH_CHECK(device >= 0 && device < kMaxDevices, "device index out of range");
  if (counts[device] == 0)
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device));
  return counts[device];
}

// Blocks of a planned call's merge that fit on one SM at once (their registers, and so how many fit,
// differ by architecture and partials' type).
inline int64_t merge_blocks_per_sm(int device, bool half_partials) {
  static int counts[kMaxDevices][2] = {};  // per device and partials' type, asked once
  STD_TORCH_CHECK(device >= 0 && device < kMaxDevices, "device index out of range");
  int& count = counts[device][half_partials ? 1 : 0];
  if (count == 0)
    MLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &count, half_partials ? mla_merge_splits_kernel<true> : mla_merge_splits_kernel<false>, kMergeThreads, 0));
  return count;
}

}  // namespace mla
