/**
 * @file kcp.cpp
 * @brief One rank's context of a context-parallel layer (see kcp.hpp).
 */
#include "runtime/kcp.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gdn {

namespace {

constexpr size_t kSlotAlign = 256;
constexpr const char* kGatheredSlot = "kcp_gathered";

size_t align_up(size_t x) { return (x + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }

}  // namespace

CpRankView kcp_rank_view(const std::vector<int64_t>& cu_seqlens, int world, int rank) {
  try {
    return cp_rank_view(cu_seqlens, world, rank);
  } catch (const std::invalid_argument& e) {
    throw InputError(e.what());
  }
}

RegionLayout kcp_workspace_layout(const LayerIR& ir, CallForm form, ProblemShape local) {
  // One layout for every target: a context-parallel layer has no buffers that a target leaves out
  // (only the one-rank fused reverse walk does).
  for (const Buffer& b : ir.buffers)
    if (!b.unused_on.empty())
      throw std::logic_error(fmt::format(
          "layer '{}': buffer '{}' is unused on some targets, which a KCP layout cannot follow", ir.spec.name, b.name));
  RegionLayout l = region_layout(ir, BufferRole::workspace, form, local);
  // One offset for every call form: a checkpointed step's forward, recompute and backward share
  // one arena, and the gathered buffer never lands on the tapes a recompute hands over.
  const size_t layer_bytes = std::max(region_layout(ir, BufferRole::workspace, CallForm::forward, local).bytes,
                                      region_layout(ir, BufferRole::workspace, CallForm::backward, local).bytes);
  const size_t at = align_up(layer_bytes);
  const size_t gathered = kcp_record_bytes(ir.spec) * static_cast<size_t>(ir.spec.cp_ranks);
  l.offset[kGatheredSlot] = at;
  l.size[kGatheredSlot] = gathered;
  l.bytes = at + align_up(gathered);
  return l;
}

KcpContext::KcpContext(const Layer& layer, std::vector<int64_t> cu_seqlens, int rank, int world)
    : layer_(&layer), global_cu_(std::move(cu_seqlens)) {
  const Spec& sp = layer.ir().spec;
  if (sp.cp_ranks <= 1)
    throw InputError(
        fmt::format("cp.ranks: layer '{}' has 1 rank; a context-parallel context needs cp.ranks > 1", sp.name));
  if (global_cu_.empty()) throw InputError("cu_seqlens: is empty (N + 1 offsets from 0 to T expected)");
  view_ = kcp_rank_view(global_cu_, world, rank);  // its checks first: they name cu_seqlens' bad entry
  cp_check_world(world, sp, global_cu_.back());
  check_problem_size(view_.tokens, view_.documents());
  agreement_ = cp_agreement(global_cu_, world, rank, sp);
  const RegionLayout l = workspace_layout(CallForm::backward);
  gathered_offset_ = l.offset.at(kGatheredSlot);
  workspace_bytes_ = l.bytes;
}

void KcpContext::check_agreement(const CpAgreement* gathered, size_t count) const {
  if (!gathered) throw InputError("gathered: is null");
  if (count != static_cast<size_t>(world()))
    throw InputError(fmt::format("gathered: {} records for a world of {} ranks", count, world()));
  const std::vector<CpAgreement> all(gathered, gathered + count);
  cp_check_agreement(all);
}

RegionLayout KcpContext::workspace_layout(CallForm form) const {
  return kcp_workspace_layout(layer_->ir(), form, shape());
}

void KcpContext::require_workspace(const Workspace& ws) const {
  const size_t need = workspace_bytes_;
  if (!ws.data()) throw InputError("workspace: is null");
  if (ws.bytes() < need)
    throw InputError(
        fmt::format("workspace: {} bytes given, rank {} of layer '{}' needs {} (the layer's {} and the "
                    "gathered records' {}; KcpContext::workspace_bytes)",
                    ws.bytes(), rank(), layer_->ir().spec.name, need, need - align_up(gathered_bytes()),
                    align_up(gathered_bytes())));
}

void* KcpContext::gathered(const Workspace& ws) const { return static_cast<char*>(ws.data()) + gathered_offset_; }

void* KcpContext::own_record(const Workspace& ws) const {
  return static_cast<char*>(gathered(ws)) + static_cast<size_t>(rank()) * record_bytes();
}

void KcpContext::forward_summaries(const LayerInputs& in, void* saved, size_t saved_size, Workspace& ws,
                                   CUstream stream) const {
  require_workspace(ws);
  layer_->kcp_forward_summaries(view_, in, saved, saved_size, ws.data(), ws.bytes(), own_record(ws), stream);
}

void KcpContext::forward_walk(const LayerInputs& in, const LayerOutputs& out, void* saved, size_t saved_size,
                              Workspace& ws, CUstream stream) const {
  require_workspace(ws);
  layer_->kcp_forward_walk(view_, in, out, saved, saved_size, ws.data(), ws.bytes(), gathered(ws), stream);
}

HandOff KcpContext::recompute(const LayerInputs& in, const LayerOutputs& out, OutputNeeded output, void* saved,
                              size_t saved_size, Workspace& ws, CUstream stream) const {
  require_workspace(ws);
  return layer_->kcp_recompute(view_, in, out, output, saved, saved_size, ws, stream);
}

HandOff KcpContext::backward_summaries(const LayerInputs& in, const LayerGrads& gr, const void* saved,
                                       size_t saved_size, Workspace& ws, CUstream stream) const {
  require_workspace(ws);
  return layer_->kcp_backward_summaries(view_, in, gr, saved, saved_size, ws, own_record(ws), stream);
}

void KcpContext::backward_walk(const LayerInputs& in, const LayerGrads& gr, const void* saved, size_t saved_size,
                               Workspace& ws, CUstream stream) const {
  require_workspace(ws);
  layer_->kcp_backward_walk(view_, in, gr, saved, saved_size, ws, gathered(ws), stream);
}

void KcpContext::check_comm(const rt::Nccl& nccl, rt::nccl_abi::Comm comm) const {
  if (!comm) throw InputError("comm: is null");
  int count = 0, user_rank = 0;
  nccl.check(nccl.comm_count(comm, &count), "ncclCommCount");
  nccl.check(nccl.comm_user_rank(comm, &user_rank), "ncclCommUserRank");
  if (count != world())
    throw InputError(fmt::format("comm: the communicator has {} ranks, the context (cp.ranks) {}", count, world()));
  if (user_rank != rank())
    throw InputError(
        fmt::format("comm: this process is rank {} of the communicator, but the context was built for "
                    "rank {}",
                    user_rank, rank()));
}

void KcpContext::all_gather(const rt::Nccl& nccl, rt::nccl_abi::Comm comm, const Workspace& ws, CUstream stream) const {
  // In place: this rank's record already sits at its place in the gathered buffer.
  nccl.check(nccl.all_gather(own_record(ws), gathered(ws), record_bytes(), rt::nccl_abi::kUint8, comm, stream),
             "ncclAllGather of the KCP summaries");
}

void KcpContext::forward_nccl(const rt::Nccl& nccl, rt::nccl_abi::Comm comm, const LayerInputs& in,
                              const LayerOutputs& out, void* saved, size_t saved_size, Workspace& ws,
                              CUstream stream) const {
  check_comm(nccl, comm);
  forward_summaries(in, saved, saved_size, ws, stream);
  all_gather(nccl, comm, ws, stream);
  forward_walk(in, out, saved, saved_size, ws, stream);
}

HandOff KcpContext::backward_nccl(const rt::Nccl& nccl, rt::nccl_abi::Comm comm, const LayerInputs& in,
                                  const LayerGrads& gr, const void* saved, size_t saved_size, Workspace& ws,
                                  CUstream stream) const {
  check_comm(nccl, comm);
  const HandOff h = backward_summaries(in, gr, saved, saved_size, ws, stream);
  all_gather(nccl, comm, ws, stream);
  backward_walk(in, gr, saved, saved_size, ws, stream);
  return h;
}

void KcpContext::check_agreement_nccl(const rt::Nccl& nccl, rt::nccl_abi::Comm comm, CUstream stream) const {
  check_comm(nccl, comm);
  const size_t one = sizeof(CpAgreement);
  rt::DeviceBuffer records = rt::DeviceBuffer::create(one * static_cast<size_t>(world()));
  char* base = records.get<char>();
  GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(base + one * static_cast<size_t>(rank())),
                                         &agreement_, one),
               "copy of the agreement record");
  nccl.check(nccl.all_gather(base + one * static_cast<size_t>(rank()), base, one, rt::nccl_abi::kUint8, comm, stream),
             "ncclAllGather of the agreement records");
  GDN_CHECK_CU(rt::drv().cuStreamSynchronize(stream), "the agreement's all-gather");
  std::vector<CpAgreement> all(static_cast<size_t>(world()));
  GDN_CHECK_CU(rt::drv().cuMemcpyDtoH_v2(all.data(), records.handle(), one * all.size()), "the gathered records");
  check_agreement(all.data(), all.size());
}

}  // namespace gdn
