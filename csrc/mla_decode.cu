// Launcher and torch-library binding of the MLA decode kernels, on PyTorch's stable C ABI
// (STABLE_TORCH_LIBRARY, torch::stable::Tensor, the aoti_torch shim; built with TORCH_TARGET_VERSION
// set to the oldest supported torch): one library serves every torch from that release on and every
// Python version. Shapes and dtypes were validated in Python (mla_backend/checks.py); the checks here
// guard the kernel's own assumptions.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <type_traits>

#include "mainloop.cuh"
#include "mainloop_ws.cuh"
#include "merge_splits.cuh"
#include "plan.cuh"
#include "tile_config.h"

namespace mla {
namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

#define MLA_CUDA_CHECK(call)                                                                                         \
  do {                                                                                                               \
    const cudaError_t mla_status = (call);                                                                           \
    STD_TORCH_CHECK(mla_status == cudaSuccess, "mla_backend: ", #call, " failed: ", cudaGetErrorString(mla_status)); \
  } while (0)

// Dev builds only (NVCC_APPEND_FLAGS=-DMLA_SMEM_FLOOR_BYTES=N): each CTA asks for at least N bytes of
// shared memory, so that an SM90 holds as few CTAs as an SM120 does (one of ours in its 100 KB) and the
// lent H100 measures kernels at SM120's occupancy. Unset, a CTA asks for what its tile uses.
#ifndef MLA_SMEM_FLOOR_BYTES
#define MLA_SMEM_FLOOR_BYTES 0
#endif
constexpr int smem_request(int tile_bytes) { return std::max(tile_bytes, MLA_SMEM_FLOOR_BYTES); }

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

// Every tile (FP8 at 16 and 32 rows, BF16 at 16 and at 32 in two row groups) runs the warp-specialized
// kernel (mainloop_ws.cuh) where one CTA fills an SM (SM120: 100 KB of shared memory), so that its math
// warps are two (four at two row groups) per sub-partition and a loader warpgroup keeps the ring full;
// where two v1 CTAs fit (SM90, SM100) those hold twice the rows instead (docs/performance.md). Each
// library is built for one architecture (__CUDA_ARCH_LIST__); MLA_WARP_SPECIALIZED overrides (dev
// builds): 0 runs v1 everywhere, 1 only the 32-row FP8 tile warp-specialized, 2 both FP8 tiles, 3 the
// 16-row BF16 tile too, 4 the 32-row BF16 tile (20 warps, 112 registers for the math roles) as well.
#ifndef MLA_WARP_SPECIALIZED
#if defined(__CUDA_ARCH_LIST__) && __CUDA_ARCH_LIST__ >= 1200
#define MLA_WARP_SPECIALIZED 4
#else
#define MLA_WARP_SPECIALIZED 0
#endif
#endif
#if MLA_WARP_SPECIALIZED && defined(__CUDA_ARCH_LIST__) && __CUDA_ARCH_LIST__ < 900
#error "the warp-specialized kernel trades registers between its roles (setmaxnreg): sm_90a and newer"
#endif
// The level from which a tile runs warp-specialized.
constexpr int warp_specialized_from(bool fp8, int row_groups, int rf) {
  if (!fp8) return row_groups == 1 ? 3 : 4;
  return rf == 2 ? 1 : 2;
}
template <bool FP8, int ROW_GROUPS, int RF>
constexpr bool kWarpSpecialized = MLA_WARP_SPECIALIZED >= warp_specialized_from(FP8, ROW_GROUPS, RF);

template <bool FP8, int ROW_GROUPS, int RF>
void launch_decode(const DecodeParams& params, cudaStream_t stream, bool pdl) {
  using C = TileConfig<FP8, ROW_GROUPS, RF>;
  // With a plan, grid.y covers its largest item count (plan.cuh); CTAs past the step's items return.
  const int row_blocks = (params.rows + C::kTileRows - 1) / C::kTileRows;
  const dim3 grid = params.plan != nullptr ? dim3(row_blocks, PlanLayout{params.batch, params.plan_pieces}.max_items())
                                           : dim3(row_blocks, params.num_splits, params.batch);
  if constexpr (kWarpSpecialized<FP8, ROW_GROUPS, RF>)
    launch(mla_decode_ws_kernel<C>, grid, WsLayout<C>::kThreads, smem_request(WsLayout<C>::kSmemBytes), stream, pdl,
           params);
  else
    launch(mla_decode_kernel<FP8, ROW_GROUPS, RF>, grid, C::kThreads, smem_request(C::kSmemBytes), stream, pdl, params);
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

// CTAs of one tile shape that fit on one SM at once (the split-KV heuristic plans whole waves).
struct ResidentCtas {
  template <bool FP8, int ROW_GROUPS, int RF>
  int64_t operator()() const {
    using C = TileConfig<FP8, ROW_GROUPS, RF>;
    if constexpr (kWarpSpecialized<FP8, ROW_GROUPS, RF>)
      return resident(mla_decode_ws_kernel<C>, WsLayout<C>::kThreads, smem_request(WsLayout<C>::kSmemBytes));
    else
      return resident(mla_decode_kernel<FP8, ROW_GROUPS, RF>, C::kThreads, smem_request(C::kSmemBytes));
  }
  template <class Kernel>
  static int64_t resident(Kernel kernel, int threads, int smem_bytes) {
    MLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    int blocks = 0;
    MLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem_bytes));
    return blocks;
  }
};

int64_t ctas_per_sm(bool fp8, int64_t row_groups, int64_t rf) {
  return with_tile_shape(fp8, row_groups, rf, ResidentCtas{});
}

struct LaunchDecode {
  const DecodeParams& params;
  cudaStream_t stream;
  bool pdl;
  template <bool FP8, int ROW_GROUPS, int RF>
  void operator()() const {
    launch_decode<FP8, ROW_GROUPS, RF>(params, stream, pdl);
  }
};

constexpr int kMaxGridY = 65535;  // CUDA's bound on grid.y, which a plan's items span

int64_t multiprocessors(int device) {
  static int counts[64] = {};  // per device, asked once
  STD_TORCH_CHECK(device >= 0 && device < 64, "device index out of range");
  if (counts[device] == 0)
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device));
  return counts[device];
}

