"""The seed's single-rank names over gdnc's layer: cake_gdn_train (non-deterministic) and
cake_gdn_det_train (deterministic), with FLA's call arguments and the seed's three code options.

    from gdnc.cake import Options, cake_gdn_det_train
    o, ht = cake_gdn_det_train(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                               options=Options(graph="replay", save_mode="full"))

Both are chunk_gated_delta_rule with `deterministic` set; the options become spec fields. An
option passed explicitly is recorded as given (Options.given), so an explicit "auto" and an omitted
one stay distinguishable: only given options enter the spec, the rest keep the spec's defaults
(graph "off", reuse_recompute_tapes "auto", save_mode "light").

The context-parallel variants take a gdnc.cp context (build_cp_context) and this rank's tokens:

    from gdnc.cp import build_cp_context
    from gdnc.cake import OptionsKcp, WorkspaceKcp, cake_gdn_det_train_kcp, gdn_workspace_bytes_kcp
    ctx = build_cp_context(cu_seqlens, group)
    ws = WorkspaceKcp(gdn_workspace_bytes_kcp(ctx, q, k, v, g, beta, use_qk_l2norm_in_kernel=True), q.device)
    o, ht = cake_gdn_det_train_kcp(q, k, v, g, beta, ctx, options=OptionsKcp(save_mode="full"), workspace=ws,
                                   use_qk_l2norm_in_kernel=True)

OptionsKcp takes the same options as Options. WorkspaceKcp is a caller-held arena (torch memory
with its libgdn stamp) that the step's forward and backward use instead of allocating their own,
so its address stays put across steps (graph capture); gdn_workspace_bytes_kcp and
gdn_workspace_layout_kcp give its size and slots for a call's arguments without a GPU call.
"""

import ctypes

from ._lib import InputError, check, library
from .api import check_arguments, chunk_gated_delta_rule, cp_options

# The values each option takes, as the seed names them; the spec's own reader checks them again.
CHOICES = {
    "graph": ("off", "replay"),
    "reuse_recompute_tapes": (True, False, "auto"),
    "save_mode": ("light", "full"),
}
DEFAULTS = {"graph": "off", "reuse_recompute_tapes": "auto", "save_mode": "light"}


class Options:
    """The code options of a cake_gdn_* call. Each keyword may be left out (the spec's default
    applies) or given; a bad value raises ValueError naming the option and what it takes."""

    __slots__ = ("_given",)

    def __init__(self, **options):
        unknown = sorted(set(options) - set(CHOICES))
        if unknown:
            raise TypeError(f"Options: unknown option(s) {unknown} (known: {', '.join(CHOICES)})")
        for name, value in options.items():
            # `is` for the booleans: 1 == True would pass a membership test.
            if not any(value is c if isinstance(c, bool) else (not isinstance(value, bool) and value == c)
                       for c in CHOICES[name]):
                raise ValueError(f"Options: {name}={value!r} is not supported (supported: "
                                 f"{', '.join(repr(c) for c in CHOICES[name])})")
        object.__setattr__(self, "_given", dict(options))

    def __setattr__(self, name, value):
        raise AttributeError("Options are immutable: build a new one")

    def __getattr__(self, name):
        if name in CHOICES:
            return self._given.get(name, DEFAULTS[name])
        raise AttributeError(name)

    @property
    def given(self):
        """The options passed explicitly, as a dict."""
        return dict(self._given)

    def spec(self, deterministic):
        """The spec fields these options set, with the variant's determinism."""
        return dict(self._given, deterministic=bool(deterministic))

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self._given.items())
        return f"Options({inner})"

    def __eq__(self, other):
        return isinstance(other, Options) and self._given == other._given

    def __hash__(self):
        return hash(tuple(sorted((k, repr(v)) for k, v in self._given.items())))


def _train(deterministic, q, k, v, g, beta, options, kwargs):
    if "spec" in kwargs:
        raise TypeError("cake_gdn_*: pass code options as options=Options(...), not spec=")
    if options is None:
        options = Options()
    elif not isinstance(options, Options):
        raise TypeError(f"cake_gdn_*: options must be gdnc.cake.Options, not {type(options).__name__}")
    return chunk_gated_delta_rule(q, k, v, g, beta, spec=options.spec(deterministic), **kwargs)


def cake_gdn_train(q, k, v, g, beta, options=None, **kwargs):
    """Non-deterministic single-rank GDN training step (forward with autograd): FLA's
    chunk_gated_delta_rule arguments in `kwargs` (scale, initial_state, output_final_state,
    use_qk_l2norm_in_kernel, cu_seqlens, ...). Returns (o, final_state or None). gdnc's
    non-deterministic layer runs the fixed-order kernels today (docs/spec.md)."""
    return _train(False, q, k, v, g, beta, options, kwargs)


