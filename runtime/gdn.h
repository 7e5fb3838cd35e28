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
  GDN_ERR_OTHER = 5
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
 *  gdn_layer_workspace_bytes give them; *count (required) the number of buffers. slots may be NULL
 *  (capacity 0) to query the count; otherwise capacity must hold them all (GDN_ERR_INPUT if not;
 *  nothing is written then). Buffers are ordered by offset, then by name. */
int gdn_spec_region_layout(const char* spec_json, int region, int form, int64_t T, int N, gdn_slot* slots,
                           size_t capacity, size_t* count, size_t* total);

/** Synchronizes `stream`; GDN_ERR_INPUT with the message if the forward found invalid cu_seqlens. */
int gdn_layer_check_status(const gdn_layer*, int64_t T, int N, const void* saved, void* stream);

#ifdef __cplusplus
}
#endif

#endif
