"""Context parallelism through the binding, one process per rank: each rank runs its share of a
batch with cp_context (forward, backward, and a torch.utils.checkpoint step), runs the single-GPU
proxy of the same partition over the whole batch itself, and compares its results with the
proxy's bit for bit. Prints one line per rank and check; exits 1 on any difference.

    python3 kcp_ranks.py --world 2 --transport nccl       # one GPU per rank (torch.distributed, NCCL)
    python3 kcp_ranks.py --world 4 --transport host       # every rank on GPU 0: the records go
                                                          # through the host over gloo

The ranks run through gdnc.cp.spawn_local_ranks; the host transport is gdnc.cp.HostGather, a communicator of one's own (rank(), size(),
all_gather_into_tensor()) over a gloo group: it moves the records through host memory, so several
ranks share one GPU (NCCL refuses two ranks on one device)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

import gdnc  # noqa: E402
from gdnc.cp import build_cp_context, spawn_local_ranks  # noqa: E402


def batch(seed, lens, H, HV, D, device):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.randn(1, T, H, D, generator=gen).bfloat16()
    k = torch.randn(1, T, H, D, generator=gen).bfloat16()
    v = torch.randn(1, T, HV, D, generator=gen).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen))
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=gen))
    h0 = torch.randn(len(lens), HV, D, D, generator=gen) * 0.1
    do = torch.randn(1, T, HV, D, generator=gen).bfloat16()
    dht = torch.randn(len(lens), HV, D, D, generator=gen) * 0.1
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    return [t.to(device) for t in (q, k, v, g, beta, h0, do, dht, cu)]


def step(q, k, v, g, beta, h0, do, dht, ckpt=False, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, beta, h0)]

    def layer(q, k, v, g, beta, h0):
        return gdnc.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                           use_qk_l2norm_in_kernel=True, **kw)

    if ckpt:
        o, ht = torch.utils.checkpoint.checkpoint(layer, *leaves, use_reentrant=False)
    else:
        o, ht = layer(*leaves)
    torch.autograd.backward([o, ht], [do, dht])
    return {"o": o.detach(), "ht": ht.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad,
            "dg": leaves[3].grad, "dbeta": leaves[4].grad, "dh0": leaves[5].grad}


def run_rank(rank, world, group, transport):
    device = torch.device("cuda", torch.cuda.current_device())
    bad = 0
    cases = [("n heads (2, 6)", 2, 6, [4000, 1, 63, 64, 65, 30, 129, 700, 1, 100, 2415], 7),
             ("one document over every rank", 2, 6, [7568], 8),
             ("m heads (16, 48)", 16, 48, [3000, 64, 1, 1031, 4096], 9)]
    for name, H, HV, lens, seed in cases:
        q, k, v, g, beta, h0, do, dht, cu = batch(seed, lens, H, HV, 128, device)
        spec = {"cp": {"ranks": world}}
        proxy = step(q, k, v, g, beta, h0, do, dht, cu_seqlens=cu, spec=spec)
        ctx = build_cp_context(cu, group=group, cu_seqlens_cpu=cu.cpu())
        t0, t1 = ctx.token_begin, ctx.token_begin + ctx.tokens
        docs = list(ctx.documents)
        local = [t[:, t0:t1].contiguous() for t in (q, k, v, g, beta)]
        rows = torch.tensor(docs, device=device)
        mine_h0, mine_dht = h0[rows].contiguous(), dht[rows].contiguous()
        # ht rows of documents that end here, dh0 rows of documents that start here.
        ends = [i for i in range(len(docs)) if i < len(docs) - 1 or ctx.post_num_ranks == 0]
        starts = [i for i in range(len(docs)) if i > 0 or ctx.pre_num_ranks == 0]
        for ckpt in (False, True):
            got = step(*local, mine_h0, do[:, t0:t1].contiguous(), mine_dht, ckpt=ckpt, cp_context=ctx)
            label = f"rank {rank}/{world} {name}{' ckpt' if ckpt else ''}"
            for key, value in got.items():
                if key in ("ht", "dh0"):
                    keep = ends if key == "ht" else starts
                    want = proxy[key][rows[keep]]
                    value = value[keep]
                    other = [i for i in range(len(docs)) if i not in keep]
                    if other and bool(got[key][other].abs().sum() != 0):
                        print(f"{label}: {key} rows {other} (documents going on elsewhere) are not zero")
                        bad += 1
                else:
                    want = proxy[key][:, t0:t1]
                if not torch.equal(value, want):
                    diff = (value.float() - want.float()).abs().max().item()
                    print(f"{label}: {key} differs from the proxy's (max |diff| {diff:.3e})")
                    bad += 1
            print(f"{label}: {len(got)} results checked against the proxy's bits")
    if transport == "nccl":
        # A CUDA graph captures the rank's forward with its all-gather; replays give the eager bits.
        q, k, v, g, beta, _, _, _, cu = batch(12, [3000, 64, 1, 1031, 4096], 16, 48, 128, device)
        ctx = build_cp_context(cu, group=group, cu_seqlens_cpu=cu.cpu())
        mine = [t[:, ctx.token_begin:ctx.token_begin + ctx.tokens].contiguous() for t in (q, k, v, g, beta)]
        with torch.no_grad():
            eager, _ = gdnc.chunk_gated_delta_rule(*mine, cp_context=ctx, use_qk_l2norm_in_kernel=True)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                gdnc.chunk_gated_delta_rule(*mine, cp_context=ctx, use_qk_l2norm_in_kernel=True)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured, _ = gdnc.chunk_gated_delta_rule(*mine, cp_context=ctx, use_qk_l2norm_in_kernel=True)
            for _ in range(3):
                captured.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                if not torch.equal(captured, eager):
                    print(f"rank {rank}/{world}: a graph replay's o differs from the eager call's")
                    bad += 1
        print(f"rank {rank}/{world}: graph capture with the all-gather: 3 replays checked against the eager bits")
    # Refused by name, on every rank, with no rank left waiting: a spec whose cp.ranks is not the
    # group's size, and ranks that disagree on the batch (checked at a layer's first call).
    q, k, v, g, beta, _, _, _, cu = batch(11, [1024 * world], 2, 6, 128, device)
    ctx = build_cp_context(cu, group=group)
    mine = [t[:, ctx.token_begin:ctx.token_begin + ctx.tokens].contiguous() for t in (q, k, v, g, beta)]
    other = [0, 512 + (64 if rank == 1 else 0), 1024 * world]
    for label, call, says in (
            ("cp.ranks unlike the group's size",
             lambda: gdnc.chunk_gated_delta_rule(*mine, cp_context=ctx, spec={"cp": {"ranks": world + 1}}),
             f"differs from the cp_context's world of {world} ranks"),
            ("ranks that disagree on cu_seqlens",
             lambda: gdnc.chunk_gated_delta_rule(*mine, cp_context=build_cp_context(other, group=group)),
             "rank 1 disagrees with rank 0 on cu_seqlens")):
        try:
            call()
            print(f"rank {rank}/{world}: {label} passed")
            bad += 1
        except gdnc.InputError as e:
            if says not in str(e):
                print(f"rank {rank}/{world}: {label}: unexpected message: {e}")
                bad += 1
            else:
                print(f"rank {rank}/{world}: {label} refused: {e}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--transport", choices=("nccl", "host"), default="host")
    args = ap.parse_args()
    try:
        bad = sum(spawn_local_ranks(run_rank, args.world, args.transport, (args.transport,)))
    except gdnc.InputError as e:
        print(f"kcp_ranks: {e}")
        return 2
    print(f"kcp_ranks: {args.world} ranks over {args.transport}: {bad} difference(s) from the proxy")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
