/**
 * @file wgmma.cuh
 * @brief Hopper warpgroup MMA (wgmma.mma_async, bf16 operands from shared memory, fp32
 *        accumulators in registers) and the 128-byte-swizzled tile layout it reads. sm_90a only
 *        (GDN_HAS_WGMMA); the other targets keep the mma.sync tiles of mma.cuh.
 *
 * The shared-memory forms (SS) are used by chunk_bwd on sm_90a (bwd/chunk_bwd_sm90.cuh: the mma.sync chunk_bwd was
 * bound by the shared-memory traffic of its operands); the GPU test gpu_wgmma checks every operand form against a CPU
 * product.
 *
 * The shared tiles use the 128-byte-swizzled layout of common/sw128.hpp, where the layout and
 * the descriptors' byte fields are defined (shared with the host's model test, test_sw128.cpp).
 * The four m64nNk16 wrappers spell out their operand lists: inline PTX needs one operand per
 * accumulator register.
 * Accumulator fragment of m64nNk16 (f32): warp w of the warpgroup owns rows 16w..16w+15; lane l
 * holds rows 16w + l/4 (+8) and columns 8i + 2(l%4) (+1): d[4i + 0..1] the upper row, d[4i + 2..3]
 * the lower one, i = 0..N/8-1 (the mma.sync m16n8 accumulator, N/8 times).
 */
#pragma once

#include "arch.cuh"
#include "common/numeric.cuh"
#include "common/sw128.hpp"

#if GDN_HAS_WGMMA

