/**
 * @file fake_nccl.hpp
 * @brief What the stand-in NCCL (fake_nccl.cpp) keeps of its last ncclAllGather, for tests that
 *        read it through the library's fakeNcclLastAllGather().
 */
#pragma once

#include <cstddef>

struct FakeAllGather {
  const void* send;
  void* recv;
  size_t count;
  int type;
  void* comm;
  void* stream;
  int calls;  ///< ncclAllGather calls so far
};
