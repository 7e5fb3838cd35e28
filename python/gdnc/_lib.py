"""Loading libgdn.so (the C ABI of runtime/gdn.h) with ctypes: no compilation against torch."""

import ctypes
import os
from pathlib import Path

_lib = None

GDN_OK, GDN_ERR_SPEC, GDN_ERR_INPUT, GDN_ERR_COMPILE, GDN_ERR_CUDA, GDN_ERR_OTHER, GDN_ERR_NCCL = range(7)


class GdncError(Exception):
    """The base of every error gdnc raises, as gdn::Error is in C++: the message says what is wrong
    and names the argument, the spec field or the path. Raised as such for failures of no finer
    kind (libgdn cannot be loaded, GDN_ERR_OTHER)."""


class SpecError(GdncError, ValueError):
    """An invalid layer spec; the message starts with the JSON pointer of the field, or with
    "spec:" when the spec as a whole cannot be read."""


class InputError(GdncError, ValueError):
    """Invalid call arguments (types, shapes, dtypes, values, sizes); the message starts with the
    argument's name."""


class CompileError(GdncError, RuntimeError):
    """NVRTC rejected a generated program; the message has the log and the source path."""


class CudaError(GdncError, RuntimeError):
    """The CUDA driver failed or is missing."""


class NcclError(GdncError, RuntimeError):
    """NCCL (gdnc's own convenience path of context parallelism) could not be loaded or failed."""


def _candidates():
    env = os.environ.get("GDNC_LIBRARY")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    # Next to the package, a source tree's build/, then an installed libgdn (cmake --install into a
    # prefix the loader searches, or LD_LIBRARY_PATH): the bare name goes to the dynamic loader.
    return [here / "libgdn.so", here.parent.parent / "build" / "libgdn.so", "libgdn.so"]


def library():
    """The loaded libgdn; raises GdncError naming every path tried when it cannot be loaded."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if isinstance(path, Path) and not path.is_file():
            tried.append(f"{path} (missing)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        _declare(lib)
        _lib = lib
        return lib
    raise GdncError("cannot load libgdn.so; tried: " + "; ".join(tried) +
                    ". Build it with ./scripts/test.sh (or install it: cmake --install) or point GDNC_LIBRARY at it.")


def check(status):
    """Raises the exception that matches a libgdn status code, with libgdn's message."""
    if status == GDN_OK:
        return
    message = library().gdn_last_error().decode(errors="replace")
    if status == GDN_ERR_SPEC:
        raise SpecError(message)
    if status == GDN_ERR_INPUT:
        raise InputError(message)
    if status == GDN_ERR_COMPILE:
        raise CompileError(message)
    if status == GDN_ERR_CUDA:
        raise CudaError(message)
    if status == GDN_ERR_NCCL:
        raise NcclError(message)
    raise GdncError(message)