// Blocks of a planned call's merge that fit on one SM at once: its grid is one wave of them (their
// registers, and so how many fit, differ by architecture and partials' type).
int64_t merge_blocks_per_sm(int device, bool half_partials) {
  static int counts[64][2] = {};  // per device and partials' type, asked once
  STD_TORCH_CHECK(device >= 0 && device < 64, "device index out of range");
  int& count = counts[device][half_partials ? 1 : 0];
  if (count == 0)
    MLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &count, half_partials ? mla_merge_splits_kernel<true> : mla_merge_splits_kernel<false>, kMergeThreads, 0));
  return count;
}

const float* optional_scale(const std::optional<Tensor>& t) {
  if (!t.has_value()) return nullptr;
  STD_TORCH_CHECK(t->scalar_type() == ScalarType::Float && t->numel() == 1, "scale tensors must be one float32");
  return static_cast<const float*>(t->data_ptr());
}

// Q as two [B, q_len, H, *] tensors (or views of one [B, q_len, H, 576] tensor): rows contiguous,
// other strides (of dims longer than 1) and the start 16-byte aligned, for the kernel's 16-byte loads.
void check_q_part(const Tensor& t, int64_t dim, const char* name) {
  STD_TORCH_CHECK(t.is_cuda() && t.dim() == 4 && t.size(3) == dim && t.stride(3) == 1, name, ": [B, q_len, H, ", dim,
                  "] CUDA tensor with contiguous rows");
  STD_TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, ": start must be 16-byte aligned");
  for (int d = 0; d < 3; ++d) {
    STD_TORCH_CHECK(t.size(d) == 1 || t.stride(d) * t.element_size() % 16 == 0, name,
                    ": strides must be multiples of 16 bytes");
  }
}

// Byte strides; a dim of size 1 is only ever indexed at 0, so its stride (which may be anything) is 0.
void set_q_strides(long long (&dst)[3], const Tensor& t) {
  for (int d = 0; d < 3; ++d) dst[d] = t.size(d) == 1 ? 0 : t.stride(d) * t.element_size();
}

// One part of the KV cache, [pages, page, dim] (a column range of one [.., 576] cache, or a cache of
// its own): rows contiguous; start, token stride and page stride 16-byte aligned (16-byte copies).
void check_kv_part(const Tensor& t, const Tensor& q, int64_t dim, const char* name) {
  STD_TORCH_CHECK(
      t.is_cuda() && t.scalar_type() == q.scalar_type() && t.dim() == 3 && t.size(2) == dim && t.stride(2) == 1, name,
      ": [pages, page, ", dim, "] CUDA tensor of the query's dtype with contiguous rows");
  STD_TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(1) * t.element_size() % 16 == 0 &&
                      (t.size(0) == 1 || t.stride(0) * t.element_size() % 16 == 0),
                  name, ": start, token stride and page stride must be 16-byte aligned");
}

