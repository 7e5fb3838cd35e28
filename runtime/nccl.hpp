/**
 * @file nccl.hpp
 * @brief NCCL loaded with dlopen, for the context-parallel (KCP) path's collectives.
 *
 * gdnc never links NCCL and needs no nccl.h: the few entry points it calls are declared here
 * (NCCL 2's C ABI), and the library is found at run time, so builds, compile-ahead and single-rank
 * use work where NCCL is absent. Callers that own a communicator (torch.distributed, their own
 * NCCL) do not need this at all: the KCP phases take the gathered buffer from them.
 *
 * Where the library is looked for, in order (the first that loads is used):
 *   1. the path given to Nccl::load (the Python binding passes the one of torch's nvidia-nccl
 *      wheel, which is not on the loader's path);
 *   2. $GDNC_NCCL_LIBRARY;
 *   3. libnccl.so.2 through the dynamic loader (LD_LIBRARY_PATH, the system's library paths).
 */
#pragma once

#include "common/error.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace gdn::rt {

/// NCCL could not be loaded, is too old, or a call failed (the message names the call and
/// NCCL's own error string).
class NcclError : public Error {
 public:
  using Error::Error;
};

/// The NCCL 2 C ABI, as far as gdnc uses it.
namespace nccl_abi {
using Result = int;  ///< ncclResult_t: 0 = ncclSuccess
constexpr Result kSuccess = 0;
constexpr int kUniqueIdBytes = 128;  ///< NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  char internal[kUniqueIdBytes];
};
using Comm = struct ncclComm*;
using DataType = int;           ///< ncclDataType_t
constexpr DataType kUint8 = 1;  ///< ncclUint8
constexpr DataType kFloat32 = 7;
using Stream = void*;  ///< cudaStream_t / CUstream

using GetVersionFn = Result (*)(int*);
using GetUniqueIdFn = Result (*)(UniqueId*);
using CommInitRankFn = Result (*)(Comm*, int, UniqueId, int);
using CommDestroyFn = Result (*)(Comm);
using CommCountFn = Result (*)(Comm, int*);
using CommUserRankFn = Result (*)(Comm, int*);
using AllGatherFn = Result (*)(const void*, void*, size_t, DataType, Comm, Stream);
using GetErrorStringFn = const char* (*)(Result);
}  // namespace nccl_abi

/// The loaded library and its entry points. Loading happens once per path; the handle stays
/// open for the life of the process (communicators outlive any one layer).
class Nccl {
 public:
  /// Loads NCCL from `path` (empty: the search order above). Throws NcclError naming every place
  /// tried and why each failed, a missing entry point, or a version older than 2.18.
  static const Nccl& load(const std::string& path = {});

  /// NCCL's version as ncclGetVersion reports it (e.g. 22703 for 2.27.3).
  int version() const { return version_; }
  /// The file that was loaded (as given to dlopen).
  const std::string& library() const { return library_; }
  /// "2.27.3" from version().
  std::string version_text() const;

  /// Throws NcclError "<what>: <NCCL's error string> (ncclResult_t <rc>)" unless rc is success.
  void check(nccl_abi::Result rc, const std::string& what) const;

  nccl_abi::GetVersionFn get_version = nullptr;
  nccl_abi::GetUniqueIdFn get_unique_id = nullptr;
  nccl_abi::CommInitRankFn comm_init_rank = nullptr;
  nccl_abi::CommDestroyFn comm_destroy = nullptr;
  nccl_abi::CommCountFn comm_count = nullptr;
  nccl_abi::CommUserRankFn comm_user_rank = nullptr;
  nccl_abi::AllGatherFn all_gather = nullptr;
  nccl_abi::GetErrorStringFn get_error_string = nullptr;

 private:
  int version_ = 0;
  std::string library_;
};

/// The oldest NCCL gdnc accepts (ncclGetVersion's encoding): 2.18, the first with CUDA graph
/// capture of collectives on every stream kind the runtime uses.
constexpr int kNcclMinVersion = 21800;

/// The places Nccl::load tries for `path`, in order (for messages and tests).
std::vector<std::string> nccl_search_list(const std::string& path);

}  // namespace gdn::rt
