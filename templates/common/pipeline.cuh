/**
 * @file pipeline.cuh
 * @brief Hopper's warp-specialization primitives (sm_90a, GDN_HAS_WGMMA): shared-memory mbarriers
 *        with transaction counts, cp.async completion signalled on an mbarrier, named barriers,
 *        elected lanes and setmaxnreg's register rebalancing between warpgroups (the entry must
 *        pin its register count: Program::max_registers, __maxnreg__).
 *
 * A producer warp fills a ring of stages and consumer warpgroups drain it: `full[s]` completes when
 * stage s holds its data (the producer's arrivals, or cp.async's), `empty[s]` when every consumer
 * is done with it. Each barrier's phase flips when its expected arrivals are in; a waiter names
 * the parity of the phase it waits for, which for a ring of S stages is (use / S) & 1.
 * tests/pipeline_probe.hpp runs a producer/consumer ring through all of it (gpu_pipeline).
 */
#pragma once

#include "arch.cuh"
#include "common/numeric.cuh"

#if GDN_HAS_WGMMA

namespace gdn {
namespace pipe {

__device__ __forceinline__ u32 smem_u32(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

/// One thread initializes; a fence and a block barrier must follow before any other thread uses it.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, u32 arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
/// Makes mbarrier initializations visible to the async proxy (cp.async.bulk, wgmma) too.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_u32(bar))
               : "memory");
}
/// Arrives and adds `bytes` to the transactions the current phase waits for (bulk copies).
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, u32 bytes) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
      "r"(bytes)
      : "memory");
}
/// The barrier receives one arrival when every cp.async this thread issued before has landed
/// (.noinc: the arrival counts against the barrier's expected count, which must include it).
__device__ __forceinline__ void cp_async_arrive(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
/// One 64 x 64 bf16 box of a 2-D tensor map (`map`: a gdn::TensorMap in the kernel's parameter
/// space, __grid_constant__) starting at element column `col`, row `row` into the shared tile at
/// `dst` (1024-byte aligned for the 128-byte swizzle); its bytes complete transactions on `bar`.
/// Rows past the map's extent arrive as zeros.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, int col, int row, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(col), "r"(row), "r"(smem_u32(bar))
      : "memory");
}
/// A ROWS x COLS tile of `map` (boxes of 64 columns x ROWS rows) from element column `col`, row
/// `row` into COLS / 64 consecutive SW128 blocks of ROWS rows at `dst`, onto `bar`.
template <int ROWS, int COLS>
__device__ __forceinline__ void tma_load_tile(void* dst, const void* map, int col, int row, unsigned long long* bar) {
  static_assert(COLS % 64 == 0, "tma_load_tile: whole 64-column boxes");
#pragma unroll
  for (int b = 0; b < COLS / 64; ++b)
    tma_load_2d(static_cast<unsigned char*>(dst) + b * ROWS * 128, map, col + 64 * b, row, bar);
}
/// The shared tile at shared address `src` (written through the generic proxy: every writer's
/// fence.proxy.async and a barrier come first) into the box of `map` starting at column `col`,
/// row `row`, as one bulk group of this thread once committed. The tile may be rewritten after
/// bulk_wait_read; the global writes are complete after bulk_wait.
__device__ __forceinline__ void tma_store_2d(const void* map, int col, int row, u32 src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(src), "r"(col), "r"(row)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/// This thread's bulk groups but the newest `kPending` have read their shared sources.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
/// This thread's bulk groups but the newest `kPending` are complete.
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
/// Fetches a tensor map into the TMA unit's descriptor cache ahead of its first use.
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

/// One test of whether the phase of parity `parity` has completed (the hardware may suspend the
/// thread briefly before answering no).
__device__ __forceinline__ bool mbar_try_wait(unsigned long long* bar, u32 parity) {
  u32 done = 0;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(smem_u32(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
/// Spins until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

/// A barrier among `threads` threads (a multiple of 32) of the block, id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// The same barriers reached from different code (one call site per warpgroup role): `bar.sync`
/// and `bar.arrive` are the `.aligned` forms, which promise that every participating thread runs
/// the same instruction, and compute-sanitizer's synccheck reports them when the roles' differ.
__device__ __forceinline__ void named_sync_roles(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive_roles(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// A barrier among `threads` threads that also returns whether `pred` holds in all of them
/// (barrier.red.and, the non-aligned form: the two walking warpgroups reach it with their own
/// values of the same code).
__device__ __forceinline__ bool named_all(int id, int threads, bool pred) {
  u32 all;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n barrier.red.and.pred q, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(all)
      : "r"(static_cast<u32>(pred)), "r"(id), "r"(threads)
      : "memory");
  return all != 0;
}

/// True in exactly one lane of the (fully active) warp.
__device__ __forceinline__ bool elect_one() {
  u32 pred = 0;
  asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(pred) : : "memory");
  return pred != 0;
}

/// Register rebalancing between warpgroups: every warp of a warpgroup executes the same one, and
/// the block's total may not exceed what it was launched with (threads x the pinned count), e.g.
/// 256 threads at 128: one warpgroup dec to 40, the other inc to 216. Counts: 24..256, multiples of 8.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: 24..256, a multiple of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: 24..256, a multiple of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace pipe
}  // namespace gdn

#endif  // GDN_HAS_WGMMA
