/**
 * @file geometry.hpp
 * @brief Launch geometry of the context-parallel programs, shared by the host (IR) and the
 *        templates. Plain C++17: no device code and no includes, so both compilers read it.
 */
#pragma once

namespace gdn {

/// kcp_exchange copies at most cp.ranks - 1 records of a few MB: two blocks per SM of the H200.
struct KcpExchangeGeometry {
  static constexpr int kThreads = 256;
  static constexpr int kBlocks = 264;
};

}  // namespace gdn
