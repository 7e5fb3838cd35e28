/**
 * @file graph.cpp
 * @brief The graph cache and the driver's capture backend.
 */
#include "runtime/graph.hpp"

#include <exception>

namespace gdn {

size_t GraphKeyHash::operator()(const GraphKey& k) const noexcept {
  uint64_t h = 1469598103934665603ull ^ k.plan;  // FNV-1a over the words
  for (uint64_t w : k.frame.word) {
    h ^= w;
    h *= 1099511628211ull;
  }
  return static_cast<size_t>(h);
}

CapturedGraph* GraphCache::find(const GraphKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->graph.get();
}

CapturedGraph* GraphCache::insert(const GraphKey& key, std::unique_ptr<CapturedGraph> graph) {
  if (auto it = index_.find(key); it != index_.end()) {
    bytes_ -= it->second->graph->bytes();
    lru_.erase(it->second);
    index_.erase(it);
  }
  bytes_ += graph->bytes();
  lru_.push_front(Item{key, std::move(graph)});
  index_.emplace(key, lru_.begin());
  while (lru_.size() > 1 && (lru_.size() > limits_.max_entries || bytes_ > limits_.max_bytes)) {
    bytes_ -= lru_.back().graph->bytes();
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++evictions_;
  }
  return lru_.front().graph.get();
}

namespace {

class DeviceGraph final : public CapturedGraph {
 public:
  DeviceGraph(CUgraphExec exec, size_t nodes) : exec_(exec), bytes_(4096 + nodes * 512) {}
  ~DeviceGraph() override {
    const CUresult rc = rt::drv().cuGraphExecDestroy(exec_);
    (void)rc;  // a destructor must not throw; a deinitialized driver at exit is expected
  }
  void replay(CUstream stream) override {
    GDN_CHECK_CU(rt::drv().cuGraphLaunch(exec_, stream), "cuGraphLaunch (graph replay)");
  }
  size_t bytes() const override { return bytes_; }

 private:
  CUgraphExec exec_;
  size_t bytes_;
};

class DeviceGraphBackend final : public GraphBackend {
 public:
  ~DeviceGraphBackend() override {
    if (stream_) {
      const CUresult rc = rt::drv().cuStreamDestroy_v2(stream_);
      (void)rc;  // a destructor must not throw; a deinitialized driver at exit is expected
    }
  }

  std::unique_ptr<CapturedGraph> capture(const std::function<void(CUstream)>& run) override {
    const auto& d = rt::drv();
    if (!stream_) GDN_CHECK_CU(d.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate (capture stream)");
    const CUstream stream = stream_;
    GDN_CHECK_CU(d.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
    CUgraph graph = nullptr;
    try {
      run(stream);
    } catch (...) {
      d.cuStreamEndCapture(stream, &graph);  // leave the stream usable; the partial graph is dropped
      if (graph) d.cuGraphDestroy(graph);
      throw;
    }
    GDN_CHECK_CU(d.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
    size_t nodes = 0;
    const CUresult count_rc = d.cuGraphGetNodes(graph, nullptr, &nodes);
    CUgraphExec exec = nullptr;
    const CUresult rc = d.cuGraphInstantiateWithFlags(&exec, graph, 0);
    d.cuGraphDestroy(graph);
    GDN_CHECK_CU(count_rc, "cuGraphGetNodes");
    GDN_CHECK_CU(rc, "cuGraphInstantiate ({} nodes)", nodes);
    return std::make_unique<DeviceGraph>(exec, nodes);
  }

  bool capturing(CUstream stream) override {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    GDN_CHECK_CU(rt::drv().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

 private:
  CUstream stream_ = nullptr;  ///< created in the context current at the first capture; the layer's device
};

}  // namespace

std::shared_ptr<GraphBackend> device_graph_backend() { return std::make_shared<DeviceGraphBackend>(); }

}  // namespace gdn
