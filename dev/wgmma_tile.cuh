// The pieces of a 64-row MLA tile on Hopper's wgmma that dev/wgmma_probe.cu and
// dev/wgmma_decode_probe.cu share: the 128-byte-swizzled shared-memory layout of a [64][576] bf16
// operand, its matrix descriptors, the wgmma instructions at the shapes the tile uses, and a
// CUDA return-code check. sm_90a only. The kernels' own PTX wrappers (csrc/ptx.cuh) serve the rest.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../csrc/common/ptx.cuh"

using mla::cp_async_16;
using mla::cp_async_commit;
using mla::cp_async_wait;
using mla::e4m3x4_to_f16x4;
using mla::fast_exp2;
using mla::mbarrier_init;
using mla::mbarrier_wait;
using mla::pack2;
using mla::smem_u32;
using mla::st_shared_v4;
using mla::unpack2;

#define CHECK(call)                                                                           \
  do {                                                                                        \
    cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      exit(2);                                                                                \
    }                                                                                         \
  } while (0)

constexpr int kRows = 64;      // heads x q_len of one CTA: wgmma's M
constexpr int kTokens = 64;    // KV tokens a tile
constexpr int kHeadDim = 576;  // 512 latent + 64 rope
constexpr int kDimV = 512;
constexpr int kAtomCols = 64;  // bf16 columns of a 128-byte swizzle atom row
constexpr int kAtoms = kHeadDim / kAtomCols;
constexpr int kAtomBytes = 64 * 128;  // one atom column of a 64-row operand
constexpr int kTileBytes = kAtoms * kAtomBytes;
constexpr int kThreads = 256;  // two warpgroups: each owns 256 of the 512 output dims

// Byte offset of (row, col) of a [64][cols] bf16 operand stored as 64-column atoms of 128-byte rows,
// the 16-byte chunks of row r XOR-ed with r % 8 (wgmma's 128-byte swizzle; atoms 1024-byte aligned).
__host__ __device__ inline int swizzled(int row, int col) {
  const int atom = col / kAtomCols, byte = (col % kAtomCols) * 2;
  return atom * kAtomBytes + row * 128 + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15);
}

// A shared-memory matrix descriptor with the 128-byte swizzle: start, leading and stride byte offsets.
__device__ inline uint64_t descriptor(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(leading_bytes >> 4) << 16) |
         ((uint64_t)(stride_bytes >> 4) << 32) | (1ull << 62);
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Generic-proxy shared-memory stores made visible to wgmma's (async proxy) reads.
__device__ inline void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// D (64 x N fp32, N / 2 registers a thread) = A.B (+ D where accumulate): both operands in shared
// memory, bf16 (or f16: F16); B K-major (QK^T: K rows) or MN-major (P.V: V rows read in place), the last
// immediate. Each instruction's operand list is a macro of its element type; MLA_DEFINE_WGMMA makes
// the wrapper that picks bf16 or f16.
#define MLA_DEFINE_WGMMA(name, REGS, INSTRUCTION)                                                            \
  template <bool F16 = false>                                                                                \
  __device__ __forceinline__ void name(float (&d)[REGS], uint64_t desc_a, uint64_t desc_b, int accumulate) { \
    if constexpr (F16)                                                                                       \
      INSTRUCTION("f16");                                                                                    \
    else                                                                                                     \
      INSTRUCTION("bf16");                                                                                   \
  }
#define MLA_WGMMA_M64N32_KMAJOR(TYPE)                                                                               \
  asm volatile(                                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE                                                   \
      " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"                     \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                    \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
MLA_DEFINE_WGMMA(wgmma_m64n32_ss_kmajor, 16, MLA_WGMMA_M64N32_KMAJOR)
#undef MLA_WGMMA_M64N32_KMAJOR
#define MLA_WGMMA_M64N64_KMAJOR(TYPE)                                                                                 \
  asm volatile(                                                                                                       \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                    \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE                                                     \
      " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%" \
      "29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                                    \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),   \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),        \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),       \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                     \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
MLA_DEFINE_WGMMA(wgmma_m64n64_ss_kmajor, 32, MLA_WGMMA_M64N64_KMAJOR)
#undef MLA_WGMMA_M64N64_KMAJOR
#define MLA_WGMMA_M64N256_BMN(TYPE)                                                                                   \
  asm volatile(                                                                                                       \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE                                                    \
      " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%" \
      "29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%"  \
      "56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%"  \
      "83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%"  \
      "108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, "   \
      "%129, p, 1, 1, 0, 1;\n}\n"                                                                                     \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),   \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),        \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),       \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),       \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),       \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),       \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),       \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),       \
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),       \
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),       \
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),       \
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),       \
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),  \
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),             \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),             \
        "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),             \
        "+f"(d[126]), "+f"(d[127])                                                                                    \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
MLA_DEFINE_WGMMA(wgmma_m64n256_ss_bmn, 128, MLA_WGMMA_M64N256_BMN)
#undef MLA_WGMMA_M64N256_BMN
#undef MLA_DEFINE_WGMMA
