/**
 * @file c_api.cpp
 * @brief The C ABI over gdn::Layer: exceptions become status codes and a per-thread message.
 */
#include "runtime/gdn.h"

#include "compiler/nvrtc.hpp"
#include "runtime/layer.hpp"

#include <algorithm>
#include <cstring>
#include <string>

struct gdn_layer {
  gdn::rt::Context ctx;
  std::unique_ptr<gdn::Layer> layer;
};

struct gdn_workspace {
  gdn::Workspace ws;
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

int gdn_spec_region_layout(const char* spec_json, int region, int form, int64_t T, int N, gdn_slot* slots,
                           size_t capacity, size_t* count, size_t* total) {
  return guarded([&] {
    if (!count) throw gdn::InputError("count: is null");
    if (region != GDN_REGION_SAVED && region != GDN_REGION_WORKSPACE)
      throw gdn::InputError("region: " + std::to_string(region) + " is not a region (0 saved, 1 workspace)");
    const gdn::CallForm f = region == GDN_REGION_SAVED ? gdn::CallForm::forward : form_of(form);
    const gdn::LayerIR ir = gdn::lower(parse_spec(spec_json));
    const gdn::RegionLayout l = gdn::region_layout(
        ir, region == GDN_REGION_SAVED ? gdn::BufferRole::saved : gdn::BufferRole::workspace, f, {T, N});
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
          throw std::logic_error("gdn_spec_region_layout: buffer name '" + name + "' does not fit gdn_slot::name");
        std::memset(slots[i].name, 0, sizeof(slots[i].name));
        std::memcpy(slots[i].name, name.c_str(), name.size());
        slots[i].offset = order[i].first;
        slots[i].bytes = l.size.at(name);
      }
    *count = order.size();
    if (total) *total = l.bytes;
  });
}

int gdn_workspace_create(void* data, size_t bytes, gdn_workspace** out) {
  return guarded([&] {
    if (!out) throw gdn::InputError("out: is null");
    *out = new gdn_workspace{gdn::Workspace(data, bytes)};
  });
}

void gdn_workspace_destroy(gdn_workspace* w) { delete w; }

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
    l->layer->forward({T, N}, inputs(q, k, v, g, beta, cu, cu64, h0, scale), {o, ht}, saved, saved_bytes,
                      workspace_of(ws), static_cast<CUstream>(stream));
  });
}

int gdn_layer_recompute(const gdn_layer* l, int64_t T, int N, const void* q, const void* k, const void* v,
                        const float* g, const float* beta, const void* cu, int cu64, const float* h0, float scale,
                        int output_needed, void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* ws,
                        void* stream, int* handoff) {
  return guarded([&] {
    l->ctx.make_current();
    const gdn::HandOff h = l->layer->recompute({T, N}, inputs(q, k, v, g, beta, cu, cu64, h0, scale), {o, ht},
                                               output_needed ? gdn::OutputNeeded::yes : gdn::OutputNeeded::no, saved,
                                               saved_bytes, workspace_of(ws), static_cast<CUstream>(stream));
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

}  // extern "C"
