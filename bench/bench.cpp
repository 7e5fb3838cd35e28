/**
 * @file bench.cpp
 * @brief Times our forward, forward+backward and checkpointed step on the seed's shapes N, M,
 *        G, A, for three arms (the spec, an A/A copy, the spec without the tape hand-off): CUDA
 *        events, warm-ups, L2 flushed before every sample, arms interleaved in mirrored order,
 *        median and spread, with FLA's H200 numbers and the floors of DEVICE.md.
 *
 * Usage: gdn_bench [--shapes N,M,G,A] [--groups 5] [--samples 12] [--warmup 10]
 *        gdn_bench --host-only   host time per call of the LLVM stub and the interpreter, launches
 *                                 discarded (no GPU needed: what the host adds before the driver)
 */
#include "runtime/bf16.hpp"
#include "runtime/layer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

using namespace gdn;

namespace {

/// The repository root: $GDN_SOURCE_DIR on a machine the build was carried to.
const char* source_dir() {
  const char* e = std::getenv("GDN_SOURCE_DIR");
  return e ? e : GDN_SOURCE_DIR;
}

/// FLA's H200 numbers and the floors of DEVICE.md, in ms, per operation (fwd, fwd+bwd, ckpt).
/// The ckpt floor is a forward plus a forward+backward (the step runs 2 x fwd + bwd).
struct Shape {
  const char* name;
  const char* example;
  std::vector<long long> docs;
  double fla[3];
  double floor[3];
};

const Shape kShapes[] = {
    {"N", "n", {2049, 3001, 3142}, {0.626, 3.138, 5.339}, {0.011, 0.043, 0.054}},
    {"M", "m", {12000, 9000, 6000, 3768, 2000}, {2.909, 11.363, 14.378}, {0.352, 1.36, 1.712}},
    {"G", "g", {3598, 18252, 9000, 14000, 12000, 6000, 16000, 10000, 11000, 8000, 13222, 10000},
     {11.440, 45.777, 57.577}, {1.406, 5.45, 6.856}},
    {"A", "a", {98304, 65536, 57344, 40960}, {23.182, 95.348, 118.855}, {2.812, 10.90, 13.712}},
};
const char* const kOps[] = {"fwd", "fwd+bwd", "ckpt"};

rt::DeviceBuffer random_buffer(size_t n_elems, int kind, uint64_t seed) {
  // kind 0: bf16 N(0,1); 1: fp32 logsigmoid gate; 2: fp32 sigmoid beta
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::string host;
  if (kind == 0) {
    host.resize(n_elems * 2);
    for (size_t i = 0; i < n_elems; ++i) {
      const uint16_t b = to_bf16(nd(rng));
      std::memcpy(host.data() + 2 * i, &b, 2);
    }
  } else {
    host.resize(n_elems * 4);
    for (size_t i = 0; i < n_elems; ++i) {
      const float x = nd(rng);
      const float v = kind == 1 ? -std::log1p(std::exp(-x)) : 1.f / (1.f + std::exp(-x));
      std::memcpy(host.data() + 4 * i, &v, 4);
    }
  }
  auto b = rt::DeviceBuffer::create(host.size());
  GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(b.handle(), host.data(), host.size()), "upload");
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

/// Discards launches: what remains is the host work of a call.
class NullLauncher final : public Launcher {
 public:
  size_t launches = 0;
  void launch(const Program&, rt::dim3_t, const void*, size_t, CUstream) override { ++launches; }
};

int host_only() {
  fmt::print("host time per call, launches discarded (median of 31 rounds of 2000 calls)\n");
  fmt::print("{:<6} {:<12} {:>12} {:>12}\n", "shape", "path", "fwd us", "bwd us");
  for (const char* name : {"n", "m"}) {
    Spec spec = spec_from_file((std::filesystem::path(source_dir()) / "examples" / (std::string(name) + ".json")).string());
    for (HostPath path : {HostPath::llvm_stub, HostPath::interpreted}) {
      if (path == HostPath::llvm_stub && !stubs_available()) continue;
      auto null = std::make_shared<NullLauncher>();
      auto layer = Layer::with_launcher(spec, null, path);
      const ProblemShape s{32768, 5};
      // Distinct aligned fake addresses: nothing is dereferenced on the host.
      auto p = [](uint64_t i) { return reinterpret_cast<void*>(0x100000000ull * i); };
      auto fp = [](uint64_t i) { return reinterpret_cast<float*>(0x100000000ull * i); };
      const LayerInputs in{p(1), p(2), p(3), fp(4), fp(5), p(6), IndexType::int32, fp(7), 0};
      const LayerOutputs out{p(8), fp(9)};
      const LayerGrads gr{p(10), nullptr, p(11), p(12), p(13), fp(14), fp(15), fp(16)};
      const size_t saved = layer->saved_bytes(s), ws = layer->workspace_bytes(CallForm::backward, s);
      std::vector<double> fwd, bwd;
      for (int round = 0; round < 31; ++round) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 2000; ++i) layer->forward(s, in, out, p(20), saved, p(30), ws, nullptr);
        auto t1 = std::chrono::steady_clock::now();
        for (int i = 0; i < 2000; ++i) layer->backward(s, in, gr, p(20), saved, p(30), ws, nullptr);
        auto t2 = std::chrono::steady_clock::now();
        fwd.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2000);
        bwd.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count() / 2000);
      }
      fmt::print("{:<6} {:<12} {:>12.3f} {:>12.3f}\n", name, to_string(path), median(fwd), median(bwd));
    }
  }
  return 0;
}

