/**
 * @file async_copy.cuh
 * @brief The cp.async group fences shared by the forward (gdn::fwd) and backward (gdn::bwd) tile
 *        helpers. The copies themselves stay per side: their shared-address conversions differ
 *        (an intrinsic vs inline PTX), which changes the machine code of the other side's
 *        programs, so merging them waits for a GPU run (scripts/compare_cubins.sh shows it).
 */
#pragma once

namespace gdn {

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace gdn
