/**
 * @file layer_check.cpp
 * @brief GPU run + fp64 reference comparison.
 */
#include "runtime/check/layer_check.hpp"

#include "compiler/nvrtc.hpp"
#include "runtime/bf16.hpp"
#include "runtime/check/gdn_reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <tuple>

namespace gdn::check {

namespace {

/// Rounds `x` to bf16 in place and returns the bits.
std::vector<uint16_t> round_bf16(std::vector<double>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = to_bf16(static_cast<float>(x[i]));
    x[i] = from_bf16(out[i]);
  }
  return out;
}

/// Counts the 32-bit words in which two device buffers differ, on the device. A determinism check
/// of shape M compares about 1.1 GB per repeat: downloading every repeat took most of the two
/// minutes gpu_determinism ran; this downloads one counter. It checks itself on a known
/// difference first, so a broken comparator cannot pass every repeat.
class DeviceDiff {
 public:
  explicit DeviceDiff(Target target) : module_(load(target)), count_(rt::DeviceBuffer::create(8)) {
    std::vector<unsigned> host(1024, 0u);
    auto a = rt::DeviceBuffer::create(4096), b = rt::DeviceBuffer::create(4096);
    GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(a.handle(), host.data(), 4096), "diff self-check");
    for (size_t word : {0, 517, 1023}) host[word] = 7u;
    GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(b.handle(), host.data(), 4096), "diff self-check");
    const unsigned long long same = words_differing(a.handle(), a.handle(), 4096, nullptr);
    const unsigned long long three = words_differing(a.handle(), b.handle(), 4096, nullptr);
    if (same != 0 || three != 3)
      throw std::logic_error(
          fmt::format("the device comparator counts {} and {} differing words (0 and 3 expected)", same, three));
  }
  unsigned long long words_differing(CUdeviceptr a, CUdeviceptr b, size_t bytes, CUstream stream) const {
    if (bytes % 4 != 0)
      throw std::invalid_argument(fmt::format("DeviceDiff: {} bytes is not whole 32-bit words", bytes));
    struct Params {
      CUdeviceptr a, b;
      unsigned long long words;
      CUdeviceptr count;
    } params{a, b, bytes / 4, count_.handle()};
    GDN_CHECK_CU(rt::drv().cuMemsetD8Async(count_.handle(), 0, 8, stream), "diff counter");
    module_.launch(rt::dim3_t{1024, 1, 1}, stream, params);
    unsigned long long count = 0;
    GDN_CHECK_CU(rt::drv().cuStreamSynchronize(stream), "diff");
    GDN_CHECK_CU(rt::drv().cuMemcpyDtoH_v2(&count, count_.handle(), 8), "diff counter");
    return count;
  }

 private:
  static rt::Module load(Target target) {
    Program p;
    p.name = "bitwise_diff";
    p.threads = 256;
    const std::string source = R"(// gdnc test harness: counts differing 32-bit words of two buffers.
struct Params {
  const unsigned* a;
  const unsigned* b;
  unsigned long long words;
  unsigned long long* count;
};
extern "C" __global__ void __launch_bounds__(256) gdn_bitwise_diff(Params p) {
  unsigned long long local = 0;
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < p.words; i += gridDim.x * 256ull)
    local += p.a[i] != p.b[i];
  for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
  if ((threadIdx.x & 31) == 0 && local != 0) atomicAdd(p.count, local);
}
)";
    return rt::Module::load(nvrtc_compile(p, target, source).cubin, p.entry(), p.threads, 0);
  }
  rt::Module module_;
  rt::DeviceBuffer count_;
};

std::vector<float> round_f32(std::vector<double>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = static_cast<float>(x[i]);
    x[i] = out[i];
  }
  return out;
}

