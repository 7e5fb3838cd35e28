/**
 * @file graph.hpp
 * @brief Graph mode: each (call plan, call frame) is captured once into a CUDA graph and
 *        replayed afterwards, from a cache bounded by entries and by bytes (least recently used
 *        out first).
 *
 * Key contract (stable addresses): the key is the plan plus every word of the call frame (T, N,
 * every tensor and region pointer, the scale, the stream). A replay therefore launches exactly
 * what the eager call would, and it reads whatever the caller's buffers hold now: updating an
 * operand in place is seen by the next replay; moving it to a new address captures a new graph.
 */
#pragma once

#include "runtime/plan.hpp"

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>

namespace gdn {

/// One instantiated graph.
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
  virtual void replay(CUstream stream) = 0;
  /// The cache's accounting size: an estimate of what the driver keeps for this graph.
  virtual size_t bytes() const = 0;
};

/// Captures into a graph the launches `run` issues on the stream it is given (the device, or a fake
/// in tests). The device backend captures on a stream of its own, so that a graph can be made for
/// any caller stream, the legacy default stream included (which cannot be captured); the graph is
/// then replayed on the caller's stream.
class GraphBackend {
 public:
  virtual ~GraphBackend() = default;
  virtual std::unique_ptr<CapturedGraph> capture(const std::function<void(CUstream capture_stream)>& run) = 0;
  /// Whether `stream` is being captured by someone else (e.g. torch.cuda.graph): then the layer
  /// launches eagerly into that capture instead of nesting one of its own.
  virtual bool capturing(CUstream stream) = 0;
};

/// The CUDA driver backend (stream capture, instantiate, launch).
std::shared_ptr<GraphBackend> device_graph_backend();

struct GraphKey {
  uint64_t plan;  ///< which of a layer's plans (with the layer's serial)
  CallFrame frame;
  bool operator==(const GraphKey& o) const { return plan == o.plan && frame.word == o.frame.word; }
};

struct GraphKeyHash {
  size_t operator()(const GraphKey& k) const noexcept;
};

/// LRU cache of captured graphs, bounded by entry count and by accounted bytes.
class GraphCache {
 public:
  struct Limits {
    size_t max_entries = 256;
    size_t max_bytes = size_t{256} << 20;
  };
  explicit GraphCache(Limits limits) : limits_(limits) {}
  /// The graph for `key`, most recently used now; null if absent.
  CapturedGraph* find(const GraphKey& key);
  /// Inserts (replacing any entry with the key) and evicts least recently used entries until
  /// both bounds hold; an entry alone larger than max_bytes is still kept (the cache holds >= 1).
  CapturedGraph* insert(const GraphKey& key, std::unique_ptr<CapturedGraph> graph);
  size_t entries() const { return index_.size(); }
  size_t bytes() const { return bytes_; }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Item {
    GraphKey key;
    std::unique_ptr<CapturedGraph> graph;
  };
  Limits limits_;
  std::list<Item> lru_;  ///< front: most recently used
  std::unordered_map<GraphKey, std::list<Item>::iterator, GraphKeyHash> index_;
  size_t bytes_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace gdn
