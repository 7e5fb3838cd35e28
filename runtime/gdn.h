/**
 * @file gdn.h
 * @brief The C ABI of the layer API, for bindings (ctypes, cffi). Every function returns 0 on
 *        success and a nonzero gdn_status on failure; gdn_last_error() then holds the message
 *        (per thread). Pointers are device pointers; streams are CUstream handles.
 */
#ifndef GDN_H
#define GDN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdn_layer gdn_layer;
/** A caller-held workspace with the host-side stamp of the checkpointed step's hand-off. */
typedef struct gdn_workspace gdn_workspace;

enum gdn_status {
  GDN_OK = 0,
  GDN_ERR_SPEC = 1,
  GDN_ERR_INPUT = 2,
  GDN_ERR_COMPILE = 3,
  GDN_ERR_CUDA = 4,
  GDN_ERR_OTHER = 5,
  GDN_ERR_NCCL = 6 /**< NCCL could not be loaded, is older than 2.18, or a call failed */
};
enum gdn_call_form { GDN_FORWARD = 0, GDN_RECOMPUTE = 1, GDN_BACKWARD = 2 };

const char* gdn_last_error(void);
/** Creates a layer from a JSON spec on device `ordinal`, compiling through the cache at `cache_dir` (NULL: default). */
int gdn_layer_create(const char* spec_json, int ordinal, const char* cache_dir, gdn_layer** out);
void gdn_layer_destroy(gdn_layer*);
int gdn_layer_saved_bytes(const gdn_layer*, int64_t T, int N, size_t* out);
int gdn_layer_workspace_bytes(const gdn_layer*, int form, int64_t T, int N, size_t* out);
/** cu_is_int64: 0 for int32 cu_seqlens, 1 for int64. scale: 0 for the spec's. */
int gdn_layer_forward(const gdn_layer*, int64_t T, int N, const void* q, const void* k, const void* v, const float* g,
                      const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0, float scale, void* o,
                      float* ht, void* saved, size_t saved_bytes, void* workspace, size_t workspace_bytes,
                      void* stream);
int gdn_layer_backward(const gdn_layer*, int64_t T, int N, const void* q, const void* k, const void* v, const float* g,
                       const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0, float scale,
                       const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg, float* dbeta,
                       float* dh0, const void* saved, size_t saved_bytes, void* workspace, size_t workspace_bytes,
                       void* stream);
/** Wraps caller memory as a stamped workspace (no allocation on the device). */
int gdn_workspace_create(void* data, size_t bytes, gdn_workspace** out);
void gdn_workspace_destroy(gdn_workspace*);
/** A bound on every document's tokens for the forwards and recomputes made on this workspace from
 *  now on, like flash-attn's max_seqlen (0, the default: none; GDN_ERR_INPUT if negative). Such a
 *  call checks it on the device (gdn_layer_check_status reports a longer document, and the call
 *  leaves its outputs unwritten) and, under `cp.segments: "auto"`, launches only the segment programs a
 *  document of that length needs: none where it cannot be split. A backward uses it only when it
 *  binds the tapes of a recompute made with it (the hand-off), on the same saved region. The KCP
 *  calls (gdn_kcp_*) take no bound: they refuse a workspace that has one (GDN_ERR_INPUT). */
int gdn_workspace_set_max_doc_tokens(gdn_workspace*, int64_t max_doc_tokens);

/** The forward on a stamped workspace (clears any pending hand-off). */
int gdn_layer_forward_ws(const gdn_layer*, int64_t T, int N, const void* q, const void* k, const void* v,
                         const float* g, const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0,
                         float scale, void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* workspace,
                         void* stream);
/** The recompute of a checkpointed step. output_needed = 0 skips the output program (o may be
 *  NULL). *handoff (if not NULL) is set to 1 when the tapes were kept for the next backward. */
int gdn_layer_recompute(const gdn_layer*, int64_t T, int N, const void* q, const void* k, const void* v, const float* g,
                        const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0, float scale,
                        int output_needed, void* o, float* ht, void* saved, size_t saved_bytes,
                        gdn_workspace* workspace, void* stream, int* handoff);
/** The backward on a stamped workspace: binds a fresh hand-off, else re-runs the prep program and
 *  the walk (same bits). *handoff (if not NULL) is set to 1 when it bound the recompute's tapes. */
int gdn_layer_backward_ws(const gdn_layer*, int64_t T, int N, const void* q, const void* k, const void* v,
                          const float* g, const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0,
                          float scale, const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg,
                          float* dbeta, float* dh0, const void* saved, size_t saved_bytes, gdn_workspace* workspace,
                          void* stream, int* handoff);

/** Validates a JSON spec without a GPU; GDN_ERR_SPEC with "<json pointer>: <problem>" if invalid.
 *  If canonical is not NULL, the canonical JSON (defaults filled in) is written there, up to
 *  capacity bytes including the terminating zero. */
int gdn_spec_validate(const char* spec_json, char* canonical, size_t capacity);