struct Dev {
  rt::DeviceBuffer buf;
  template <class T>
  static Dev from(const std::vector<T>& host) {
    Dev d{rt::DeviceBuffer::create(std::max<size_t>(host.size() * sizeof(T), 16))};
    if (!host.empty())
      GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(d.buf.handle(), host.data(), host.size() * sizeof(T)), "upload");
    // A copy on the legacy stream does not order against the layer's non-blocking stream.
    GDN_CHECK_CU(rt::drv().cuCtxSynchronize(), "upload");
    return d;
  }
  /// Device memory filled with 0xFF bytes: NaN in both bf16 and fp32, so unwritten elements show.
  /// The memset runs on the legacy stream, which does not order against the non-blocking stream
  /// the layer runs on, so it is waited for here.
  static Dev poisoned(size_t bytes) {
    Dev d{rt::DeviceBuffer::create(std::max<size_t>(bytes, 16))};
    GDN_CHECK_CU(rt::drv().cuMemsetD8_v2(d.buf.handle(), 0xFF, d.buf.bytes()), "poison");
    GDN_CHECK_CU(rt::drv().cuCtxSynchronize(), "poison");
    return d;
  }
  std::string download(size_t bytes) const {
    std::string s(bytes, '\0');
    GDN_CHECK_CU(rt::drv().cuMemcpyDtoH_v2(s.data(), buf.handle(), bytes), "download");
    return s;
  }
  void* get() const { return buf.get(); }
  CUdeviceptr handle() const { return buf.handle(); }
};

std::vector<double> bf16_bytes_to_double(const std::string& s) {
  std::vector<double> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, s.data() + 2 * i, 2);
    out[i] = from_bf16(b);
  }
  return out;
}

std::vector<double> f32_bytes_to_double(const std::string& s) {
  std::vector<double> out(s.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    float f;
    std::memcpy(&f, s.data() + 4 * i, 4);
    out[i] = f;
  }
  return out;
}

}  // namespace

double tolerance(const std::string& t) {
  if (t == "o" || t == "ht") return 5e-3;
  if (t == "dg" || t == "dbeta") return 1.5e-2;
  return 8e-3;
}

