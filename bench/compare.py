#!/usr/bin/env python3
"""gdnc beside one peer (FLA 0.6.0 or FlashQLA 0.1.3) in one process, on the same inputs, under the
benchmark's publishing rules (docs/benchmark.md; the decisions are in bench/protocol.py).

One process = one run: gdnc, a second copy of gdnc (the A/A arm) and one peer, in one arm order
(--order; the other order is a second process). The peers need their own environments, so each
runs in its own process with its own gdnc arm, and each peer's ratio is taken against the gdnc arm
of its process. bench/table.py merges the runs' JSON files into the published table.

Per shape, every arm's o, dq, dk, dv, dg, dbeta are first checked against the fp64 reference
(rel-RMS <= 1e-2, max-abs <= 2e-2 max|ref|) on a pack of about --gate-tokens tokens (every document
scaled down, the count kept);
an arm that fails is reported and not timed. Then per operation (fwd, fwd+bwd, ckpt) every arm
runs untimed for --settle-s seconds (its JIT compiles first), then the normal protocol; a cell
with an arm at the board power limit in 5 % or more of its samples is re-timed under the
sustained protocol (gdnc and the peer only; --sustained off skips it). Power, the
enforced limit, the SM clock and the clock-event reasons are read through NVML after every sample,
outside the timed region; a sample is at the power limit when NVML reports the software power cap
or the hardware power brake.

--gdnc-spec '{"forward":"fused","cp":{"segments":"auto"}}' sets code options of the gdnc arm and its
A/A copy (the spec fields a caller may set: gdnc/spec.py CODE_OPTIONS); the run file records them and
bench/table.py merges only runs of one gdnc configuration.

The output JSON is rewritten after every cell, and --resume FILE skips the cells FILE already holds
for the same commit, peer and order: a table that does not fit one device call is completed by
the next (--budget-s stops before a cell that would start past the budget). Where both runs carry
a code digest (--code-digest, `gdnc digest`: the IR, call plans and machine code of the example
layers), that digest stands for the commit: a later commit that launches the same kernels the same
way resumes the table, and the run file lists it under resumed_commits.

On the GPU machine (scripts/gpu_run.sh, STEPS=compare, does this):
    FLA:      PYTHONPATH=python:/tmp/site (fla-core 0.6.0, einops) FLA_FLASH_QLA=0
              python3 bench/compare.py --peer fla ...
    FlashQLA: PYTHONPATH=python:/tmp/flashqla (scripts/flashqla_bundle.sh) CUDA_HOME=/usr/local/cuda
              python3 bench/compare.py --peer flashqla ...
"""

import argparse
import ctypes
import datetime
import itertools
import json
import os
import sys
import time
from pathlib import Path

try:
    import torch
except ImportError:  # the helpers below that need no GPU are tested without torch
    torch = None

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
import protocol  # noqa: E402

# (q/k heads, value heads), document lengths. L is one long document at N's heads: the shape where
# a design without intra-document parallelism leaves most of the GPU idle.
SHAPES = {
    "N": ((2, 6), [2049, 3001, 3142]),
    "M": ((16, 48), [12000, 9000, 6000, 3768, 2000]),
    "G": ((16, 48), [3598, 18252, 9000, 14000, 12000, 6000, 16000, 10000, 11000, 8000, 13222, 10000]),
    "A": ((16, 48), [98304, 65536, 57344, 40960]),
    "L": ((2, 6), [32768]),
    # FlashQLA's published layout: eight documents that fill the GPU, and one that does not.
    "F": ((16, 32), [4096] * 8),
    "F1": ((16, 32), [32768]),
}
# The H200's floors in ms (docs/benchmark.md: FLOPs at 790 TFLOP/s, minimal bytes at 4.3 TB/s);
# the ckpt floor is a forward plus a forward+backward.
FLOOR = {"N": (0.011, 0.043, 0.054), "M": (0.352, 1.36, 1.712), "G": (1.406, 5.45, 6.856),
         "A": (2.812, 10.90, 13.712), "L": (0.044, 0.172, 0.216), "F": (0.234, 0.908, 1.143),
         "F1": (0.234, 0.908, 1.143)}
OPS = ("fwd", "fwd+bwd", "ckpt")
OURS, AA = "gdnc", "gdnc A/A"
PEERS = ("fla", "flashqla")
EXTRA_ARMS = {"graph": "gdnc graph", "nondet": "gdnc nondet", "fused": "gdnc fused", "merge": "gdnc merge",
              "bounded": "gdnc max_seqlen"}