enum gdn_region { GDN_REGION_SAVED = 0, GDN_REGION_WORKSPACE = 1 };
/** One named buffer of a region: byte offset from the region's start and its own bytes. Buffers
 *  that reuse another's bytes (workspace only) share its offset. */
typedef struct gdn_slot {
  char name[32];
  uint64_t offset;
  uint64_t bytes;
} gdn_slot;

/** The layout of the saved region (region GDN_REGION_SAVED; form ignored) or of call form `form`'s
 *  workspace (GDN_REGION_WORKSPACE) for T tokens and N documents, from the spec alone: no GPU, no
 *  compilation. *total (if not NULL) gets the region's bytes, as gdn_layer_saved_bytes /
 *  gdn_layer_workspace_bytes give them, except where a target leaves workspace buffers out
 *  (`gdnc ir` marks them unused_on): the spec's layout serves the layer on any of its targets,
 *  a loaded layer's workspace is its own target's and smaller; *count (required) the number of
 *  buffers. slots may be NULL
 *  (capacity 0) to query the count; otherwise capacity must hold them all (GDN_ERR_INPUT if not;
 *  nothing is written then). Buffers are ordered by offset, then by name. */
int gdn_spec_region_layout(const char* spec_json, int region, int form, int64_t T, int N, gdn_slot* slots,
                           size_t capacity, size_t* count, size_t* total);
/** gdn_spec_region_layout for a layer loaded on `target` ("sm_90a", ...; one of the spec's
 *  /targets, else GDN_ERR_INPUT): that target's layout, as gdn_layer_workspace_bytes gives it
 *  there. target NULL: gdn_spec_region_layout's (enough on any of the spec's targets). */
int gdn_spec_region_layout_on(const char* spec_json, const char* target, int region, int form, int64_t T, int N,
                              gdn_slot* slots, size_t capacity, size_t* count, size_t* total);

/** Synchronizes `stream`; GDN_ERR_INPUT with the message if the forward found invalid cu_seqlens or
 *  a g that is not a finite log decay (positive, NaN or infinite; the first [token, head] named). */
int gdn_layer_check_status(const gdn_layer*, int64_t T, int N, const void* saved, void* stream);

/* ---- Context parallelism (KCP): one rank of a layer with cp.ranks > 1 ----------------------
 * A context is built once per batch layout and rank, from the WHOLE batch's cu_seqlens on the
 * host (N + 1 int64 offsets from 0 to T; T divisible by the world, at least one 64-token chunk
 * per rank). The rank's tensors are its own T / world tokens [token_begin, token_begin + tokens)
 * with the local cu_seqlens of gdn_kcp_local_cu_seqlens (on the device, int32 or int64); h0, ht,
 * dht and dh0 have one row per local document. A step:
 *   forward:  gdn_kcp_forward_summaries, all-gather, gdn_kcp_forward_walk
 *   backward: gdn_kcp_backward_summaries, all-gather, gdn_kcp_backward_walk
 * The all-gather is the caller's (any communicator), in place over the workspace slot
 * "kcp_gathered" (gdn_workspace_layout_kcp): every rank's record_bytes, in rank order; a
 * summaries phase has written this rank's record at its place. No phase synchronizes with the
 * host, so a CUDA graph captures the step with the collective. The results are bitwise those of
 * the single-GPU proxy (the same layer called over the whole batch on one GPU). The context
 * keeps a pointer to its layer: destroy the context first. */
typedef struct gdn_kcp_context gdn_kcp_context;
/** The rank's share of the batch. */
typedef struct gdn_kcp_view {
  int64_t token_begin;    /**< the rank's first global token */
  int64_t tokens;         /**< T / world */
  int32_t documents;      /**< local documents (pieces of global documents) */
  int32_t first_document; /**< the global index of the first local document */
  int32_t pieces_before;  /**< pieces of the first local document on earlier ranks */
  int32_t pieces_after;   /**< pieces of the last local document on later ranks */
} gdn_kcp_view;

/** Rank `rank`'s share of a batch split over `world` ranks, without a layer or a GPU: the view,
 *  and, where not NULL, the local cu_seqlens (documents + 1 offsets) and the global document of
 *  each local one (documents), each array holding `capacity` entries. */
int gdn_cp_rank_view(const int64_t* cu_seqlens, size_t count, int rank, int world, gdn_kcp_view* view,
                     int64_t* local_cu_seqlens, int32_t* local_documents, size_t capacity);
/** The KCP workspace layout of rank `rank` for a spec with cp.ranks > 1 and the whole batch's
 *  cu_seqlens, from the spec alone (no GPU), as gdn_workspace_layout_kcp gives it. */
int gdn_spec_kcp_workspace_layout(const char* spec_json, int form, const int64_t* cu_seqlens, size_t count, int rank,
                                  gdn_slot* slots, size_t capacity, size_t* slot_count, size_t* total);
/** One rank's summary record of a spec's layer. */
int gdn_spec_kcp_record_bytes(const char* spec_json, size_t* out);

