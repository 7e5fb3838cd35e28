"""chunk_gated_delta_rule with FLA's argument names and [B, T, H, D] layout, on libgdn."""

import ctypes
import json

from . import spec as _spec
from ._lib import InputError, check, library

# FLA arguments gdnc does not implement: passing a non-default value raises, naming it.
_UNSUPPORTED = {
    "use_beta_sigmoid_in_kernel": False,
    "allow_neg_eigval": False,
    "state_v_first": False,
    "transpose_state_layout": False,
    "cp_context": None,
    "use_gate_in_kernel": False,
    "A_log": None,
    "dt_bias": None,
    "head_first": False,
}
# FLA hints that only avoid host syncs FLA would otherwise make; gdnc never syncs, so they are
# accepted and not needed.
_HINTS = ("cu_seqlens_cpu", "chunk_indices")


def _dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def _shape(t):
    return tuple(int(x) for x in t.shape)


def check_arguments(q, k, v, g, beta, initial_state=None, cu_seqlens=None, output_final_state=False, **kwargs):
    """Validates a call; returns (B, T, H, HV, K, V, N). Works on any tensor-like object with
    shape, dtype, is_cuda and is_contiguous(), so it is testable without torch or a GPU."""
    unknown = sorted(set(kwargs) - set(_UNSUPPORTED) - set(_HINTS) - {"chunk_size", "spec"})
    if unknown:
        raise TypeError(f"chunk_gated_delta_rule: unexpected argument(s) {unknown}")
    for name, default in _UNSUPPORTED.items():
        if name in kwargs and kwargs[name] is not default and kwargs[name] != default:
            raise NotImplementedError(f"{name}={kwargs[name]!r} is not supported by gdnc (only {default!r})")
    if kwargs.get("chunk_size", 64) != 64:
        raise ValueError(f"chunk_size={kwargs['chunk_size']!r} is not supported (supported: 64)")
    if len(_shape(q)) != 4:
        raise InputError(f"q: expected [B, T, H, K], got shape {_shape(q)}")
    B, T, H, K = _shape(q)
    if _shape(k) != (B, T, H, K):
        raise InputError(f"k: shape {_shape(k)} differs from q's {(B, T, H, K)}")
    if len(_shape(v)) != 4 or _shape(v)[:2] != (B, T):
        raise InputError(f"v: expected [B={B}, T={T}, HV, V], got shape {_shape(v)}")
    HV, V = _shape(v)[2:]
    if HV % H != 0:
        raise InputError(f"v: {HV} value heads is not a multiple of {H} q/k heads")
    for name, t in (("g", g), ("beta", beta)):
        if _shape(t) != (B, T, HV):
            raise InputError(f"{name}: expected [B={B}, T={T}, HV={HV}], got shape {_shape(t)}")
    for name, t, want in (("q", q, "bfloat16"), ("k", k, "bfloat16"), ("v", v, "bfloat16"), ("g", g, "float32"),
                          ("beta", beta, "float32")):
        if _dtype_name(t) != want:
            raise InputError(f"{name}: dtype {_dtype_name(t)} is not supported (supported: {want})")
    if cu_seqlens is not None:
        if B != 1:
            raise InputError(f"q: batch {B} with cu_seqlens; pack the documents into B = 1")
        if len(_shape(cu_seqlens)) != 1 or _shape(cu_seqlens)[0] < 2:
            raise InputError(f"cu_seqlens: expected [N + 1] with N >= 1, got shape {_shape(cu_seqlens)}")
        if _dtype_name(cu_seqlens) not in ("int32", "int64"):
            raise InputError(f"cu_seqlens: dtype {_dtype_name(cu_seqlens)} is not supported (int32 or int64)")
        N = _shape(cu_seqlens)[0] - 1
    else:
        N = B
    if initial_state is not None:
        if _shape(initial_state) != (N, HV, K, V):
            raise InputError(f"initial_state: expected [N={N}, HV={HV}, K={K}, V={V}], got {_shape(initial_state)}")
        if _dtype_name(initial_state) != "float32":
            raise InputError(f"initial_state: dtype {_dtype_name(initial_state)} is not supported (float32)")
    named = [("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("cu_seqlens", cu_seqlens),
             ("initial_state", initial_state)]
    for name, t in named:
        if t is None:
            continue
        if not t.is_cuda:
            raise InputError(f"{name}: must be on a CUDA device")
        if not t.is_contiguous():
            raise InputError(f"{name}: must be contiguous")
    return B, T, H, HV, K, V, N


class _Layer:
    """One compiled layer (libgdn handle) per (canonical spec, device)."""

    def __init__(self, canonical, device_index):
        handle = ctypes.c_void_p()
        check(library().gdn_layer_create(json.dumps(canonical).encode(), device_index, None, ctypes.byref(handle)))
        self.handle = handle
        self.spec = canonical
        self._sizes = {}  # (T, N) -> (saved, workspace): asked once per shape, not per call

    def __del__(self):
        if getattr(self, "handle", None):
            library().gdn_layer_destroy(self.handle)

    def saved_bytes(self, T, N):
        return self._sizes_of(T, N)[0]

    def workspace_bytes(self, T, N):
        return self._sizes_of(T, N)[1]

    def _sizes_of(self, T, N):
        if (T, N) not in self._sizes:
            self._sizes[(T, N)] = (self._saved_bytes(T, N), self._workspace_bytes(T, N))
        return self._sizes[(T, N)]

    def _saved_bytes(self, T, N):
        out = ctypes.c_size_t()
        check(library().gdn_layer_saved_bytes(self.handle, T, N, ctypes.byref(out)))
        return out.value

    def _workspace_bytes(self, T, N):
        sizes = []
        for form in (0, 2):  # forward, backward: one workspace serves a whole checkpointed step
            out = ctypes.c_size_t()
            check(library().gdn_layer_workspace_bytes(self.handle, form, T, N, ctypes.byref(out)))
            sizes.append(out.value)
        return max(sizes)


_layers = {}
# (caller's options as JSON, the call's shapes and flags, device) -> layer: building and
# validating the spec costs about 100 us, too much to pay on every call.
_call_layers = {}


def _layer(canonical, device_index):
    key = (json.dumps(canonical, sort_keys=True), device_index)
    if key not in _layers:
        _layers[key] = _Layer(canonical, device_index)
    return _layers[key]


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """FLA's chunk_gated_delta_rule on gdnc kernels. Returns (o [B, T, HV, V], final_state or None).

    Code options come from `spec=` (a dict: save_mode, deterministic, reuse_recompute_tapes, ...);
    call options from the arguments. Runs on torch's current stream; memory comes from torch.
    Under torch.utils.checkpoint(use_reentrant=False) the recompute is detected and its tapes are
    handed to the backward when the spec's reuse_recompute_tapes rule says so.
    """
    B, T, H, HV, K, V, N = check_arguments(q, k, v, g, beta, initial_state, cu_seqlens, output_final_state,
                                           **kwargs)
    import torch  # only here: the module imports without torch
    from ._autograd import apply

    options = kwargs.get("spec")
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    call_key = (json.dumps(options, sort_keys=True), H, HV, K, V, bool(use_qk_l2norm_in_kernel),
                initial_state is not None, bool(output_final_state), device_index)
    layer = _call_layers.get(call_key)
    if layer is None:
        canonical = _spec.build(options, heads_qk=H, heads_v=HV, head_dim_k=K, head_dim_v=V,
                                l2norm=use_qk_l2norm_in_kernel, initial_state=initial_state is not None,
                                final_state=output_final_state)
        layer = _call_layers[call_key] = _layer(canonical, device_index)
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=q.device)
    o, ht = apply(layer, q.reshape(1, B * T, H, K), k.reshape(1, B * T, H, K), v.reshape(1, B * T, HV, V),
                  g.reshape(1, B * T, HV), beta.reshape(1, B * T, HV), cu_seqlens, initial_state,
                  0.0 if scale is None else float(scale), output_final_state)
    return o.reshape(B, T, HV, V), ht