def shape_docs(shape, tokens=None):
    """The shape's heads and documents; with `tokens` below the shape's total, the gate's pack: every
    document scaled by tokens / total (at least one token each, rounded down). It keeps the shape's
    document count and proportions, and with them the choices a peer makes from them: FlashQLA's
    intra-card CP model splits one 8192-token document at 48 value heads but none of M's, G's or A's
    documents, so a pack of the first 8192 tokens (one document there) gated CP kernels that the
    timed calls never run, where the scaled pack gates the timed path."""
    heads, docs = SHAPES[shape]
    total = sum(docs)
    if tokens is not None and tokens < total:
        docs = [max(1, d * tokens // total) for d in docs]
    return heads, docs


def inputs(shape, seed, tokens=None):
    (H, HV), docs = shape_docs(shape, tokens)
    T = sum(docs)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    cu = torch.tensor([0] + list(itertools.accumulate(docs)), dtype=torch.int64, device="cuda")
    return {
        "q": rnd(1, T, H, 128).bfloat16(), "k": rnd(1, T, H, 128).bfloat16(), "v": rnd(1, T, HV, 128).bfloat16(),
        "g": torch.nn.functional.logsigmoid(rnd(1, T, HV)), "beta": torch.sigmoid(rnd(1, T, HV)),
        "cu64": cu, "cu32": cu.int(), "do": rnd(1, T, HV, 128).bfloat16(), "longest": max(docs),
    }


def our_arm(name, bounded=False, **spec):
    """bounded: the call also gets the batch's longest document as max_seqlen (flash-attn's host-side
    hint, which a training loop that packs its batches knows; the peers take no such hint)."""
    import gdnc
    spec = dict(spec, name=name)

    def fn(q, k, v, g, beta, x):
        hint = {"max_seqlen": x["longest"]} if bounded else {}
        return gdnc.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu32"],
                                           spec=spec, **hint)[0]
    return fn


def lift_fla_hopper_guard():
    """FLA 0.6.0 refuses its gated backward on Hopper with Triton 3.4 to 3.7.0 (its issue #640);
    the H200's image has Triton 3.6.0. FLA is timed with the guard lifted: the accuracy gate checks
    FLA's gradients against the fp64 reference on the same inputs, so a wrong result is reported
    instead of timed."""
    import fla.ops.common.chunk_o as chunk_o
    if not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        print("FLA: lifted the Hopper/Triton < 3.7.1 guard of chunk_bwd_dqkwg (FLA issue #640); "
              "the accuracy gate decides whether FLA is timed")


def fla_arm():
    # FLA 0.6.0 hands its calls to FlashQLA when that is importable: "fla" would then time FlashQLA.
    if os.environ.get("FLA_FLASH_QLA") != "0":
        raise RuntimeError("FLA_FLASH_QLA must be 0 in the FLA process (else FLA 0.6.0 dispatches to "
                           "FlashQLA where it is importable)")
    import fla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdr
    lift_fla_hopper_guard()

    def fn(q, k, v, g, beta, x):
        return fla_gdr(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu64"])[0]
    return fn, f"fla-core {getattr(fla, '__version__', 'unknown')}"


def flashqla_arm():
    import flash_qla
    import tilelang

    def fn(q, k, v, g, beta, x):
        return flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                                cu_seqlens=x["cu64"])[0]
    return fn, f"flash-qla {flash_qla.__version__}, tilelang {getattr(tilelang, '__version__', 'unknown')}"


def forward(fn, op, x, leaves):
    """The forward half of one call of `op`: under torch.utils.checkpoint for ckpt."""
    q, k, v, g, beta = leaves
    if op == "ckpt":
        return torch.utils.checkpoint.checkpoint(lambda *a: fn(*a, x), q, k, v, g, beta, use_reentrant=False)
    return fn(q, k, v, g, beta, x)


def call(fn, op, x, leaves):
    o = forward(fn, op, x, leaves)
    if op != "fwd":
        o.backward(x["do"])
    return o


def leaves_of(x):
    return [x[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")]


def arm_runner(fns, op, x):
    """run_one(name): one call of `op` by arm `name` on `x`, through leaves of its own, their grads
    dropped first (drop_grads)."""
    leaves = leaves_of(x)

    def run_one(n):
        drop_grads(leaves)
        call(fns[n], op, x, leaves)
    return run_one


def drop_grads(leaves):
    """Before every call, outside the timed region: with a leaf's .grad left from the previous call,
    autograd adds the new gradient into it, one elementwise kernel per input (the same for every
    arm, and not the layer's work: in a model the layer's inputs are not leaves). triton's do_bench
    offers the same (grad_to_none)."""
    for t in leaves:
        t.grad = None


def gate(fn, x, ref):
    leaves = leaves_of(x)
    o = call(fn, "fwd+bwd", x, leaves)
    got = {"o": o, "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad, "dg": leaves[3].grad,
           "dbeta": leaves[4].grad}
    report = {}
    for name, t in got.items():
        r = ref[name].reshape(-1)
        d = t.detach().double().cpu().reshape(-1)
        rel = ((r - d).pow(2).mean().sqrt() / (r.pow(2).mean().sqrt() + 1e-8)).item()
        mx = (r - d).abs().max().item() / max(r.abs().max().item(), 1e-30)
        ok = bool(torch.isfinite(d).all()) and rel <= 1e-2 and mx <= 2e-2
        report[name] = {"rel_rms": rel, "max_abs_rel": mx, "ok": ok}
    return report


class Nvml:
    """Power draw, enforced limit, SM clock and clock-event reasons of one GPU through NVML
    (libnvidia-ml via ctypes, no extra package): microseconds per read, so every sample gets one."""
    SW_POWER_CAP, HW_POWER_BRAKE = 0x4, 0x80  # nvmlClocksEventReason* bits
    NVML_CLOCK_SM = 1

    def __init__(self, pci_bus_id=None, index=0, lib_name="libnvidia-ml.so.1"):
        try:
            self.lib = ctypes.CDLL(lib_name)
        except OSError as e:
            raise RuntimeError(f"NVML: cannot load {lib_name}: {e}") from None
        self._check("nvmlInit_v2", self.lib.nvmlInit_v2())
        self.handle = ctypes.c_void_p()
        if pci_bus_id:
            self._check("nvmlDeviceGetHandleByPciBusId_v2",
                        self.lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(self.handle)))
        else:
            self._check("nvmlDeviceGetHandleByIndex_v2",
                        self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)))
        # Newer drivers name it ClocksEventReasons; the older name is the same call.
        self._reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.lib.nvmlDeviceGetCurrentClocksThrottleReasons

    def _check(self, what, rc):
        if rc != 0:
            raise RuntimeError(f"NVML: {what} returned {rc}")

    def read(self):
        mw, limit_mw, mhz, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self._check("nvmlDeviceGetPowerUsage", self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw)))
        self._check("nvmlDeviceGetEnforcedPowerLimit",
                    self.lib.nvmlDeviceGetEnforcedPowerLimit(self.handle, ctypes.byref(limit_mw)))
        self._check("nvmlDeviceGetClockInfo",
                    self.lib.nvmlDeviceGetClockInfo(self.handle, self.NVML_CLOCK_SM, ctypes.byref(mhz)))
        self._check("clock-event reasons", self._reasons(self.handle, ctypes.byref(reasons)))
        return {"draw_w": mw.value / 1000.0, "limit_w": limit_mw.value / 1000.0, "sm_mhz": mhz.value,
                "reasons": reasons.value, "at_limit": bool(reasons.value & (self.SW_POWER_CAP | self.HW_POWER_BRAKE))}


