/**
 * @file pipeline_probe.hpp
 * @brief A warp-specialized producer/consumer kernel over templates/common/pipeline.cuh, for the
 *        CPU compile test and the GPU test gpu_pipeline (which checks its sums against the CPU).
 *
 * Warpgroup 0 is the producer (setmaxnreg.dec to 40 registers): its first warp's lanes copy `tiles` tiles of
 * 64 rows x 64 floats from global memory into a ring of `stages` shared stages with cp.async, each
 * lane signalling completion on the stage's `full` barrier; it waits on `empty` before refilling.
 * Warpgroup 1 consumes (setmaxnreg.inc to 216): waits on `full`, sums each tile's rows into out[tile][64],
 * syncs on a named barrier, and one elected lane per warp arrives on `empty`. An odd tile count
 * and more tiles than stages exercise the phase parities. Waits are bounded: err[0] = 1 instead
 * of a hang when a phase never completes.
 */
#pragma once

#include "compiler/ir.hpp"

#include <fmt/format.h>

#include <string>

namespace gdn::test {

struct PipelineProbe {
  int stages = 2;
  int tiles = 37;
  int smem_bytes() const { return stages * 64 * 64 * 4 + 2 * stages * 8 + 16; }
  Program program() const {
    Program p;
    p.name = "pipeline_probe";
    p.threads = 256;
    p.smem_bytes = smem_bytes();
    return p;
  }
  std::string source() const {
    return fmt::format(R"(// gdnc test: the pipeline probe, {stages} stages, {tiles} tiles.
#include "common/pipeline.cuh"
#if !GDN_HAS_WGMMA
#error "the pipeline probe needs sm_90a"
#endif

constexpr int S = {stages}, TILES = {tiles};

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {{
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(gdn::pipe::smem_u32(dst)), "l"(src) : "memory");
}}

// A bounded wait: a wrong parity or arrival count reports through err instead of hanging the GPU.
__device__ __forceinline__ bool wait_bounded(unsigned long long* bar, unsigned parity, int* err) {{
  for (long long i = 0; i < (1ll << 24); ++i)
    if (gdn::pipe::mbar_try_wait(bar, parity)) return true;
  atomicExch(err, 1);
  return false;
}}

// 256 threads launched at 128 registers each: the producer warpgroup gives 88 of its registers
// back (40), the consumer warpgroup takes them (216).
extern "C" __global__ void __maxnreg__(128) gdn_pipeline_probe(const float* in, float* out, int* err) {{
  using namespace gdn;
  extern __shared__ __align__(16) unsigned char smem[];
  float* stage = reinterpret_cast<float*>(smem);
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + S * 64 * 64 * 4);
  unsigned long long* empty = full + S;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {{
    for (int s = 0; s < S; ++s) {{
      pipe::mbar_init(&full[s], 32);   // the producer warp's 32 cp.async arrivals
      pipe::mbar_init(&empty[s], 4);   // one elected lane per consumer warp
    }}
    pipe::fence_mbar_init();
  }}
  __syncthreads();
  if (wg == 0) {{
    pipe::setmaxnreg_dec<40>();
    if (warp == 0) {{
      for (int t = 0; t < TILES; ++t) {{
        const int s = t % S;
        if (t >= S && !wait_bounded(&empty[s], ((t / S) - 1) & 1, err)) return;
        const float* src = in + (long long)t * 64 * 64;
        for (int i = lane; i < 64 * 64 / 4; i += 32) cp_async16(stage + s * 64 * 64 + 4 * i, src + 4 * i);
        pipe::cp_async_arrive(&full[s]);
      }}
    }}
  }} else {{
    pipe::setmaxnreg_inc<216>();
    const int c = threadIdx.x - 128;  // 128 consumer threads: column c / 2, half the rows each
    for (int t = 0; t < TILES; ++t) {{
      const int s = t % S;
      if (!wait_bounded(&full[s], (t / S) & 1, err)) return;
      const int col = c % 64, half = c / 64;
      float sum = 0.f;
      for (int r = 32 * half; r < 32 * half + 32; ++r) sum += stage[s * 64 * 64 + r * 64 + col];
      atomicAdd(out + (long long)t * 64 + col, sum);  // two halves: exact in fp32 for the test's integers
      pipe::named_sync(1, 128);  // every consumer is done reading stage s
      if (pipe::elect_one()) pipe::mbar_arrive(&empty[s]);
    }}
  }}
}}
)",
                       fmt::arg("stages", stages), fmt::arg("tiles", tiles));
  }
};

}  // namespace gdn::test
