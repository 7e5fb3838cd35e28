"""chunk_gated_delta_rule with FLA's argument names and [B, T, H, D] layout, on libgdn."""

import ctypes
import json
import math
import operator
import struct

from . import spec as _spec
from ._lib import InputError, check, library

# FLA arguments gdnc does not implement: passing a non-default value raises, naming it.
_UNSUPPORTED = {
    "use_beta_sigmoid_in_kernel": False,
    "allow_neg_eigval": False,
    "state_v_first": False,
    "transpose_state_layout": False,
    "use_gate_in_kernel": False,
    "A_log": None,
    "dt_bias": None,
    "head_first": False,
}
# FLA hints that only avoid host syncs FLA would otherwise make. gdnc never syncs; it uses
# cu_seqlens_cpu to check the values of cu_seqlens on the host, for free, when it is given.
_HINTS = ("cu_seqlens_cpu", "chunk_indices")
# gdnc's own options: the layer spec, and the opt-in synchronous check of cu_seqlens and g
# (check_inputs; check_cu_seqlens is its older name); a bound on every document's tokens
# (max_seqlen, as flash-attn names it); FLA's context parallelism (gdnc.cp) and, with it, a
# caller-held workspace (gdnc.cake.WorkspaceKcp).
_OWN = ("spec", "check_inputs", "check_cu_seqlens", "max_seqlen", "cp_context", "workspace")
# Limits of libgdn's calls (runtime/plan.hpp, check_problem_size).
_MAX_TOKENS = (1 << 31) - 1
_MAX_DOCUMENTS = 65535
_FLOAT32_MAX = 3.4028234663852886e38


# Every call checks its arguments on the host, before the GPU's work is queued: in the benchmark's
# pattern (a call, then a wait for it) that host time is GPU idle time, so these helpers avoid
# per-element generators and repeated shape reads.
_DTYPE_NAMES = {}
_TENSOR_ATTRS = ("shape", "dtype", "is_cuda", "is_contiguous")


def _dtype_name(t):
    dtype = t.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _shape(t):
    return tuple(map(int, t.shape))


def _require_tensor(name, t, optional=False):
    """A tensor-like argument's shape, or the InputError that names it (a list, None, a number...)."""
    if t is None and optional:
        return None
    for attr in _TENSOR_ATTRS:
        if not hasattr(t, attr):
            raise InputError(f"{name}: expected a tensor, got {'None' if t is None else type(t).__name__}")
    shape = _shape(t)
    for x in shape:
        if x < 1:
            raise InputError(f"{name}: shape {shape} has an empty dimension")
    return shape


def _require_flag(name, value):
    # 0 and 1 pass: they are what an int-typed config gives for False and True.
    if not (isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))):
        raise InputError(f"{name}: expected True or False, got {_spec.excerpt(value)}")


def check_scale(scale):
    """The scale as libgdn receives it (a float32; 0.0 stands for None, 1/sqrt(K)), or the
    InputError that names it: it must be None or a positive number that a float32 holds."""
    if scale is None:
        return 0.0
    problem = f"scale: {_spec.excerpt(scale)} must be a positive finite number or None (1/sqrt(K))"
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) and not hasattr(scale, "__float__"):
        raise InputError(problem)
    try:
        value = float(scale)
    except (TypeError, ValueError, OverflowError):
        raise InputError(problem) from None
    if not (math.isfinite(value) and value > 0):
        raise InputError(problem)
    as_float32 = struct.unpack("f", struct.pack("f", value))[0] if value <= _FLOAT32_MAX else math.inf
    if not (math.isfinite(as_float32) and as_float32 > 0):
        raise InputError(f"scale: {_spec.excerpt(scale)} is outside what a float32 holds (about 1.2e-38 to 3.4e38)")
    return as_float32


