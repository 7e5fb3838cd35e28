#!/usr/bin/env python3
"""Merges the run files of bench/compare.py (one per process: FLA and FlashQLA, both arm orders,
any number of device calls) into the published table: markdown, a JSON summary and a PNG of the
ratios.

    python3 bench/table.py RUN.json... --out docs/results/bench_COMMIT   # .md, .json, .png

A cell (shape, operation, peer) lists every run in time order. A run counts when it used the
normal protocol (a shortened one is shown as such, never published) and its decision published it
(bench/protocol.py): by drift, by the paired-ratio test (marked †), or, for a power-capped cell,
under the sustained protocol (marked §; the class then uses the A/A envelope of the same run's
normal protocol). The milliseconds shown are those of the first published run in time order; the
ratio column lists every published run's ratio (peer ms / gdnc ms, above 1 = gdnc faster) and
class. A cell without a published run says why: n/p power-capped (no sustained record),
measured under the cap (sustained record, drift above 2 %), n/p unstable, failed gate, n/p peer
kernels from a carried cache (the peer loaded its compiled kernels from disk), or not measured.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import protocol  # noqa: E402

SHAPES = ("N", "M", "G", "A", "L", "F", "F1")
OPS = ("fwd", "fwd+bwd", "ckpt")
FLOOR = {"N": (0.011, 0.043, 0.054), "M": (0.352, 1.36, 1.712), "G": (1.406, 5.45, 6.856),
         "A": (2.812, 10.90, 13.712), "L": (0.044, 0.172, 0.216), "F": (0.234, 0.908, 1.143),
         "F1": (0.234, 0.908, 1.143)}
PEER_LABEL = {"flashqla": "FlashQLA", "fla": "FLA"}
OURS = "gdnc"


def run_outcome(run, shape, op):
    """What one run says about one cell: a dict with `published` and, if so, the numbers."""
    peer = run["peer"]
    entry = run["shapes"].get(shape)
    if entry is None or op not in entry.get("ops", {}):
        gate = (entry or {}).get("gate", {})
        if gate and not all(r["ok"] for r in gate.get(OURS, {"x": {"ok": False}}).values()):
            return {"published": False, "reason": "gdnc failed gate"}
        return None
    gate = entry.get("gate", {}).get(peer)
    if gate is not None and not all(r["ok"] for r in gate.values()):
        return {"published": False, "reason": f"{PEER_LABEL.get(peer, peer)} failed gate"}
    cell = entry["ops"][op]
    d = cell.get("decision")
    if d is None:
        return {"published": False, "reason": "no peer timed"}
    base = {"order": run["order"], "commit": run["commit"], "started_utc": run["started_utc"],
            "capped_arms": d["capped_arms"]}
    if run.get("protocol") != protocol.NORMAL:
        return dict(base, published=False, reason="shortened protocol")
    # FlashQLA ran up to 37 % slower with its kernels loaded from a carried disk cache than with
    # them compiled in the process (M fwd 1.55-1.69 against 1.23-1.30 ms, M fwd+bwd 5.85 against
    # 5.18; docs/PERF.md): a peer that did not compile its own kernels is not the peer at its best.
    if run.get("peer_kernel_cache") == "carried":
        return dict(base, published=False, reason="n/p peer kernels from a carried cache")
    if d["status"] == "published":
        return dict(base, published=True, mark="†" if d["by"] == "paired" else "", ratio=d["ratio"],
                    cls=d["cls"], ours_ms=d["ms"][OURS], peer_ms=d["ms"][peer])
    if d["status"] == "unstable":
        return dict(base, published=False, reason="n/p unstable")
    s = cell.get("sustained")
    if s is None:
        return dict(base, published=False, reason="n/p power-capped")
    sd = s["decision"]
    if not sd["published"]:
        return dict(base, published=False, reason="measured under the cap")
    return dict(base, published=True, mark="§", ratio=sd["ratio"], cls=protocol.classify(sd["ratio"], d["aa_spread"]),
                ours_ms=sd["ms"][OURS], peer_ms=sd["ms"][peer], range=sd["range"])


def build(runs):
    """{(shape, op, peer): {"runs": [outcome, ...] in time order, "headline": first published or None,
    "reason": why none is published}}."""
    runs = sorted(runs, key=lambda r: r["started_utc"])
    table = {}
    for shape in SHAPES:
        for op in OPS:
            for peer in PEER_LABEL:
                outcomes = [o for o in (run_outcome(r, shape, op) for r in runs if r["peer"] == peer) if o]
                if not outcomes:
                    continue
                published = [o for o in outcomes if o["published"]]
                reasons = sorted({o["reason"] for o in outcomes if not o["published"]})
                table[(shape, op, peer)] = {"runs": outcomes, "headline": published[0] if published else None,
                                            "reason": None if published else "; ".join(reasons)}
    return table


def ratio_text(cell):
    if cell is None:
        return "not measured"
    n = len(cell["runs"])
    if cell["headline"] is None:
        return f"{cell['reason']} ({n} run{'s' if n > 1 else ''})"
    shown = [o for o in cell["runs"] if o["published"]]
    text = ", ".join(f"{o['ratio']:.3f}{o['mark']} {o['cls']}" for o in shown)
    return text if len(shown) == n else f"{text} ({len(shown)} of {n} runs)"


def markdown(table, runs):
    commits = sorted({c for r in runs for c in [r["commit"], *r.get("resumed_commits", [])]})
    digests = sorted({r["code_digest"] for r in runs if r.get("code_digest")})
    devices = sorted({r["device"] for r in runs})
    versions = sorted({f"{PEER_LABEL.get(r['peer'], r['peer'])}: {r['peer_version']}" for r in runs if r["peer_version"]})
    config = runs[0].get("gdnc_spec", {}) if runs else {}
    config_text = f" with {json.dumps(config, sort_keys=True)}" if config else ""
    # Whether the peer's kernels were compiled in the process or loaded from a carried disk cache:
    # FlashQLA's times differed between the two (docs/PERF.md). Older run files do not say.
    caches = sorted({f"{r['peer']} {r.get('peer_kernel_cache', 'unknown')}" for r in runs if r.get("peer")})
    cache_text = f" Peer kernels: {', '.join(caches)}." if caches else ""
    # Commits of one code digest launch the same kernels the same way (`gdnc digest`).
    digest_text = f" (code digest {', '.join(digests)})" if digests else ""
    lines = [f"gdnc at {', '.join(commits)}{digest_text}{config_text} on {', '.join(devices)}; peers {'; '.join(versions)}."
             + cache_text,
             "Ratio = peer ms / gdnc ms of the same process (above 1: gdnc faster), one per published run with its "
             "class; † = published by the paired-ratio test, § = sustained protocol (power cap).", "",
             "| shape | op | floor ms | gdnc ms | FlashQLA ms | FlashQLA / gdnc | gdnc ms | FLA ms | FLA / gdnc | gdnc / floor |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape in SHAPES:
        for i, op in enumerate(OPS):
            cells = {p: table.get((shape, op, p)) for p in PEER_LABEL}
            if not any(cells.values()):
                continue
            row = [shape, op, f"{FLOOR[shape][i]:.3f}"]
            ours_ms = None
            for peer in ("flashqla", "fla"):
                c = cells[peer]
                h = c["headline"] if c else None
                row += [f"{h['ours_ms']:.3f}" if h else "", f"{h['peer_ms']:.3f}" if h else "", ratio_text(c)]
                ours_ms = ours_ms or (h["ours_ms"] if h else None)
            row.append(f"{ours_ms / FLOOR[shape][i]:.1f}" if ours_ms else "")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def summary_json(table):
    return [{"shape": s, "op": o, "peer": p, **{k: v for k, v in c.items()}} for (s, o, p), c in table.items()]


def plot(table, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"no plot: {e}")
        return False
    fig, axes = plt.subplots(1, len(OPS), figsize=(15, 4), sharey=True)
    for ax, op in zip(axes, OPS):
        labelled = set()
        for k, peer in enumerate(PEER_LABEL):
            label = PEER_LABEL[peer] + " / gdnc"
            for j, shape in enumerate(SHAPES):
                c = table.get((shape, op, peer))
                if c is None:
                    continue
                x = j + (k - 0.5) * 0.35
                if c["headline"] is None:
                    note = PEER_LABEL[peer] + ": not published"
                    ax.plot([x], [1.0], marker="x", color=f"C{k}", linestyle="none",
                            label=None if note in labelled else note)
                    labelled.add(note)
                    continue
                ratios = sorted(o["ratio"] for o in c["runs"] if o["published"])
                mid = ratios[len(ratios) // 2]
                ax.bar(x, mid - 1.0, bottom=1.0, width=0.33, color=f"C{k}", label=None if label in labelled else label)
                ax.annotate(f"{mid:.2f}", (x, mid), ha="center", va="bottom" if mid >= 1 else "top", fontsize=7)
                labelled.add(label)
                ax.plot([x] * len(ratios), ratios, "k.", markersize=4)
        ax.axhline(1.0, color="k", linewidth=0.8)
        ax.set_xticks(range(len(SHAPES)))
        ax.set_xticklabels(SHAPES)
        ax.set_yscale("log")
        ax.set_ylim(0.25, 4.0)
        ax.set_title(f"{op}: peer ms / gdnc ms (>1: gdnc faster; x = not published)", fontsize=9)
        if labelled:
            ax.legend()
    fig.tight_layout()
    fig.savefig(str(path))
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run files of bench/compare.py")
    ap.add_argument("--out", required=True, help="path stem: writes STEM.md, STEM.json, STEM.png")
    args = ap.parse_args(argv)
    runs = []
    for p in args.runs:
        try:
            runs.append(json.loads(Path(p).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"table: {p}: {e}")
    configs = {json.dumps(r.get("gdnc_spec", {}), sort_keys=True) for r in runs}
    if len(configs) > 1:
        sys.exit("table: the runs time different gdnc configurations (--gdnc-spec): " + "; ".join(sorted(configs)) +
                 "; build one table per configuration")
    # A ratio holds for the card it was timed on (an H100 and an H200 throttle differently under
    # the same power cap): one table per device.
    devices = {r.get("device", "unknown") for r in runs}
    if len(devices) > 1:
        sys.exit("table: the runs were timed on different devices: " + "; ".join(sorted(devices)) +
                 "; build one table per device")
    table = build(runs)
    text = markdown(table, runs)
    stem = Path(args.out)
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps(summary_json(table), indent=1))
    plot(table, stem.with_suffix(".png"))
    print(text)


if __name__ == "__main__":
    main()
