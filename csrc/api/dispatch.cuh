// The one dispatch of the decode kernels: the tile shape from the run-time values (constants.h's tile
// table), then the kernel the architecture's traits (decode/arch_traits.h) give that shape.
#pragma once

#include <algorithm>

#include "api/invariants.h"
#include "common/params.h"
#include "decode/arch_traits.h"
#include "decode/mainloop.cuh"
#include "decode/mainloop_ws.cuh"
#include "decode/tile_config.h"
#include "schedule/plan_layout.h"

namespace mla {

// MLA_DEV_DECODE_TRAITS is a dev/test hook: a dev profile (dev/profiles/) names traits to build in
// place of the target architecture's, e.g. SM120's on an sm_90a build.
#ifdef MLA_DEV_DECODE_TRAITS
using DecodeTraits = MLA_DEV_DECODE_TRAITS;
#else
using DecodeTraits = TargetArchTraits;
#endif

template <bool FP8, int ROW_GROUPS, int RF>
constexpr bool kWarpSpecialized = DecodeTraits::warp_specialized(FP8, ROW_GROUPS, RF);

#if defined(__CUDA_ARCH_LIST__) && __CUDA_ARCH_LIST__ < 900
static_assert(!kWarpSpecialized<true, 1, 1> && !kWarpSpecialized<true, 1, 2> && !kWarpSpecialized<false, 1, 1> &&
                  !kWarpSpecialized<false, 2, 1>,
              "the warp-specialized kernel trades registers between its roles (setmaxnreg): sm_90a and newer");
#endif

// Shared memory a CTA asks for: what its tile uses, or the traits' floor where that is more.
constexpr int smem_request(int tile_bytes) { return std::max(tile_bytes, DecodeTraits::kSmemFloorBytes); }

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t stream, bool pdl,
            const DecodeParams& params) {
  if (smem_bytes > 48 * 1024) {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  MLA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
  MLA_CUDA_CHECK(cudaGetLastError());
}

// The tile shapes built into the library (constants.h's MLA_TILE_SHAPES): calls
// fn.template operator()<FP8, ROW_GROUPS, RF>() for the one matching the run-time values.
template <class Fn>
auto with_tile_shape(bool fp8, int64_t row_groups, int64_t rf, const Fn& fn) {
#define MLA_DISPATCH_TILE_SHAPE(FP8, MAX_ROWS, ROW_GROUPS, RF)  \
  if (fp8 == (FP8) && row_groups == (ROW_GROUPS) && rf == (RF)) \
    return fn.template operator()<(FP8) != 0, (ROW_GROUPS), (RF)>();
  MLA_TILE_SHAPES(MLA_DISPATCH_TILE_SHAPE)
#undef MLA_DISPATCH_TILE_SHAPE
  STD_TORCH_CHECK(false, "mla_backend: no kernel built for fp8=", fp8, " row_groups=", row_groups, " rf=", rf);
}

// The decode kernel of a tile shape and KV format, its threads and the shared memory it asks for.
// fp8_ds_mla rows run the v1 kernel everywhere: on BF16 tiles they convert in registers on their way to
// shared memory, which the warp-specialized loader (24 registers a thread) cannot.
template <bool FP8, int ROW_GROUPS, int RF, KvFormat KV = KvFormat::kPlain>
struct DecodeKernel {
  using C = TileConfig<FP8, ROW_GROUPS, RF, KV>;
  static constexpr bool kWs = KV == KvFormat::kPlain && kWarpSpecialized<FP8, ROW_GROUPS, RF>;
  static auto kernel() {
    if constexpr (kWs)
      return mla_decode_ws_kernel<C>;
    else
      return mla_decode_kernel<FP8, ROW_GROUPS, RF, KV>;
  }
  static constexpr int kThreads = kWs ? WsLayout<C>::kThreads : C::kThreads;
  static constexpr int kSmemBytes = smem_request(kWs ? WsLayout<C>::kSmemBytes : C::kSmemBytes);
};

// Whether fp8_ds_mla rows run the FP8 tile of a shape in this build (else a BF16 tile serves them).
template <bool FP8, int ROW_GROUPS, int RF>
constexpr bool kDsMlaTile = !FP8 || (kDsMlaOnFp8Tiles && RF > 1);

// fn.for_kernel<K>() for K, the DecodeKernel of a tile shape reading rows of `kv_format`; refused for a
// shape this build does not build for that format.
template <bool FP8, int ROW_GROUPS, int RF, class Fn>
auto with_decode_kernel(KvFormat kv_format, const Fn& fn) {
  if (kv_format == KvFormat::kDsMla) {
    if constexpr (kDsMlaTile<FP8, ROW_GROUPS, RF>)
      return fn.template for_kernel<DecodeKernel<FP8, ROW_GROUPS, RF, KvFormat::kDsMla>>();
    STD_TORCH_CHECK(false, "mla_backend: this FP8 tile does not read fp8_ds_mla rows in this build");
  }
  return fn.template for_kernel<DecodeKernel<FP8, ROW_GROUPS, RF>>();
}

struct LaunchDecode {
  const DecodeParams& params;
  cudaStream_t stream;
  bool pdl;
  KvFormat kv_format = KvFormat::kPlain;
  template <bool FP8, int ROW_GROUPS, int RF>
  void operator()() const {
    with_decode_kernel<FP8, ROW_GROUPS, RF>(kv_format, *this);
  }
  template <class K>
  void for_kernel() const {
    // With a plan, grid.y covers its largest item count (plan/plan_kernel.cuh); CTAs past the step's
    // items return.
    const int row_blocks = (params.rows + K::C::kTileRows - 1) / K::C::kTileRows;
    const dim3 grid = params.plan != nullptr
                          ? dim3(row_blocks, PlanLayout{params.batch, params.plan_pieces}.max_items())
                          : dim3(row_blocks, params.num_splits, params.batch);
    launch(K::kernel(), grid, K::kThreads, K::kSmemBytes, stream, pdl, params);
  }
};

// CTAs of one tile shape and KV format that fit on one SM at once (the split-KV schedule plans whole waves).
struct ResidentCtas {
  KvFormat kv_format;
  template <bool FP8, int ROW_GROUPS, int RF>
  int64_t operator()() const {
    return with_decode_kernel<FP8, ROW_GROUPS, RF>(kv_format, *this);
  }
  template <class K>
  int64_t for_kernel() const {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(K::kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes));
    int blocks = 0;
    MLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, K::kernel(), K::kThreads, K::kSmemBytes));
    return blocks;
  }
};

inline int64_t ctas_per_sm(bool fp8, int64_t row_groups, int64_t rf, int64_t kv_format) {
  STD_TORCH_CHECK(kv_format == 0 || kv_format == 1, "kv_format must be 0 (plain rows) or 1 (fp8_ds_mla)");
  return with_tile_shape(fp8, row_groups, rf, ResidentCtas{static_cast<KvFormat>(kv_format)});
}

// Whether this build runs fp8_ds_mla rows on the FP8 tile (row_groups, rf).
struct ReadsDsMla {
  template <bool FP8, int ROW_GROUPS, int RF>
  bool operator()() const {
    return kDsMlaTile<FP8, ROW_GROUPS, RF>;
  }
};

inline bool ds_mla_fp8_tile(int64_t row_groups, int64_t rf) {
  return with_tile_shape(true, row_groups, rf, ReadsDsMla{});
}

}  // namespace mla