def host_offsets(values, source):
    """Offsets given on the host (a tensor, a list, any sequence) as a list of ints, or the
    InputError that names `source` and, for an element that is not an integer, its index."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        values = list(values)
    except TypeError:
        raise InputError(f"{source}: expected a sequence of integers, got {type(values).__name__}") from None
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, int):
            raise InputError(f"{source}[{i}]: {_spec.excerpt(x)} is not an integer")
    return values


def check_cu_seqlens_values(values, T, N, source="cu_seqlens_cpu", max_seqlen=None):
    """The checks the chunk-table kernel makes on the device, on a host copy: values[0] == 0,
    non-decreasing, values[N] == T, and no document longer than max_seqlen if given. Raises
    InputError with the device's words, naming cu_seqlens, for the failure the device reports:
    offset i checks values[i] (0: == 0; 1..N: >= values[i - 1], document i - 1 within max_seqlen;
    N: == T), the lowest failing offset wins, and within an offset the first of those checks."""
    values = host_offsets(values, source)
    if len(values) != N + 1:
        raise InputError(f"{source}: {len(values)} offsets, cu_seqlens has {N + 1}")
    where = f" (from {source})"
    longest = max_seqlen if max_seqlen is not None else _MAX_TOKENS
    for i in range(N + 1):
        if i == 0 and values[0] != 0:
            raise InputError(f"cu_seqlens[0]: {values[0]} must be 0{where}")
        if i > 0 and values[i] < values[i - 1]:
            raise InputError(f"cu_seqlens[{i}]: {values[i]} < cu_seqlens[{i - 1}] ({values[i - 1]}): must be "
                             f"non-decreasing{where}")
        if i == N and values[N] != T:
            raise InputError(f"cu_seqlens[{N}]: {values[N]} must equal T ({T}){where}")
        if i > 0 and values[i] - values[i - 1] > longest:
            raise InputError(f"cu_seqlens: document {i - 1} has {values[i] - values[i - 1]} tokens, "
                             f"more than max_seqlen {max_seqlen}{where}")


def doc_bound(T, cu_seqlens, kwargs, capturing=False):
    """The bound on every document's tokens that a call hands libgdn (0: none): max_seqlen if
    given, else the longest document of FLA's cu_seqlens_cpu hint, else T for a batch of
    equal-length sequences (no cu_seqlens). Under cp.segments "auto" a call whose documents
    cannot be split then launches none of the segment programs; the forward checks the bound on
    the device either way. While a CUDA graph is being captured the hint gives no bound: it
    describes the captured call's documents, and a replay may bring longer ones in the same
    cu_seqlens buffer, which the bound would leave unwritten (an explicit max_seqlen is the
    caller's promise for every replay). Assumes check_arguments passed."""
    if kwargs.get("max_seqlen") is not None:
        return min(kwargs["max_seqlen"], _MAX_TOKENS)  # past any T it bounds nothing
    if cu_seqlens is None:
        return T
    hint = kwargs.get("cu_seqlens_cpu")
    if hint is None or capturing:
        return 0
    values = host_offsets(hint, "cu_seqlens_cpu")
    return max(map(operator.sub, values[1:], values[:-1]))


def check_arguments(q, k, v, g, beta, initial_state=None, cu_seqlens=None, output_final_state=False, scale=None,
                    use_qk_l2norm_in_kernel=False, **kwargs):
    """Validates a call; returns (B, T, H, HV, K, V, N). Works on any tensor-like object with
    shape, dtype, is_cuda and is_contiguous(), so it is testable without torch or a GPU. Every
    argument is checked here, before libgdn sees it, and every error names it."""
    unknown = sorted(set(kwargs) - set(_UNSUPPORTED) - set(_HINTS) - set(_OWN) - {"chunk_size"})
    if unknown:
        raise TypeError(f"chunk_gated_delta_rule: unexpected argument(s) {_spec.excerpt(unknown, 200)}")
    for name, default in _UNSUPPORTED.items():
        if name in kwargs and kwargs[name] is not default and kwargs[name] != default:
            raise NotImplementedError(f"{name}={_spec.excerpt(kwargs[name])} is not supported by gdnc "
                                      f"(only {default!r})")
    if kwargs.get("chunk_size", 64) != 64:
        raise ValueError(f"chunk_size={_spec.excerpt(kwargs['chunk_size'])} is not supported (supported: 64)")
    q_shape, k_shape, v_shape = _require_tensor("q", q), _require_tensor("k", k), _require_tensor("v", v)
    g_shape, beta_shape = _require_tensor("g", g), _require_tensor("beta", beta)
    h0_shape = _require_tensor("initial_state", initial_state, optional=True)
    cu_shape = _require_tensor("cu_seqlens", cu_seqlens, optional=True)
    _require_flag("output_final_state", output_final_state)
    _require_flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    _require_flag("check_inputs", kwargs.get("check_inputs", False))
    _require_flag("check_cu_seqlens", kwargs.get("check_cu_seqlens", False))
    check_scale(scale)
    _spec.options_of(kwargs.get("spec"))
    max_seqlen = kwargs.get("max_seqlen")
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 1):
        raise InputError(f"max_seqlen: {_spec.excerpt(max_seqlen)} must be a positive Python int or None (a tensor "
                         "would need a host sync)")
    if len(q_shape) != 4:
        raise InputError(f"q: expected [B, T, H, K], got shape {q_shape}")
    B, T, H, K = q_shape
    if k_shape != q_shape:
        raise InputError(f"k: shape {k_shape} differs from q's {q_shape}")
    if len(v_shape) != 4 or v_shape[:2] != (B, T):
        raise InputError(f"v: expected [B={B}, T={T}, HV, V], got shape {v_shape}")
    HV, V = v_shape[2:]
    if HV % H != 0:
        raise InputError(f"v: {HV} value heads is not a multiple of {H} q/k heads")
    for name, shape in (("g", g_shape), ("beta", beta_shape)):
        if shape != (B, T, HV):
            raise InputError(f"{name}: expected [B={B}, T={T}, HV={HV}], got shape {shape}")
    for name, t, want in (("q", q, "bfloat16"), ("k", k, "bfloat16"), ("v", v, "bfloat16"), ("g", g, "float32"),
                          ("beta", beta, "float32")):
        if _dtype_name(t) != want:
            raise InputError(f"{name}: dtype {_dtype_name(t)} is not supported (supported: {want})")
    if B * T > _MAX_TOKENS:
        raise InputError(f"q: {B * T} tokens (B x T) is out of range (1 to 2^31-1)")
    if cu_seqlens is not None:
        if B != 1:
            raise InputError(f"q: batch {B} with cu_seqlens; pack the documents into B = 1")
        if len(cu_shape) != 1 or cu_shape[0] < 2:
            raise InputError(f"cu_seqlens: expected [N + 1] with N >= 1, got shape {cu_shape}")
        if _dtype_name(cu_seqlens) not in ("int32", "int64"):
            raise InputError(f"cu_seqlens: dtype {_dtype_name(cu_seqlens)} is not supported (int32 or int64)")
        N = cu_shape[0] - 1
        if "cu_seqlens_cpu" in kwargs and kwargs["cu_seqlens_cpu"] is not None:
            check_cu_seqlens_values(kwargs["cu_seqlens_cpu"], T, N, max_seqlen=max_seqlen)
        if max_seqlen is not None and max_seqlen * N < T:
            raise InputError(f"max_seqlen: {N} documents of at most {max_seqlen} tokens cannot hold the {T} of "
                             "cu_seqlens")
    else:
        if kwargs.get("cu_seqlens_cpu") is not None:
            raise InputError("cu_seqlens_cpu: given without cu_seqlens")
        if max_seqlen is not None and max_seqlen < T:
            raise InputError(f"max_seqlen: {max_seqlen} is less than the sequences' length T={T}")
        N = B
    if N > _MAX_DOCUMENTS:
        raise InputError(f"cu_seqlens: {N} documents is out of range (1 to {_MAX_DOCUMENTS})")
    if initial_state is not None:
        if h0_shape != (N, HV, K, V):
            raise InputError(f"initial_state: expected [N={N}, HV={HV}, K={K}, V={V}], got {h0_shape}")
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