def _declare(lib):
    c = ctypes
    p, sz, i64, i32, f32 = c.c_void_p, c.c_size_t, c.c_int64, c.c_int, c.c_float
    fp = c.POINTER(c.c_float)
    lib.gdn_last_error.restype = c.c_char_p
    lib.gdn_last_error.argtypes = []
    lib.gdn_spec_validate.argtypes = [c.c_char_p, c.c_char_p, sz]
    lib.gdn_layer_create.argtypes = [c.c_char_p, i32, c.c_char_p, c.POINTER(p)]
    lib.gdn_layer_destroy.argtypes = [p]
    lib.gdn_layer_destroy.restype = None
    lib.gdn_layer_saved_bytes.argtypes = [p, i64, i32, c.POINTER(sz)]
    lib.gdn_layer_workspace_bytes.argtypes = [p, i32, i64, i32, c.POINTER(sz)]
    lib.gdn_workspace_create.argtypes = [p, sz, c.POINTER(p)]
    lib.gdn_workspace_destroy.argtypes = [p]
    lib.gdn_workspace_destroy.restype = None
    lib.gdn_workspace_set_max_doc_tokens.argtypes = [p, i64]
    inputs = [p, i64, i32, p, p, p, p, p, p, i32, p, f32]
    lib.gdn_layer_forward_ws.argtypes = inputs + [p, p, p, sz, p, p]
    lib.gdn_layer_recompute.argtypes = inputs + [i32, p, p, p, sz, p, p, c.POINTER(i32)]
    lib.gdn_layer_backward_ws.argtypes = inputs + [p, p, p, p, p, p, p, p, p, sz, p, p, c.POINTER(i32)]
    lib.gdn_layer_check_status.argtypes = [p, i64, i32, p, p]
    lib.gdn_spec_region_layout.argtypes = [c.c_char_p, i32, i32, i64, i32, p, sz, c.POINTER(sz), c.POINTER(sz)]
    lib.gdn_spec_region_layout_on.argtypes = [c.c_char_p, c.c_char_p, i32, i32, i64, i32, p, sz, c.POINTER(sz),
                                              c.POINTER(sz)]
    # Context parallelism (runtime/gdn.h): one rank's context and its phases.
    i64p, i32p, szp = c.POINTER(i64), c.POINTER(c.c_int32), c.POINTER(sz)
    lib.gdn_cp_rank_view.argtypes = [i64p, sz, i32, i32, p, i64p, i32p, sz]
    lib.gdn_spec_kcp_workspace_layout.argtypes = [c.c_char_p, i32, i64p, sz, i32, p, sz, szp, szp]
    lib.gdn_spec_kcp_record_bytes.argtypes = [c.c_char_p, szp]
    lib.gdn_kcp_context_create.argtypes = [p, i64p, sz, i32, i32, c.POINTER(p)]
    lib.gdn_kcp_context_destroy.argtypes = [p]
    lib.gdn_kcp_context_destroy.restype = None
    lib.gdn_kcp_agreement_bytes.argtypes = []
    lib.gdn_kcp_agreement_bytes.restype = sz
    lib.gdn_kcp_agreement.argtypes = [p, p, sz]
    lib.gdn_kcp_check_agreement.argtypes = [p, p, sz]
    lib.gdn_kcp_record_bytes.argtypes = [p, szp]
    lib.gdn_saved_bytes_kcp.argtypes = [p, szp]
    lib.gdn_workspace_bytes_kcp.argtypes = [p, i32, szp]
    lib.gdn_workspace_layout_kcp.argtypes = [p, i32, p, sz, szp, szp]
    kcp_inputs = [p, p, p, p, p, p, p, i32, p, f32]
    lib.gdn_kcp_forward_summaries.argtypes = kcp_inputs + [p, sz, p, p]
    lib.gdn_kcp_forward_walk.argtypes = kcp_inputs + [p, p, p, sz, p, p]
    lib.gdn_kcp_recompute.argtypes = kcp_inputs + [i32, p, p, p, sz, p, p, c.POINTER(i32)]
    grads = [p, p, p, p, p, p, p, p]
    lib.gdn_kcp_backward_summaries.argtypes = kcp_inputs + grads + [p, sz, p, p, c.POINTER(i32)]
    lib.gdn_kcp_backward_walk.argtypes = kcp_inputs + grads + [p, sz, p, p]
    for name in ("gdn_spec_validate", "gdn_layer_create", "gdn_layer_saved_bytes", "gdn_layer_workspace_bytes",
                 "gdn_workspace_create", "gdn_workspace_set_max_doc_tokens", "gdn_layer_forward_ws",
                 "gdn_layer_recompute", "gdn_layer_backward_ws", "gdn_layer_check_status", "gdn_spec_region_layout",
                 "gdn_spec_region_layout_on",
                 "gdn_cp_rank_view", "gdn_spec_kcp_workspace_layout", "gdn_spec_kcp_record_bytes",
                 "gdn_kcp_context_create",
                 "gdn_kcp_agreement", "gdn_kcp_check_agreement", "gdn_kcp_record_bytes", "gdn_saved_bytes_kcp",
                 "gdn_workspace_bytes_kcp", "gdn_workspace_layout_kcp", "gdn_kcp_forward_summaries",
                 "gdn_kcp_forward_walk", "gdn_kcp_recompute", "gdn_kcp_backward_summaries", "gdn_kcp_backward_walk"):
        getattr(lib, name).restype = c.c_int
    del fp
