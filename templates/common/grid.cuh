/**
 * @file grid.cuh
 * @brief Block-to-work mapping of the chunk_heads grids (x: chunks, y: value heads).
 */
#pragma once

#include "params.cuh"

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

/// This block's value head and chunk (chunk_heads grids), with what the per-chunk programs read
/// first: the chunk's first token and its length (0: nothing to do).
struct ChunkBlock {
  int chunk;  ///< index into the chunk table
  int head;   ///< value head
  int start;  ///< the chunk's first token in the packed stream
  int len;    ///< tokens in the chunk, 0..CHUNK
};
__device__ __forceinline__ ChunkBlock chunk_block(const ChunkInfo* chunks) {
  const ChunkHead at = chunk_head_of_block();
  const ChunkInfo ci = chunks[at.chunk];
  return {at.chunk, at.head, ci.start, ci.len};
}

}  // namespace gdn
