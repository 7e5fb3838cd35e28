/**
 * @file c_api.cpp
 * @brief The C ABI over gdn::Layer: exceptions become status codes and a per-thread message.
 */
#include "runtime/gdn.h"

#include "common/json_input.hpp"
#include "compiler/nvrtc.hpp"
#include "runtime/kcp.hpp"
#include "runtime/layer.hpp"
#include "runtime/nccl.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

struct gdn_layer {
  gdn::rt::Context ctx;
  std::unique_ptr<gdn::Layer> layer;
};

struct gdn_workspace {
  gdn::Workspace ws;
  int64_t max_doc_tokens = 0;  ///< gdn_workspace_set_max_doc_tokens
};

struct gdn_kcp_context {
  const gdn_layer* layer;
  gdn::KcpContext kcp;
};

namespace {

thread_local std::string last_error;

template <class F>
int guarded(F&& f) {
  try {
    f();
    last_error.clear();
    return GDN_OK;
  } catch (const gdn::SpecError& e) {
    last_error = e.what();
    return GDN_ERR_SPEC;
  } catch (const gdn::InputError& e) {
    last_error = e.what();
    return GDN_ERR_INPUT;
  } catch (const gdn::CompileError& e) {
    last_error = e.what();
    return GDN_ERR_COMPILE;
  } catch (const gdn::rt::CudaError& e) {
    last_error = e.what();
    return GDN_ERR_CUDA;
  } catch (const gdn::rt::DriverError& e) {
    last_error = e.what();
    return GDN_ERR_CUDA;
  } catch (const gdn::rt::NcclError& e) {
    last_error = e.what();
    return GDN_ERR_NCCL;
  } catch (const std::exception& e) {
    last_error = e.what();
    return GDN_ERR_OTHER;
  }
}

gdn::LayerInputs inputs(const void* q, const void* k, const void* v, const float* g, const float* beta, const void* cu,
                        int cu64, const float* h0, float scale) {
  return {q, k, v, g, beta, cu, cu64 ? gdn::IndexType::int64 : gdn::IndexType::int32, h0, scale};
}

gdn::CallForm form_of(int f) {
  switch (f) {
    case GDN_FORWARD: return gdn::CallForm::forward;
    case GDN_RECOMPUTE: return gdn::CallForm::recompute;
    case GDN_BACKWARD: return gdn::CallForm::backward;
  }
  throw gdn::InputError("form: " + std::to_string(f) + " is not a call form (0 forward, 1 recompute, 2 backward)");
}

/// A region's slots ordered by offset, then name, into the caller's array (see gdn_spec_region_layout).
void write_layout(const gdn::RegionLayout& l, gdn_slot* slots, size_t capacity, size_t* count, size_t* total) {
  if (!count) throw gdn::InputError("count: is null");
  std::vector<std::pair<size_t, std::string>> order;
  for (const auto& [name, offset] : l.offset) order.emplace_back(offset, name);
  std::sort(order.begin(), order.end());
  if (slots && capacity < order.size())
    throw gdn::InputError("capacity: " + std::to_string(capacity) + " slots given, the layout has " +
                          std::to_string(order.size()));
  if (slots)
    for (size_t i = 0; i < order.size(); ++i) {
      const std::string& name = order[i].second;
      if (name.size() >= sizeof(slots[i].name))
        throw std::logic_error("region layout: buffer name '" + name + "' does not fit gdn_slot::name");
      std::memset(slots[i].name, 0, sizeof(slots[i].name));
      std::memcpy(slots[i].name, name.c_str(), name.size());
      slots[i].offset = order[i].first;
      slots[i].bytes = l.size.at(name);
    }
  *count = order.size();
  if (total) *total = l.bytes;
}

const gdn::KcpContext& kcp_of(const gdn_kcp_context* c) {
  if (!c) throw gdn::InputError("context: is null");
  c->layer->ctx.make_current();
  return c->kcp;
}

template <class T>
T& out_of(T* p, const char* name) {
  if (!p) throw gdn::InputError(std::string(name) + ": is null");
  return *p;
}

/// NCCL as gdn_nccl_load left it (else loaded from the default places on first use).
const gdn::rt::Nccl* loaded_nccl = nullptr;
const gdn::rt::Nccl& nccl() {
  if (!loaded_nccl) loaded_nccl = &gdn::rt::Nccl::load();
  return *loaded_nccl;
}
gdn::rt::nccl_abi::Comm comm_of(void* c) { return static_cast<gdn::rt::nccl_abi::Comm>(c); }

void require_unique_id(const void* id, size_t bytes) {
  if (!id) throw gdn::InputError("id: is null");
  if (bytes != sizeof(gdn::rt::nccl_abi::UniqueId))
    throw gdn::InputError("bytes: " + std::to_string(bytes) + ", an NCCL unique id has " +
                          std::to_string(sizeof(gdn::rt::nccl_abi::UniqueId)));
}

gdn_kcp_view view_of(const gdn::CpRankView& v) {
  return {v.token_begin, v.tokens, v.documents(), v.docs.front(), v.pieces_before, v.pieces_after};
}

/// A rank's host array into the caller's `out[0 .. capacity)`.
template <class From, class To>
void copy_out(const std::vector<From>& from, To* out, size_t capacity, const char* what) {
  if (!out || capacity < from.size())
    throw gdn::InputError("out: room for " + std::to_string(out ? capacity : 0) + " " + what + ", the rank has " +
                          std::to_string(from.size()));
  std::copy(from.begin(), from.end(), out);
}

}  // namespace