def cake_gdn_det_train(q, k, v, g, beta, options=None, **kwargs):
    """Deterministic single-rank GDN training step: the same as cake_gdn_train, with every output
    and gradient bitwise identical run to run and independent of the other documents of the batch."""
    return _train(True, q, k, v, g, beta, options, kwargs)


class OptionsKcp(Options):
    """The code options of a cake_gdn_*_kcp call: those of Options (graph, reuse_recompute_tapes,
    save_mode); cp.ranks comes from the context."""

    __slots__ = ()

    def __repr__(self):
        return "OptionsKcp" + super().__repr__()[len("Options"):]


class WorkspaceKcp:
    """A caller-held KCP workspace of `nbytes` on `device` (gdn_workspace_bytes_kcp), with its
    libgdn stamp. One serves the forward and the backward of a step; steps may reuse it."""

    def __init__(self, nbytes, device):
        import torch
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise InputError(f"nbytes: {nbytes!r} must be a positive int (gdn_workspace_bytes_kcp)")
        self.memory = torch.empty(nbytes, dtype=torch.uint8, device=device)
        handle = ctypes.c_void_p()
        check(library().gdn_workspace_create(ctypes.c_void_p(self.memory.data_ptr()), nbytes, ctypes.byref(handle)))
        self.handle = handle

    def __del__(self):
        if getattr(self, "handle", None):
            library().gdn_workspace_destroy(self.handle)

    @property
    def nbytes(self):
        return self.memory.numel()

    def _bind(self, rank_of_layer, device):
        if self.memory.device != device:
            raise InputError(f"workspace: on {self.memory.device}, the call's tensors on {device}")
        if self.nbytes < rank_of_layer.workspace_bytes:
            raise InputError(f"workspace: {self.nbytes} bytes, this call needs {rank_of_layer.workspace_bytes} "
                             "(gdn_workspace_bytes_kcp)")
        return self


def _options_kcp(options, deterministic):
    if options is None:
        options = OptionsKcp()
    elif not isinstance(options, Options):
        raise TypeError(f"cake_gdn_*_kcp: options must be gdnc.cake.OptionsKcp, not {type(options).__name__}")
    return options.spec(deterministic)


def _train_kcp(deterministic, q, k, v, g, beta, cp_context, options, workspace, kwargs):
    if "spec" in kwargs:
        raise TypeError("cake_gdn_*_kcp: pass code options as options=OptionsKcp(...), not spec=")
    if cp_context is None:
        raise InputError("cp_context: is None (gdnc.cp.build_cp_context)")
    if workspace is not None and not isinstance(workspace, WorkspaceKcp):
        raise TypeError(f"workspace: expected gdnc.cake.WorkspaceKcp, not {type(workspace).__name__}")
    return chunk_gated_delta_rule(q, k, v, g, beta, spec=_options_kcp(options, deterministic), cp_context=cp_context,
                                  workspace=workspace, **kwargs)


def cake_gdn_train_kcp(q, k, v, g, beta, cp_context, options=None, workspace=None, **kwargs):
    """Non-deterministic context-parallel GDN training step on this rank's tokens (gdnc.cp):
    FLA's arguments in `kwargs`; returns (o, final_state or None)."""
    return _train_kcp(False, q, k, v, g, beta, cp_context, options, workspace, kwargs)


def cake_gdn_det_train_kcp(q, k, v, g, beta, cp_context, options=None, workspace=None, **kwargs):
    """Deterministic context-parallel GDN training step: every rank's results bitwise equal run to
    run, and equal to the single-GPU proxy of the same partition."""
    return _train_kcp(True, q, k, v, g, beta, cp_context, options, workspace, kwargs)


def gdn_workspace_layout_kcp(cp_context, q, k, v, g, beta, options=None, deterministic=True, form="backward",
                             initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False):
    """The KCP workspace a cake_gdn_*_kcp call with these arguments uses on this rank, from the
    spec alone: {"bytes": total, "buffers": {name: (offset, bytes)}}, "kcp_gathered" included."""
    from . import spec as _spec
    from .cp import workspace_layout
    _, _, H, HV, K, V, _ = check_arguments(q, k, v, g, beta, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    spec = _spec.build(cp_options(_options_kcp(options, deterministic), cp_context), heads_qk=H, heads_v=HV,
                       head_dim_k=K, head_dim_v=V, l2norm=use_qk_l2norm_in_kernel,
                       initial_state=initial_state is not None, final_state=output_final_state)
    return workspace_layout(spec, cp_context.global_cu_seqlens, cp_context.rank, form)


def gdn_workspace_bytes_kcp(cp_context, q, k, v, g, beta, **kwargs):
    """The bytes of gdn_workspace_layout_kcp: the size of a WorkspaceKcp for such calls."""
    return gdn_workspace_layout_kcp(cp_context, q, k, v, g, beta, **kwargs)["bytes"]