def _layer_of_call(options, H, HV, K, V, l2norm, has_h0, has_ht, device_index):
    import torch
    call_key = (_spec.options_key(options), H, HV, K, V, bool(l2norm), has_h0, bool(has_ht), device_index)
    layer = _call_layers.get(call_key)
    if layer is None:
        # JIT for the GPU the call runs on (a spec's own "targets" still wins).
        target = _spec.target_of_capability(torch.cuda.get_device_capability(device_index))
        canonical = _spec.build(options, heads_qk=H, heads_v=HV, head_dim_k=K, head_dim_v=V, l2norm=l2norm,
                                initial_state=has_h0, final_state=has_ht, target=target)
        layer = _call_layers[call_key] = _layer(canonical, device_index)
    return layer


def _require_cp_context(cp_context):
    from .cp import CPContext
    if not isinstance(cp_context, CPContext):
        raise InputError(f"cp_context: expected a gdnc.cp.CPContext (gdnc.cp.build_cp_context), got "
                         f"{type(cp_context).__name__}")
    return cp_context


def cp_options(options, cp_context):
    """The caller's code options with cp.ranks set to the context's world (a different cp.ranks
    given by the caller is an error naming both)."""
    _require_cp_context(cp_context)
    options = _spec.options_of(options)
    cp = options.get("cp", {})
    if not isinstance(cp, dict):
        raise InputError(f"spec: cp must be an object, got {_spec.excerpt(cp)}")
    if cp.get("ranks", cp_context.world) != cp_context.world:
        raise InputError(f"spec: cp.ranks {_spec.excerpt(cp['ranks'])} differs from the cp_context's world of "
                         f"{cp_context.world} ranks")
    options["cp"] = dict(cp, ranks=cp_context.world)
    return options


