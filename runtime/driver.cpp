/**
 * @file driver.cpp
 * @brief dlopen of libcuda.so.1 and the RAII handles.
 */
#include "runtime/driver.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <mutex>

namespace gdn::rt {

namespace {

std::string result_name(CUresult rc) {
  const char* name = nullptr;
  try {
    if (drv().cuGetErrorName) drv().cuGetErrorName(rc, &name);
  } catch (...) {}
  return name ? name : fmt::format("CUresult {}", static_cast<int>(rc));
}

/// Destructors log instead of throwing; a deinitialized driver at exit is not an error.
void log_release_failure(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_DEINITIALIZED)
    std::fprintf(stderr, "gdnc: %s failed: %s\n", what, result_name(rc).c_str());
}

}  // namespace

CudaError::CudaError(CUresult code, const std::string& what)
    : Error(fmt::format("{}: {}", what, result_name(code))), code_(code) {}

const Driver& Driver::get() {
  static std::once_flag once;
  static Driver d;
  static std::string error;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      error = fmt::format(
          "cannot load the CUDA driver (libcuda.so.1): {}. Is an NVIDIA driver installed? "
          "Compile-ahead (gdnc compile) and cache commands work without one.",
          e ? e : "unknown error");
      return;
    }
#define GDN_RESOLVE(name)                                                                          \
  d.name = reinterpret_cast<decltype(d.name)>(dlsym(lib, #name));                                  \
  if (!d.name) {                                                                                   \
    error = fmt::format("the CUDA driver (libcuda.so.1) has no symbol {}: driver too old", #name); \
    return;                                                                                        \
  }
    GDN_DRIVER_FUNCTIONS(GDN_RESOLVE)
#undef GDN_RESOLVE
    const CUresult rc = d.cuInit(0);
    if (rc != CUDA_SUCCESS) {
      const char* name = nullptr;
      d.cuGetErrorName(rc, &name);
      error = fmt::format("cuInit(0) failed: {} (no usable GPU?)", name ? name : "?");
    }
  });
  if (!error.empty()) throw DriverError(error);
  return d;
}

Context Context::create(int ordinal) {
  CUdevice dev;
  GDN_CHECK_CU(drv().cuDeviceGet(&dev, ordinal), "cuDeviceGet({})", ordinal);
  CUcontext ctx;
  GDN_CHECK_CU(drv().cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain(device {})", ordinal);
  Context c(dev, ctx);
  c.make_current();
  return c;
}

Context& Context::operator=(Context&& o) noexcept {
  if (this != &o) {
    this->~Context();
    dev_ = o.dev_;
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

Context::~Context() {
  if (ctx_) log_release_failure(drv().cuDevicePrimaryCtxRelease_v2(dev_), "cuDevicePrimaryCtxRelease");
}

void Context::make_current() const { GDN_CHECK_CU(drv().cuCtxSetCurrent(ctx_), "cuCtxSetCurrent"); }

int Context::compute_capability() const {
  int major = 0, minor = 0;
  GDN_CHECK_CU(drv().cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev_), "cc major");
  GDN_CHECK_CU(drv().cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev_), "cc minor");
  return major * 10 + minor;
}

int Context::sm_count() const {
  int n = 0;
  GDN_CHECK_CU(drv().cuDeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev_), "SM count");
  return n;
}

std::string Context::name() const {
  char buf[256] = {};
  GDN_CHECK_CU(drv().cuDeviceGetName(buf, sizeof buf, dev_), "cuDeviceGetName");
  return buf;
}

DeviceBuffer DeviceBuffer::create(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  GDN_CHECK_CU(drv().cuMemAlloc_v2(&b.ptr_, bytes), "cuMemAlloc({} bytes)", bytes);
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    this->~DeviceBuffer();
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) log_release_failure(drv().cuMemFree_v2(ptr_), "cuMemFree");
}

