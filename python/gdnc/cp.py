"""Context parallelism (KCP): one layer's tokens split over the ranks of a process group, with
FLA 0.6.0's surface, so that a user of FLA's CP changes an import:

    from gdnc.cp import build_cp_context
    from gdnc import chunk_gated_delta_rule
    ctx = build_cp_context(cu_seqlens, group=dist.group.WORLD)      # the whole batch's cu_seqlens
    o, _ = chunk_gated_delta_rule(q, k, v, g, beta, cp_context=ctx,  # this rank's T / world tokens
                                  use_qk_l2norm_in_kernel=True)

Each rank holds T / world consecutive tokens of the packed batch (T divisible by the world, at
least one 64-token chunk per rank). A step runs the rank's summaries, one all-gather over the
group (torch.distributed.all_gather_into_tensor on torch's current stream), then the merge and
the walk; the backward mirrors it. Nothing synchronizes with the host, so torch.cuda.graph captures
the step with its collectives. Every rank's results are bitwise those of the single-GPU proxy: the
same layer with spec {"cp": {"ranks": world}} called on one GPU over the whole batch.

Unlike FLA's CP, initial_state and output_final_state are accepted: initial_state has a row per
local document (ctx.documents names their global index) and is read for the documents that start
on this rank; the final state is returned for the documents that end on this rank (the other rows
are zero). A checkpointed step (torch.utils.checkpoint) runs the forward's all-gather again in its
recompute, so every rank must recompute the layer, as every rank runs its backward.

`group` is a torch.distributed ProcessGroup (None: the default group), or any object with the
methods rank(), size() and all_gather_into_tensor(output, input) that gathers CUDA tensors in rank
order on torch's current stream: a communicator of the caller's own.
"""

import ctypes

from ._lib import InputError, check, library

_FORMS = {"forward": 0, "recompute": 1, "backward": 2}


class _View(ctypes.Structure):
    _fields_ = [("token_begin", ctypes.c_int64), ("tokens", ctypes.c_int64), ("documents", ctypes.c_int32),
                ("first_document", ctypes.c_int32), ("pieces_before", ctypes.c_int32),
                ("pieces_after", ctypes.c_int32)]


def _offsets(values, name):
    from .api import host_offsets
    values = host_offsets(values, name)
    if not values:
        raise InputError(f"{name}: is empty (N + 1 offsets from 0 to T expected)")
    return values


def rank_view(cu_seqlens, rank, world):
    """Rank `rank`'s share of the batch `cu_seqlens` (the whole batch's offsets, host values) split
    over `world` ranks, without a GPU: a dict with token_begin, tokens, cu_seqlens (local offsets),
    documents (the global index of each local document), pieces_before and pieces_after (pieces of
    the first / last local document on other ranks). Raises InputError naming the problem."""
    values = _offsets(cu_seqlens, "cu_seqlens")
    cu = (ctypes.c_int64 * len(values))(*values)
    view = _View()
    check(library().gdn_cp_rank_view(cu, len(values), rank, world, ctypes.byref(view), None, None, 0))
    local = (ctypes.c_int64 * (view.documents + 1))()
    docs = (ctypes.c_int32 * (view.documents + 1))()
    check(library().gdn_cp_rank_view(cu, len(values), rank, world, ctypes.byref(view), local, docs,
                                     view.documents + 1))
    return {"token_begin": view.token_begin, "tokens": view.tokens, "cu_seqlens": list(local),
            "documents": list(docs)[:view.documents], "pieces_before": view.pieces_before,
            "pieces_after": view.pieces_after}


def _is_own_communicator(group):
    if group is None or not all(hasattr(group, m) for m in ("rank", "size", "all_gather_into_tensor")):
        return False
    try:
        import torch.distributed as dist
    except ImportError:  # then it cannot be a ProcessGroup
        return True
    return not (dist.is_available() and isinstance(group, dist.ProcessGroup))


def _rank_and_size(group):
    if _is_own_communicator(group):
        return int(group.rank()), int(group.size())
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise InputError("group: torch.distributed is not initialized (call torch.distributed.init_process_group "
                         "first, or pass a communicator with rank(), size() and all_gather_into_tensor())")
    return dist.get_rank(group), dist.get_world_size(group)


def _all_gather(group, output, input):
    if _is_own_communicator(group):
        group.all_gather_into_tensor(output, input)
    else:
        import torch.distributed as dist
        dist.all_gather_into_tensor(output, input, group=group)


