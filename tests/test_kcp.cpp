/**
 * @file test_kcp.cpp
 * @brief One rank's KCP context on the CPU (recorded launches, a stand-in NCCL): the rank's view,
 *        the workspace with its gathered slot, where the phases put and read the records, the
 *        in-place all-gather of the NCCL path, and the errors of building and calling a context.
 */
#include "runtime/kcp.hpp"
#include "tests/fake_nccl.hpp"
#include "tests/launch_recorder.hpp"

#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;
using namespace gdn;

namespace {

Spec example(const char* name, int ranks) {
  Spec s = spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(name) + ".json")).string());
  s.cp_ranks = ranks;
  return s;
}

/// The fake NCCL's record of its last ncclAllGather (tests/fake_nccl.cpp).
const FakeAllGather& last_all_gather() {
  void* lib = dlopen(GDN_FAKE_NCCL_OK, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(lib != nullptr);
  auto fn = reinterpret_cast<const FakeAllGather* (*)()>(dlsym(lib, "fakeNcclLastAllGather"));
  REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
  return *fn();
}

/// Fake, aligned device addresses for one rank's tensors, and a recorder.
struct RankRig {
  std::shared_ptr<testing::RecordingLauncher> rec = std::make_shared<testing::RecordingLauncher>();
  std::unique_ptr<Layer> layer;
  std::unique_ptr<KcpContext> kcp;
  LayerInputs in;
  LayerOutputs out;
  LayerGrads grads;
  void* saved = reinterpret_cast<void*>(0x100000000ull);
  Workspace ws{nullptr, 0};

  RankRig(const Spec& spec, std::vector<int64_t> cu, int rank)
      : layer(Layer::with_launcher(spec, rec)),
        kcp(std::make_unique<KcpContext>(*layer, std::move(cu), rank, spec.cp_ranks)) {
    auto p = [](uint64_t i) { return reinterpret_cast<void*>(0x1000000ull * i); };
    auto fp = [](uint64_t i) { return reinterpret_cast<float*>(0x1000000ull * i); };
    in = {p(1), p(2), p(3), fp(4), fp(5), p(6), IndexType::int64, fp(7), 0};
    out = {p(8), fp(9)};
    grads = {p(10), fp(11), p(12), p(13), p(14), fp(15), fp(16), fp(17)};
    ws = Workspace(reinterpret_cast<void*>(0x200000000ull), kcp->workspace_bytes(CallForm::backward));
  }
  /// Does any recorded launch since `from` of `program` carry the address `a` in its parameters?
  bool passes(size_t from, const std::string& program, const void* a) const {
    uint64_t want = reinterpret_cast<uint64_t>(a);
    for (size_t i = from; i < rec->records.size(); ++i) {
      const testing::LaunchRecord& r = rec->records[i];
      if (r.program != program) continue;
      for (size_t off = 0; off + 8 <= r.params.size(); off += 8) {
        uint64_t w = 0;
        std::memcpy(&w, r.params.data() + off, 8);
        if (w == want) return true;
      }
    }
    return false;
  }
};

}  // namespace