Stream Stream::create() {
  CUstream s;
  GDN_CHECK_CU(drv().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return Stream(s);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    this->~Stream();
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (s_) log_release_failure(drv().cuStreamDestroy_v2(s_), "cuStreamDestroy");
}

void Stream::synchronize() const { GDN_CHECK_CU(drv().cuStreamSynchronize(s_), "cuStreamSynchronize"); }

Event Event::create() {
  CUevent e;
  GDN_CHECK_CU(drv().cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
  return Event(e);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    this->~Event();
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (e_) log_release_failure(drv().cuEventDestroy_v2(e_), "cuEventDestroy");
}

void Event::record(CUstream s) const { GDN_CHECK_CU(drv().cuEventRecord(e_, s), "cuEventRecord"); }

float Event::elapsed_ms(const Event& start, const Event& end) {
  GDN_CHECK_CU(drv().cuEventSynchronize(end.e_), "cuEventSynchronize");
  float ms = 0;
  GDN_CHECK_CU(drv().cuEventElapsedTime_v2(&ms, start.e_, end.e_), "cuEventElapsedTime");
  return ms;
}

CUtensorMap encode_bf16_sw128_map(const void* base, uint64_t rows, uint64_t row_elements, uint32_t box_cols,
                                  uint32_t box_rows, const std::string& what) {
  if (box_cols * 2 != 128)
    throw std::logic_error(
        fmt::format("tensor map of {}: a 128-byte swizzled box is 64 bf16 wide, not {}", what, box_cols));
  const uintptr_t address = reinterpret_cast<uintptr_t>(base);
  if (!base || address % 16 != 0 || (row_elements * 2) % 16 != 0)
    throw InputError(
        fmt::format("{}: address {} with rows of {} bf16: a TMA operand needs a 16-byte aligned "
                    "address and rows of a multiple of 16 bytes",
                    what, base, row_elements));
  // Box coordinates are 32-bit: a row past 2^31 could not be addressed.
  if (rows > static_cast<uint64_t>(INT32_MAX))
    throw InputError(fmt::format("{}: {} rows exceed the 2^31 a TMA coordinate can address", what, rows));
  CUtensorMap map{};
  const cuuint64_t dims[2] = {row_elements, rows > 0 ? rows : 1};  // a map has no empty dimension
  const cuuint64_t strides[1] = {row_elements * 2};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  GDN_CHECK_CU(
      drv().cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                                   box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      "cuTensorMapEncodeTiled({}: {} x {} bf16 at {}, box {} x {})", what, rows, row_elements, base, box_rows,
      box_cols);
  return map;
}

Module Module::load(const std::string& cubin, const std::string& entry, int threads, int smem_bytes) {
  Module m;
  GDN_CHECK_CU(drv().cuModuleLoadData(&m.mod_, cubin.data()), "cuModuleLoadData({}, {} bytes)", entry, cubin.size());
  GDN_CHECK_CU(drv().cuModuleGetFunction(&m.fn_, m.mod_, entry.c_str()), "cuModuleGetFunction({})", entry);
  if (smem_bytes > 48 * 1024)
    GDN_CHECK_CU(drv().cuFuncSetAttribute(m.fn_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
                 "cuFuncSetAttribute({}, max dynamic smem = {})", entry, smem_bytes);
  m.entry_ = entry;
  m.threads_ = threads;
  m.smem_ = smem_bytes;
  return m;
}

Module::Module(Module&& o) noexcept
    : mod_(std::exchange(o.mod_, nullptr)),
      fn_(std::exchange(o.fn_, nullptr)),
      entry_(std::move(o.entry_)),
      threads_(o.threads_),
      smem_(o.smem_) {}

Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    this->~Module();
    mod_ = std::exchange(o.mod_, nullptr);
    fn_ = std::exchange(o.fn_, nullptr);
    entry_ = std::move(o.entry_);
    threads_ = o.threads_;
    smem_ = o.smem_;
  }
  return *this;
}

Module::~Module() {
  if (mod_) log_release_failure(drv().cuModuleUnload(mod_), "cuModuleUnload");
}

void Module::launch_params(dim3_t grid, CUstream stream, const void* params, const void* second) const {
  void* args[] = {const_cast<void*>(params), const_cast<void*>(second)};
  GDN_CHECK_CU(drv().cuLaunchKernel(fn_, grid.x, grid.y, grid.z, threads_, 1, 1, smem_, stream, args, nullptr),
               "launch of {} (grid ({}, {}, {}), block {}, dynamic smem {} bytes)", entry_, grid.x, grid.y, grid.z,
               threads_, smem_);
}

}  // namespace gdn::rt