class CPContext:
    """One rank's context of a batch layout: FLA 0.6.0's FLACPContext fields (group, the rank-local
    cu_seqlens on the GPU and cu_seqlens_cpu, both int32 as FLA's, is_first_rank, is_last_rank,
    pre_num_ranks, post_num_ranks, conv1d_kernel_size, pre_num_conv_tokens, num_seqs,
    is_cp_enabled) and gdnc's (rank, world, token_begin, tokens, documents: the global index of
    each local document, global_cu_seqlens). Build it with build_cp_context, once per batch layout."""

    def __init__(self, group, rank, world, global_cu_seqlens, view, device, conv1d_kernel_size):
        import torch
        self.group = group
        self.rank, self.world = rank, world
        self.global_cu_seqlens = tuple(global_cu_seqlens)
        self.token_begin, self.tokens = view["token_begin"], view["tokens"]
        self.documents = tuple(view["documents"])
        self.pre_num_ranks, self.post_num_ranks = view["pieces_before"], view["pieces_after"]
        self.is_first_rank = self.pre_num_ranks == 0
        self.is_last_rank = self.post_num_ranks == 0
        self.cu_seqlens_cpu = torch.tensor(view["cu_seqlens"], dtype=torch.int32)
        self.cu_seqlens = self.cu_seqlens_cpu.to(device)
        # For the caller's short convolution, as FLA's context carries it; gdnc's layer has none.
        self.conv1d_kernel_size = conv1d_kernel_size
        self.pre_num_conv_tokens = 0 if (conv1d_kernel_size is None or self.is_first_rank) else conv1d_kernel_size - 1
        self._layers = {}  # layer handle -> _RankOfLayer, made (and agreed on) at the first call

    @property
    def num_seqs(self):
        return len(self.documents)

    @property
    def is_cp_enabled(self):
        return self.world > 1

    def __repr__(self):
        return (f"CPContext(rank={self.rank}, world={self.world}, tokens=[{self.token_begin}, "
                f"{self.token_begin + self.tokens}), documents={len(self.documents)}, "
                f"pre_num_ranks={self.pre_num_ranks}, post_num_ranks={self.post_num_ranks})")

    def _of_layer(self, layer):
        """This rank's libgdn context for `layer`; the first time, the ranks' agreement check (an
        all-gather and a host sync, so not during a CUDA graph capture)."""
        rank_of_layer = self._layers.get(id(layer))
        if rank_of_layer is None:
            rank_of_layer = self._layers[id(layer)] = _RankOfLayer(layer, self)
        return rank_of_layer


class _RankOfLayer:
    """A gdn_kcp_context: one layer on one rank of a CPContext."""

    def __init__(self, layer, cp):
        import torch
        self.layer, self.cp = layer, cp
        lib = library()
        values = cp.global_cu_seqlens
        cu = (ctypes.c_int64 * len(values))(*values)
        handle = ctypes.c_void_p()
        check(lib.gdn_kcp_context_create(layer.handle, cu, len(values), cp.rank, cp.world, ctypes.byref(handle)))
        self.handle = handle
        out = ctypes.c_size_t()
        check(lib.gdn_saved_bytes_kcp(handle, ctypes.byref(out)))
        self.saved_bytes = out.value
        check(lib.gdn_workspace_bytes_kcp(handle, _FORMS["backward"], ctypes.byref(out)))
        self.workspace_bytes = out.value
        check(lib.gdn_kcp_record_bytes(handle, ctypes.byref(out)))
        self.record_bytes = out.value
        self.gathered_offset = _layout_of(lib.gdn_workspace_layout_kcp, handle, _FORMS["backward"])["kcp_gathered"][0]
        if torch.cuda.is_current_stream_capturing():
            raise InputError("cp_context: the first call of a layer on a CP context checks that the ranks agree (a "
                             "host sync), which CUDA graph capture forbids: run one step before capturing")
        self._check_agreement(torch)

    def _check_agreement(self, torch):
        lib = library()
        one = lib.gdn_kcp_agreement_bytes()
        mine = (ctypes.c_uint8 * one)()
        check(lib.gdn_kcp_agreement(self.handle, mine, one))
        device = self.cp.cu_seqlens.device
        gathered = torch.empty(one * self.cp.world, dtype=torch.uint8, device=device)
        _all_gather(self.cp.group, gathered, torch.tensor(list(mine), dtype=torch.uint8, device=device))
        host = bytes(gathered.cpu().tolist())
        check(lib.gdn_kcp_check_agreement(self.handle, host, len(host)))

    def __del__(self):
        if getattr(self, "handle", None):
            library().gdn_kcp_context_destroy(self.handle)

    def gather(self, workspace):
        """The in-place all-gather of the records in a KCP workspace tensor, over the group."""
        start = self.gathered_offset
        gathered = workspace[start:start + self.record_bytes * self.cp.world]
        own = gathered[self.cp.rank * self.record_bytes:(self.cp.rank + 1) * self.record_bytes]
        _all_gather(self.cp.group, gathered, own)


class HostGather:
    """A communicator of one's own over a torch.distributed group of any backend (gloo): gathers
    CUDA tensors through host memory, in rank order. For ranks that share one GPU (tests, smoke
    runs of the benchmark), where NCCL refuses two ranks on one device; it synchronizes with the
    host, so it neither overlaps nor goes into a CUDA graph."""

    def __init__(self, group=None):
        self.group = group

    def rank(self):
        import torch.distributed as dist
        return dist.get_rank(self.group)

    def size(self):
        import torch.distributed as dist
        return dist.get_world_size(self.group)

    def all_gather_into_tensor(self, output, input):
        import torch
        import torch.distributed as dist
        host = input.cpu()
        parts = [torch.empty_like(host) for _ in range(self.size())]
        dist.all_gather(parts, host, group=self.group)
        output.copy_(torch.cat(parts).reshape(output.shape))