TEST_SUITE("kcp") {
  TEST_CASE("a rank's context: its view, its agreement record, its workspace with the gathered slot") {
    // 4 ranks of 1024 tokens: rank 1 holds the middle of document 0 only, rank 2 its end and two more.
    const std::vector<int64_t> cu = {0, 2500, 2600, 3000, 4096};
    const Spec spec = example("n", 4);
    auto layer = Layer::with_launcher(spec, std::make_shared<testing::RecordingLauncher>());
    const KcpContext mid(*layer, cu, 1, 4), third(*layer, cu, 2, 4);
    CHECK(mid.shape().T == 1024);
    CHECK(mid.shape().N == 1);
    CHECK(mid.view().token_begin == 1024);
    CHECK(mid.view().pieces_before == 1);
    CHECK(mid.view().pieces_after == 1);
    CHECK(third.view().cu_seqlens == std::vector<int64_t>{0, 452, 552, 952, 1024});
    CHECK(third.view().docs == std::vector<int>{0, 1, 2, 3});
    CHECK(third.view().pieces_before == 2);
    CHECK(third.view().pieces_after == 1);
    CHECK(mid.agreement().rank == 1);
    CHECK(third.agreement().rank == 2);
    CHECK(std::memcmp(mid.agreement().cu_seqlens_sha256, third.agreement().cu_seqlens_sha256, 64) == 0);

    // One record = (S_ext, M) of every value head: [HV, K, V + K] fp32.
    CHECK(mid.record_bytes() == size_t{6} * 128 * 256 * 4);
    CHECK(mid.gathered_bytes() == 4 * mid.record_bytes());
    // The layer's slots for the rank's own shape, then the gathered records at one offset for
    // every call form, past the largest form's slots.
    const size_t layer_ws = std::max(layer->workspace_bytes(CallForm::forward, third.shape()),
                                     layer->workspace_bytes(CallForm::backward, third.shape()));
    for (CallForm f : {CallForm::forward, CallForm::recompute, CallForm::backward}) {
      const RegionLayout l = third.workspace_layout(f);
      const size_t at = l.offset.at("kcp_gathered");
      CHECK(at % 256 == 0);
      CHECK(at >= layer_ws);
      CHECK(at < layer_ws + 256);
      CHECK(l.size.at("kcp_gathered") == third.gathered_bytes());
      CHECK(l.bytes == third.workspace_bytes(f));
      CHECK(l.bytes >= at + third.gathered_bytes());
      for (const auto& [name, offset] : layer->workspace_layout(f, third.shape()).offset)
        CHECK_MESSAGE(l.offset.at(name) == offset, name);
    }
    CHECK(third.saved_bytes() == layer->saved_bytes(third.shape()));
  }

  TEST_CASE("the phases write this rank's record at its place and read the gathered buffer") {
    const std::vector<int64_t> cu = {0, 2500, 2600, 3000, 4096};
    for (int rank = 0; rank < 4; ++rank) {
      CAPTURE(rank);
      RankRig r(example("n", 4), cu, rank);
      const KcpContext& k = *r.kcp;
      char* gathered =
          static_cast<char*>(r.ws.data()) + k.workspace_layout(CallForm::forward).offset.at("kcp_gathered");
      CHECK(k.gathered(r.ws) == gathered);
      CHECK(k.own_record(r.ws) == gathered + static_cast<size_t>(rank) * k.record_bytes());
      const size_t saved_size = k.saved_bytes();
      k.forward_summaries(r.in, r.saved, saved_size, r.ws, nullptr);
      const size_t walk_from = r.rec->records.size();
      CHECK(r.passes(0, "kcp_exchange", k.own_record(r.ws)));
      CHECK_FALSE(r.passes(0, "kcp_exchange", gathered + (rank == 0 ? k.record_bytes() : 0)));
      k.forward_walk(r.in, r.out, r.saved, saved_size, r.ws, nullptr);
      CHECK(r.passes(walk_from, "kcp_exchange", gathered));
      const size_t bwd_from = r.rec->records.size();
      k.backward_summaries(r.in, r.grads, r.saved, saved_size, r.ws, nullptr);
      CHECK(r.passes(bwd_from, "kcp_exchange", k.own_record(r.ws)));
      const size_t bwd_walk_from = r.rec->records.size();
      k.backward_walk(r.in, r.grads, r.saved, saved_size, r.ws, nullptr);
      CHECK(r.passes(bwd_walk_from, "kcp_exchange", gathered));
    }
  }

  TEST_CASE("a rank's recompute hands its tapes over with or without the output, on the fused forward too") {
    const std::vector<int64_t> cu = {0, 2500, 2600, 3000, 4096};
    for (const char* name : {"n", "m"}) {
      CAPTURE(name);
      RankRig r(example(name, 2), cu, 1);
      const KcpContext& k = *r.kcp;
      const bool fused = r.layer->ir().spec.forward == ForwardPath::fused;
      CHECK(r.layer->ir().recompute_output_tapes == fused);
      const size_t saved_size = k.saved_bytes();
      k.forward_summaries(r.in, r.saved, saved_size, r.ws, nullptr);
      k.forward_walk(r.in, r.out, r.saved, saved_size, r.ws, nullptr);
      for (const OutputNeeded o : {OutputNeeded::yes, OutputNeeded::no}) {
        CAPTURE(o == OutputNeeded::yes);
        const size_t from = r.rec->records.size();
        CHECK(k.recompute(r.in, o == OutputNeeded::yes ? r.out : LayerOutputs{nullptr, r.out.ht}, o, r.saved,
                          saved_size, r.ws, nullptr) == HandOff::taken);
        // o is written only when it is needed; the walk writes the tapes where the backward reads
        // them either way.
        const char* walk = fused ? (o == OutputNeeded::yes ? "fused_walk" : "walk_tape") : "state_walk";
        CHECK(r.passes(from, walk, r.out.o) == (o == OutputNeeded::yes && fused));
        for (const char* tape : {"h_tape", "v_new"}) {
          CAPTURE(tape);
          CHECK(r.passes(from, walk,
                         static_cast<char*>(r.ws.data()) + k.workspace_layout(CallForm::forward).offset.at(tape)));
        }
        CHECK(k.backward_summaries(r.in, r.grads, r.saved, saved_size, r.ws, nullptr) == HandOff::taken);
        k.backward_walk(r.in, r.grads, r.saved, saved_size, r.ws, nullptr);
      }
    }
  }

  TEST_CASE("the NCCL path gathers in place between the phases, on the caller's stream") {
    const rt::Nccl& nccl = rt::Nccl::load(GDN_FAKE_NCCL_OK);
    const std::vector<int64_t> cu = {0, 700, 2048};
    RankRig r(example("n", 2), cu, 1);
    const KcpContext& k = *r.kcp;
    rt::nccl_abi::UniqueId id;
    nccl.check(nccl.get_unique_id(&id), "ncclGetUniqueId");
    rt::nccl_abi::Comm comm = nullptr, wrong_rank = nullptr, wrong_size = nullptr;
    nccl.check(nccl.comm_init_rank(&comm, 2, id, 1), "ncclCommInitRank");
    nccl.check(nccl.comm_init_rank(&wrong_rank, 2, id, 0), "ncclCommInitRank");
    nccl.check(nccl.comm_init_rank(&wrong_size, 3, id, 1), "ncclCommInitRank");
    const auto stream = reinterpret_cast<CUstream>(0x5eed);
    const int calls = last_all_gather().calls;
    k.forward_nccl(nccl, comm, r.in, r.out, r.saved, k.saved_bytes(), r.ws, stream);
    const FakeAllGather& ag = last_all_gather();
    CHECK(ag.calls == calls + 1);
    CHECK(ag.send == k.own_record(r.ws));
    CHECK(ag.recv == k.gathered(r.ws));
    CHECK(ag.count == k.record_bytes());
    CHECK(ag.type == rt::nccl_abi::kUint8);
    CHECK(ag.comm == comm);
    CHECK(ag.stream == stream);
    for (const testing::LaunchRecord& rec : r.rec->records) CHECK(rec.stream == stream);
    CHECK(k.backward_nccl(nccl, comm, r.in, r.grads, r.saved, k.saved_bytes(), r.ws, stream) == HandOff::not_taken);
    CHECK(last_all_gather().calls == calls + 2);

    const size_t launched = r.rec->records.size();
    CHECK_THROWS_WITH_AS(k.forward_nccl(nccl, wrong_rank, r.in, r.out, r.saved, k.saved_bytes(), r.ws, stream),
                         "comm: this process is rank 0 of the communicator, but the context was built for rank 1",
                         InputError);
    CHECK_THROWS_WITH_AS(k.forward_nccl(nccl, wrong_size, r.in, r.out, r.saved, k.saved_bytes(), r.ws, stream),
                         "comm: the communicator has 3 ranks, the context (cp.ranks) 2", InputError);
    CHECK_THROWS_WITH_AS(k.forward_nccl(nccl, nullptr, r.in, r.out, r.saved, k.saved_bytes(), r.ws, stream),
                         "comm: is null", InputError);
    CHECK(r.rec->records.size() == launched);  // refused before any launch
  }

  TEST_CASE("building or calling a context with bad input is refused by name") {
    auto rec = std::make_shared<testing::RecordingLauncher>();
    auto single = Layer::with_launcher(example("n", 1), rec);
    CHECK_THROWS_WITH_AS(KcpContext(*single, {0, 4096}, 0, 2),
                         "cp.ranks: layer 'shape_n' has 1 rank; a context-parallel context needs cp.ranks > 1",
                         InputError);
    auto layer = Layer::with_launcher(example("n", 4), rec);
    CHECK_THROWS_WITH_AS(KcpContext(*layer, {0, 4096}, 0, 2),
                         "cp.ranks: the communicator has 2 ranks, the spec asks for 4", InputError);
    CHECK_THROWS_WITH_AS(KcpContext(*layer, {0, 4096}, 4, 4), "rank: 4 is outside 0 .. 3 (world 4)", InputError);
    CHECK_THROWS_WITH_AS(KcpContext(*layer, {0, 4097}, 0, 4), doctest::Contains("4097"), InputError);
    CHECK_THROWS_WITH_AS(KcpContext(*layer, {0, 128}, 0, 4),
                         "cp.ranks: 4 ranks for 128 tokens: each rank needs at least one 64-token chunk (at most 2 "
                         "ranks)",
                         InputError);
    CHECK_THROWS_WITH_AS(KcpContext(*layer, {0, 3000, 2000, 4096}, 0, 4), doctest::Contains("cu_seqlens[2]"),
                         InputError);
    CHECK_THROWS_WITH_AS(KcpContext(*layer, {}, 0, 4), "cu_seqlens: is empty (N + 1 offsets from 0 to T expected)",
                         InputError);

    RankRig r(example("n", 4), {0, 2500, 4096}, 2);
    const KcpContext& k = *r.kcp;
    Workspace small(r.ws.data(), k.workspace_bytes(CallForm::forward) - 256);
    CHECK_THROWS_WITH_AS(k.forward_summaries(r.in, r.saved, k.saved_bytes(), small, nullptr),
                         doctest::Contains("workspace: "), InputError);
    CHECK_THROWS_WITH_AS(k.forward_summaries(r.in, r.saved, k.saved_bytes(), small, nullptr),
                         doctest::Contains("KcpContext::workspace_bytes"), InputError);
    Workspace null_ws(nullptr, 1 << 30);
    CHECK_THROWS_WITH_AS(k.forward_walk(r.in, r.out, r.saved, k.saved_bytes(), null_ws, nullptr), "workspace: is null",
                         InputError);
    CHECK_THROWS_WITH_AS(k.forward_summaries(r.in, r.saved, k.saved_bytes() - 1, r.ws, nullptr),
                         doctest::Contains("saved: "), InputError);
    CHECK(r.rec->records.empty());

    // The agreement check names the rank and the field.
    std::vector<CpAgreement> all;
    for (int rank = 0; rank < 4; ++rank) all.push_back(KcpContext(*layer, {0, 2500, 4096}, rank, 4).agreement());
    CHECK_NOTHROW(k.check_agreement(all.data(), all.size()));
    CHECK_THROWS_WITH_AS(k.check_agreement(all.data(), 3), "gathered: 3 records for a world of 4 ranks", InputError);
    all[3] = KcpContext(*layer, {0, 2501, 4096}, 3, 4).agreement();
    CHECK_THROWS_WITH_AS(k.check_agreement(all.data(), all.size()),
                         doctest::Contains("rank 3 disagrees with rank 0 on cu_seqlens"), InputError);
  }
}
