"""Layer specs from Python: options that change code come from a spec (a dict or JSON string),
merged over what the tensors imply; libgdn validates them (no GPU needed)."""

import ctypes
import json

from ._lib import check, library

# Spec fields a caller may set; the rest (heads, head_dim, norm, states) follow from the call.
CODE_OPTIONS = ("name", "save_mode", "reuse_recompute_tapes", "deterministic", "graph", "tensor_cores", "walk_slab", "walk_bwd_slab", "forward",
                "targets", "scale",
                "cp")


def validate(spec):
    """Returns the canonical form of `spec` (dict or JSON string), defaults filled in.
    Raises SpecError("<json pointer>: <problem>") for an invalid spec."""
    text = spec if isinstance(spec, str) else json.dumps(spec)
    buf = ctypes.create_string_buffer(1 << 14)
    check(library().gdn_spec_validate(text.encode(), buf, len(buf)))
    return json.loads(buf.value.decode())


def build(options, *, heads_qk, heads_v, head_dim_k, head_dim_v, l2norm, initial_state, final_state):
    """The spec of one call: the shapes and flags of the call, plus the caller's code options."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(CODE_OPTIONS))
    if unknown:
        raise TypeError(f"spec: unknown option(s) {unknown} (options: {list(CODE_OPTIONS)}; heads, head_dim, "
                        "norm and the state flags follow from the tensors and arguments)")
    spec = {
        "name": f"gdn_h{heads_qk}_hv{heads_v}_k{head_dim_k}_v{head_dim_v}",
        "heads": {"qk": heads_qk, "v": heads_v},
        "head_dim": {"k": head_dim_k, "v": head_dim_v},
        "norm": "l2_in_kernel" if l2norm else "none",
        "initial_state": bool(initial_state),
        "final_state": bool(final_state),
        "targets": ["sm_90a"],
    }
    spec.update(options)
    return validate(spec)
