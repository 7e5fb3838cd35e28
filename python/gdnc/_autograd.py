"""The torch.autograd.Function over libgdn's forward, recompute and backward."""

import ctypes

import torch

from ._handoff import RecomputeWorkspaces
from ._lib import check, library


def _ptr(t):
    # A plain int: the functions' argtypes (c_void_p) convert it, faster than a c_void_p object.
    return t.data_ptr() if t is not None else None


class _Workspace:
    """Torch-allocated workspace memory with its libgdn stamp (the hand-off of a ckpt step)."""

    def __init__(self, nbytes, device):
        self.memory = torch.empty(max(nbytes, 16), dtype=torch.uint8, device=device)
        handle = ctypes.c_void_p()
        check(library().gdn_workspace_create(_ptr(self.memory), self.memory.numel(), ctypes.byref(handle)))
        self.handle = handle

    def __del__(self):
        if getattr(self, "handle", None):
            library().gdn_workspace_destroy(self.handle)


# A recompute's stamped workspace, by the address of the saved region it wrote, for as long as
# that region lives (_handoff.py says why the address alone is not enough).
_recompute_workspaces = RecomputeWorkspaces()
# Counters for tests and curious users: forwards run as a recompute, and backwards that bound the
# recompute's tapes (the hand-off) instead of re-running the prep program and the walk.
stats = {"recomputes": 0, "handoffs": 0}


def _gradients(q, k, v, g, beta, initial_state, zero_dh0=False):
    """The backward's output tensors: dq, dk, dv, dg, dbeta, dh0 (None without an initial state)."""
    dh0 = None
    if initial_state is not None:
        dh0 = torch.zeros_like(initial_state) if zero_dh0 else torch.empty_like(initial_state)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g),
            torch.empty_like(beta), dh0)


