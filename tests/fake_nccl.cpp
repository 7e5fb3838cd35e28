/**
 * @file fake_nccl.cpp
 * @brief A stand-in for libnccl.so.2 with NCCL 2's C ABI, for the loader's tests on machines
 *        without NCCL: FAKE_NCCL_VERSION sets what ncclGetVersion reports, FAKE_NCCL_NO_ALLGATHER
 *        leaves ncclAllGather out. A communicator records its size and rank; nothing is sent, but
 *        the last all-gather's arguments are kept for fakeNcclLastAllGather.
 */
#include "tests/fake_nccl.hpp"

#include <cstddef>
#include <cstring>

namespace {
struct FakeComm {
  int nranks, rank;
};
FakeComm comms[8];
int next_comm = 0;
}  // namespace

struct ncclUniqueIdFake {
  char internal[128];
};

extern "C" {
int ncclGetVersion(int* version) {
  *version = FAKE_NCCL_VERSION;
  return 0;
}
int ncclGetUniqueId(ncclUniqueIdFake* id) {
  for (int i = 0; i < 128; ++i) id->internal[i] = static_cast<char>(i * 7 + 1);
  return 0;
}
// The id is passed by value (128 bytes): rank is the id's first byte plus `rank`, so a test sees
// that the id and both integers arrived where the ABI puts them.
int ncclCommInitRank(void** comm, int nranks, ncclUniqueIdFake id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks || next_comm == 8) return 4;  // ncclInvalidArgument
  comms[next_comm] = {nranks, rank + id.internal[127] - static_cast<char>(127 * 7 + 1)};
  *comm = &comms[next_comm++];
  return 0;
}
int ncclCommDestroy(void*) { return 0; }
int ncclCommCount(void* comm, int* count) {
  *count = static_cast<FakeComm*>(comm)->nranks;
  return 0;
}
int ncclCommUserRank(void* comm, int* rank) {
  *rank = static_cast<FakeComm*>(comm)->rank;
  return 0;
}
#ifndef FAKE_NCCL_NO_ALLGATHER
FakeAllGather last_all_gather{};
int ncclAllGather(const void* send, void* recv, size_t count, int type, void* comm, void* stream) {
  last_all_gather = {send, recv, count, type, comm, stream, last_all_gather.calls + 1};
  return count == 0 ? 4 : 0;
}
/// Not NCCL's: for tests, the arguments of the last ncclAllGather and the number of calls.
const FakeAllGather* fakeNcclLastAllGather() { return &last_all_gather; }
#endif
const char* ncclGetErrorString(int rc) { return rc == 4 ? "invalid argument (fake)" : "fake error"; }
}
