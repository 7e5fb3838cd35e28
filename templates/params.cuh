/**
 * @file params.cuh
 * @brief Kernel parameter blocks, shared byte for byte by the host (g++) and the device (NVRTC).
 *
 * Every program takes exactly one of these structs by value. Only plain C types appear here so
 * the host and NVRTC lay them out identically; bf16 data is carried as its raw 16-bit pattern.
 * Layouts (token-major, contiguous): q, k [T, H, K]; v, o [T, HV, V]; g, beta [T, HV];
 * states [N, HV, K, V]; per-chunk state tapes [NT, HV, K, V] indexed by the global chunk id.
 * Where alignment would pad, an explicit `pad_*` member stands instead (same layout), so a block
 * built by aggregate initialization has no indeterminate bytes and launches can be recorded and
 * compared byte for byte.
 */
#pragma once

namespace gdn {

typedef unsigned short bf16_t;  ///< raw bfloat16 bits

/// One chunk of one document: tokens [start, start + len), len in 1..CHUNK.
struct ChunkInfo {
  int start;
  int len;
  int doc;
  /// cp.ranks > 1: bits 0-7 the document's piece between rank boundaries (0 for the first), bits
  /// 8-15 the document's pieces in all (common/segments.cuh); else 0. A rank of a context-parallel
  /// run holds one piece of each of its documents, numbered as in the whole batch.
  int piece;
};
constexpr int kPieceBits = 8;

/// Error codes of the device-side input checks: chunk_table's of cu_seqlens (first failure wins;
/// an invalid table leaves every later program idle, so nothing else is reported), then
/// gate_cumsum's of g.
enum CuSeqlensError : int {
  kCuOk = 0,
  kCuFirstNotZero = 1,     ///< cu_seqlens[0] != 0
  kCuDecreasing = 2,       ///< cu_seqlens[i] < cu_seqlens[i-1]
  kCuLastNotT = 3,         ///< cu_seqlens[N] != T
  kCuTooManyChunks = 4,    ///< more chunks than the host-side bound (cannot happen for valid input)
  kGateNotLogDecay = 5,    ///< some g is not finite or > 0; value = the lowest t x HV + head of one
  kCuLongerThanBound = 6,  ///< a document longer than the caller's max_doc_tokens; value = its tokens
};
/// chunk_table's status when cu_seqlens is valid: `value` starts at the largest key, so that
/// gate_cumsum's blocks can lower it to the first bad gate's with atomicMin. An enumerator, not a
/// variable: a namespace-scope constant would be emitted into every program's constant bank.
enum : long long { kStatusNoKey = 0x7fffffffffffffffLL };

/// A TMA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte aligned). The host encodes
/// one per operand and launch (Program::tensor_maps) from the pointer and the row count in the
/// parameter block; the kernels' sm_90a bodies name it in cp.async.bulk.tensor.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};
constexpr int kMaxTensorMaps = 12;
/// A program that reads operands through tensor maps takes this as its entry's second argument
/// (__grid_constant__); maps past the program's own are zero.
struct TensorMaps {
  TensorMap map[kMaxTensorMaps];
};

/// Device status block written by chunk_table and, for the gates, gate_cumsum: {code, index,
/// value, expected}.
struct DeviceStatus {
  int code;
  int index;
  long long value;
  long long expected;
};

struct ChunkTableParams {
  const void* cu_seqlens;  ///< [N + 1], int32 or int64
  int cu_is_int64;
  int T;
  int N;
  int nt_max;             ///< host bound on the chunk count: T / CHUNK + N (+ cp.ranks - 1)
  ChunkInfo* chunks;      ///< [nt_max]; entries past num_chunks get len = 0
  int* doc_chunk_offset;  ///< [N + 1]
  int* num_chunks;        ///< [1]
  DeviceStatus* status;   ///< [1]
  /// One rank of a context-parallel run (cp.ranks > 1, docs/design_kcp.md 3.1): 1 when T and
  /// cu_seqlens are the rank's own tokens (no cuts inside; each document is one piece); 0 for the
  /// whole batch (the single-GPU proxy cuts it at the rank boundaries).
  int rank_local;
  int pieces_before;  ///< rank_local: the first document's pieces on earlier ranks
  int pieces_after;   ///< rank_local: the last document's pieces on later ranks
  /// The caller's bound on every document's tokens (0: none): a longer one is reported
  /// (kCuLongerThanBound) and the table is left empty, as for invalid cu_seqlens, because the
  /// call's walks were launched with the segment rows of the bound.
  int max_doc_tokens;
  int* doc_order;  ///< [N]: the documents in the walks' launch order, longest first (seg::doc_order_key)
};

struct L2NormParams {
  const bf16_t* x;  ///< [rows, D]
  bf16_t* y;        ///< [rows, D] normalized, bf16; null: not written (the rstd alone)
  float* rstd;      ///< [rows]; null: not written
  long long rows;
};

/// l2norm_k_marked: kn for the rows of the chains the forward's verified carry marked (fwd_fail),
/// after its verify walks; a block per (chunk, value head), the first value head of a q/k head's
/// group writing that head's rows when any head of the group is marked.
struct L2NormMarkedParams {
  const bf16_t* x;  ///< [T, H, K] raw k
  bf16_t* y;        ///< [T, H, K] kn
  const ChunkInfo* chunks;
  const int* doc_chunk_offset;
  const int* seg_fail;  ///< [N, HV]
};

struct GateCumsumParams {
  const float* g;  ///< [T, HV]
  float* gc;       ///< [T, HV]: chunk-local inclusive cumsum, times 1/ln 2
  const ChunkInfo* chunks;
  DeviceStatus* status;  ///< [1]: a g that is not finite or > 0 is reported here (kGateNotLogDecay)
  int nt_max;
  int pad_end;
};

/// Chunk-local products (F3): W and U from chunk_solve's Tm.
struct ChunkPrepParams {
  const bf16_t* k;    ///< [T, H, K] (normalized when the norm is on)
  const bf16_t* v;    ///< [T, HV, V]
  const float* beta;  ///< [T, HV]
  const float* gc;    ///< [T, HV]
  const ChunkInfo* chunks;
  const bf16_t* tm;  ///< [T, HV, CHUNK], chunk_solve's gated inverse
  bf16_t* w;         ///< [T, HV, K]
  bf16_t* u;         ///< [T, HV, V]
  // chunk_prep_marked, chunk_prep_fwd_marked (Cfg::MARKED_CHAINS): only the chunks of the chains
  // marked in seg_fail (the verified carry's backward or forward marks; null otherwise).
  const int* doc_chunk_offset;
  const int* seg_fail;  ///< [N, HV]
};

/// The forward's solve (F2): L = tril1(diag(beta)(K K^T) .* Dec), Tm = (I + L)^-1 per (chunk, value head).
struct ChunkSolveParams {
  const bf16_t* k;    ///< [T, H, K]: normalized when the norm is on, raw with Cfg::FOLD_RSTD
  const float* beta;  ///< [T, HV]
  const float* gc;    ///< [T, HV]
  const ChunkInfo* chunks;
  bf16_t* tm;     ///< [T, HV, CHUNK]: row t holds Tm's row for token t (rows < len of each chunk)
  float* rstd_k;  ///< [T, H] with Cfg::FOLD_RSTD: written from K K^T's diagonal, which it then normalizes
};

/// Forward state walk (F4), one program per (V slab, value head, document).
struct StateWalkParams {
  const bf16_t* k;
  const bf16_t* w;
  const bf16_t* u;
  const float* gc;
  const ChunkInfo* chunks;
  const int* doc_chunk_offset;  ///< [N + 1]
  int N;
  int pad_n;
  const float* h0;  ///< [N, HV, K, V] or null
  float* ht;        ///< [N, HV, K, V] or null
  bf16_t* h_tape;   ///< [nt_max, HV, K, V]: state entering each chunk
  bf16_t* v_new;    ///< [T, HV, V]
  // Intra-card segments (Cfg::SEGMENTS > 1; unused otherwise). Segment i of document n is grid
  // position l = i * N + n (seg::grid_position: y = (l % R) * HV + head, z = l / R, R the call's
  // segment rows)
  // and covers chunks [nc * i / SEGMENTS, nc * (i + 1) / SEGMENTS) of it.
  float* seg_hm;  ///< [segment slots, HV, K, V + K]: per segment, S_ext | M (walk_prescan)
  /// [segment slots, HV, K, V]: the state entering each segment (walk_merge; under the verified
  /// carry walk_speculate writes it too, through a cast: every other reader only reads it)
  const float* seg_h0;
  const int* doc_order;  ///< [N]: grid position l's document is doc_order[l mod N] (common/segments.cuh)
  // The verified carry (cp.carry "verified", docs/algorithm.md 4.7; null otherwise).
  float* seg_ckpt;  ///< [segment slots, HV, kCarryCheckpoints, K, V]: walk_speculate's first states
  /// [N, HV]: 1 where a document's chain of segments did not verify (the merge then runs for it).
  /// Null in the backward's re-run walk, which walks every segment from the saved entry states.
  int* seg_fail;
};
/// The verified carry compares a segment's re-walk with its walk from zero after each of its first
/// kCarryCheckpoints chunks (docs/algorithm.md 4.7). An enumerator: a namespace-scope constant
/// would be emitted into every program's constant bank.
enum : int { kCarryCheckpoints = 4 };
/// The verified carry speculates on a chain only where the gates decay each re-walked window of
/// kCarryCheckpoints chunks by 2^kCarryDecayLog2 (about e^-36) or more: numpy put the bitwise
/// meeting of a walk from zero with the walk from the entry at a decay of e^-26 to e^-56, most
/// near e^-30 to e^-40 (docs/algorithm.md 4.7). Other chains take the merge at once, without the
/// speculative walks.
enum : int { kCarryDecayLog2 = -52 };
/// The backward's marks in seg_fail under the verified carry: 0 verified; kChainOwnMaps, the
/// backward prescan walks the chain's transitions A itself; kChainSavedMaps, the forward marked
/// the chain (its gate test or its verification failed), so the forward's prescan walked it and
/// saved its maps (seg_hm): the backward takes A = M^T from them, as the merge carry does.
enum : int { kChainOwnMaps = 1, kChainSavedMaps = 2 };

/// The fused forward walk (state walk and output in one program), one program per (V slab, value
/// head, document).
struct FusedWalkParams {
  const bf16_t* q;  ///< [T, H, K]: normalized when the norm is on, raw with Cfg::FOLD_RSTD
  const bf16_t* k;
  const bf16_t* v;    ///< [T, HV, V]
  const float* beta;  ///< [T, HV]
  const float* gc;    ///< [T, HV]
  const bf16_t* tm;   ///< [T, HV, CHUNK], chunk_prep's gated inverse
  const ChunkInfo* chunks;
  const int* doc_chunk_offset;  ///< [N + 1]
  int N;
  float scale;
  const float* h0;  ///< [N, HV, K, V] or null
  float* ht;        ///< [N, HV, K, V] or null
  bf16_t* o;        ///< [T, HV, V]
  // Intra-card segments (Cfg::SEGMENTS > 1): grid position l = i * N + n walks segment i of
  // document n from its entry state (walk_merge); a document's last segment writes ht.
  const float* seg_h0;  ///< [segment slots, HV, K, V]
  // Cfg::FOLD_RSTD: every product takes the raw q and k; their rows' rstd scale the results in fp32.
  const float* rstd_q;  ///< [T, H]
  const float* rstd_k;  ///< [T, H]
  // Cfg::TAPES: the backward's tapes, as StateWalkParams has them (the walk_tape program, and the
  // fused walk of full saves).
  bf16_t* h_tape;  ///< [nt_max, HV, K, V]: the state entering each chunk
  bf16_t* v_new;   ///< [T, HV, V]
  long long T;     ///< the rows of q, k, v, tm and v_new (their tensor maps' extent)
  int nt_max;      ///< the h tape's chunk slots (its tensor map's extent: nt_max x HV x K rows)
  int pad_end;
  const int* doc_order;  ///< [N]: block z's document is doc_order[z mod N] (common/segments.cuh)
  // The verified carry on the fused path (docs/design_fused_fwd_sm90.md 3.11.1): the speculative
  // walk's first states per segment (fused_speculate / tape_speculate write them, the verify
  // programs compare), and the chains' marks (the forward's, saved: fwd_fail). Null elsewhere; a
  // walk of the merge path with null marks walks every segment (the backward's re-run).
  float* seg_ckpt;  ///< [segment slots, HV, kCarryCheckpoints, K, V]
  int* seg_fail;    ///< [N, HV]
};

/// Intra-card segments: the carry of each segment from the prescan's (S_ext, M), one program per
/// (32 columns, value head, document). The backward's merge uses the same block: (dZ_ext, A) per
/// segment, dht, and the gradient at each segment's end, chained from the last segment.
struct WalkMergeParams {
  const int* doc_chunk_offset;  ///< [N + 1]: each document's segment count and slots (common/segments.cuh)
  const ChunkInfo* chunks;      ///< the chunk table: with cp.ranks > 1 its pieces are the segments
  const float* seg_hm;          ///< [segment slots, HV, K, V + K]
  const float* h0;              ///< [N, HV, K, V] or null
  float* seg_h0;                ///< [segment slots, HV, K, V]
  /// One rank of a context-parallel forward (docs/design_kcp.md 3.1): the state entering the
  /// first document's local piece when that document started on an earlier rank. kKcpEntryWrite:
  /// the merge (over the gathered pieces copied into seg_hm) stores it; kKcpEntryRead: the merge
  /// starts from it (a recompute, a backward's re-run: no second all-gather). Else unused.
  float* kcp_entry;  ///< [HV, K, V]
  int kcp_entry_mode;
  int pad_end;
  /// The backward's merge on one rank (SavedMaps): the forward's saved seg_hm, whose M_i gives
  /// A_i = M_i^T. Else unused.
  const float* fwd_maps;  ///< [segment slots, HV, K, V + K]
  /// The merges under the verified carry: [N, HV], the documents' chains to merge (the others
  /// verified); the backward's takes A from fwd_maps where a chain's mark is kChainSavedMaps.
  /// Else null.
  const int* seg_fail;
};
enum KcpEntryMode : int { kKcpEntryNone = 0, kKcpEntryWrite = 1, kKcpEntryRead = 2 };

/// One rank of a context-parallel run: its summaries into the caller's send buffer, and the
/// gathered summaries of the ranks its boundary documents span into its segment slots.
struct KcpExchangeParams {
  const int* doc_chunk_offset;  ///< [N + 1]
  const ChunkInfo* chunks;
  float* slots;           ///< seg_hm (forward) or seg_dzm (backward): [segment slots, HV, K, V + K]
  float* send;            ///< [HV, K, V + K]: this rank's record
  const float* gathered;  ///< [ranks, HV, K, V + K]: every rank's record, in rank order
  int N;
  int rank;
  int mode;  ///< KcpExchangeMode
  int pad_end;
};
enum KcpExchangeMode : int {
  kKcpForwardSend = 0,
  kKcpForwardReceive = 1,
  kKcpBackwardSend = 2,
  kKcpBackwardReceive = 3
};

/// Forward output (F5), one program per (chunk, value head).
struct OutputParams {
  const bf16_t* q;
  const bf16_t* k;
  const bf16_t* v_new;
  const bf16_t* h_tape;
  const float* gc;
  const ChunkInfo* chunks;
  int nt_max;
  float scale;
  bf16_t* o;  ///< [T, HV, V]
};

/// Backward B2: dV'_local = P^T dO, one program per (chunk, value head).
struct DvLocalParams {
  const bf16_t* q;
  const bf16_t* k;
  const float* gc;
  const bf16_t* d_o;  ///< [T, HV, V]
  const ChunkInfo* chunks;
  int nt_max;
  float scale;
  bf16_t* dv_local;  ///< [T, HV, V]
  // dv_local_marked (Cfg::MARKED_CHAINS): only the chunks of the chains marked in seg_fail (the
  // verified carry's; null otherwise).
  const int* doc_chunk_offset;
  const int* seg_fail;  ///< [N, HV]
};

/// Backward B3: reverse state walk, one program per (V slab, value head, document).
struct StateWalkBwdParams {
  const bf16_t* q;
  const bf16_t* k;
  union {
    const bf16_t* w;   ///< [T, HV, K] chunk_prep's W
    const bf16_t* tm;  ///< Cfg::WALK_FUSES_W: [T, HV, C] chunk_solve's Tm (the sm_90a body forms W)
  };
  const float* gc;
  const bf16_t* d_o;
  // Cfg::WALK_FUSED (walk_bwd_layout "fused", sm_90a): the fused walk is chunk_bwd too; its inputs
  // travel in the bytes of fields it has no use for, its outputs after the walk's fields
  // (StateWalkBwdFusedParams).
  union {
    const bf16_t* dv_local;
    const bf16_t* v;  ///< WALK_FUSED: [T, HV, V]
  };
  const ChunkInfo* chunks;
  const int* doc_chunk_offset;
  int N;
  float scale;
  const float* dht;  ///< [N, HV, K, V] or null
  float* dh0;        ///< [N, HV, K, V] or null
  union {
    bf16_t* dh_tape;       ///< [nt_max, HV, K, V]: gradient w.r.t. the state at the END of each chunk
    const bf16_t* h_tape;  ///< WALK_FUSED: the forward's state entering each chunk, same shape
  };
  union {
    bf16_t* dv_new;       ///< [T, HV, V]: full gradient w.r.t. v_new
    const bf16_t* v_new;  ///< WALK_FUSED: [T, HV, V]
  };
  // Intra-card segments (Cfg::SEGMENTS > 1; unused otherwise), grid position l = segment * N + n
  // as in the forward walk. Per segment, the reverse walk is affine in the gradient at its end:
  // Z_start = A Z_end + dZ_ext, A = M^T the transposed transition.
  // Cfg::RAW_QK (backward_norm "in_walk", one segment): the fused walk reads raw q and k and
  // normalizes them from the rows' saved rstd, in the bytes of the segment fields.
  union {
    float* seg_dzm;       ///< [segment slots, HV, K, V + K]: per segment, dZ_ext | A (walk_bwd_prescan)
    const float* rstd_q;  ///< RAW_QK: [T, H] l2norm's rstd of q (saved)
  };
  union {
    /// [segment slots, HV, K, V]: the gradient at each segment's end (walk_merge_bwd; under the
    /// verified carry walk_bwd_speculate writes it too, through a cast)
    const float* seg_dz;
    const float* rstd_k;  ///< RAW_QK: [T, H] chunk_solve's rstd of k (saved)
  };
  long long T;           ///< the rows of q, k, w (or tm), d_o and dv_new (their tensor maps' extent)
  long long nt_max;      ///< the chunks of dh_tape (its tensor map's extent)
  const int* doc_order;  ///< [N]: block z's document is doc_order[z mod N] (common/segments.cuh)
  // The verified carry in reverse (cp.carry "verified", docs/algorithm.md 4.7; null otherwise): the
  // forward's buffers, free again by the backward.
  float* seg_ckpt;  ///< [segment slots, HV, kCarryCheckpoints, K, V]: walk_bwd_speculate's first gradients
  /// [N, HV]: nonzero where a document's chain did not verify (the merge runs for it):
  /// kChainOwnMaps or kChainSavedMaps.
  int* seg_fail;
  /// [N, HV] (saved): the forward's marks, nonzero where the forward's prescan walked the chain
  /// and saved its maps.
  const int* fwd_fail;
  const float* beta;  ///< Cfg::WALK_FUSES_W: [T, HV]
};

/// walk_bwd_layout "fused" (Cfg::WALK_FUSED): the reverse walk's programs with chunk_bwd's body
/// on sm_90a take chunk_bwd's outputs after the walk's fields (whose unions carry its inputs);
/// the other targets' portable walk reads the walk's fields only. The block's byte offset in the
/// parameters is sizeof(StateWalkBwdParams) (the sizes pinned below leave no other place).
struct WalkBwdFusedOutputs {
  bf16_t* dq_v;  ///< [T, HV, K] as ChunkBwdParams
  bf16_t* dk_v;  ///< [T, HV, K]
  bf16_t* dv;    ///< [T, HV, V]
  float* dg;     ///< [T, HV]
  float* dbeta;  ///< [T, HV]
};
/// Cfg::RAW_QK where a program's configuration has it (backward_norm "in_walk": the fused reverse
/// walk and finalize read the raw q and k rows), else false. Enumerators, not static members: a
/// static constexpr member takes bytes of a constant bank in every program that names it.
template <class Cfg, class = int>
struct RawQkOf {
  enum : bool { value = false };
};
template <class Cfg>
struct RawQkOf<Cfg, decltype((void)Cfg::RAW_QK, 0)> {
  enum : bool { value = Cfg::RAW_QK };
};
struct StateWalkBwdFusedParams : StateWalkBwdParams {
  WalkBwdFusedOutputs out;
};

/// Backward B4 + B5 + B6 per (chunk, value head): dq/dk per value head, dv, dbeta, dg.
struct ChunkBwdParams {
  const bf16_t* q;
  const bf16_t* k;
  const bf16_t* v;
  const float* beta;
  const float* gc;
  const bf16_t* tm;
  const bf16_t* h_tape;
  const bf16_t* dh_tape;
  const bf16_t* v_new;
  const bf16_t* dv_new;
  const bf16_t* d_o;
  const ChunkInfo* chunks;
  int nt_max;
  float scale;
  bf16_t* dq_v;  ///< [T, HV, K] bf16 per value head (summed over the group by Finalize)
  bf16_t* dk_v;
  bf16_t* dv;    ///< [T, HV, V]
  float* dbeta;  ///< [T, HV]
  float* dg;     ///< [T, HV]: dL/dg in natural-log units (reverse cumsum done)
  long long T;   ///< the rows of q, k, v, d_o, v_new, dv_new and tm (their tensor maps' extent)
};

/// Backward B7: group sum over the HV/H value heads (fixed order) and the L2-norm backward.
struct FinalizeParams {
  const bf16_t* dq_v;  ///< [T, HV, K] bf16, as ChunkBwdParams::dq_v
  const bf16_t* dk_v;
  const bf16_t* qn;  ///< normalized q (or raw q when the norm is off)
  const bf16_t* kn;
  const float* rstd_q;  ///< null when the norm is off
  const float* rstd_k;
  bf16_t* dq;  ///< [T, H, K]
  bf16_t* dk;
  int T;
  int pad_end;
};

// Sizes pinned: a change here changes the ABI between the host and every cached kernel.
static_assert(sizeof(ChunkTableParams) == 80, "ChunkTableParams: the host and the kernels share this layout");
static_assert(sizeof(L2NormParams) == 32, "L2NormParams: the host and the kernels share this layout");
static_assert(sizeof(L2NormMarkedParams) == 40, "L2NormMarkedParams: the host and the kernels share this layout");
static_assert(sizeof(GateCumsumParams) == 40, "GateCumsumParams: the host and the kernels share this layout");
static_assert(sizeof(ChunkPrepParams) == 80, "ChunkPrepParams: the host and the kernels share this layout");
static_assert(sizeof(ChunkSolveParams) == 48, "ChunkSolveParams: the host and the kernels share this layout");
static_assert(sizeof(StateWalkParams) == 128, "StateWalkParams: the host and the kernels share this layout");
static_assert(sizeof(OutputParams) == 64, "OutputParams: the host and the kernels share this layout");
static_assert(sizeof(DvLocalParams) == 72, "DvLocalParams: the host and the kernels share this layout");
static_assert(sizeof(StateWalkBwdParams) == 176, "StateWalkBwdParams: the host and the kernels share this layout");
static_assert(sizeof(WalkBwdFusedOutputs) == 40 && sizeof(StateWalkBwdFusedParams) == 216,
              "StateWalkBwdFusedParams: the host and the kernels share this layout");
static_assert(sizeof(ChunkBwdParams) == 152, "ChunkBwdParams: the host and the kernels share this layout");
static_assert(sizeof(FinalizeParams) == 72, "FinalizeParams: the host and the kernels share this layout");
static_assert(sizeof(FusedWalkParams) == 176, "FusedWalkParams: the host and the kernels share this layout");
static_assert(sizeof(WalkMergeParams) == 72, "WalkMergeParams: the host and the kernels share this layout");
static_assert(sizeof(KcpExchangeParams) == 56, "KcpExchangeParams: the host and the kernels share this layout");
static_assert(sizeof(TensorMap) == 128 && alignof(TensorMap) == 64, "TensorMap: the driver's CUtensorMap");
static_assert(sizeof(ChunkInfo) == 16, "ChunkInfo: the host and the kernels share this layout");
static_assert(sizeof(DeviceStatus) == 24, "DeviceStatus: the host and the kernels share this layout");

}  // namespace gdn
