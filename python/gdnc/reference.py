"""The fp64 reference (runtime/check, libgdn_reference.so) from Python, for accuracy gates.

Works on flat sequences of floats and on torch tensors (moved to the CPU as float64). Gradients are those of loss = sum(o * d_o) + sum(ht * dht), with respect to the RAW q
and k (before the optional in-kernel L2 norm).
"""

import ctypes
import os
from pathlib import Path

_lib = None


def library():
    global _lib
    if _lib is not None:
        return _lib
    env = os.environ.get("GDNC_REFERENCE_LIBRARY")
    here = Path(__file__).resolve().parent
    paths = [Path(env)] if env else [here / "libgdn_reference.so", here.parent.parent / "build" / "libgdn_reference.so"]
    for path in paths:
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            d = ctypes.POINTER(ctypes.c_double)
            lib.gdn_ref_run.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_double, ctypes.c_int,
                                        d, d, d, d, d, d, ctypes.c_int, d, d, d, d, d, d, d, d, d, d,
                                        ctypes.c_char_p, ctypes.c_size_t]
            lib.gdn_ref_run.restype = ctypes.c_int
            _lib = lib
            return lib
    raise RuntimeError("cannot find libgdn_reference.so; tried: " + "; ".join(str(p) for p in paths))


def _buf(values, n):
    """A ctypes double buffer holding `values` (or n zeros when values is None)."""
    if values is None:
        return (ctypes.c_double * n)()
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().reshape(-1).double().cpu().tolist()
    return (ctypes.c_double * n)(*values)


def run(q, k, v, g, beta, cu_seqlens, H, HV, K, V, scale=0.0, l2norm=False, h0=None, d_o=None, dht=None):
    """Returns a dict of flat float lists: o, ht, and with d_o also dq, dk, dv, dg, dbeta, dh0."""
    cu = [int(x) for x in (cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens)]
    T, N = cu[-1], len(cu) - 1
    tqk, tv, th, st = T * H * K, T * HV * V, T * HV, N * HV * K * V
    ins = [_buf(x, n) for x, n in ((q, tqk), (k, tqk), (v, tv), (g, th), (beta, th))]
    h0b = _buf(h0, st) if h0 is not None else None
    backward = d_o is not None
    dob = _buf(d_o, tv) if backward else None
    dhtb = _buf(dht, st) if dht is not None else None
    out = {name: (ctypes.c_double * n)() for name, n in
           (("o", tv), ("ht", st), ("dq", tqk), ("dk", tqk), ("dv", tv), ("dg", th), ("dbeta", th), ("dh0", st))}
    err = ctypes.create_string_buffer(1024)
    cu_arr = (ctypes.c_int64 * len(cu))(*cu)
    rc = library().gdn_ref_run(T, H, HV, K, V, cu_arr, N, scale, int(l2norm), *ins, h0b, int(backward), dob, dhtb,
                               out["o"], out["ht"], out["dq"], out["dk"], out["dv"], out["dg"], out["dbeta"],
                               out["dh0"] if h0 is not None else None, err, len(err))
    if rc != 0:
        raise ValueError(err.value.decode())
    keep = ["o", "ht"] + (["dq", "dk", "dv", "dg", "dbeta"] + (["dh0"] if h0 is not None else []) if backward else [])
    return {name: list(out[name]) for name in keep}


def rel_rms(ref, got):
    """FLA's metric: rms(ref - got) / (rms(ref) + 1e-8); inf if got holds a NaN or inf."""
    num = den = 0.0
    for r, x in zip(ref, got):
        if x != x or x in (float("inf"), float("-inf")):
            return float("inf")
        num += (r - x) ** 2
        den += r * r
    n = max(len(ref), 1)
    return (num / n) ** 0.5 / ((den / n) ** 0.5 + 1e-8)


__all__ = ["run", "run_tensors", "rel_rms", "library"]


def run_tensors(q, k, v, g, beta, cu_seqlens, scale=0.0, l2norm=False, h0=None, d_o=None, dht=None):
    """The same on torch tensors in FLA's layout ([1, T, H, K] etc.), zero-copy on the CPU side:
    returns fp64 CPU tensors shaped like their inputs (o like v, dq like q, ...)."""
    import torch

    def host(t):
        return None if t is None else t.detach().to("cpu", torch.float64).contiguous()

    H, K = q.shape[-2], q.shape[-1]
    HV, V = v.shape[-2], v.shape[-1]
    cu = cu_seqlens.detach().to("cpu", torch.int64).contiguous()
    T, N = int(cu[-1]), cu.numel() - 1
    ins = [host(x) for x in (q, k, v, g, beta, h0, d_o, dht)]
    out = {"o": torch.empty_like(ins[2]), "ht": torch.empty(N, HV, K, V, dtype=torch.float64),
           "dq": torch.empty_like(ins[0]), "dk": torch.empty_like(ins[1]), "dv": torch.empty_like(ins[2]),
           "dg": torch.empty_like(ins[3]), "dbeta": torch.empty_like(ins[4]),
           "dh0": torch.empty(N, HV, K, V, dtype=torch.float64)}
    ptr = lambda t: None if t is None else ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_double))  # noqa: E731
    err = ctypes.create_string_buffer(1024)
    cu_ptr = ctypes.cast(cu.data_ptr(), ctypes.POINTER(ctypes.c_int64))
    backward = d_o is not None
    rc = library().gdn_ref_run(T, H, HV, K, V, cu_ptr, N, scale, int(l2norm), *[ptr(t) for t in ins[:6]],
                               int(backward), ptr(ins[6]), ptr(ins[7]), ptr(out["o"]), ptr(out["ht"]),
                               ptr(out["dq"]), ptr(out["dk"]), ptr(out["dv"]), ptr(out["dg"]), ptr(out["dbeta"]),
                               ptr(out["dh0"]) if h0 is not None else None, err, len(err))
    if rc != 0:
        raise ValueError(err.value.decode())
    keep = ["o", "ht"] + (["dq", "dk", "dv", "dg", "dbeta"] + (["dh0"] if h0 is not None else []) if backward else [])
    return {name: out[name] for name in keep}