def torch_pci_bus_id():
    """The NVML bus id of torch's current device (NVML numbers GPUs without CUDA_VISIBLE_DEVICES)."""
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    if torch.cuda.device_count() == 1 and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return None  # NVML index 0 is then the one GPU
    raise RuntimeError("NVML: this torch does not expose the PCI bus id, and with several GPUs the NVML "
                       "index of the current one is unknown")


class Timer:
    """Times calls of one arm with CUDA events, the L2 flushed before each, and reads the power
    state after each (outside the timed region)."""

    def __init__(self, flush, nvml):
        self.flush, self.nvml = flush, nvml
        self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def visit(self, fn, op, x, warmup, samples):
        leaves = leaves_of(x)
        for _ in range(warmup):
            drop_grads(leaves)
            call(fn, op, x, leaves)
        times, limited, clocks = [], 0, []
        for _ in range(samples):
            drop_grads(leaves)
            self.flush.zero_()
            self.e0.record()
            call(fn, op, x, leaves)
            self.e1.record()
            self.e1.synchronize()
            times.append(self.e0.elapsed_time(self.e1))
            state = self.nvml.read()
            limited += state["at_limit"]
            clocks.append(state["sm_mhz"])
        return times, limited, clocks


def inductor_configs():
    """The launch configs this process's torch.compile'd kernels run with (FlashQLA's L2 norm is
    one: Inductor benchmarks its configs at the first call's size, keeps the winner for every later
    size and caches it on disk for later processes). Per kernel its size hints and launchers (one
    after autotuning). A diagnostic; an Inductor without these internals gives an error entry."""
    try:
        from torch._inductor.codecache import PyCodeCache
        mods = getattr(PyCodeCache, "modules", None)
        if isinstance(mods, dict):
            mods = list(mods.values())
        if mods is None:
            mods = list(getattr(PyCodeCache, "cache", {}).values())
        out = []
        for m in mods:
            for name, obj in sorted(vars(m).items()):
                launchers = getattr(obj, "launchers", None)
                if not launchers or not isinstance(launchers, (list, tuple)):
                    continue
                out.append({"kernel": name, "size_hints": str(getattr(obj, "size_hints", "")),
                            "configs": [str(getattr(launcher, "config", launcher)) for launcher in launchers]})
        return out
    except Exception as e:  # noqa: BLE001  internals differ between torch versions
        return {"error": f"{type(e).__name__}: {e}"}


