"""Layer specs from Python: options that change code come from a spec (a dict or JSON string),
merged over what the tensors imply; libgdn validates them (no GPU needed)."""

import ctypes
import json
import math

from ._lib import InputError, SpecError, check, library

# Spec fields a caller may set; the rest (heads, head_dim, norm, states) follow from the call.
CODE_OPTIONS = ("name", "save_mode", "reuse_recompute_tapes", "deterministic", "graph", "tensor_cores", "walk_slab", "walk_bwd_slab", "forward", "backward_w",
                "walk_bwd_layout", "backward_norm", "targets", "scale",
                "cp")
# libgdn reads at most this much spec text (kSpecJsonLimits); longer text is refused here first.
MAX_SPEC_BYTES = 1 << 20


def excerpt(value, limit=48):
    """A short, printable rendering of a value for a message: repr() escapes control characters,
    and anything longer than `limit` is cut with its full length noted."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters in all)"


def _reject_constant(name):
    raise SpecError(f"spec: {name} is not a JSON number")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise SpecError(f"spec: number {excerpt(text, 24)} is out of range (it overflows a double)")
    return value


def _no_duplicate_keys(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise SpecError(f"spec: duplicate key {excerpt(key)} (each field may appear once)")
        out[key] = value
    return out


def _loads(text):
    """JSON text as Python objects, as strictly as libgdn reads it: no NaN or Infinity, no
    overflowing numbers, no duplicate keys, no NUL (which would cut the text at the C ABI)."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"spec: {len(text)} characters, more than the {MAX_SPEC_BYTES} allowed")
    if "\0" in text:
        raise SpecError(f"spec: a NUL character at index {text.index(chr(0))} (JSON text holds none)")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant,
                          parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise SpecError(f"spec: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise SpecError("spec: nesting too deep") from None


def _dumps(spec):
    try:
        return json.dumps(spec, allow_nan=False)
    except RecursionError:
        raise SpecError("spec: nesting too deep") from None
    except (TypeError, ValueError) as e:
        raise SpecError(f"spec: cannot be written as JSON: {excerpt(str(e), 120)}") from None


def validate(spec):
    """Returns the canonical form of `spec` (dict or JSON string), defaults filled in.
    Raises SpecError("<json pointer>: <problem>") for an invalid spec."""
    if isinstance(spec, str):
        # libgdn reads the text with its bounded reader (pointers in its messages); ctypes would
        # cut it at a NUL, which could leave a different, valid spec.
        if "\0" in spec:
            raise SpecError(f"spec: a NUL character at index {spec.index(chr(0))} (JSON text holds none)")
        text = spec
    elif isinstance(spec, dict):
        text = _dumps(spec)
    else:
        raise SpecError(f"spec: expected a dict or a JSON string, got {type(spec).__name__}")
    try:
        data = text.encode()
    except UnicodeEncodeError as e:
        raise SpecError(f"spec: {e.reason} at index {e.start}") from None
    buf = ctypes.create_string_buffer(1 << 14)
    check(library().gdn_spec_validate(data, buf, len(buf)))
    return json.loads(buf.value.decode())


class _Slot(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 32), ("offset", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


_REGIONS = {"saved": 0, "workspace": 1}
_FORMS = {"forward": 0, "recompute": 1, "backward": 2}


def region_layout(spec, T, N, region="saved", form="forward", target=None):
    """The layout of a layer's saved region or of a call form's workspace for T tokens and N
    documents, from the spec alone (no GPU): {"bytes": total, "buffers": {name: (offset, bytes)}},
    buffers in offset order. Buffers that reuse another's workspace bytes share its offset.
    target ("sm_90a", ... one of the spec's targets): the layout of a layer loaded there, which may
    leave buffers out; None: a layout that serves the layer on any of its targets."""
    if target is not None and not isinstance(target, str):
        raise InputError(f"target: expected a str or None, got {type(target).__name__}")
    if region not in _REGIONS:
        raise InputError(f"region: {excerpt(region)} is not 'saved' or 'workspace'")
    if form not in _FORMS:
        raise InputError(f"form: {excerpt(form)} is not 'forward', 'recompute' or 'backward'")
    for name, value, bits in (("T", T, 63), ("N", N, 31)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{name}: expected an int, got {type(value).__name__}")
        if not -(1 << bits) <= value < (1 << bits):
            raise InputError(f"{name}: {excerpt(value)} does not fit a {bits + 1}-bit integer")
    text = json.dumps(validate(spec))
    lib = library()
    count, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    args = (text.encode(), None if target is None else target.encode(), _REGIONS[region], _FORMS[form], T, N)
    check(lib.gdn_spec_region_layout_on(*args, None, 0, ctypes.byref(count), ctypes.byref(total)))
    slots = (_Slot * count.value)()
    check(lib.gdn_spec_region_layout_on(*args, slots, count.value, ctypes.byref(count), None))
    return {"bytes": total.value, "buffers": {s.name.decode(): (s.offset, s.bytes) for s in slots}}


def options_key(options):
    """A hashable text of the caller's code options, for caching layers per call."""
    if options is None or isinstance(options, str):
        return options
    try:
        return json.dumps(options, sort_keys=True, allow_nan=False)
    except RecursionError:
        raise SpecError("spec: nesting too deep") from None
    except (TypeError, ValueError) as e:
        raise SpecError(f"spec: cannot be written as JSON: {excerpt(str(e), 120)}") from None


def options_of(options):
    """The caller's code options as a dict: from None, a dict, or a JSON string of an object."""
    if options is None:
        return {}
    if isinstance(options, str):
        options = _loads(options)
        if not isinstance(options, dict):
            raise SpecError(f"spec: expected a JSON object, got {excerpt(options)}")
        return options
    if isinstance(options, dict):
        return dict(options)
    raise SpecError(f"spec: expected a dict, a JSON string or None, got {type(options).__name__}")


# Compute capability -> the target gdnc compiles for it.
_TARGET_OF_CAPABILITY = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a"}


def target_of_capability(capability):
    """The gdnc target for a device's (major, minor) compute capability; InputError naming the device's
    architecture when gdnc has no target for it (sm_107a, for one, is not known to NVRTC 13.0)."""
    major, minor = (int(x) for x in capability)
    target = _TARGET_OF_CAPABILITY.get((major, minor))
    if target is None:
        supported = ", ".join(f"{t} (compute capability {a}.{b})" for (a, b), t in _TARGET_OF_CAPABILITY.items())
        raise InputError(f"this GPU is sm_{major}{minor} (compute capability {major}.{minor}); gdnc compiles for "
                         f"{supported} only")
    return target


def build(options, *, heads_qk, heads_v, head_dim_k, head_dim_v, l2norm, initial_state, final_state,
          target="sm_90a"):
    """The spec of one call: the shapes and flags of the call, plus the caller's code options.
    `target` is the GPU's own (target_of_capability) unless the options name targets."""
    options = options_of(options)
    unknown = sorted(set(options) - set(CODE_OPTIONS))
    if unknown:
        raise TypeError(f"spec: unknown option(s) {excerpt(unknown, 200)} (options: {list(CODE_OPTIONS)}; heads, "
                        "head_dim, norm and the state flags follow from the tensors and arguments)")
    spec = {
        "name": f"gdn_h{heads_qk}_hv{heads_v}_k{head_dim_k}_v{head_dim_v}",
        "heads": {"qk": heads_qk, "v": heads_v},
        "head_dim": {"k": head_dim_k, "v": head_dim_v},
        "norm": "l2_in_kernel" if l2norm else "none",
        "initial_state": bool(initial_state),
        "final_state": bool(final_state),
        "targets": [target],
    }
    spec.update(options)
    return validate(spec)