def _chunk_gated_delta_rule_cp(q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, cu_seqlens, B, T,
                               H, HV, K, V, kwargs):
    cp_context, workspace = kwargs.get("cp_context"), kwargs.get("workspace")
    if cp_context is None:
        raise InputError("workspace: a caller-held workspace is for context-parallel calls (cp_context)")
    for flag in ("check_inputs", "check_cu_seqlens"):
        if kwargs.get(flag):
            raise InputError(f"{flag}: not with cp_context (the context checked the batch's cu_seqlens on the "
                             "host when it was built)")
    options = cp_options(kwargs.get("spec"), cp_context)
    if B != 1:
        raise InputError(f"q: batch {B} with cp_context; pack the rank's tokens into B = 1")
    if T != cp_context.tokens:
        raise InputError(f"q: {T} tokens, but rank {cp_context.rank} of the cp_context holds {cp_context.tokens}")
    local = cp_context.cu_seqlens
    if cu_seqlens is None:
        cu_seqlens = local
    elif cu_seqlens is not local and (tuple(cu_seqlens.shape) != tuple(local.shape)
                                      or cu_seqlens.device != local.device):
        raise InputError(f"cu_seqlens: with cp_context pass the context's rank-local cu_seqlens (cp_context."
                         f"cu_seqlens, {local.shape[0]} offsets on {local.device}) or none")
    # initial_state's rows (one per local document) were checked against these cu_seqlens' count.
    import torch  # after the checks above, which need no torch
    from ._autograd import apply_kcp
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    layer = _layer_of_call(options, H, HV, K, V, l2norm, initial_state is not None, output_final_state,
                           device_index)
    rank_of_layer = cp_context._of_layer(layer)
    ws = None
    if workspace is not None:
        ws = workspace._bind(rank_of_layer, q.device)
    return apply_kcp(rank_of_layer, q, k, v, g, beta, cu_seqlens, initial_state, check_scale(scale),
                     output_final_state, ws)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """FLA's chunk_gated_delta_rule on gdnc kernels. Returns (o [B, T, HV, V], final_state or None).

    Code options come from `spec=` (a dict or a JSON string: save_mode, deterministic,
    reuse_recompute_tapes, ...); call options from the arguments. Runs on torch's current stream;
    memory comes from torch. Under torch.utils.checkpoint(use_reentrant=False) the recompute is
    detected and its tapes are handed to the backward when the spec's reuse_recompute_tapes rule
    says so.

    cu_seqlens and g are checked on the device without a host sync; a bad cu_seqlens gives garbage
    and a positive, NaN or infinite g a wrong answer, not an error. To be told: pass FLA's
    cu_seqlens_cpu hint (cu_seqlens checked on the host, free), or check_inputs=True (older name
    check_cu_seqlens=True), which synchronizes after the forward and raises InputError naming
    cu_seqlens[i] or the first bad g[t, head] (not allowed during CUDA graph capture).

    max_seqlen= (a Python int, as flash-attn names it) bounds every document's tokens; without it
    the bound is the longest document of cu_seqlens_cpu (except while a CUDA graph is captured:
    replays may bring longer documents), or T for [B, T] sequences. Under the
    default cp.segments "auto" a call whose documents are too short to split then launches none of
    the segment programs. The forward checks the bound on the device: a longer document is
    reported like a bad cu_seqlens (check_inputs=True raises InputError naming it), and the call's
    outputs are not written: cu_seqlens_cpu must be the host copy of cu_seqlens, as in FLA. Not
    used with cp_context.

    cp_context=gdnc.cp.build_cp_context(...) runs this rank of a context-parallel layer on the
    rank's tokens (gdnc.cp says how; cu_seqlens then defaults to the context's rank-local ones).
    """
    if kwargs.get("cu_seqlens_cpu") is not None:
        # One host list for every use below (an iterator would be used up by the first).
        kwargs["cu_seqlens_cpu"] = host_offsets(kwargs["cu_seqlens_cpu"], "cu_seqlens_cpu")
    cp_context = kwargs.get("cp_context")
    if cp_context is not None and cu_seqlens is None:
        # The rank's own documents: initial_state has a row per local document.
        cu_seqlens = _require_cp_context(cp_context).cu_seqlens
    B, T, H, HV, K, V, N = check_arguments(q, k, v, g, beta, initial_state, cu_seqlens, output_final_state,
                                           scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                           **kwargs)
    if cp_context is not None or kwargs.get("workspace") is not None:
        return _chunk_gated_delta_rule_cp(q, k, v, g, beta, scale, initial_state, output_final_state,
                                          use_qk_l2norm_in_kernel, cu_seqlens, B, T, H, HV, K, V, kwargs)
    import torch  # only here: the module imports without torch
    from ._autograd import apply

    options = kwargs.get("spec")
    check_flag = "check_inputs" if kwargs.get("check_inputs") else "check_cu_seqlens"
    check_inputs = bool(kwargs.get(check_flag, False))
    if check_inputs and torch.cuda.is_current_stream_capturing():
        raise InputError(f"{check_flag}: True needs a host sync, which CUDA graph capture forbids; pass "
                         "cu_seqlens_cpu instead, or check outside the capture")
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    layer = _layer_of_call(options, H, HV, K, V, use_qk_l2norm_in_kernel, initial_state is not None,
                           output_final_state, device_index)
    bound = doc_bound(T, cu_seqlens, kwargs, capturing=torch.cuda.is_current_stream_capturing())
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=q.device)
    if B == 1:  # already the packed layout: no views to make
        return apply(layer, q, k, v, g, beta, cu_seqlens, initial_state, check_scale(scale), output_final_state,
                     check_inputs, bound)
    o, ht = apply(layer, q.reshape(1, B * T, H, K), k.reshape(1, B * T, H, K), v.reshape(1, B * T, HV, V),
                  g.reshape(1, B * T, HV), beta.reshape(1, B * T, HV), cu_seqlens, initial_state,
                  check_scale(scale), output_final_state, check_inputs, bound)
    return o.reshape(B, T, HV, V), ht