def _stream(device):
    """torch's current stream on `device` as the raw cudaStream_t, through torch's own fast accessor
    where it has one (the public Stream object costs microseconds a call on the host)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _in_backward_pass():
    # During torch.utils.checkpoint's recompute an autograd graph task is running.
    return torch._C._current_graph_task_id() != -1


class ChunkGatedDeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layer, q, k, v, g, beta, cu_seqlens, initial_state, scale, output_final_state, check_inputs,
                max_doc_tokens):
        T, N = q.shape[1], cu_seqlens.shape[0] - 1
        HV, V, K = v.shape[2], v.shape[3], q.shape[3]
        dev = q.device
        stream = _stream(dev)
        o = torch.empty_like(v)
        ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev) if output_final_state else None
        saved = torch.empty(layer.saved_bytes(T, N), dtype=torch.uint8, device=dev)
        ws = _Workspace(layer.workspace_bytes(T, N), dev)
        # Checked on the device by the forward; a backward uses it only with a recompute's hand-off.
        if max_doc_tokens:
            check(library().gdn_workspace_set_max_doc_tokens(ws.handle, max_doc_tokens))
        cu64 = int(cu_seqlens.dtype == torch.int64)
        args = (layer.handle, T, N, _ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta), _ptr(cu_seqlens), cu64,
                _ptr(initial_state), scale)
        recompute = _in_backward_pass()
        if recompute:
            handoff = ctypes.c_int(0)
            check(library().gdn_layer_recompute(*args, 1, _ptr(o), _ptr(ht), _ptr(saved), saved.numel(), ws.handle,
                                                stream, ctypes.byref(handoff)))
            stats["recomputes"] += 1
            if handoff.value:
                _recompute_workspaces.remember(saved, saved.data_ptr(), ws)
        else:
            check(library().gdn_layer_forward_ws(*args, _ptr(o), _ptr(ht), _ptr(saved), saved.numel(), ws.handle,
                                                 stream))
        if check_inputs:
            # Synchronizes the stream and reads the device's verdict on cu_seqlens and g.
            check(library().gdn_layer_check_status(layer.handle, T, N, _ptr(saved), stream))
        ctx.layer, ctx.scale, ctx.cu64 = layer, scale, cu64
        # A plain forward's workspace is scratch, released now so training memory stays at light
        # saves; a recompute's waits in _recompute_workspaces for the backward that follows.
        ctx.save_for_backward(q, k, v, g, beta, cu_seqlens, initial_state, saved)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, cu_seqlens, initial_state, saved = ctx.saved_tensors
        layer = ctx.layer
        T, N = q.shape[1], cu_seqlens.shape[0] - 1
        dev = q.device
        stream = _stream(dev)
        do = do.contiguous()
        dq, dk, dv, dg, dbeta, dh0 = _gradients(q, k, v, g, beta, initial_state)
        ws = _recompute_workspaces.take(saved.data_ptr())
        if ws is None:
            ws = _Workspace(layer.workspace_bytes(T, N), dev)
        handoff = ctypes.c_int(0)
        check(library().gdn_layer_backward_ws(
            layer.handle, T, N, _ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta), _ptr(cu_seqlens), ctx.cu64,
            _ptr(initial_state), ctx.scale, _ptr(do), _ptr(dht.contiguous() if dht is not None else None), _ptr(dq),
            _ptr(dk), _ptr(dv), _ptr(dg), _ptr(dbeta), _ptr(dh0), _ptr(saved), saved.numel(), ws.handle, stream,
            ctypes.byref(handoff)))
        stats["handoffs"] += handoff.value
        return None, dq, dk, dv, dg, dbeta, None, dh0, None, None, None, None


def apply(layer, q, k, v, g, beta, cu_seqlens, initial_state, scale, output_final_state, check_inputs=False,
          max_doc_tokens=0):
    return ChunkGatedDeltaRule.apply(layer, q, k, v, g, beta, cu_seqlens, initial_state, scale, output_final_state,
                                     check_inputs, max_doc_tokens)


class _KcpWorkspace(_Workspace):
    """A KCP workspace: the layer's slots for the rank's shape, then the gathered records."""


class KcpChunkGatedDeltaRule(torch.autograd.Function):
    """One rank of a context-parallel layer: summaries, the all-gather, merge + walk (gdnc.cp)."""

    @staticmethod
    def forward(ctx, rank_of_layer, q, k, v, g, beta, cu_seqlens, initial_state, scale, output_final_state, workspace):
        r = rank_of_layer
        N = cu_seqlens.shape[0] - 1
        HV, V, K = v.shape[2], v.shape[3], q.shape[3]
        dev = q.device
        stream = _stream(dev)
        o = torch.empty_like(v)
        # Rows of documents that go on past this rank get no final state here: zeros, not garbage.
        ht = torch.zeros(N, HV, K, V, dtype=torch.float32, device=dev) if output_final_state else None
        saved = torch.empty(r.saved_bytes, dtype=torch.uint8, device=dev)
        ws = workspace if workspace is not None else _KcpWorkspace(r.workspace_bytes, dev)
        cu64 = int(cu_seqlens.dtype == torch.int64)
        args = (r.handle, _ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta), _ptr(cu_seqlens), cu64,
                _ptr(initial_state), scale)
        # A recompute under torch.utils.checkpoint has a fresh saved region, without the entry state
        # the forward merged: it runs the forward's phases again, all-gather included.
        check(library().gdn_kcp_forward_summaries(*args, _ptr(saved), saved.numel(), ws.handle, stream))
        r.gather(ws.memory)
        check(library().gdn_kcp_forward_walk(*args, _ptr(o), _ptr(ht), _ptr(saved), saved.numel(), ws.handle,
                                             stream))
        if _in_backward_pass():
            stats["recomputes"] += 1
        ctx.rank_of_layer, ctx.scale, ctx.cu64, ctx.workspace = r, scale, cu64, workspace
        ctx.save_for_backward(q, k, v, g, beta, cu_seqlens, initial_state, saved)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, cu_seqlens, initial_state, saved = ctx.saved_tensors
        r = ctx.rank_of_layer
        dev = q.device
        stream = _stream(dev)
        do = do.contiguous()
        # Rows of documents that started on an earlier rank get no dh0 here: zeros.
        dq, dk, dv, dg, dbeta, dh0 = _gradients(q, k, v, g, beta, initial_state, zero_dh0=True)
        ws = ctx.workspace if ctx.workspace is not None else _KcpWorkspace(r.workspace_bytes, dev)
        args = (r.handle, _ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta), _ptr(cu_seqlens), ctx.cu64,
                _ptr(initial_state), ctx.scale, _ptr(do), _ptr(dht.contiguous() if dht is not None else None),
                _ptr(dq), _ptr(dk), _ptr(dv), _ptr(dg), _ptr(dbeta), _ptr(dh0), _ptr(saved), saved.numel(),
                ws.handle, stream)
        handoff = ctypes.c_int(0)
        check(library().gdn_kcp_backward_summaries(*args, ctypes.byref(handoff)))
        r.gather(ws.memory)
        check(library().gdn_kcp_backward_walk(*args))
        stats["handoffs"] += handoff.value
        return None, dq, dk, dv, dg, dbeta, None, dh0, None, None, None


def apply_kcp(rank_of_layer, q, k, v, g, beta, cu_seqlens, initial_state, scale, output_final_state, workspace=None):
    return KcpChunkGatedDeltaRule.apply(rank_of_layer, q, k, v, g, beta, cu_seqlens, initial_state, scale,
                                        output_final_state, workspace)