def first_calls(arms, run_one):
    """One untimed fwd+bwd of every arm on the timed inputs, before anything else of the shape runs:
    a model's first call is at its own size, and a peer that tunes at its first call (FlashQLA's
    compiled L2 norm) tunes there, not at the smaller pack of the accuracy gate. Returns per arm the
    call's seconds (its compiles included) or its error; an arm that fails here still meets the gate."""
    out = {}
    for n in arms:
        t = time.monotonic()
        try:
            run_one(n)
            torch.cuda.synchronize()
            out[n] = {"s": round(time.monotonic() - t, 3)}
        except Exception as e:  # noqa: BLE001  the gate reports it again and the arm is not timed
            torch.cuda.synchronize()
            out[n] = {"error": f"{type(e).__name__}: {e}"}
    return out


def top_kernels(rows, top=12):
    """(kernel name, calls, device microseconds) rows of one profiled call -> the `top` kernels by
    device time, longest first, names cut to 100 characters: which kernel a slow arm spends its time
    in (FlashQLA's forward ran 1.25 ms at M in some processes and 1.76 in others, docs/PERF.md)."""
    kept = sorted(((str(k), int(c), float(us)) for k, c, us in rows if us > 0), key=lambda r: (-r[2], r[0]))
    return [[k[:100], c, round(us, 1)] for k, c, us in kept[:top]]


def profile_kernels(names, run_one, flush):
    """One untimed call of each arm under torch.profiler (CUDA activity only), after the cell's
    timing, the L2 flushed (`flush`, asynchronous) and the GPU idle before it: per arm, its kernels'
    device time (top_kernels). A diagnostic, not a timing result (one call, the profiler attached);
    a profiler failure is recorded, never fatal."""
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for n in names:
        try:
            flush()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run_one(n)
                torch.cuda.synchronize()
            rows = []
            for e in prof.key_averages():
                us = getattr(e, "device_time_total", None)
                if us is None:
                    us = getattr(e, "cuda_time_total", 0)
                rows.append((e.key, e.count, us))
            out[n] = top_kernels(rows)
        except Exception as e:  # noqa: BLE001  the timing stands without it
            out[n] = {"error": f"{type(e).__name__}: {e}"}
    return out


ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def host_wait(names, run_one, flush, cuda, clock=time.perf_counter, sleep_cycles=100_000_000, repeats=3):
    """Whether an arm's call keeps the GPU waiting for the host: per arm, `repeats` pairs of
    untimed calls after the cell, each from an idle GPU with the L2 flush queued before it
    (`flush`, asynchronous); medians. The first call of a pair runs as the timed calls do: CUDA
    events around it (`event_ms`; the flush runs while the host starts the call), the host's time
    to issue it (`host_ms`) and the caching allocator's counters over it (a cudaFree inside a call
    synchronizes the device; a cudaMalloc can stall the host). The second is queued behind a GPU
    sleep longer than the host needs, so its events measure the device alone (`queued_event_ms`:
    kernels and the gaps between them); `gpu_waits_ms` = event_ms - queued_event_ms is the time the
    GPU waited for the host. If the host returns only after the sleep, the call synchronized with
    the device (`synchronizes`). A diagnostic like `kernels`: an error is recorded, never fatal."""
    def timed_call(n, sleep):
        slept, start, end = (cuda.Event(enable_timing=True) for _ in range(3))
        cuda.synchronize()
        flush()
        slept.record()
        if sleep:
            cuda._sleep(sleep_cycles)
        start.record()
        t0 = clock()
        run_one(n)
        host_ms = (clock() - t0) * 1e3
        end.record()
        cuda.synchronize()
        return start.elapsed_time(end), host_ms, slept.elapsed_time(start)

    out = {}
    for n in names:
        try:
            plain, queued, allocator = [], [], {k: 0 for k in ALLOCATOR_COUNTERS}
            for _ in range(repeats):
                counters = cuda.memory_stats()  # the host's own counters: no sync needed
                plain.append(timed_call(n, False))
                after = cuda.memory_stats()
                for k in ALLOCATOR_COUNTERS:
                    allocator[k] += after.get(k, 0) - counters.get(k, 0)
                queued.append(timed_call(n, True))
            event_ms, host_ms = (protocol.median([c[i] for c in plain]) for i in (0, 1))
            queued_event_ms, queued_host_ms, sleep_ms = (protocol.median([c[i] for c in queued]) for i in (0, 1, 2))
            out[n] = {"event_ms": round(event_ms, 4), "host_ms": round(host_ms, 4),
                      "queued_event_ms": round(queued_event_ms, 4), "queued_host_ms": round(queued_host_ms, 4),
                      "sleep_ms": round(sleep_ms, 3), "gpu_waits_ms": round(event_ms - queued_event_ms, 4),
                      "synchronizes": any(c[1] > 0.5 * c[2] for c in queued),
                      "allocator": allocator, "repeats": repeats}
        except Exception as e:  # noqa: BLE001  the timing stands without it
            out[n] = {"error": f"{type(e).__name__}: {e}"}
    return out