Report run(const Layer& layer, const Case& c) {
  const Spec& sp = layer.ir().spec;
  ref::Problem p;
  p.H = sp.heads_qk;
  p.HV = sp.heads_v;
  p.K = sp.head_dim_k;
  p.V = sp.head_dim_v;
  p.cu_seqlens = {0};
  for (long long len : c.doc_lens) p.cu_seqlens.push_back(p.cu_seqlens.back() + len);
  p.T = p.cu_seqlens.back();
  p.scale = sp.effective_scale();
  p.l2norm = sp.norm == Norm::l2_in_kernel;
  p.has_h0 = sp.initial_state == StateFlag::present;
  const bool has_ht = sp.final_state == StateFlag::present;
  const int N = static_cast<int>(c.doc_lens.size());
  if (!c.doc_seeds.empty() && c.doc_seeds.size() != c.doc_lens.size())
    throw std::invalid_argument(
        fmt::format("check::Case: {} doc_seeds for {} documents", c.doc_seeds.size(), c.doc_lens.size()));
  // With a seed per document every value comes from the documents' own streams below: the batch's
  // are not drawn (at 8201 documents and 16 value heads h0 and dht alone are 4.3 G normals).
  const size_t doc_state = static_cast<size_t>(p.HV) * p.K * p.V;
  ref::Inputs in;
  std::vector<double> d_o, dht;
  if (c.doc_seeds.empty()) {
    in = ref::random_inputs(p, c.seed, c.gate_shift);
    d_o = ref::random_normal(static_cast<size_t>(p.T) * p.HV * p.V, c.seed + 101);
    if (has_ht) dht = ref::random_normal(static_cast<size_t>(N) * doc_state, c.seed + 202);
  } else {
    ref::validate(p);
    const auto T = static_cast<size_t>(p.T);
    in.q.resize(T * p.H * p.K);
    in.k.resize(T * p.H * p.K);
    in.v.resize(T * p.HV * p.V);
    in.g.resize(T * p.HV);
    in.beta.resize(T * p.HV);
    if (p.has_h0) in.h0.resize(static_cast<size_t>(N) * doc_state);
    d_o.resize(T * p.HV * p.V);
    if (has_ht) dht.resize(static_cast<size_t>(N) * doc_state);
    for (size_t n = 0; n < c.doc_lens.size(); ++n) {
      ref::Problem one = p;
      one.T = c.doc_lens[n];
      one.cu_seqlens = {0, one.T};
      const ref::Inputs d = ref::random_inputs(one, c.doc_seeds[n], c.gate_shift);
      const auto put = [&](std::vector<double>& dst, const std::vector<double>& src, size_t at) {
        std::copy(src.begin(), src.end(), dst.begin() + static_cast<std::ptrdiff_t>(at));
      };
      const size_t t0 = static_cast<size_t>(p.cu_seqlens[n]);
      put(in.q, d.q, t0 * p.H * p.K);
      put(in.k, d.k, t0 * p.H * p.K);
      put(in.v, d.v, t0 * p.HV * p.V);
      put(in.g, d.g, t0 * p.HV);
      put(in.beta, d.beta, t0 * p.HV);
      if (p.has_h0) put(in.h0, d.h0, n * doc_state);
      put(d_o, ref::random_normal(static_cast<size_t>(one.T) * p.HV * p.V, c.doc_seeds[n] + 101), t0 * p.HV * p.V);
      if (has_ht) put(dht, ref::random_normal(doc_state, c.doc_seeds[n] + 202), n * doc_state);
    }
  }
  if (c.gate_value) std::fill(in.g.begin(), in.g.end(), *c.gate_value);
  for (const int j : c.zero_gate_heads) {
    if (j < 0 || j >= p.HV)
      throw std::invalid_argument(fmt::format("zero_gate_heads: value head {} is outside 0 .. {}", j, p.HV - 1));
    for (long long t = 0; t < p.T; ++t) in.g[static_cast<size_t>(t * p.HV + j)] = 0.0;
  }
  if (c.beta_value) std::fill(in.beta.begin(), in.beta.end(), *c.beta_value);
  const auto q16 = round_bf16(in.q), k16 = round_bf16(in.k), v16 = round_bf16(in.v);
  const auto g32 = round_f32(in.g), b32 = round_f32(in.beta), h032 = round_f32(in.h0);
  const auto do16 = round_bf16(d_o);
  const auto dht32 = round_f32(dht);

  const ProblemShape shape{p.T, N, c.max_doc_tokens};
  Dev q = Dev::from(q16), k = Dev::from(k16), v = Dev::from(v16), g = Dev::from(g32), beta = Dev::from(b32);
  Dev h0 = Dev::from(h032), dod = Dev::from(do16), dhtd = Dev::from(dht32);
  std::vector<int> cu32(p.cu_seqlens.begin(), p.cu_seqlens.end());
  std::vector<long long> cu64(p.cu_seqlens.begin(), p.cu_seqlens.end());
  Dev cu = c.cu_type == IndexType::int32 ? Dev::from(cu32) : Dev::from(cu64);
  const size_t tv = static_cast<size_t>(p.T) * p.HV, state = static_cast<size_t>(N) * p.HV * p.K * p.V;
  const size_t tqk = static_cast<size_t>(p.T) * p.H * p.K;
  Dev o = Dev::poisoned(tv * p.V * 2), ht = Dev::poisoned(state * 4);
  Dev saved = Dev::poisoned(layer.saved_bytes(shape));
  Dev ws = Dev::poisoned(
      std::max(layer.workspace_bytes(CallForm::forward, shape), layer.workspace_bytes(CallForm::backward, shape)));
  LayerInputs li{q.get(),
                 k.get(),
                 v.get(),
                 static_cast<const float*>(g.get()),
                 static_cast<const float*>(beta.get()),
                 cu.get(),
                 c.cu_type,
                 p.has_h0 ? static_cast<const float*>(h0.get()) : nullptr,
                 0.f};
  LayerOutputs lo{o.get(), has_ht ? static_cast<float*>(ht.get()) : nullptr};
  rt::Stream stream = rt::Stream::create(), other_stream = rt::Stream::create();
  const size_t grad_state = p.has_h0 ? state * 4 : 0;
  Dev dq = Dev::poisoned(tqk * 2), dk = Dev::poisoned(tqk * 2), dv = Dev::poisoned(tv * p.V * 2);
  Dev dg = Dev::poisoned(tv * 4), db = Dev::poisoned(tv * 4), dh0 = Dev::poisoned(state * 4);
  Report r;
  const CUstream run_on = c.legacy_stream ? nullptr : stream.handle();

  // The simulated ranks: each its slice of the global tensors (rows of its tokens, states of its
  // documents), its own cu_seqlens, saved region and workspace; one gathered buffer.
  struct Rank {
    CpRankView view;
    Dev cu, saved, ws;
    std::optional<Workspace> stamped;
  };
  std::vector<Rank> ranks;
  const int world = sp.cp_ranks;
  if (c.simulated_ranks) {
    if (world <= 1) throw std::invalid_argument("check::Case: simulated_ranks needs a layer with cp.ranks > 1");
    for (int rank = 0; rank < world; ++rank) {
      CpRankView view = cp_rank_view(p.cu_seqlens, world, rank);
      const ProblemShape local{view.tokens, view.documents()};
      std::vector<int> l32(view.cu_seqlens.begin(), view.cu_seqlens.end());
      std::vector<long long> l64(view.cu_seqlens.begin(), view.cu_seqlens.end());
      Dev lcu = c.cu_type == IndexType::int32 ? Dev::from(l32) : Dev::from(l64);
      Dev lsaved = Dev::poisoned(layer.saved_bytes(local));
      Dev lws = Dev::poisoned(
          std::max(layer.workspace_bytes(CallForm::forward, local), layer.workspace_bytes(CallForm::backward, local)));
      ranks.push_back(Rank{std::move(view), std::move(lcu), std::move(lsaved), std::move(lws), std::nullopt});
    }
  }
  Dev gathered = Dev::poisoned(c.simulated_ranks ? static_cast<size_t>(world) * layer.kcp_record_bytes() : 16);
  const auto shift = [](const void* base, size_t bytes) -> void* {
    return base ? const_cast<char*>(static_cast<const char*>(base)) + bytes : nullptr;
  };
  const size_t state_bytes = static_cast<size_t>(p.HV) * p.K * p.V * 4;
  const auto local_inputs = [&](const Rank& rk) {
    const size_t t0 = static_cast<size_t>(rk.view.token_begin);
    LayerInputs l = li;
    l.q = shift(li.q, t0 * p.H * p.K * 2);
    l.k = shift(li.k, t0 * p.H * p.K * 2);
    l.v = shift(li.v, t0 * p.HV * p.V * 2);
    l.g = static_cast<const float*>(shift(li.g, t0 * p.HV * 4));
    l.beta = static_cast<const float*>(shift(li.beta, t0 * p.HV * 4));
    l.cu_seqlens = rk.cu.get();
    l.h0 = static_cast<const float*>(shift(li.h0, static_cast<size_t>(rk.view.docs.front()) * state_bytes));
    return l;
  };
  const auto local_outputs = [&](const Rank& rk, const LayerOutputs& out) {
    const size_t t0 = static_cast<size_t>(rk.view.token_begin);
    return LayerOutputs{shift(out.o, t0 * p.HV * p.V * 2),
                        static_cast<float*>(shift(out.ht, static_cast<size_t>(rk.view.docs.front()) * state_bytes))};
  };
  const auto local_grads = [&](const Rank& rk, const LayerGrads& gr) {
    const size_t t0 = static_cast<size_t>(rk.view.token_begin), n0 = static_cast<size_t>(rk.view.docs.front());
    return LayerGrads{shift(gr.d_o, t0 * p.HV * p.V * 2),
                      static_cast<const float*>(shift(gr.dht, n0 * state_bytes)),
                      shift(gr.dq, t0 * p.H * p.K * 2),
                      shift(gr.dk, t0 * p.H * p.K * 2),
                      shift(gr.dv, t0 * p.HV * p.V * 2),
                      static_cast<float*>(shift(gr.dg, t0 * p.HV * 4)),
                      static_cast<float*>(shift(gr.dbeta, t0 * p.HV * 4)),
                      static_cast<float*>(shift(gr.dh0, n0 * state_bytes))};
  };
  const size_t record = c.simulated_ranks ? layer.kcp_record_bytes() : 0;
  const auto send_of = [&](const Rank& rk) {
    return shift(gathered.get(), static_cast<size_t>(rk.view.rank) * record);
  };
  const auto shape_of = [](const Rank& rk) { return ProblemShape{rk.view.tokens, rk.view.documents()}; };
  // One call form over the whole batch: the layer's own call, or every rank's phases in turn.
  const auto forward = [&](Workspace& stamped, const LayerOutputs& out, CUstream s) {
    if (!c.simulated_ranks) return layer.forward(shape, li, out, saved.get(), saved.buf.bytes(), stamped, s);
    for (Rank& rk : ranks) {
      rk.stamped.emplace(rk.ws.get(), rk.ws.buf.bytes());
      layer.kcp_forward_summaries(rk.view, local_inputs(rk), rk.saved.get(), rk.saved.buf.bytes(), rk.ws.get(),
                                  rk.ws.buf.bytes(), send_of(rk), s);
    }
    for (Rank& rk : ranks)
      layer.kcp_forward_walk(rk.view, local_inputs(rk), local_outputs(rk, out), rk.saved.get(), rk.saved.buf.bytes(),
                             rk.ws.get(), rk.ws.buf.bytes(), gathered.get(), s);
  };
  const auto check_status = [&](CUstream s) {
    if (!c.simulated_ranks) return layer.check_device_status(saved.get(), shape, s);
    for (Rank& rk : ranks) layer.check_device_status(rk.saved.get(), shape_of(rk), s);
  };
  const auto recompute = [&](Workspace& stamped, const LayerOutputs& out, OutputNeeded output, CUstream s) {
    if (!c.simulated_ranks) {
      layer.recompute(shape, li, out, output, saved.get(), saved.buf.bytes(), stamped, s);
      return;
    }
    for (Rank& rk : ranks)
      layer.kcp_recompute(rk.view, local_inputs(rk), local_outputs(rk, out), output, rk.saved.get(),
                          rk.saved.buf.bytes(), *rk.stamped, s);
  };
  const auto backward = [&](Workspace& stamped, const LayerGrads& gr, CUstream s) {
    if (!c.simulated_ranks) return layer.backward(shape, li, gr, saved.get(), saved.buf.bytes(), stamped, s);
    HandOff taken = HandOff::taken;
    for (Rank& rk : ranks)
      if (layer.kcp_backward_summaries(rk.view, local_inputs(rk), local_grads(rk, gr), rk.saved.get(),
                                       rk.saved.buf.bytes(), *rk.stamped, send_of(rk), s) == HandOff::not_taken)
        taken = HandOff::not_taken;
    for (Rank& rk : ranks)
      layer.kcp_backward_walk(rk.view, local_inputs(rk), local_grads(rk, gr), rk.saved.get(), rk.saved.buf.bytes(),
                              *rk.stamped, gathered.get(), s);
    return taken;
  };
  // Repeats are compared on the device against a device copy of the first run's results.
  std::optional<DeviceDiff> diff;
  std::map<std::string, Dev> first_run;
  if (c.repeats > 1) diff.emplace(layer.target());
  const auto sync = [](CUstream s) { GDN_CHECK_CU(rt::drv().cuStreamSynchronize(s), "synchronize"); };
  for (int run = 0; run < std::max(1, c.repeats); ++run) {
    for (Dev* d : {&o, &ht, &dq, &dk, &dv, &dg, &db, &dh0})
      GDN_CHECK_CU(rt::drv().cuMemsetD8Async(d->buf.handle(), 0xFF, d->buf.bytes(), run_on), "poison");
    Workspace stamped(ws.get(), ws.buf.bytes());
    forward(stamped, lo, run_on);
    check_status(run_on);
    std::vector<std::tuple<std::string, const Dev*, size_t>> results = {{"o", &o, tv * p.V * 2}};
    if (has_ht) results.emplace_back("ht", &ht, state * 4);
    if (c.backward) {
      LayerGrads lg{dod.get(),
                    has_ht ? static_cast<const float*>(dhtd.get()) : nullptr,
                    dq.get(),
                    dk.get(),
                    dv.get(),
                    static_cast<float*>(dg.get()),
                    static_cast<float*>(db.get()),
                    p.has_h0 ? static_cast<float*>(dh0.get()) : nullptr};
      CUstream backward_stream = run_on;
      if (c.step == Case::Step::ckpt_with_output) {
        // Poisoned again, so that what the recompute leaves unwritten shows.
        for (Dev* d : {&o, &ht})
          GDN_CHECK_CU(rt::drv().cuMemsetD8Async(d->buf.handle(), 0xFF, d->buf.bytes(), run_on), "poison");
        recompute(stamped, lo, OutputNeeded::yes, run_on);
      } else if (c.step != Case::Step::fwd_bwd) {
        const LayerOutputs no_output{nullptr, lo.ht};
        recompute(stamped, no_output, OutputNeeded::no, run_on);
      }
      if (c.step == Case::Step::ckpt_intervening) forward(stamped, lo, run_on);
      if (c.step == Case::Step::ckpt_other_stream) {
        sync(run_on);
        backward_stream = other_stream.handle();
      }
      r.handoff = backward(stamped, lg, backward_stream);
      GDN_CHECK_CU(rt::drv().cuStreamSynchronize(backward_stream), "backward");
      sync(run_on);
      for (auto [name, dev, bytes] :
           {std::tuple{"dq", &dq, tqk * 2}, std::tuple{"dk", &dk, tqk * 2}, std::tuple{"dv", &dv, tv * p.V * 2},
            std::tuple{"dg", &dg, tv * 4}, std::tuple{"dbeta", &db, tv * 4}})
        results.emplace_back(name, dev, bytes);
      if (grad_state) results.emplace_back("dh0", &dh0, grad_state);
    }
    sync(run_on);
    if (run == 0) {
      for (const auto& [name, dev, bytes] : results) {
        r.bytes[name] = dev->download(bytes);
        if (diff) {
          Dev copy{rt::DeviceBuffer::create(std::max<size_t>(bytes, 16))};
          GDN_CHECK_CU(rt::drv().cuMemcpyDtoDAsync_v2(copy.handle(), dev->handle(), bytes, run_on),
                       "keep the first run");
          first_run.emplace(name, std::move(copy));
        }
      }
      continue;
    }
    for (const auto& [name, dev, bytes] : results)
      if (const unsigned long long n = diff->words_differing(first_run.at(name).handle(), dev->handle(), bytes, run_on))
        r.mismatches.push_back(fmt::format("{} run {} ({} words differ)", name, run, n));
  }
  if (!c.with_reference) return r;

  const ref::Outputs ro = ref::forward(p, in);
  r.rel_rms["o"] = ref::rel_rms(ro.o, bf16_bytes_to_double(r.bytes["o"]));
  if (has_ht) r.rel_rms["ht"] = ref::rel_rms(ro.ht, f32_bytes_to_double(r.bytes["ht"]));
  if (c.backward) {
    const ref::Grads rg = ref::backward(p, in, d_o, dht);
    r.rel_rms["dq"] = ref::rel_rms(rg.dq, bf16_bytes_to_double(r.bytes["dq"]));
    r.rel_rms["dk"] = ref::rel_rms(rg.dk, bf16_bytes_to_double(r.bytes["dk"]));
    r.rel_rms["dv"] = ref::rel_rms(rg.dv, bf16_bytes_to_double(r.bytes["dv"]));
    r.rel_rms["dg"] = ref::rel_rms(rg.dg, f32_bytes_to_double(r.bytes["dg"]));
    r.rel_rms["dbeta"] = ref::rel_rms(rg.dbeta, f32_bytes_to_double(r.bytes["dbeta"]));
    if (p.has_h0) r.rel_rms["dh0"] = ref::rel_rms(rg.dh0, f32_bytes_to_double(r.bytes["dh0"]));
  }
  return r;
}