// A step's plan made by `plan` (below) and read by every layer's call: int32, PlanLayout{batch, pieces}.
int* step_plan_ints(const std::optional<Tensor>& plan, const Tensor& q, int64_t batch, int64_t pieces) {
  if (!plan.has_value()) return nullptr;
  STD_TORCH_CHECK(pieces > 0, "a step plan needs plan_pieces > 0");
  STD_TORCH_CHECK(plan->is_cuda() && plan->get_device_index() == q.get_device_index() &&
                      plan->scalar_type() == ScalarType::Int && plan->is_contiguous(),
                  "plan: contiguous int32 tensor on the query's device");
  const PlanLayout layout{static_cast<int>(batch), static_cast<int>(pieces)};
  STD_TORCH_CHECK(plan->numel() >= layout.ints(), "plan: ", layout.ints(), " ints for batch ", batch, " and ", pieces,
                  " pieces, got ", plan->numel());
  return static_cast<int*>(plan->data_ptr());
}

// Stable boxing passes tensors by value (reference-counted handles).
void decode(Tensor q_nope, Tensor q_pe, Tensor kv, Tensor kv_pe, Tensor block_tables, Tensor seq_lens, Tensor out,
            std::optional<Tensor> lse, Tensor workspace, int64_t max_seq_len, int64_t num_splits, int64_t plan_pieces,
            std::optional<Tensor> plan, int64_t row_groups, int64_t rf, double bmm1, std::optional<Tensor> bmm1_tensor,
            double bmm2, std::optional<Tensor> bmm2_tensor, bool pdl) {
  check_q_part(q_nope, kDimV, "q_nope");
  check_q_part(q_pe, kRopeDim, "q_pe");
  STD_TORCH_CHECK(q_pe.scalar_type() == q_nope.scalar_type() && q_pe.size(0) == q_nope.size(0) &&
                      q_pe.size(1) == q_nope.size(1) && q_pe.size(2) == q_nope.size(2),
                  "q_pe must match q_nope in dtype and leading shape");
  const Tensor& q = q_nope;
  const bool fp8 = q.scalar_type() == ScalarType::Float8_e4m3fn;
  STD_TORCH_CHECK(fp8 || q.scalar_type() == ScalarType::BFloat16, "q must be bf16 or fp8 e4m3");
  check_kv_part(kv, q, kDimV, "kv");
  check_kv_part(kv_pe, q, kRopeDim, "kv_pe");
  STD_TORCH_CHECK(kv_pe.size(0) == kv.size(0) && kv_pe.size(1) == kv.size(1), "kv_pe: same pages and page size as kv");
  const int64_t page_size = kv.size(1);
  STD_TORCH_CHECK(page_size >= 16 && (page_size & (page_size - 1)) == 0, "page size must be a power of two >= 16");
  STD_TORCH_CHECK(block_tables.scalar_type() == ScalarType::Int && block_tables.stride(1) == 1,
                  "block_tables: int32 rows");
  STD_TORCH_CHECK(seq_lens.scalar_type() == ScalarType::Int && seq_lens.is_contiguous(), "seq_lens: int32");
  STD_TORCH_CHECK(out.scalar_type() == ScalarType::BFloat16 && out.is_contiguous() && out.numel() == q.numel(),
                  "out: bf16 [B, q_len, H, 512]");
  STD_TORCH_CHECK(num_splits >= 1 && num_splits <= kMaxSplits, "num_splits must be 1..", kMaxSplits);
  STD_TORCH_CHECK(plan_pieces >= 0 && plan_pieces <= kMaxPlanPieces, "plan_pieces must be 0..", kMaxPlanPieces);
  STD_TORCH_CHECK(plan_pieces == 0 || num_splits == 1, "a planned call takes num_splits=1");
  const int64_t batch = q.size(0), rows = q.size(1) * q.size(2);

  DecodeParams p = {};
  p.q_nope = static_cast<const uint8_t*>(q_nope.data_ptr());
  p.q_pe = static_cast<const uint8_t*>(q_pe.data_ptr());
  set_q_strides(p.q_nope_stride, q_nope);
  set_q_strides(p.q_pe_stride, q_pe);
  p.kv = static_cast<const uint8_t*>(kv.data_ptr());
  p.kv_pe = static_cast<const uint8_t*>(kv_pe.data_ptr());
  p.block_tables = static_cast<const int*>(block_tables.data_ptr());
  p.seq_lens = static_cast<const int*>(seq_lens.data_ptr());
  p.out = reinterpret_cast<__nv_bfloat16*>(out.data_ptr());
  p.lse = nullptr;
  if (lse.has_value()) {
    STD_TORCH_CHECK(lse->scalar_type() == ScalarType::Float && lse->is_contiguous() && lse->numel() == batch * rows,
                    "lse: fp32 [B, q_len, H]");
    p.lse = static_cast<float*>(lse->data_ptr());
  }
  p.bmm1_ptr = optional_scale(bmm1_tensor);
  p.bmm2_ptr = optional_scale(bmm2_tensor);
  p.bmm1 = static_cast<float>(bmm1);
  p.bmm2 = static_cast<float>(bmm2);
  p.page_stride = kv.stride(0) * kv.element_size();
  p.pe_page_stride = kv_pe.stride(0) * kv_pe.element_size();
  p.token_stride = static_cast<int>(kv.stride(1) * kv.element_size());
  p.pe_token_stride = static_cast<int>(kv_pe.stride(1) * kv_pe.element_size());
  p.q_len = static_cast<int>(q.size(1));
  p.heads = static_cast<int>(q.size(2));
  p.rows = static_cast<int>(rows);
  STD_TORCH_CHECK(rows <= MLA_MAX_ROWS, "q_len x heads must be <= ", MLA_MAX_ROWS);  // heads_recip's exact range
  p.heads_recip = ((1 << 20) + p.heads - 1) / p.heads;
  p.page_shift = __builtin_ctzll(page_size);
  p.max_pages = static_cast<int>(block_tables.size(1));
  p.bt_stride = static_cast<int>(block_tables.stride(0));
  p.batch = static_cast<int>(batch);
  p.num_splits = static_cast<int>(num_splits);
  p.max_seq_len =
      static_cast<int>(std::clamp<int64_t>(max_seq_len, 0, static_cast<int64_t>(p.max_pages) << p.page_shift));
  p.plan_pieces = static_cast<int>(plan_pieces);
  int* const step_plan = step_plan_ints(plan, q, batch, plan_pieces);
  if (plan_pieces > 0 || num_splits > 1) {
    // The plan (when planned in this call) first, then the partials, sized for fp32 (FP8 problems
    // store f16 partials and use the first half of them) and their LSE.
    const PlanLayout layout{p.batch, p.plan_pieces};
    STD_TORCH_CHECK(plan_pieces == 0 || layout.max_items() <= kMaxGridY,
                    "batch + the plan's cut waves x plan_pieces must be <= ", kMaxGridY);
    const int64_t plan_bytes = plan_pieces > 0 && step_plan == nullptr ? plan_workspace_bytes(layout) : 0;
    const int64_t partials = (plan_pieces > 0 ? layout.max_partials() : batch * num_splits) * rows;
    const int64_t need = plan_bytes + partials * (kDimV + 1) * static_cast<int64_t>(sizeof(float));
    STD_TORCH_CHECK(workspace.is_cuda() && workspace.is_contiguous() &&
                        workspace.numel() * static_cast<int64_t>(workspace.element_size()) >= need,
                    "workspace too small: need ", need, " bytes for ",
                    plan_pieces > 0 ? "the split plan" : "the KV splits");
    uint8_t* base = static_cast<uint8_t*>(workspace.data_ptr());
    if (plan_pieces > 0) p.plan = step_plan != nullptr ? step_plan : reinterpret_cast<int*>(base);
    p.part_o = base + plan_bytes;
    p.part_lse = reinterpret_cast<float*>(base + plan_bytes) + partials * kDimV;
  }

  const torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  void* current_stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(q.get_device_index(), &current_stream));
  const cudaStream_t stream = static_cast<cudaStream_t>(current_stream);
  if (batch == 0) return;
  if (p.plan != nullptr && step_plan == nullptr) launch(mla_plan_kernel, dim3(1), kPlanThreads, 0, stream, pdl, p);
  with_tile_shape(fp8, row_groups, rf, LaunchDecode{p, stream, pdl});
  if (p.plan != nullptr) {
    // Enough blocks to fill the GPU; they take merge units in turn (how many is known on the GPU).
    const int64_t units = static_cast<int64_t>(PlanLayout{p.batch, p.plan_pieces}.max_merged()) * rows * kMergeSlices;
    const int device = q.get_device_index();
    const int64_t wave = std::max<int64_t>(1, merge_blocks_per_sm(device, fp8)) * multiprocessors(device);
    const int64_t blocks = std::min<int64_t>(units, wave);
    launch(fp8 ? mla_merge_splits_kernel<true> : mla_merge_splits_kernel<false>, dim3(static_cast<unsigned>(blocks)),
           kMergeThreads, 0, stream, pdl, p);
  } else if (num_splits > 1 && num_splits <= kFewSplitsMax) {
    const int64_t blocks = (batch * rows + kFewSplitsRowsPerBlock - 1) / kFewSplitsRowsPerBlock;
    launch(fp8 ? mla_merge_few_splits_kernel<true> : mla_merge_few_splits_kernel<false>,
           dim3(static_cast<unsigned>(blocks)), 32 * kFewSplitsRowsPerBlock, 0, stream, pdl, p);
  } else if (num_splits > 1) {
    launch(fp8 ? mla_merge_splits_kernel<true> : mla_merge_splits_kernel<false>, dim3(rows, batch, kMergeSlices),
           kMergeThreads, 0, stream, pdl, p);
  }
}