def settle(names, run_one, sync, seconds, clock=time.monotonic):
    """Before a cell's first group, untimed: every arm once (a peer's JIT compile for this shape
    and operation happens here, not inside the first group's warm-ups), then the arms in mirrored
    order until `seconds` have passed, so the first group starts from the loaded GPU state the
    later groups see. Returns the calls per arm."""
    calls = {n: 0 for n in names}

    def one(n):
        run_one(n)
        calls[n] += 1

    for n in names:
        one(n)
        sync()
    t0 = clock()
    while clock() - t0 < seconds:
        for n in names + names[::-1]:
            one(n)
        sync()
    return calls


def arm_record(groups, limited, clocks):
    flat = [t for g in groups for t in g]
    return {"groups": groups, "ms": protocol.median(flat), "drift_pct": protocol.drift_pct(groups),
            "power_limited_pct": 100.0 * limited / len(flat), "sm_mhz_median": protocol.median(clocks)}


def measure_normal(timer, arms, op, x, p):
    names = list(arms)
    groups = {n: [[] for _ in range(p["groups"])] for n in names}
    limited, clocks = {n: 0 for n in names}, {n: [] for n in names}
    for grp in range(p["groups"]):
        for n in names + names[::-1]:
            t, lim, clk = timer.visit(arms[n], op, x, p["warmup"], p["samples"])
            groups[n][grp] += t
            limited[n] += lim
            clocks[n] += clk
    return {n: arm_record(groups[n], limited[n], clocks[n]) for n in names}


def measure_sustained(timer, arms, op, x, p):
    """Blocks of (cool-down, warm-ups, samples) per arm, `groups` groups of mirrored block pairs."""
    names = list(arms)
    blocks = {n: [[] for _ in range(p["groups"])] for n in names}
    limited, clocks, count = {n: 0 for n in names}, {n: [] for n in names}, {n: 0 for n in names}
    for grp in range(p["groups"]):
        for n in protocol.sustained_order(names):
            torch.cuda.synchronize()
            time.sleep(p["cooldown_s"])
            t, lim, clk = timer.visit(arms[n], op, x, p["warmup"], p["samples"])
            blocks[n][grp].append(protocol.median(t))
            limited[n] += lim
            clocks[n] += clk
            count[n] += len(t)
    return {"blocks": blocks,
            "power_limited_pct": {n: 100.0 * limited[n] / count[n] for n in names},
            "sm_mhz_median": {n: protocol.median(clocks[n]) for n in names}}


def cell_complete(cell, sustained):
    """Whether a resumed cell needs no more timing: absent cells do, and so do power-capped ones
    whose sustained re-time is missing while it is asked for."""
    if cell is None:
        return False
    d = cell.get("decision")
    return not (d and d["status"] == "power-capped" and sustained == "auto" and "sustained" not in cell)


def parse_gdnc_spec(text):
    """The --gdnc-spec JSON object: code options only (the call sets heads, head dims and states)."""
    from gdnc.spec import CODE_OPTIONS
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"compare: --gdnc-spec: not JSON ({e})")
    if not isinstance(spec, dict):
        raise SystemExit(f"compare: --gdnc-spec: a JSON object is needed, not {type(spec).__name__}")
    unknown = sorted(set(spec) - set(CODE_OPTIONS) | ({"name"} & set(spec)))
    if unknown:
        raise SystemExit(f"compare: --gdnc-spec: {', '.join(unknown)} cannot be set here (code options: "
                         f"{', '.join(o for o in CODE_OPTIONS if o != 'name')})")
    return spec


