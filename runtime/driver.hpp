/**
 * @file driver.hpp
 * @brief The CUDA driver API loaded with dlopen, one exception type, and RAII handles.
 *
 * libcuda is never linked, so compile-ahead and cache inspection run where there is no driver;
 * the first use of the driver on such a machine throws DriverError with a clear message.
 */
#pragma once

#include "common/error.hpp"

#include <cuda.h>
#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace gdn::rt {

struct dim3_t {
  unsigned x = 1, y = 1, z = 1;
};

/// A failed driver call: the CUresult, its name, and what we were doing.
class CudaError : public Error {
 public:
  CudaError(CUresult code, const std::string& what);
  CUresult code() const noexcept { return code_; }

 private:
  CUresult code_;
};

/// The driver could not be loaded (no libcuda.so.1 or a symbol missing).
class DriverError : public Error {
 public:
  using Error::Error;
};

// clang-format off
#define GDN_DRIVER_FUNCTIONS(X) \
  X(cuInit) \
  X(cuGetErrorName) \
  X(cuGetErrorString) \
  X(cuDeviceGet) \
  X(cuDeviceGetCount) \
  X(cuDeviceGetAttribute) \
  X(cuDeviceGetName) \
  X(cuDevicePrimaryCtxRetain) \
  X(cuDevicePrimaryCtxRelease_v2) \
  X(cuCtxSetCurrent) \
  X(cuCtxSynchronize) \
  X(cuModuleLoadData) \
  X(cuModuleUnload) \
  X(cuModuleGetFunction) \
  X(cuFuncSetAttribute) \
  X(cuLaunchKernel) \
  X(cuMemAlloc_v2) \
  X(cuMemFree_v2) \
  X(cuMemcpyHtoD_v2) \
  X(cuMemcpyDtoH_v2) \
  X(cuMemcpyDtoHAsync_v2) \
  X(cuMemsetD8Async) \
  X(cuMemsetD8_v2) \
  X(cuStreamCreate) \
  X(cuStreamDestroy_v2) \
  X(cuStreamSynchronize) \
  X(cuEventCreate) \
  X(cuEventDestroy_v2) \
  X(cuEventRecord) \
  X(cuEventSynchronize) \
  X(cuEventElapsedTime_v2) \
  X(cuMemcpyDtoDAsync_v2) \
  X(cuDriverGetVersion) \
  X(cuStreamBeginCapture_v2) \
  X(cuStreamEndCapture) \
  X(cuGraphInstantiateWithFlags) \
  X(cuGraphLaunch) \
  X(cuGraphExecDestroy) \
  X(cuGraphDestroy) \
  X(cuGraphGetNodes) \
  X(cuStreamIsCapturing) \
  X(cuTensorMapEncodeTiled)
// clang-format on

/// Function pointers into libcuda.so.1, resolved once.
struct Driver {
#define GDN_DECLARE(name) decltype(&::name) name = nullptr;
  GDN_DRIVER_FUNCTIONS(GDN_DECLARE)
#undef GDN_DECLARE
  /// Loads the driver on first use and calls cuInit(0); throws DriverError if that fails.
  static const Driver& get();
};

inline const Driver& drv() { return Driver::get(); }

/// Throws CudaError built lazily from the format arguments when `expr` fails.
#define GDN_CHECK_CU(expr, ...)                                                                 \
  do {                                                                                          \
    const CUresult gdn_rc_ = (expr);                                                            \
    if (gdn_rc_ != CUDA_SUCCESS) throw ::gdn::rt::CudaError(gdn_rc_, fmt::format(__VA_ARGS__)); \
  } while (0)

/// The primary context of one device, retained for the lifetime of the object and made current.
class Context {
 public:
  static Context create(int ordinal = 0);
  Context(Context&& o) noexcept : dev_(o.dev_), ctx_(std::exchange(o.ctx_, nullptr)) {}
  Context& operator=(Context&& o) noexcept;
  Context(const Context&) = delete;
  ~Context();
  CUcontext handle() const { return ctx_; }
  CUdevice device() const { return dev_; }
  void make_current() const;
  int compute_capability() const;
  int sm_count() const;
  std::string name() const;

 private:
  Context(CUdevice d, CUcontext c) : dev_(d), ctx_(c) {}
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

/// Device memory owned by the object.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static DeviceBuffer create(size_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  CUdeviceptr handle() const { return ptr_; }
  template <class T = void>
  T* get() const {
    return reinterpret_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

class Stream {
 public:
  static Stream create();
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  ~Stream();
  CUstream handle() const { return s_; }
  void synchronize() const;

 private:
  explicit Stream(CUstream s) : s_(s) {}
  CUstream s_ = nullptr;
};

class Event {
 public:
  static Event create();
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  ~Event();
  CUevent handle() const { return e_; }
  void record(CUstream s) const;
  /// Milliseconds between two recorded events (waits for `end`).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  explicit Event(CUevent e) : e_(e) {}
  CUevent e_ = nullptr;
};

/// One loaded cubin with its single kernel and its launch geometry.
/// A TMA map of a bf16 row-major matrix (`rows` x `row_elements`, rows contiguous) read in boxes of
/// `box_cols` x `box_rows` elements into 128-byte-swizzled shared tiles (box_cols x 2 = 128 bytes);
/// elements past the matrix read as zero. Throws InputError naming `what` where the driver refuses
/// the address or the strides (16-byte alignment).
CUtensorMap encode_bf16_sw128_map(const void* base, uint64_t rows, uint64_t row_elements, uint32_t box_cols,
                                  uint32_t box_rows, const std::string& what);

class Module {
 public:
  /// Loads `cubin`, finds `entry`, and raises the dynamic shared-memory limit to `smem_bytes`.
  static Module load(const std::string& cubin, const std::string& entry, int threads, int smem_bytes);
  Module(Module&& o) noexcept;
  Module& operator=(Module&& o) noexcept;
  Module(const Module&) = delete;
  ~Module();
  CUfunction function() const { return fn_; }
  const std::string& entry() const { return entry_; }
  int threads() const { return threads_; }
  int smem_bytes() const { return smem_; }

  /// Launches with one by-value parameter block; errors carry grid, block, smem and the entry.
  template <class Params>
  void launch(dim3_t grid, CUstream stream, const Params& params) const {
    static_assert(std::is_trivially_copyable_v<Params>, "kernel parameters must be trivially copyable");
    launch_params(grid, stream, &params);
  }
  /// The same with the parameter block as bytes (the kernel's single by-value argument), and
  /// with `second` non-null a second by-value argument (the tensor maps of Program::tensor_maps).
  void launch_params(dim3_t grid, CUstream stream, const void* params, const void* second = nullptr) const;

 private:
  Module() = default;
  CUmodule mod_ = nullptr;
  CUfunction fn_ = nullptr;
  std::string entry_;
  int threads_ = 0;
  int smem_ = 0;
};

}  // namespace gdn::rt