int run(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdn_bench: {}\n", e.what());
    return 1;
  }
}

int run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--host-only")) return host_only();
    if (!std::strcmp(argv[i], "--help")) {
      fmt::print("usage: gdn_bench [--shapes N,M,G,A] [--groups 5] [--samples 12] [--warmup 10]\n"
                 "       gdn_bench --host-only\n");
      return 0;
    }
  }
  std::string shapes = "N,M,G,A";
  int samples = 12, warmup = 10, groups = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shapes")) shapes = argv[i + 1];
    else if (!std::strcmp(argv[i], "--samples")) samples = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--groups")) groups = std::atoi(argv[i + 1]);
    else { fmt::print(stderr, "unknown option {}\n", argv[i]); return 2; }
  }
  rt::Context ctx = rt::Context::create(0);
  cache::DiskCache cache;
  rt::Stream stream = rt::Stream::create();
  auto flush = rt::DeviceBuffer::create(256u << 20);  // > the H200's 60 MB L2
  rt::Event e0 = rt::Event::create(), e1 = rt::Event::create();
  fmt::print("device: {} ({} SMs)\n", ctx.name(), ctx.sm_count());
  fmt::print("{:<5} {:<8} {:<12} {:>9} {:>8} {:>9} {:>9} {:>8}\n", "shape", "op", "arm", "ms", "drift %",
             "FLA ms", "FLA/ours", "floor x");
  for (const Shape& sh : kShapes) {
    if (shapes.find(sh.name) == std::string::npos) continue;
    Spec base = spec_from_file((std::filesystem::path(source_dir()) / "examples" / (std::string(sh.example) + ".json")).string());
    base.targets = {Target::sm_90a};
    long long T = 0;
    for (auto d : sh.docs) T += d;
    const int N = static_cast<int>(sh.docs.size());
    const int H = base.heads_qk, HV = base.heads_v;
    auto q = random_buffer(size_t(T) * H * 128, 0, 1), k = random_buffer(size_t(T) * H * 128, 0, 2);
    auto v = random_buffer(size_t(T) * HV * 128, 0, 3), d_o = random_buffer(size_t(T) * HV * 128, 0, 4);
    auto g = random_buffer(size_t(T) * HV, 1, 5), beta = random_buffer(size_t(T) * HV, 2, 6);
    std::vector<int> cu = {0};
    for (auto d : sh.docs) cu.push_back(cu.back() + static_cast<int>(d));
    auto dcu = rt::DeviceBuffer::create(cu.size() * 4);
    GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(dcu.handle(), cu.data(), cu.size() * 4), "upload");
    const size_t state = size_t(N) * HV * 128 * 128 * 4;
    auto h0 = rt::DeviceBuffer::create(state), ht = rt::DeviceBuffer::create(state), dh0 = rt::DeviceBuffer::create(state);
    GDN_CHECK_CU(rt::drv().cuMemsetD8_v2(h0.handle(), 0, state), "zero h0");
    auto o = rt::DeviceBuffer::create(size_t(T) * HV * 128 * 2);
    auto dq = rt::DeviceBuffer::create(size_t(T) * H * 128 * 2), dk = rt::DeviceBuffer::create(size_t(T) * H * 128 * 2);
    auto dv = rt::DeviceBuffer::create(size_t(T) * HV * 128 * 2);
    auto dg = rt::DeviceBuffer::create(size_t(T) * HV * 4), db = rt::DeviceBuffer::create(size_t(T) * HV * 4);
    // Arms: the spec as given (its hand-off rule applies to ckpt), an A/A copy of it (a second
    // layer object on the same programs: the noise envelope), and the same spec without the
    // hand-off (ckpt re-runs the prep program and the walk).
    struct Arm {
      std::string name;
      std::unique_ptr<Layer> layer;
      rt::DeviceBuffer saved, ws;
    };
    std::vector<Arm> arms;
    const ProblemShape ps{T, N};
    struct Variant {
      const char* arm;
      const char* suffix;
      bool handoff_allowed;
    };
    for (const Variant& v : {Variant{"spec", "spec", true}, Variant{"spec A/A", "aa", true},
                             Variant{"no hand-off", "nohandoff", false}}) {
      Spec s = base;
      s.name = std::string(sh.example) + "_" + v.suffix;
      if (!v.handoff_allowed) s.reuse_recompute_tapes = ReuseTapes::no;
      Arm a{v.arm, Layer::create(s, ctx, cache), {}, {}};
      a.saved = rt::DeviceBuffer::create(a.layer->saved_bytes(ps));
      a.ws = rt::DeviceBuffer::create(std::max(a.layer->workspace_bytes(CallForm::forward, ps),
                                               a.layer->workspace_bytes(CallForm::backward, ps)));
      arms.push_back(std::move(a));
    }
    // Uploads and memsets ran on the legacy stream, which does not order against ours.
    GDN_CHECK_CU(rt::drv().cuCtxSynchronize(), "setup");
    const LayerInputs in{q.get(), k.get(), v.get(), g.get<float>(), beta.get<float>(), dcu.get(), IndexType::int32,
                         h0.get<float>(), 0};
    const LayerOutputs out{o.get(), ht.get<float>()};
    const LayerOutputs no_output{nullptr, ht.get<float>()};
    const LayerGrads grads{d_o.get(), nullptr, dq.get(), dk.get(), dv.get(), dg.get<float>(), db.get<float>(), dh0.get<float>()};
    auto time_op = [&](Arm& a, int op) {
      Workspace ws(a.ws.get(), a.ws.bytes());
      GDN_CHECK_CU(rt::drv().cuMemsetD8Async(flush.handle(), 0, flush.bytes(), stream.handle()), "L2 flush");
      e0.record(stream.handle());
      a.layer->forward(ps, in, out, a.saved.get(), a.saved.bytes(), ws, stream.handle());
      if (op == 2)
        a.layer->recompute(ps, in, no_output, OutputNeeded::no, a.saved.get(), a.saved.bytes(), ws, stream.handle());
      if (op >= 1) a.layer->backward(ps, in, grads, a.saved.get(), a.saved.bytes(), ws, stream.handle());
      e1.record(stream.handle());
      return static_cast<double>(rt::Event::elapsed_ms(e0, e1));
    };
    for (auto& a : arms) {
      time_op(a, 2);
      a.layer->check_device_status(a.saved.get(), ps, stream.handle());
    }
    // The seed's protocol: per operation, `groups` groups; each group visits every arm twice in
    // mirrored order (A B C C B A), each visit `warmup` untimed calls then `samples` timed ones.
    // A cell is the median of all its samples; drift compares the first and last group medians.
    for (int op = 0; op < 3; ++op) {
      std::vector<std::vector<std::vector<double>>> by_group(arms.size());  // [arm][group][sample]
      for (int grp = 0; grp < groups; ++grp) {
        for (size_t visit = 0; visit < 2 * arms.size(); ++visit) {
          const size_t j = visit < arms.size() ? visit : 2 * arms.size() - 1 - visit;
          if (by_group[j].size() <= static_cast<size_t>(grp)) by_group[j].resize(static_cast<size_t>(grp) + 1);
          for (int w = 0; w < warmup; ++w) time_op(arms[j], op);
          for (int k = 0; k < samples; ++k) by_group[j][static_cast<size_t>(grp)].push_back(time_op(arms[j], op));
        }
      }
      std::vector<double> cell(arms.size());
      for (size_t j = 0; j < arms.size(); ++j) {
        std::vector<double> all;
        for (const auto& g : by_group[j]) all.insert(all.end(), g.begin(), g.end());
        cell[j] = median(all);
        const double drift = std::abs(median(by_group[j].front()) - median(by_group[j].back())) / cell[j] * 100;
        fmt::print("{:<5} {:<8} {:<12} {:>9.3f} {:>8.2f} {:>9.3f} {:>9.2f} {:>8.1f}\n", sh.name, kOps[op],
                   arms[j].name, cell[j], drift, sh.fla[op], sh.fla[op] / cell[j], cell[j] / sh.floor[op]);
      }
      fmt::print("{:<5} {:<8} A/A difference {:.2f} %\n", sh.name, kOps[op], std::abs(cell[0] - cell[1]) / cell[0] * 100);
    }
    std::fflush(stdout);
  }
  return 0;
}