std::string document_bytes(const Report& r, const std::string& tensor, const Spec& spec,
                           const std::vector<long long>& doc_lens, size_t doc) {
  const size_t H = spec.heads_qk, HV = spec.heads_v, K = spec.head_dim_k, V = spec.head_dim_v;
  if (doc >= doc_lens.size())
    throw std::invalid_argument(fmt::format("document_bytes: document {} of {}", doc, doc_lens.size()));
  const auto found = r.bytes.find(tensor);
  if (found == r.bytes.end()) throw std::invalid_argument("document_bytes: the report has no result " + tensor);
  const std::string& all = found->second;
  size_t tokens = 0;
  for (long long len : doc_lens) tokens += static_cast<size_t>(len);
  const auto expect_total = [&](size_t want) {
    if (all.size() != want)
      throw std::invalid_argument(
          fmt::format("document_bytes: {} has {} bytes, {} expected for these documents", tensor, all.size(), want));
  };
  if (tensor == "ht" || tensor == "dh0") {
    expect_total(doc_lens.size() * HV * K * V * 4);
    return all.substr(doc * HV * K * V * 4, HV * K * V * 4);
  }
  size_t per_token = 0;
  if (tensor == "o" || tensor == "dv")
    per_token = HV * V * 2;
  else if (tensor == "dq" || tensor == "dk")
    per_token = H * K * 2;
  else if (tensor == "dg" || tensor == "dbeta")
    per_token = HV * 4;
  else
    throw std::invalid_argument("document_bytes: unknown tensor " + tensor);
  expect_total(tokens * per_token);
  size_t t0 = 0;
  for (size_t n = 0; n < doc; ++n) t0 += static_cast<size_t>(doc_lens[n]);
  return all.substr(t0 * per_token, static_cast<size_t>(doc_lens[doc]) * per_token);
}

}  // namespace gdn::check