// A decode step's split plan, made once for all its layers' calls (`decode`'s plan argument): what a
// planned call would make itself, from the same seq_lens and block-table width. A plan stays correct
// for other lengths (each split's tiles come from the request's length when it runs), only less even.
void plan(Tensor seq_lens, Tensor plan, int64_t max_pages, int64_t page_size, int64_t plan_pieces) {
  STD_TORCH_CHECK(seq_lens.is_cuda() && seq_lens.scalar_type() == ScalarType::Int && seq_lens.is_contiguous() &&
                      seq_lens.dim() == 1,
                  "seq_lens: contiguous int32 [B] CUDA tensor");
  STD_TORCH_CHECK(plan_pieces > 0 && plan_pieces <= kMaxPlanPieces, "plan_pieces must be 1..", kMaxPlanPieces);
  STD_TORCH_CHECK(page_size >= 16 && (page_size & (page_size - 1)) == 0, "page size must be a power of two >= 16");
  STD_TORCH_CHECK(max_pages >= 0 && (max_pages << __builtin_ctzll(page_size)) <= INT_MAX,
                  "max_pages x page_size must fit int32");
  const int64_t batch = seq_lens.size(0);
  const PlanLayout layout{static_cast<int>(batch), static_cast<int>(plan_pieces)};
  STD_TORCH_CHECK(layout.max_items() <= kMaxGridY, "batch + the plan's cut waves x plan_pieces must be <= ", kMaxGridY);
  DecodeParams p = {};
  p.seq_lens = static_cast<const int*>(seq_lens.data_ptr());
  p.batch = static_cast<int>(batch);
  p.max_pages = static_cast<int>(max_pages);
  p.page_shift = __builtin_ctzll(page_size);
  p.plan_pieces = static_cast<int>(plan_pieces);
  p.plan = step_plan_ints(plan, seq_lens, batch, plan_pieces);
  const torch::stable::accelerator::DeviceGuard guard(seq_lens.get_device_index());
  void* current_stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(seq_lens.get_device_index(), &current_stream));
  if (batch == 0) return;
  // No programmatic launch: whatever follows on the stream sees the whole plan.
  launch(mla_plan_kernel, dim3(1), kPlanThreads, 0, static_cast<cudaStream_t>(current_stream), false, p);
}

}  // namespace
}  // namespace mla

