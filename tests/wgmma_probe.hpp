/**
 * @file wgmma_probe.hpp
 * @brief A one-warpgroup kernel that runs templates/common/wgmma.cuh on a 64 x N x KD product
 *        with A and B written into SW128 tiles in either major order, for the CPU compile test
 *        and the GPU test gpu_wgmma (which checks it against a CPU product).
 *
 * Inputs: a = A as row-major [64][KD] bf16, b = B as row-major [KD][N] bf16; output d =
 * row-major [64][N] fp32; err[0] is set to 1 if dynamic shared memory is not 1024-byte aligned.
 */
#pragma once

#include "compiler/ir.hpp"

#include <fmt/format.h>

#include <string>

namespace gdn::test {

struct WgmmaProbe {
  int n = 128;               ///< 64 or 128
  int kd = 128;              ///< depth, a multiple of 64
  bool a_m_major = false;    ///< A stored K x M (transposed) instead of M x K
  bool b_n_major = false;    ///< B stored K x N instead of N x K
  bool split = false;        ///< 4 warpgroups, each the N/4 columns of its slice (chunk_bwd's use)
  bool a_registers = false;  ///< A from registers (the RS form; a_m_major is then meaningless)
  int threads() const { return split ? 512 : 128; }
  int smem_bytes() const { return 64 * kd * 2 + kd * n * 2; }
  std::string label() const {
    return fmt::format("m64n{}k{} A {} B {}{}", n, kd,
                       a_registers ? "in registers"
                       : a_m_major ? "M-major"
                                   : "K-major",
                       b_n_major ? "N-major" : "K-major", split ? ", split over 4 warpgroups" : "");
  }
  Program program() const {
    Program p;
    p.name = "wgmma_probe";
    p.threads = threads();
    p.smem_bytes = smem_bytes();
    return p;
  }
  std::string source() const {
    return fmt::format(R"(// gdnc test: the wgmma probe, {label}.
#include "common/wgmma.cuh"
#if !GDN_HAS_WGMMA
#error "the wgmma probe needs sm_90a"
#endif

constexpr int N = {n}, KD = {kd}, TA = {ta}, TB = {tb}, SPLIT = {split}, AREG = {areg}, THREADS = SPLIT ? 512 : 128;
constexpr int NW = SPLIT ? N / 4 : N;  // columns per warpgroup

extern "C" __global__ void __launch_bounds__(THREADS) gdn_wgmma_probe(const gdn::bf16_t* a, const gdn::bf16_t* b,
                                                                     float* d, int* err) {{
  using namespace gdn;
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 base = wg::smem_u32(smem), tile_a = base, tile_b = base + 64 * KD * 2;
  if (threadIdx.x == 0 && base % 1024 != 0) err[0] = 1;
  for (int i = threadIdx.x; i < 64 * KD; i += THREADS) {{
    const int m = i / KD, k = i % KD;
    *reinterpret_cast<bf16_t*>(smem + (TA ? sw128::offset(k, m, KD) : sw128::offset(m, k, 64))) = a[i];
  }}
  for (int i = threadIdx.x; i < KD * N; i += THREADS) {{
    const int k = i / N, c = i % N;
    *reinterpret_cast<bf16_t*>(smem + 64 * KD * 2 + (TB ? sw128::offset(k, c, KD) : sw128::offset(c, k, N))) = b[i];
  }}
  wg::fence_smem_for_async();
  __syncthreads();
  const int g = threadIdx.x / 128, col0 = g * NW;  // this warpgroup's columns
  const int w = (threadIdx.x / 32) % 4, l = threadIdx.x % 32;
  float acc[NW / 2];
#pragma unroll
  for (int i = 0; i < NW / 2; ++i) acc[i] = 0.f;
  // RS: every k-step's A fragment of this warp's 16 rows, straight from global memory.
  u32 af[KD / 16][4];
  if (AREG) {{
    const auto pair = [&](int r, int c) {{
      return static_cast<u32>(a[r * KD + c]) | (static_cast<u32>(a[r * KD + c + 1]) << 16);
    }};
#pragma unroll
    for (int ks = 0; ks < KD / 16; ++ks) {{
      const int r = 16 * w + l / 4, c = 16 * ks + 2 * (l % 4);
      af[ks][0] = pair(r, c);
      af[ks][1] = pair(r + 8, c);
      af[ks][2] = pair(r, c + 8);
      af[ks][3] = pair(r + 8, c + 8);
      wg::fence_operand(af[ks]);
    }}
  }}
  wg::fence_acc(acc);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < KD / 16; ++ks) {{
    const wg::u64 db = TB ? wg::desc_mn_major_cols(tile_b, KD, col0, ks) : wg::desc_k_major_rows(tile_b, N, col0, ks);
    if (AREG) {{
      wg::mma_rs_k16<NW, TB>(acc, af[ks], db, 1);
    }} else {{
      const wg::u64 da = TA ? wg::desc_mn_major(tile_a, KD, ks) : wg::desc_k_major(tile_a, 64, ks);
      wg::mma_k16<NW, TA, TB>(acc, da, db, 1);
    }}
  }}
  wg::commit();
  wg::wait<0>();
  wg::fence_acc(acc);
#pragma unroll
  for (int i = 0; i < NW / 8; ++i) {{
    const int r = 16 * w + l / 4, c = col0 + 8 * i + 2 * (l % 4);
    d[r * N + c] = acc[4 * i];
    d[r * N + c + 1] = acc[4 * i + 1];
    d[(r + 8) * N + c] = acc[4 * i + 2];
    d[(r + 8) * N + c + 1] = acc[4 * i + 3];
  }}
}}
)",
                       fmt::arg("label", label()), fmt::arg("n", n), fmt::arg("kd", kd),
                       fmt::arg("ta", a_m_major ? 1 : 0), fmt::arg("tb", b_n_major ? 1 : 0),
                       fmt::arg("split", split ? 1 : 0), fmt::arg("areg", a_registers ? 1 : 0));
  }
};