def _layout_of(fn, *args):
    from .spec import _Slot
    count, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    check(fn(*args, None, 0, ctypes.byref(count), ctypes.byref(total)))
    slots = (_Slot * count.value)()
    check(fn(*args, slots, count.value, ctypes.byref(count), None))
    out = {s.name.decode(): (s.offset, s.bytes) for s in slots}
    out["_bytes"] = total.value
    return out


def build_cp_context(cu_seqlens, group=None, conv1d_kernel_size=None, cu_seqlens_cpu=None,
                     use_tf32x3_affine_chain=True, layout="contiguous"):
    """The CP context of this rank for a batch, with FLA 0.6.0's signature: `cu_seqlens` are the
    whole batch's offsets (a tensor or a sequence; N + 1 from 0 to T), `group` the process group the
    tokens are split over, each rank holding T / world consecutive tokens (layout "contiguous";
    FLA's "zigzag" is not supported). Reads the offsets on the host once (from cu_seqlens_cpu when
    given: no device sync); build the context once per batch layout, outside CUDA graph capture.
    The ranks' agreement on the batch, the heads and the layer's options is checked at the first
    call of each layer. gdnc's merge of the ranks' states is fp32 in rank order, so
    use_tf32x3_affine_chain (FLA's option for its own chain) must stay True, as FLA requires."""
    if layout != "contiguous":
        raise NotImplementedError(f"layout={layout!r} is not supported by gdnc (only 'contiguous': rank r holds "
                                  "tokens [r T / world, (r + 1) T / world))")
    if use_tf32x3_affine_chain is not True:
        raise ValueError(f"use_tf32x3_affine_chain={use_tf32x3_affine_chain!r}: only True (as in FLA 0.6.0)")
    rank, world = _rank_and_size(group)
    values = _offsets(cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens,
                      "cu_seqlens_cpu" if cu_seqlens_cpu is not None else "cu_seqlens")
    if conv1d_kernel_size is not None and (isinstance(conv1d_kernel_size, bool)
                                           or not isinstance(conv1d_kernel_size, int) or conv1d_kernel_size < 1):
        raise InputError(f"conv1d_kernel_size: {conv1d_kernel_size!r} must be None or a positive int")
    view = rank_view(values, rank, world)
    if view["tokens"] < 64:
        raise InputError(f"cu_seqlens: {values[-1]} tokens over {world} ranks leave {view['tokens']} a rank; each "
                         "rank needs at least one 64-token chunk")
    import torch
    if hasattr(cu_seqlens, "device") and cu_seqlens.device.type == "cuda":
        device = cu_seqlens.device
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    return CPContext(group, rank, world, values, view, device, conv1d_kernel_size)


def workspace_layout(spec, cu_seqlens, rank, form="backward"):
    """The KCP workspace of rank `rank` for a layer spec with cp.ranks > 1 and the whole batch's
    cu_seqlens, from the spec alone (no GPU): {"bytes": total, "buffers": {name: (offset, bytes)}}
    with the slot "kcp_gathered" (every rank's summary record) after the layer's own."""
    import json
    from .spec import validate
    if form not in _FORMS:
        raise InputError(f"form: {form!r} is not 'forward', 'recompute' or 'backward'")
    values = _offsets(cu_seqlens, "cu_seqlens")
    cu = (ctypes.c_int64 * len(values))(*values)
    text = json.dumps(validate(spec)).encode()
    layout = _layout_of(library().gdn_spec_kcp_workspace_layout, text, _FORMS[form], cu, len(values), rank)
    total = layout.pop("_bytes")
    return {"bytes": total, "buffers": layout}


def _rank_main(rank, world, transport, init_file, fn, args, results):
    import torch
    import torch.distributed as dist
    if transport == "nccl":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
        group = dist.group.WORLD
    else:
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        group = HostGather()
    try:
        results[rank] = fn(rank, world, group, *args)
    finally:
        dist.destroy_process_group()


def spawn_local_ranks(fn, world, transport="nccl", args=()):
    """Runs fn(rank, world, group, *args) in `world` processes of this machine and returns their
    results in rank order (each must pickle). transport "nccl": a GPU per rank, `group` the NCCL
    world group; "host": every rank on GPU 0, `group` a HostGather over gloo (tests and smoke runs).
    NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and its kin, unless already set). Raises
    InputError when the machine has fewer GPUs than NCCL ranks."""
    import os
    import tempfile
    import torch
    import torch.multiprocessing as mp
    if transport not in ("nccl", "host"):
        raise InputError(f"transport: {transport!r} is not 'nccl' or 'host'")
    for var, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                       ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(var, value)
    if transport == "nccl" and torch.cuda.device_count() < world:
        raise InputError(f"world: {world} ranks over NCCL need {world} GPUs, this machine has "
                         f"{torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        results = mp.get_context("spawn").Manager().dict()
        mp.spawn(_rank_main, args=(world, transport, os.path.join(tmp, "init"), fn, tuple(args), results),
                 nprocs=world)
        return [results[r] for r in range(world)]
