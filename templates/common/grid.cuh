/**
 * @file grid.cuh
 * @brief Block-to-work mapping of the chunk_heads grids (x: chunks, y: value heads).
 */
#pragma once

namespace gdn {

struct ChunkHead {
  int chunk;  ///< index into the chunk table
  int head;   ///< value head
};

/// The (chunk, value head) of this block, value heads fastest in launch order: the G value heads
/// that share a q/k head run back to back and read its tiles from L2 instead of DRAM (blockIdx
/// order would run all chunks of one head first, and a head's K does not fit in L2 at shape M).
__device__ __forceinline__ ChunkHead chunk_head_of_block() {
  const unsigned linear = blockIdx.y * gridDim.x + blockIdx.x;
  return {static_cast<int>(linear / gridDim.y), static_cast<int>(linear % gridDim.y)};
}

}  // namespace gdn