/// Every operand form the chunk backward uses and the register-A forms, at both widths and
/// depths, one warpgroup or four splitting the columns.
inline std::vector<WgmmaProbe> all_wgmma_probes() {
  std::vector<WgmmaProbe> out;
  for (int n : {64, 128})
    for (int kd : {64, 128})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (bool split : {false, true}) out.push_back(WgmmaProbe{n, kd, ta, tb, split});
  // The register-A (RS) forms the fused forward's design uses: A from registers, B either way.
  for (int n : {64, 128})
    for (int kd : {64, 128})
      for (bool tb : {false, true})
        for (bool split : {false, true}) out.push_back(WgmmaProbe{n, kd, false, tb, split, true});
  return out;
}

/// A kernel that builds every descriptor form both ways, desc_* (masks and shifts per step) and
/// step_* (step 0's plus the step's offset, the fused reverse walk's), for every 16-byte tile start
/// below 227 KB (one thread each), both tile heights and the eight k-steps of a 128-deep product,
/// and counts where they differ into bad[0]: step_* is exact only while no start field carries.
struct DescStepProbe {
  static constexpr unsigned kSharedBytes = 227u * 1024u;  // the most one Hopper block can hold
  static constexpr int kThreads = 256;
  static int blocks() { return static_cast<int>((kSharedBytes / 16 + kThreads - 1) / kThreads); }
  Program program() const {
    Program p;
    p.name = "desc_step_probe";
    p.threads = kThreads;
    p.smem_bytes = 0;
    return p;
  }
  std::string source() const {
    return fmt::format(R"(// gdnc test: wgmma descriptors built per step and stepped from step 0's.
#include "common/wgmma.cuh"
#if !GDN_HAS_WGMMA
#error "the descriptor probe needs sm_90a"
#endif

extern "C" __global__ void __launch_bounds__({threads}) gdn_desc_step_probe(int* bad, int* checked) {{
  using namespace gdn;
  const unsigned tile = (blockIdx.x * blockDim.x + threadIdx.x) * 16u, limit = {limit}u;
  if (tile >= limit) return;
  int n = 0, c = 0;
  for (int rows = 64; rows <= 128; rows += 64)
    for (int ks = 0; ks < 8; ++ks) {{
      if (tile + sw128::k_major(0u, rows, ks).start < limit) {{
        n += wg::step_k_major(tile, rows, ks) != wg::desc_k_major(tile, rows, ks);
        ++c;
      }}
      if (tile + sw128::mn_major(0u, rows, ks).start + rows * 128u < limit) {{
        n += wg::step_mn_major(tile, rows, ks) != wg::desc_mn_major(tile, rows, ks);
        for (int col0 = 0; col0 < 128; col0 += 8)
          n += wg::step_mn_major_cols(tile, rows, col0, ks) != wg::desc_mn_major_cols(tile, rows, col0, ks);
        c += 17;
      }}
    }}
  atomicAdd(bad, n);
  atomicAdd(checked, c);
}}
)",
                       fmt::arg("threads", kThreads), fmt::arg("limit", kSharedBytes));
  }
};

}  // namespace gdn::test