extern "C" {

const char* gdn_last_error(void) { return last_error.c_str(); }

namespace {

gdn::Spec parse_spec(const char* spec_json) {
  if (!spec_json) throw gdn::InputError("spec_json: is null");
  return gdn::spec_from_text(spec_json);
}

gdn::Workspace& workspace_of(gdn_workspace* w) {
  if (!w) throw gdn::InputError("workspace: is null");
  return w->ws;
}

/// The KCP calls run a rank's own tokens and take no document bound: a bound set on their
/// workspace would be neither checked nor used, so it is refused instead of ignored.
gdn::Workspace& kcp_workspace_of(gdn_workspace* w) {
  gdn::Workspace& ws = workspace_of(w);
  if (w->max_doc_tokens > 0)
    throw gdn::InputError(
        fmt::format("workspace: max_doc_tokens is {} on this workspace; the KCP calls neither check "
                    "nor use a bound (gdn_workspace_set_max_doc_tokens(ws, 0) first)",
                    w->max_doc_tokens));
  return ws;
}

}  // namespace

int gdn_spec_validate(const char* spec_json, char* canonical, size_t capacity) {
  return guarded([&] {
    const std::string text = gdn::to_json(parse_spec(spec_json)).dump();
    if (!canonical) return;
    if (text.size() + 1 > capacity)
      throw gdn::InputError("canonical: " + std::to_string(capacity) + " bytes given, " +
                            std::to_string(text.size() + 1) + " needed");
    std::memcpy(canonical, text.c_str(), text.size() + 1);
  });
}

int gdn_spec_region_layout_on(const char* spec_json, const char* target, int region, int form, int64_t T, int N,
                              gdn_slot* slots, size_t capacity, size_t* count, size_t* total) {
  return guarded([&] {
    if (region != GDN_REGION_SAVED && region != GDN_REGION_WORKSPACE)
      throw gdn::InputError("region: " + std::to_string(region) + " is not a region (0 saved, 1 workspace)");
    const gdn::CallForm f = region == GDN_REGION_SAVED ? gdn::CallForm::forward : form_of(form);
    const gdn::Spec spec = parse_spec(spec_json);
    std::optional<gdn::Target> on;
    if (target) {
      on = gdn::parse_target(target);
      if (!on || std::find(spec.targets.begin(), spec.targets.end(), *on) == spec.targets.end())
        throw gdn::InputError(fmt::format("target: {} is not among the targets of layer '{}' (/targets)",
                                          gdn::quoted_excerpt(target), spec.name));
    }
    const gdn::LayerIR ir = gdn::lower(spec);
    const gdn::RegionLayout l = gdn::region_layout(
        ir, region == GDN_REGION_SAVED ? gdn::BufferRole::saved : gdn::BufferRole::workspace, f, {T, N}, on);
    write_layout(l, slots, capacity, count, total);
  });
}

int gdn_spec_region_layout(const char* spec_json, int region, int form, int64_t T, int N, gdn_slot* slots,
                           size_t capacity, size_t* count, size_t* total) {
  return gdn_spec_region_layout_on(spec_json, nullptr, region, form, T, N, slots, capacity, count, total);
}

int gdn_workspace_create(void* data, size_t bytes, gdn_workspace** out) {
  return guarded([&] {
    if (!out) throw gdn::InputError("out: is null");
    *out = new gdn_workspace{gdn::Workspace(data, bytes)};
  });
}

void gdn_workspace_destroy(gdn_workspace* w) { delete w; }

int gdn_workspace_set_max_doc_tokens(gdn_workspace* w, int64_t max_doc_tokens) {
  return guarded([&] {
    if (!w) throw gdn::InputError("workspace: is null");
    if (max_doc_tokens < 0)
      throw gdn::InputError(fmt::format("max_doc_tokens: {} is negative (0: no bound)", max_doc_tokens));
    w->max_doc_tokens = max_doc_tokens;
  });
}

int gdn_layer_create(const char* spec_json, int ordinal, const char* cache_dir, gdn_layer** out) {
  return guarded([&] {
    if (!out) throw gdn::InputError("out: is null");
    const gdn::Spec spec = parse_spec(spec_json);
    auto* l = new gdn_layer{gdn::rt::Context::create(ordinal), nullptr};
    try {
      gdn::cache::DiskCache cache(cache_dir ? std::filesystem::path(cache_dir) : gdn::cache::default_root());
      l->layer = gdn::Layer::create(spec, l->ctx, cache);
    } catch (...) {
      delete l;
      throw;
    }
    *out = l;
  });
}

void gdn_layer_destroy(gdn_layer* l) { delete l; }

int gdn_layer_saved_bytes(const gdn_layer* l, int64_t T, int N, size_t* out) {
  return guarded([&] { *out = l->layer->saved_bytes({T, N}); });
}

int gdn_layer_workspace_bytes(const gdn_layer* l, int form, int64_t T, int N, size_t* out) {
  return guarded([&] { *out = l->layer->workspace_bytes(form_of(form), {T, N}); });
}

int gdn_layer_forward(const gdn_layer* l, int64_t T, int N, const void* q, const void* k, const void* v, const float* g,
                      const float* beta, const void* cu, int cu64, const float* h0, float scale, void* o, float* ht,
                      void* saved, size_t saved_bytes, void* ws, size_t ws_bytes, void* stream) {
  return guarded([&] {
    l->ctx.make_current();
    l->layer->forward({T, N}, inputs(q, k, v, g, beta, cu, cu64, h0, scale), {o, ht}, saved, saved_bytes, ws, ws_bytes,
                      static_cast<CUstream>(stream));
  });
}

int gdn_layer_backward(const gdn_layer* l, int64_t T, int N, const void* q, const void* k, const void* v,
                       const float* g, const float* beta, const void* cu, int cu64, const float* h0, float scale,
                       const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg, float* dbeta,
                       float* dh0, const void* saved, size_t saved_bytes, void* ws, size_t ws_bytes, void* stream) {
  return guarded([&] {
    l->ctx.make_current();
    l->layer->backward({T, N}, inputs(q, k, v, g, beta, cu, cu64, h0, scale), {d_o, dht, dq, dk, dv, dg, dbeta, dh0},
                       saved, saved_bytes, ws, ws_bytes, static_cast<CUstream>(stream));
  });
}

int gdn_layer_forward_ws(const gdn_layer* l, int64_t T, int N, const void* q, const void* k, const void* v,
                         const float* g, const float* beta, const void* cu, int cu64, const float* h0, float scale,
                         void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* ws, void* stream) {
  return guarded([&] {
    l->ctx.make_current();
    gdn::Workspace& w = workspace_of(ws);
    l->layer->forward({T, N, ws->max_doc_tokens}, inputs(q, k, v, g, beta, cu, cu64, h0, scale), {o, ht}, saved,
                      saved_bytes, w, static_cast<CUstream>(stream));
  });
}

int gdn_layer_recompute(const gdn_layer* l, int64_t T, int N, const void* q, const void* k, const void* v,
                        const float* g, const float* beta, const void* cu, int cu64, const float* h0, float scale,
                        int output_needed, void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* ws,
                        void* stream, int* handoff) {
  return guarded([&] {
    l->ctx.make_current();
    gdn::Workspace& w = workspace_of(ws);
    const gdn::HandOff h =
        l->layer->recompute({T, N, ws->max_doc_tokens}, inputs(q, k, v, g, beta, cu, cu64, h0, scale), {o, ht},
                            output_needed ? gdn::OutputNeeded::yes : gdn::OutputNeeded::no, saved, saved_bytes, w,
                            static_cast<CUstream>(stream));
    if (handoff) *handoff = h == gdn::HandOff::taken;
  });
}

int gdn_layer_backward_ws(const gdn_layer* l, int64_t T, int N, const void* q, const void* k, const void* v,
                          const float* g, const float* beta, const void* cu, int cu64, const float* h0, float scale,
                          const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg, float* dbeta,
                          float* dh0, const void* saved, size_t saved_bytes, gdn_workspace* ws, void* stream,
                          int* handoff) {
  return guarded([&] {
    l->ctx.make_current();
    const gdn::HandOff h = l->layer->backward({T, N}, inputs(q, k, v, g, beta, cu, cu64, h0, scale),
                                              {d_o, dht, dq, dk, dv, dg, dbeta, dh0}, saved, saved_bytes,
                                              workspace_of(ws), static_cast<CUstream>(stream));
    if (handoff) *handoff = h == gdn::HandOff::taken;
  });
}

int gdn_layer_check_status(const gdn_layer* l, int64_t T, int N, const void* saved, void* stream) {
  return guarded([&] { l->layer->check_device_status(saved, {T, N}, static_cast<CUstream>(stream)); });
}

int gdn_cp_rank_view(const int64_t* cu, size_t count, int rank, int world, gdn_kcp_view* view, int64_t* local_cu,
                     int32_t* local_docs, size_t capacity) {
  return guarded([&] {
    if (!cu) throw gdn::InputError("cu_seqlens: is null");
    const gdn::CpRankView v = gdn::kcp_rank_view(std::vector<int64_t>(cu, cu + count), world, rank);
    out_of(view, "view") = view_of(v);
    if ((local_cu || local_docs) && capacity < v.cu_seqlens.size())
      throw gdn::InputError("capacity: " + std::to_string(capacity) + " entries, the rank has " +
                            std::to_string(v.documents()) + " documents (" + std::to_string(v.cu_seqlens.size()) +
                            " offsets)");
    if (local_cu) std::copy(v.cu_seqlens.begin(), v.cu_seqlens.end(), local_cu);
    if (local_docs) std::copy(v.docs.begin(), v.docs.end(), local_docs);
  });
}

int gdn_spec_kcp_workspace_layout(const char* spec_json, int form, const int64_t* cu, size_t count, int rank,
                                  gdn_slot* slots, size_t capacity, size_t* slot_count, size_t* total) {
  return guarded([&] {
    if (!cu) throw gdn::InputError("cu_seqlens: is null");
    const gdn::LayerIR ir = gdn::lower(parse_spec(spec_json));
    if (ir.spec.cp_ranks <= 1)
      throw gdn::InputError("cp.ranks: spec '" + ir.spec.name + "' has 1 rank; the KCP workspace needs cp.ranks > 1");
    const gdn::CpRankView v = gdn::kcp_rank_view(std::vector<int64_t>(cu, cu + count), ir.spec.cp_ranks, rank);
    gdn::cp_check_world(ir.spec.cp_ranks, ir.spec, cu[count - 1]);
    write_layout(gdn::kcp_workspace_layout(ir, form_of(form), {v.tokens, v.documents()}), slots, capacity, slot_count,
                 total);
  });
}

int gdn_spec_kcp_record_bytes(const char* spec_json, size_t* out) {
  return guarded([&] { out_of(out, "out") = gdn::kcp_record_bytes(parse_spec(spec_json)); });
}

int gdn_kcp_context_create(const gdn_layer* l, const int64_t* cu, size_t count, int rank, int world,
                           gdn_kcp_context** out) {
  return guarded([&] {
    if (!l) throw gdn::InputError("layer: is null");
    if (!cu) throw gdn::InputError("cu_seqlens: is null");
    out_of(out, "out");
    *out = new gdn_kcp_context{l, gdn::KcpContext(*l->layer, std::vector<int64_t>(cu, cu + count), rank, world)};
  });
}

void gdn_kcp_context_destroy(gdn_kcp_context* c) { delete c; }

int gdn_kcp_context_view(const gdn_kcp_context* c, gdn_kcp_view* out) {
  return guarded([&] { out_of(out, "out") = view_of(kcp_of(c).view()); });
}

int gdn_kcp_local_cu_seqlens(const gdn_kcp_context* c, int64_t* out, size_t capacity) {
  return guarded([&] { copy_out(kcp_of(c).view().cu_seqlens, out, capacity, "offsets"); });
}

int gdn_kcp_local_documents(const gdn_kcp_context* c, int32_t* out, size_t capacity) {
  return guarded([&] { copy_out(kcp_of(c).view().docs, out, capacity, "documents"); });
}

size_t gdn_kcp_agreement_bytes(void) { return sizeof(gdn::CpAgreement); }

int gdn_kcp_agreement(const gdn_kcp_context* c, void* record, size_t bytes) {
  return guarded([&] {
    if (!record) throw gdn::InputError("record: is null");
    if (bytes != sizeof(gdn::CpAgreement))
      throw gdn::InputError("bytes: " + std::to_string(bytes) + ", a record has " +
                            std::to_string(sizeof(gdn::CpAgreement)) + " (gdn_kcp_agreement_bytes)");
    std::memcpy(record, &kcp_of(c).agreement(), bytes);
  });
}

int gdn_kcp_check_agreement(const gdn_kcp_context* c, const void* gathered, size_t bytes) {
  return guarded([&] {
    const gdn::KcpContext& k = kcp_of(c);
    const size_t want = sizeof(gdn::CpAgreement) * static_cast<size_t>(k.world());
    if (bytes != want)
      throw gdn::InputError("bytes: " + std::to_string(bytes) + ", " + std::to_string(k.world()) + " records have " +
                            std::to_string(want));
    if (!gathered) throw gdn::InputError("gathered: is null");
    std::vector<gdn::CpAgreement> all(static_cast<size_t>(k.world()));
    std::memcpy(all.data(), gathered, want);
    k.check_agreement(all.data(), all.size());
  });
}

int gdn_kcp_record_bytes(const gdn_kcp_context* c, size_t* out) {
  return guarded([&] { out_of(out, "out") = kcp_of(c).record_bytes(); });
}

int gdn_saved_bytes_kcp(const gdn_kcp_context* c, size_t* out) {
  return guarded([&] { out_of(out, "out") = kcp_of(c).saved_bytes(); });
}

int gdn_workspace_bytes_kcp(const gdn_kcp_context* c, int form, size_t* out) {
  return guarded([&] { out_of(out, "out") = kcp_of(c).workspace_bytes(form_of(form)); });
}

int gdn_workspace_layout_kcp(const gdn_kcp_context* c, int form, gdn_slot* slots, size_t capacity, size_t* count,
                             size_t* total) {
  return guarded([&] { write_layout(kcp_of(c).workspace_layout(form_of(form)), slots, capacity, count, total); });
}

int gdn_kcp_forward_summaries(const gdn_kcp_context* c, const void* q, const void* k, const void* v, const float* g,
                              const float* beta, const void* cu, int cu64, const float* h0, float scale, void* saved,
                              size_t saved_bytes, gdn_workspace* ws, void* stream) {
  return guarded([&] {
    kcp_of(c).forward_summaries(inputs(q, k, v, g, beta, cu, cu64, h0, scale), saved, saved_bytes, kcp_workspace_of(ws),
                                static_cast<CUstream>(stream));
  });
}

int gdn_kcp_forward_walk(const gdn_kcp_context* c, const void* q, const void* k, const void* v, const float* g,
                         const float* beta, const void* cu, int cu64, const float* h0, float scale, void* o, float* ht,
                         void* saved, size_t saved_bytes, gdn_workspace* ws, void* stream) {
  return guarded([&] {
    kcp_of(c).forward_walk(inputs(q, k, v, g, beta, cu, cu64, h0, scale), {o, ht}, saved, saved_bytes,
                           kcp_workspace_of(ws), static_cast<CUstream>(stream));
  });
}

int gdn_kcp_recompute(const gdn_kcp_context* c, const void* q, const void* k, const void* v, const float* g,
                      const float* beta, const void* cu, int cu64, const float* h0, float scale, int output_needed,
                      void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* ws, void* stream,
                      int* handoff) {
  return guarded([&] {
    const gdn::HandOff h = kcp_of(c).recompute(inputs(q, k, v, g, beta, cu, cu64, h0, scale), {o, ht},
                                               output_needed ? gdn::OutputNeeded::yes : gdn::OutputNeeded::no, saved,
                                               saved_bytes, kcp_workspace_of(ws), static_cast<CUstream>(stream));
    if (handoff) *handoff = h == gdn::HandOff::taken;
  });
}

int gdn_kcp_backward_summaries(const gdn_kcp_context* c, const void* q, const void* k, const void* v, const float* g,
                               const float* beta, const void* cu, int cu64, const float* h0, float scale,
                               const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg, float* dbeta,
                               float* dh0, const void* saved, size_t saved_bytes, gdn_workspace* ws, void* stream,
                               int* handoff) {
  return guarded([&] {
    const gdn::HandOff h = kcp_of(c).backward_summaries(inputs(q, k, v, g, beta, cu, cu64, h0, scale),
                                                        {d_o, dht, dq, dk, dv, dg, dbeta, dh0}, saved, saved_bytes,
                                                        kcp_workspace_of(ws), static_cast<CUstream>(stream));
    if (handoff) *handoff = h == gdn::HandOff::taken;
  });
}

int gdn_kcp_backward_walk(const gdn_kcp_context* c, const void* q, const void* k, const void* v, const float* g,
                          const float* beta, const void* cu, int cu64, const float* h0, float scale, const void* d_o,
                          const float* dht, void* dq, void* dk, void* dv, float* dg, float* dbeta, float* dh0,
                          const void* saved, size_t saved_bytes, gdn_workspace* ws, void* stream) {
  return guarded([&] {
    kcp_of(c).backward_walk(inputs(q, k, v, g, beta, cu, cu64, h0, scale), {d_o, dht, dq, dk, dv, dg, dbeta, dh0},
                            saved, saved_bytes, kcp_workspace_of(ws), static_cast<CUstream>(stream));
  });
}

int gdn_nccl_load(const char* path, int* version) {
  return guarded([&] {
    loaded_nccl = &gdn::rt::Nccl::load(path ? path : "");
    if (version) *version = loaded_nccl->version();
  });
}

int gdn_nccl_unique_id(void* id, size_t bytes) {
  return guarded([&] {
    require_unique_id(id, bytes);
    gdn::rt::nccl_abi::UniqueId u{};
    nccl().check(nccl().get_unique_id(&u), "ncclGetUniqueId");
    std::memcpy(id, &u, sizeof(u));
  });
}

int gdn_nccl_comm_init(const void* id, size_t bytes, int rank, int world, void** comm) {
  return guarded([&] {
    require_unique_id(id, bytes);
    if (world < 1 || rank < 0 || rank >= world)
      throw gdn::InputError("rank: " + std::to_string(rank) + " is outside 0 .. " + std::to_string(world - 1));
    gdn::rt::nccl_abi::UniqueId u{};
    std::memcpy(&u, id, sizeof(u));
    gdn::rt::nccl_abi::Comm c = nullptr;
    nccl().check(nccl().comm_init_rank(&c, world, u, rank), "ncclCommInitRank");
    out_of(comm, "nccl_comm") = c;
  });
}

int gdn_nccl_comm_destroy(void* comm) {
  return guarded([&] {
    if (comm) nccl().check(nccl().comm_destroy(comm_of(comm)), "ncclCommDestroy");
  });
}

int gdn_kcp_check_agreement_nccl(const gdn_kcp_context* c, void* comm, void* stream) {
  return guarded([&] { kcp_of(c).check_agreement_nccl(nccl(), comm_of(comm), static_cast<CUstream>(stream)); });
}

int gdn_kcp_forward_nccl(const gdn_kcp_context* c, void* comm, const void* q, const void* k, const void* v,
                         const float* g, const float* beta, const void* cu, int cu64, const float* h0, float scale,
                         void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* ws, void* stream) {
  return guarded([&] {
    kcp_of(c).forward_nccl(nccl(), comm_of(comm), inputs(q, k, v, g, beta, cu, cu64, h0, scale), {o, ht}, saved,
                           saved_bytes, kcp_workspace_of(ws), static_cast<CUstream>(stream));
  });
}

int gdn_kcp_backward_nccl(const gdn_kcp_context* c, void* comm, const void* q, const void* k, const void* v,
                          const float* g, const float* beta, const void* cu, int cu64, const float* h0, float scale,
                          const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg, float* dbeta,
                          float* dh0, const void* saved, size_t saved_bytes, gdn_workspace* ws, void* stream,
                          int* handoff) {
  return guarded([&] {
    const gdn::HandOff h = kcp_of(c).backward_nccl(nccl(), comm_of(comm), inputs(q, k, v, g, beta, cu, cu64, h0, scale),
                                                   {d_o, dht, dq, dk, dv, dg, dbeta, dh0}, saved, saved_bytes,
                                                   kcp_workspace_of(ws), static_cast<CUstream>(stream));
    if (handoff) *handoff = h == gdn::HandOff::taken;
  });
}

}  // extern "C"