int gdn_kcp_context_create(const gdn_layer*, const int64_t* cu_seqlens, size_t count, int rank, int world,
                           gdn_kcp_context** out);
void gdn_kcp_context_destroy(gdn_kcp_context*);
int gdn_kcp_context_view(const gdn_kcp_context*, gdn_kcp_view* out);
/** The local cu_seqlens (documents + 1 int64 offsets) into out[0 .. capacity). */
int gdn_kcp_local_cu_seqlens(const gdn_kcp_context*, int64_t* out, size_t capacity);
/** The global document of each local one (documents ints) into out[0 .. capacity). */
int gdn_kcp_local_documents(const gdn_kcp_context*, int32_t* out, size_t capacity);
/** The agreement record (host bytes, gdn_kcp_agreement_bytes() each) that the ranks all-gather
 *  once, and the check of all of them (world records in rank order): GDN_ERR_INPUT naming the
 *  first rank and field that differ. */
size_t gdn_kcp_agreement_bytes(void);
int gdn_kcp_agreement(const gdn_kcp_context*, void* record, size_t bytes);
int gdn_kcp_check_agreement(const gdn_kcp_context*, const void* gathered, size_t bytes);
/** One rank's summary record; the gathered buffer holds world of them. */
int gdn_kcp_record_bytes(const gdn_kcp_context*, size_t* out);
int gdn_saved_bytes_kcp(const gdn_kcp_context*, size_t* out);
/** The KCP workspace of a call form (the same arena serves a whole checkpointed step when sized
 *  for GDN_BACKWARD), and its layout as gdn_spec_region_layout gives it, slot "kcp_gathered"
 *  included. */
int gdn_workspace_bytes_kcp(const gdn_kcp_context*, int form, size_t* out);
int gdn_workspace_layout_kcp(const gdn_kcp_context*, int form, gdn_slot* slots, size_t capacity, size_t* count,
                             size_t* total);

int gdn_kcp_forward_summaries(const gdn_kcp_context*, const void* q, const void* k, const void* v, const float* g,
                              const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0, float scale,
                              void* saved, size_t saved_bytes, gdn_workspace* workspace, void* stream);
int gdn_kcp_forward_walk(const gdn_kcp_context*, const void* q, const void* k, const void* v, const float* g,
                         const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0, float scale,
                         void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* workspace, void* stream);
/** A checkpointed step's recompute: no all-gather (the forward kept the rank's entry state). */
int gdn_kcp_recompute(const gdn_kcp_context*, const void* q, const void* k, const void* v, const float* g,
                      const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0, float scale,
                      int output_needed, void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* workspace,
                      void* stream, int* handoff);
int gdn_kcp_backward_summaries(const gdn_kcp_context*, const void* q, const void* k, const void* v, const float* g,
                               const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0, float scale,
                               const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg, float* dbeta,
                               float* dh0, const void* saved, size_t saved_bytes, gdn_workspace* workspace,
                               void* stream, int* handoff);
int gdn_kcp_backward_walk(const gdn_kcp_context*, const void* q, const void* k, const void* v, const float* g,
                          const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0, float scale,
                          const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg, float* dbeta,
                          float* dh0, const void* saved, size_t saved_bytes, gdn_workspace* workspace, void* stream);

/* The convenience path over NCCL, loaded with dlopen: `path` (NULL: $GDNC_NCCL_LIBRARY, then
 * libnccl.so.2 through the loader); NCCL 2.18 or newer. nccl_comm is an ncclComm_t of `world`
 * ranks whose rank is the context's. */
int gdn_nccl_load(const char* path, int* version);
int gdn_nccl_unique_id(void* id, size_t bytes); /**< 128 bytes (NCCL_UNIQUE_ID_BYTES) */
int gdn_nccl_comm_init(const void* id, size_t bytes, int rank, int world, void** nccl_comm);
int gdn_nccl_comm_destroy(void* nccl_comm);
/** Gathers every rank's agreement record over the communicator and checks them (one host sync). */
int gdn_kcp_check_agreement_nccl(const gdn_kcp_context*, void* nccl_comm, void* stream);
/** The forward (summaries, ncclAllGather in place, walk) and the backward of a step. */
int gdn_kcp_forward_nccl(const gdn_kcp_context*, void* nccl_comm, const void* q, const void* k, const void* v,
                         const float* g, const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0,
                         float scale, void* o, float* ht, void* saved, size_t saved_bytes, gdn_workspace* workspace,
                         void* stream);
int gdn_kcp_backward_nccl(const gdn_kcp_context*, void* nccl_comm, const void* q, const void* k, const void* v,
                          const float* g, const float* beta, const void* cu_seqlens, int cu_is_int64, const float* h0,
                          float scale, const void* d_o, const float* dht, void* dq, void* dk, void* dv, float* dg,
                          float* dbeta, float* dh0, const void* saved, size_t saved_bytes, gdn_workspace* workspace,
                          void* stream, int* handoff);

#ifdef __cplusplus
}
#endif

#endif