def load_resume(path, commit, peer, order, gdnc_spec=None, code_digest="", device=None):
    """The cells an earlier output of the same commit (or, where both runs have one, the same code
    digest), peer, order, gdnc configuration and device already holds. A device machine of another
    kind (an H200 lent where an H100 ran before) starts a run file of its own: one run file, one
    device."""
    if not path or not Path(path).exists():
        return None
    earlier = json.loads(Path(path).read_text())
    same_code = bool(code_digest) and bool(earlier.get("code_digest"))
    build = ("code_digest", code_digest) if same_code else ("commit", commit)
    checks = [build, ("peer", peer), ("order", order), ("gdnc_spec", gdnc_spec or {})]
    if device is not None:
        checks.append(("device", device))
    mismatch = [(k, earlier.get(k), v) for k, v in checks if earlier.get(k, {} if k == "gdnc_spec" else None) != v]
    if mismatch:
        raise SystemExit("compare: --resume " + str(path) + " is another run: " +
                         ", ".join(f"{k} {a!r} there, {b!r} here" for k, a, b in mismatch))
    if same_code and commit != earlier.get("commit") and commit not in earlier.get("resumed_commits", []):
        earlier.setdefault("resumed_commits", []).append(commit)
    return earlier


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", required=True, choices=PEERS + ("none",))
    ap.add_argument("--order", default="forward", choices=("forward", "reversed"),
                    help="forward: gdnc, A/A, peer; reversed: peer, A/A, gdnc (both orders = two runs)")
    ap.add_argument("--shapes", default="N,M,G,A,L")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--extra-arms", default="",
                    help="more gdnc arms timed beside (graph, nondet, fused, merge: cp.carry \"merge\", "
                         "bounded: max_seqlen given); not published")
    ap.add_argument("--gdnc-spec", default="{}",
                    help="code options of the gdnc arm and its A/A copy, a JSON object (recorded in the run file)")
    ap.add_argument("--sustained", default="auto", choices=("auto", "off"),
                    help="auto: re-time power-capped cells under the sustained protocol")
    ap.add_argument("--groups", type=int, default=protocol.NORMAL["groups"])
    ap.add_argument("--samples", type=int, default=protocol.NORMAL["samples"])
    ap.add_argument("--warmup", type=int, default=protocol.NORMAL["warmup"])
    ap.add_argument("--settle-s", type=float, default=protocol.SETTLE_S,
                    help="untimed calls of every arm before a cell's first group, for this many seconds")
    ap.add_argument("--gate-tokens", type=int, default=8192)
    ap.add_argument("--kernel-profile", default="on", choices=("on", "off"),
                    help="on: after each cell, one profiled call per arm records its kernels' device time, "
                         "and two more whether the call keeps the GPU waiting for the host")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="start no cell after this many seconds (the JSON so far stays; --resume continues)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", help="an earlier output of the same commit, peer and order: its cells are kept")
    ap.add_argument("--commit", default=os.environ.get("GDNC_COMMIT", os.environ.get("GDN_COMMIT", "unknown")))
    ap.add_argument("--code-digest", default=os.environ.get("GDNC_CODE_DIGEST", ""),
                    help="`gdnc digest`'s digest of the example layers: a run of the same digest resumes "
                         "across commits")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    ops = [o for o in args.ops.split(",") if o]
    for s in shapes:
        if s not in SHAPES:
            sys.exit(f"compare: --shapes: unknown shape '{s}' (known: {', '.join(SHAPES)})")
    for o in ops:
        if o not in OPS:
            sys.exit(f"compare: --ops: unknown operation '{o}' (known: {', '.join(OPS)})")
    extra = [e for e in args.extra_arms.split(",") if e]
    for e in extra:
        if e not in EXTRA_ARMS:
            sys.exit(f"compare: --extra-arms: unknown arm '{e}' (known: {', '.join(EXTRA_ARMS)})")
    gdnc_spec = parse_gdnc_spec(args.gdnc_spec)
    normal = {"groups": args.groups, "samples": args.samples, "warmup": args.warmup}
    if normal != protocol.NORMAL:
        print(f"compare: a shortened protocol {normal}: the table does not publish these runs")

    started = time.monotonic()
    from gdnc._autograd import stats as binding_stats  # imports torch, as the arms do
    stream = torch.cuda.Stream()  # graph mode cannot capture the legacy default stream
    torch.cuda.set_stream(stream)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    nvml = Nvml(torch_pci_bus_id())  # the power gate needs it: no NVML, no run
    print(f"NVML: {nvml.read()}")
    timer = Timer(flush, nvml)

    base = dict({"deterministic": True}, **gdnc_spec)
    ours = {OURS: our_arm("bench_gdnc", **base), AA: our_arm("bench_gdnc_aa", **base)}
    if "graph" in extra:
        ours[EXTRA_ARMS["graph"]] = our_arm("bench_gdnc_graph", deterministic=True, graph="replay")
    if "fused" in extra:
        ours[EXTRA_ARMS["fused"]] = our_arm("bench_gdnc_fused", deterministic=True, forward="fused")
    if "nondet" in extra:
        ours[EXTRA_ARMS["nondet"]] = our_arm("bench_gdnc_nondet", deterministic=False)
    if "bounded" in extra:
        ours[EXTRA_ARMS["bounded"]] = our_arm("bench_gdnc_bounded", bounded=True, **base)
    if "merge" in extra:  # the segment carry before "auto" became the default
        ours[EXTRA_ARMS["merge"]] = our_arm("bench_gdnc_merge", deterministic=True, cp={"carry": "merge"})
    peer_fn, peer_version = None, None
    if args.peer != "none":
        peer_fn, peer_version = (fla_arm if args.peer == "fla" else flashqla_arm)()
    arms = dict(ours)
    if peer_fn:
        arms[args.peer] = peer_fn
    order = list(arms) if args.order == "forward" else list(arms)[::-1]
    arms = {n: arms[n] for n in order}

    results = load_resume(args.resume, args.commit, args.peer, args.order, gdnc_spec, args.code_digest,
                          torch.cuda.get_device_name())
    if results:
        results.setdefault("resumed_utc", []).append(datetime.datetime.now(datetime.timezone.utc).isoformat())
    else:
        results = {
            "commit": args.commit, "code_digest": args.code_digest,
            "peer": args.peer, "peer_version": peer_version, "order": args.order,
            # "carried" (kernels loaded from a disk cache brought along) or "fresh" (compiled in this
            # process): FlashQLA's times differed between the two (docs/PERF.md)
            "peer_kernel_cache": os.environ.get("GDNC_PEER_KERNEL_CACHE", "unknown"),
            "gdnc_spec": gdnc_spec,
            "arm_order": order, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "protocol": normal, "settle_s": args.settle_s,
            "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "shapes": {}}
    out = Path(args.out)

    def save():
        out.write_text(json.dumps(results, indent=1))

    from gdnc import reference
    for shape in shapes:
        entry = results["shapes"].setdefault(shape, {"ops": {}})
        todo = [o for o in ops if not cell_complete(entry["ops"].get(o), args.sustained)]
        if not todo:
            print(f"{shape}: every operation already in {args.resume}")
            continue
        if time.monotonic() - started > args.budget_s:
            print(f"{shape}: not started, past the budget of {args.budget_s:.0f} s (resume with --resume)")
            break
        x = inputs(shape, seed=11)
        if "first_calls" not in entry:
            entry["first_calls"] = first_calls(list(arms), arm_runner(arms, "fwd+bwd", x))
            entry["inductor_configs"] = inductor_configs()
            print(f"{shape}: first calls " + ", ".join(f"{n} {r.get('s', r.get('error'))}"
                                                       for n, r in entry["first_calls"].items()))
            ic = entry["inductor_configs"]
            if ic:
                print(f"{shape}: torch.compile'd kernels: " + (ic["error"] if isinstance(ic, dict) else "; ".join(
                    f"{k['kernel']} {k['size_hints']} {k['configs']}" for k in ic)))
        if "gate" not in entry:
            small = inputs(shape, seed=7, tokens=args.gate_tokens)
            ref = reference.run_tensors(small["q"], small["k"], small["v"], small["g"], small["beta"],
                                        small["cu64"], l2norm=True, d_o=small["do"])
            ref = {n: ref[n] for n in ("o", "dq", "dk", "dv", "dg", "dbeta")}
            print(f"{shape}: reference done at {time.monotonic() - started:.0f} s")
            entry["gate"] = {}
            for name, fn in arms.items():
                try:
                    rep = gate(fn, small, ref)
                except Exception as e:  # reported and not timed, never silently dropped
                    rep = {"error": {"message": f"{type(e).__name__}: {e}", "ok": False}}
                entry["gate"][name] = rep
                print(f"{shape} gate {name}: {'ok' if all(r['ok'] for r in rep.values()) else 'FAILED (not timed)'} "
                      + " ".join(f"{k}={v['rel_rms']:.2e}" if "rel_rms" in v else f"{k}: {v['message']}"
                                 for k, v in rep.items()))
            print(f"{shape}: gates done at {time.monotonic() - started:.0f} s")
            save()
        timed = {n: fn for n, fn in arms.items() if all(r["ok"] for r in entry["gate"][n].values())}
        if OURS not in timed or AA not in timed:
            print(f"{shape}: gdnc failed its gate: nothing timed")
            continue
        for op in todo:
            if time.monotonic() - started > args.budget_s:
                print(f"{shape} {op}: not started, past the budget of {args.budget_s:.0f} s")
                break
            i = OPS.index(op)
            run_one = arm_runner(timed, op, x)
            settled = settle(list(timed), run_one, torch.cuda.synchronize, args.settle_s)
            before = dict(binding_stats)
            cell = {"settle_calls": settled, "arms": measure_normal(timer, timed, op, x, normal)}
            if op == "ckpt":  # every gdnc arm's recompute should hand its tapes to the backward
                cell["binding_stats"] = {k: binding_stats[k] - before[k] for k in before}
            peer = args.peer if args.peer in timed else None
            if peer:
                cell["decision"] = protocol.decide_normal(cell["arms"], OURS, peer, AA)
            for name, c in cell["arms"].items():
                print(f"{shape:<2} {op:<8} {name:<11} {c['ms']:9.3f} ms  drift {c['drift_pct']:5.2f} %  "
                      f"power-limited {c['power_limited_pct']:5.1f} %  sm {c['sm_mhz_median']:.0f} MHz  "
                      f"floor x {c['ms'] / FLOOR[shape][i]:6.1f}")
            d = cell.get("decision")
            if d:
                print(f"{shape:<2} {op:<8} {peer}/gdnc {d['ratio']:.3f} (A/A spread {d['aa_spread'] * 100:.2f} %): "
                      f"{d['status']}{' by ' + d['by'] if d['by'] else ''}{', ' + d['cls'] if d['cls'] else ''}"
                      f"{' (capped: ' + ', '.join(d['capped_arms']) + ')' if d['capped_arms'] else ''}")
                if d["status"] == "power-capped" and args.sustained == "auto":
                    entry["ops"][op] = cell  # kept if the sustained re-time is cut short
                    save()
                    t = time.monotonic()
                    pair = {n: fn for n, fn in timed.items() if n in (OURS, peer)}  # in the run's arm order
                    s = measure_sustained(timer, pair, op, x, protocol.SUSTAINED)
                    s["decision"] = protocol.decide_sustained(s["blocks"], OURS, peer)
                    cell["sustained"] = s
                    sd = s["decision"]
                    print(f"{shape:<2} {op:<8} sustained ({time.monotonic() - t:.0f} s): gdnc {sd['ms'][OURS]:.3f} "
                          f"{sd['range'][OURS]} drift {sd['drift_pct'][OURS]:.2f} %, {peer} {sd['ms'][peer]:.3f} "
                          f"{sd['range'][peer]} drift {sd['drift_pct'][peer]:.2f} %; power-limited "
                          f"{s['power_limited_pct']}; ratio {sd['ratio']:.3f}: {sd['status']}")
            if args.kernel_profile == "on":
                profiled = [n for n in timed if n != AA]
                cell["kernels"] = profile_kernels(profiled, run_one, flush.zero_)
                for name, ks in cell["kernels"].items():
                    shown = ks.get("error") if isinstance(ks, dict) else ", ".join(
                        f"{k[:40]} {us / 1000:.3f} ms" for k, _, us in ks[:3])
                    print(f"{shape:<2} {op:<8} kernels {name}: {shown}")
                cell["host_wait"] = host_wait(profiled, run_one, flush.zero_, torch.cuda)
                for name, w in cell["host_wait"].items():
                    shown = w["error"] if "error" in w else (
                        f"call {w['event_ms']:.3f} ms, device alone {w['queued_event_ms']:.3f}, GPU waits "
                        f"{w['gpu_waits_ms']:.3f}; host {w['host_ms']:.3f}"
                        f"{', synchronizes' if w['synchronizes'] else ''}; allocator {w['allocator']}")
                    print(f"{shape:<2} {op:<8} host {name}: {shown}")
            entry["ops"][op] = cell
            save()
        print(f"{shape}: timed at {time.monotonic() - started:.0f} s")
    results["finished_utc"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    save()


if __name__ == "__main__":
    main()
