"""The seed's single-rank names over gdnc's layer: cake_gdn_train (non-deterministic) and
cake_gdn_det_train (deterministic), with FLA's call arguments and the seed's three code options.

    from gdnc.cake import Options, cake_gdn_det_train
    o, ht = cake_gdn_det_train(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                               options=Options(graph="replay", save_mode="full"))

Both are chunk_gated_delta_rule with `deterministic` set; the options become spec fields. An
option passed explicitly is recorded as given (Options.given), so an explicit "auto" and an omitted
one stay distinguishable: only given options enter the spec, the rest keep the spec's defaults
(graph "off", reuse_recompute_tapes "auto", save_mode "light"). The context-parallel variants
(cake_gdn_train_kcp, cake_gdn_det_train_kcp, OptionsKcp, WorkspaceKcp) come with the KCP layer and
are not here yet.
"""

from .api import chunk_gated_delta_rule

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