STABLE_TORCH_LIBRARY(mla_backend, m) {
  m.def(
      "decode(Tensor q_nope, Tensor q_pe, Tensor kv, Tensor kv_pe, Tensor block_tables, Tensor seq_lens, Tensor(a!) "
      "out, Tensor(b!)? "
      "lse, "
      "Tensor(c!) workspace, int max_seq_len, int num_splits, int plan_pieces, Tensor? plan, int row_groups, int rf, "
      "float bmm1, Tensor? bmm1_tensor, float bmm2, Tensor? bmm2_tensor, bool pdl) -> ()");
  m.def("plan(Tensor seq_lens, Tensor(a!) plan, int max_pages, int page_size, int plan_pieces) -> ()");
  m.def("ctas_per_sm(bool fp8, int row_groups, int rf) -> int");
}

STABLE_TORCH_LIBRARY_IMPL(mla_backend, CUDA, m) {
  m.impl("decode", TORCH_BOX(&mla::decode));
  m.impl("plan", TORCH_BOX(&mla::plan));
}

// No tensor arguments: the dispatcher finds this kernel under CompositeExplicitAutograd.
STABLE_TORCH_LIBRARY_IMPL(mla_backend, CompositeExplicitAutograd, m) {
  m.impl("ctas_per_sm", TORCH_BOX(&mla::ctas_per_sm));
}
