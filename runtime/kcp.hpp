/**
 * @file kcp.hpp
 * @brief One rank's context of a context-parallel (KCP) layer: the partition of one batch layout,
 *        the rank's regions and the phases around the caller's all-gather.
 *
 * A context is built once per batch layout (the global cu_seqlens, on the host) and rank. It
 * holds what every step needs and nothing a step would have to synchronize for: the rank's view
 * of the partition (its tokens, its documents cut at the rank boundaries), the agreement record
 * the ranks compare once, and the layout of the KCP workspace, which is the layer's workspace for
 * the rank's shape followed by the gathered buffer (every rank's summary record, in rank order;
 * this rank writes its own record into its place, so the all-gather can run in place).
 *
 * A step on rank r (docs/design_kcp.md 3):
 *   forward:  forward_summaries -> all-gather of gathered() -> forward_walk
 *   backward: backward_summaries -> all-gather of gathered() -> backward_walk
 * Every phase runs on the caller's stream without a host sync, so a CUDA graph can capture the
 * whole step with the collective inside. The caller owns the communicator; forward_nccl and
 * backward_nccl are the convenience path over an NCCL communicator (runtime/nccl).
 */
#pragma once

#include "runtime/cp_partition.hpp"
#include "runtime/layer.hpp"
#include "runtime/nccl.hpp"

#include <cstdint>
#include <vector>

namespace gdn {

/// cp_rank_view with its refusals (an empty or decreasing cu_seqlens, T not divisible by the world, a
/// rank outside it) as InputError, as every entry point of a call reports bad input.
CpRankView kcp_rank_view(const std::vector<int64_t>& cu_seqlens, int world, int rank);

/// The KCP workspace of a call form for a rank with `local` tokens and documents (see
/// KcpContext::workspace_layout), from the IR alone: no GPU.
RegionLayout kcp_workspace_layout(const LayerIR&, CallForm, ProblemShape local);

class KcpContext {
 public:
  /// Rank `rank` of `world` over the batch `cu_seqlens` (global, N + 1 offsets from 0 to T).
  /// Throws InputError naming the problem: a layer without cp.ranks > 1, a world that differs from
  /// the spec's cp.ranks, fewer tokens than one chunk per rank, T not divisible by the world, a
  /// rank outside 0 .. world - 1, or invalid cu_seqlens (not from 0, decreasing).
  KcpContext(const Layer&, std::vector<int64_t> cu_seqlens, int rank, int world);

  const Layer& layer() const { return *layer_; }
  const CpRankView& view() const { return view_; }
  int rank() const { return view_.rank; }
  int world() const { return view_.world; }
  /// The rank's own problem: its tokens and its local documents.
  ProblemShape shape() const { return {view_.tokens, view_.documents()}; }
  const std::vector<int64_t>& global_cu_seqlens() const { return global_cu_; }

  /// This rank's agreement record, and the check of every rank's after the caller gathered them
  /// (`world()` records in rank order). Throws InputError naming the first rank and field that
  /// differ, or a record that claims another rank.
  const CpAgreement& agreement() const { return agreement_; }
  void check_agreement(const CpAgreement* gathered, size_t count) const;

  /// One rank's summary record and the gathered buffer (world() records).
  size_t record_bytes() const { return kcp_record_bytes(layer_->ir().spec); }
  size_t gathered_bytes() const { return record_bytes() * static_cast<size_t>(world()); }

  size_t saved_bytes() const { return layer_->saved_bytes(shape()); }
  /// The KCP workspace of a call form: the layer's slots for the rank's shape, then the slot
  /// "kcp_gathered" (256-byte aligned). Its size is the same for every form, so one arena serves a
  /// whole checkpointed step, as for the single-rank layer.
  RegionLayout workspace_layout(CallForm) const;
  size_t workspace_bytes(CallForm) const { return workspace_bytes_; }
  /// The gathered buffer inside a KCP workspace, and this rank's record in it.
  void* gathered(const Workspace&) const;
  void* own_record(const Workspace&) const;

  /// The phases (Layer::kcp_*, with the record and the gathered buffer in the workspace).
  /// `in.cu_seqlens` holds view().cu_seqlens on the device; h0 / ht / dht / dh0 have a row per
  /// local document.
  void forward_summaries(const LayerInputs&, void* saved, size_t saved_size, Workspace&, CUstream) const;
  void forward_walk(const LayerInputs&, const LayerOutputs&, void* saved, size_t saved_size, Workspace&,
                    CUstream) const;
  HandOff recompute(const LayerInputs&, const LayerOutputs&, OutputNeeded, void* saved, size_t saved_size, Workspace&,
                    CUstream) const;
  HandOff backward_summaries(const LayerInputs&, const LayerGrads&, const void* saved, size_t saved_size, Workspace&,
                             CUstream) const;
  void backward_walk(const LayerInputs&, const LayerGrads&, const void* saved, size_t saved_size, Workspace&,
                     CUstream) const;

  /// The whole forward / backward of a step with ncclAllGather (in place) between the phases, on
  /// `stream`. `comm` is an ncclComm_t of world() ranks whose rank is rank(); its size and rank
  /// are checked (host calls, no sync).
  void forward_nccl(const rt::Nccl&, rt::nccl_abi::Comm, const LayerInputs&, const LayerOutputs&, void* saved,
                    size_t saved_size, Workspace&, CUstream) const;
  HandOff backward_nccl(const rt::Nccl&, rt::nccl_abi::Comm, const LayerInputs&, const LayerGrads&, const void* saved,
                        size_t saved_size, Workspace&, CUstream) const;
  /// Gathers every rank's agreement record over `comm` and checks them: the one host sync of a
  /// context, at its start.
  void check_agreement_nccl(const rt::Nccl&, rt::nccl_abi::Comm, CUstream) const;

 private:
  void require_workspace(const Workspace&) const;
  void check_comm(const rt::Nccl&, rt::nccl_abi::Comm) const;
  void all_gather(const rt::Nccl&, rt::nccl_abi::Comm, const Workspace&, CUstream) const;

  const Layer* layer_;
  std::vector<int64_t> global_cu_;
  CpRankView view_;
  CpAgreement agreement_;
  size_t gathered_offset_ = 0;  ///< workspace_layout's, computed once: the phases run on launch paths
  size_t workspace_bytes_ = 0;
};

}  // namespace gdn