namespace gdn {
namespace wg {

typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_u32(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

/// Shared-memory matrix descriptor with 128-byte swizzling: start address, LBO and SBO in bytes
/// (all multiples of 16), base offset 0 (the swizzle atoms are 1024-byte aligned).
__device__ __forceinline__ u64 desc_sw128(u32 smem_byte_addr, u32 lbo_bytes, u32 sbo_bytes) {
  return static_cast<u64>((smem_byte_addr & 0x3FFFFu) >> 4) | (static_cast<u64>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<u64>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
__device__ __forceinline__ u64 desc_sw128(const sw128::DescFields& f) { return desc_sw128(f.start, f.lbo, f.sbo); }

/// Descriptors of k-step `ks` (16 deep); the byte fields and their meaning: common/sw128.hpp,
/// checked against a model of the hardware's address generation by tests/test_sw128.cpp.
__device__ __forceinline__ u64 desc_k_major(u32 tile, int rows, int ks) {
  return desc_sw128(sw128::k_major(tile, rows, ks));
}
__device__ __forceinline__ u64 desc_mn_major(u32 tile, int rows, int ks) {
  return desc_sw128(sw128::mn_major(tile, rows, ks));
}
__device__ __forceinline__ u64 desc_k_major_rows(u32 tile, int rows, int row0, int ks) {
  return desc_sw128(sw128::k_major_rows(tile, rows, row0, ks));
}
__device__ __forceinline__ u64 desc_mn_major_cols(u32 tile, int rows, int col0, int ks) {
  return desc_sw128(sw128::mn_major_cols(tile, rows, col0, ks));
}

/// A k-step's descriptor from step 0's: the step's byte offset / 16 added to the start field in
/// the low word. Exact, since shared addresses are below 2^18 and the 14-bit start field (address
/// / 16) never carries into the LBO bits. Built per step, desc_sw128's masks, shifts and ors are
/// four or five uniform instructions before every wgmma; from step 0's, the compiler builds one
/// descriptor per tile and adds a constant per step. The step_* forms below give desc_*'s values.
/// The fused reverse walk, whose warps' issue sets its period, uses them; the other programs, bound
/// elsewhere, measured no faster with them.
__device__ __forceinline__ u64 desc_step(u64 first, u32 offset_bytes) {
  const u32 lo = static_cast<u32>(first) + (offset_bytes >> 4), hi = static_cast<u32>(first >> 32);
  return (static_cast<u64>(hi) << 32) | lo;
}
__device__ __forceinline__ u64 step_k_major(u32 tile, int rows, int ks) {
  return desc_step(desc_sw128(sw128::k_major(tile, rows, 0)), sw128::k_major(0u, rows, ks).start);
}
__device__ __forceinline__ u64 step_mn_major(u32 tile, int rows, int ks) {
  return desc_step(desc_sw128(sw128::mn_major(tile, rows, 0)), sw128::mn_major(0u, rows, ks).start);
}
__device__ __forceinline__ u64 step_mn_major_cols(u32 tile, int rows, int col0, int ks) {
  return desc_step(desc_sw128(sw128::mn_major_cols(tile, rows, col0, 0)), sw128::mn_major(0u, rows, ks).start);
}

/// Orders earlier generic-proxy shared-memory writes (st.shared, cp.async) before wgmma reads.
__device__ __forceinline__ void fence_smem_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/// Before the first wgmma of a batch: the accumulator registers and operands are ready.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMA.
template <int R>
__device__ __forceinline__ void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// d (+)= A[64 x 16] B[16 x 16]; scale_d = 0 overwrites d. TA / TB: 1 = the operand is M- / N-major.
template <int TA, int TB>
__device__ __forceinline__ void mma_m64n16k16(float (&d)[8], u64 desc_a, u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, "
      "%12;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
}

/// d (+)= A[64 x 16] B[16 x 32]; scale_d = 0 overwrites d. TA / TB: 1 = the operand is M- / N-major.
template <int TA, int TB>
__device__ __forceinline__ void mma_m64n32k16(float (&d)[16], u64 desc_a, u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
}

/// d (+)= A[64 x 16] B[16 x 64]; scale_d = 0 overwrites d. TA / TB: 1 = the operand is M- / N-major.
template <int TA, int TB>
__device__ __forceinline__ void mma_m64n64k16(float (&d)[32], u64 desc_a, u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, "
      "1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
}

/// d (+)= A[64 x 16] B[16 x 128]; scale_d = 0 overwrites d. TA / TB: 1 = the operand is M- / N-major.
template <int TA, int TB>
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], u64 desc_a, u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
}

/// m64nNk16 for N in {16, 32, 64, 128}, chosen at compile time.
template <int N, int TA, int TB>
__device__ __forceinline__ void mma_k16(float (&d)[N / 2], u64 desc_a, u64 desc_b, int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "wg::mma_k16: N must be 16, 32, 64 or 128");
  if constexpr (N == 16)
    mma_m64n16k16<TA, TB>(d, desc_a, desc_b, scale_d);
  else if constexpr (N == 32)
    mma_m64n32k16<TA, TB>(d, desc_a, desc_b, scale_d);
  else if constexpr (N == 64)
    mma_m64n64k16<TA, TB>(d, desc_a, desc_b, scale_d);
  else
    mma_m64n128k16<TA, TB>(d, desc_a, desc_b, scale_d);
}

/// The register-A forms (RS): d (+)= A[64 x 16] B[16 x N] with A in registers (N = 16 .. 128), the m16n8k16 A
/// fragment of each warp's 16 rows (warp w of the warpgroup owns rows 16w..16w+15; lane l holds
/// a[0] = (l/4, 2(l%4) .. +1), a[1] = the same 8 rows lower, a[2] / a[3] = columns 8 .. 15), bf16
/// pairs packed low element first. A state or an intermediate kept in registers feeds the tensor
/// cores without a round trip through shared memory. TB: 1 = B is N-major.
template <int TB>
__device__ __forceinline__ void mma_rs_m64n16k16(float (&d)[8], const u32 (&a)[4], u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, "
      "p, 1, 1, %14;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void mma_rs_m64n32k16(float (&d)[16], const u32 (&a)[4], u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void mma_rs_m64n64k16(float (&d)[32], const u32 (&a)[4], u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, "
      "%35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void mma_rs_m64n128k16(float (&d)[64], const u32 (&a)[4], u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
}

/// The RS form for N in {16, 32, 64, 128}, chosen at compile time.
template <int N, int TB>
__device__ __forceinline__ void mma_rs_k16(float (&d)[N / 2], const u32 (&a)[4], u64 desc_b, int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "wg::mma_rs_k16: N must be 16, 32, 64 or 128");
  if constexpr (N == 16)
    mma_rs_m64n16k16<TB>(d, a, desc_b, scale_d);
  else if constexpr (N == 32)
    mma_rs_m64n32k16<TB>(d, a, desc_b, scale_d);
  else if constexpr (N == 64)
    mma_rs_m64n64k16<TB>(d, a, desc_b, scale_d);
  else
    mma_rs_m64n128k16<TB>(d, a, desc_b, scale_d);
}

/// Shared-window accesses by 32-bit shared address, for the warp-specialized bodies: through an
/// aligned generic pointer the compiler kept generic loads (LD.E) for them.
__device__ __forceinline__ float lds_f32(u32 a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ u32 lds_u32(u32 a) {
  u32 v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ float2 lds_f32x2(u32 a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint4 lds_v4(u32 a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ void sts_u32(u32 a, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_v4(u32 a, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void sts_f32(u32 a, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
/// Four 8 x 8 bf16 matrices from shared memory in the fragment layout (row lane / 4, columns
/// 2 (lane % 4), +1), stsm_x4's inverse; lane L gives the address of row L % 8 of matrix L / 8.
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
/// Four transposed 8 x 8 bf16 matrices from (ldmatrix) or to (stmatrix) shared memory; lane L
/// gives the row address of matrix L / 8, row L % 8.
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], u32 a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
/// Four 8 x 8 bf16 matrices in the fragment layout (row lane / 4, columns 2 (lane % 4), +1) into
/// shared memory; lane L gives the address of row L % 8 of matrix L / 8.
__device__ __forceinline__ void stsm_x4(u32 a, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void stsm_x4_trans(u32 a, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
/// Two (lanes 0-15 give the row addresses) and one (lanes 0-7) 8 x 8 bf16 matrices, as stsm_x4.
__device__ __forceinline__ void stsm_x2(u32 a, u32 r0, u32 r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n" ::"r"(a), "r"(r0), "r"(r1) : "memory");
}
__device__ __forceinline__ void stsm_x2_trans(u32 a, u32 r0, u32 r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(a), "r"(r0), "r"(r1)
               : "memory");
}
__device__ __forceinline__ void stsm_x1(u32 a, u32 r0) {
  asm volatile("stmatrix.sync.aligned.m8n8.x1.shared.b16 [%0], {%1};\n" ::"r"(a), "r"(r0) : "memory");
}
__device__ __forceinline__ void stsm_x1_trans(u32 a, u32 r0) {
  asm volatile("stmatrix.sync.aligned.m8n8.x1.trans.shared.b16 [%0], {%1};\n" ::"r"(a), "r"(r0) : "memory");
}
/// An 8 x 8 bf16 matrix in the fragment layout (row lane / 4, columns 2 (lane % 4), +1), transposed
/// across the warp into the same layout: a register-A fragment's rows become contiguous pairs.
__device__ __forceinline__ u32 movmatrix_trans(u32 a) {
  u32 d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

/// A ROWS x COLS bf16 tile into an SW128 tile by a loading warpgroup's 128 threads (tid 0..127);
/// rows >= valid become zeros. Every thread keeps one 16-byte column piece of every
/// (128 / pieces)-th row, so the swizzle phase of its pieces never changes. copy16(dst, src, ok)
/// issues one zero-filling 16-byte cp.async (the caller's, so its address conversion stays its own).
template <int ROWS, int COLS, class Copy16>
__device__ __forceinline__ void load_tile_sw128(bf16_t* dst, const bf16_t* src, long long gstride, int valid, int tid,
                                                Copy16 copy16) {
  constexpr int kPieces = COLS / 8, kRowStep = 128 / kPieces;
  static_assert(kRowStep % 8 == 0 && ROWS % kRowStep == 0, "load_tile_sw128: whole swizzle periods per step");
  const int r0 = tid / kPieces, col = (tid % kPieces) * 8;
  unsigned char* const d0 = reinterpret_cast<unsigned char*>(dst) + sw128::offset(r0, col, ROWS);
#pragma unroll 2  // loading warpgroups run at 32 to 40 registers
  for (int it = 0; it < ROWS / kRowStep; ++it) {
    const int r = r0 + it * kRowStep;
    const bool ok = r < valid;
    copy16(d0 + it * kRowStep * 128, ok ? src + r * gstride + col : src, ok);
  }
}

/// Keeps the compiler from moving writes of a register A operand across the asynchronous MMA.
__device__ __forceinline__ void fence_operand(u32 (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

}  // namespace wg
}  // namespace gdn

#endif  // GDN_HAS_WGMMA
