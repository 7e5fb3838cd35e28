"""The publishing rules of the benchmark, as pure functions of timed samples (no torch, no GPU).

bench/compare.py times; this module decides what of it may be called a result. docs/benchmark.md
states the rules in prose; the CPU tests (python/tests/test_protocol.py) check every decision on
synthetic samples.

Terms:
  run       one process timing gdnc, its A/A copy and one peer in a fixed arm order (the other
            order is a second run, a second process)
  cell      one (shape, operation) of a run
  group     one pass over the arms in mirrored order (A B C C B A); a cell has `groups` of them
  ratio     peer ms / gdnc ms: above 1 means gdnc is faster

Normal protocol (per cell): 5 groups x 2 mirrored visits x 12 samples after 10 warm-up calls per
visit, the L2 flushed before every sample. The cell's value per arm is the median of its 120
samples.
  - power gate: if any arm of the cell has 5 % or more of its samples at the board power limit,
    nothing of the cell is published from this protocol; it goes to the sustained protocol.
  - stability: published when gdnc and the peer both drift by 2 % or less (first vs last group
    median, over the cell median); else published when the paired-ratio test passes (5 or more
    groups, every per-group ratio within 1 % of their median; marked with a dagger); else
    "unstable".
  - class: the A/A arm's per-group ratios (A/A ms / gdnc ms) span the noise envelope
    1 +- max|r_aa - 1|; the run's ratio (the median of its per-group ratios) above the envelope
    is a "win", inside it "parity", below it "REGRESSION" (gdnc slower than the peer by more than
    the noise).

Sustained protocol (a power-capped cell, gdnc against the strongest peer only): per arm block a
5 s idle cool-down, 20 warm-up calls and 300 timed samples; three groups of mirrored block pairs
(gdnc, peer, peer, gdnc); the value per arm is the median of its block medians with [min, max];
published when both arms drift by 2 % or less across the groups (first vs last group's median of
block medians), else "measured under the cap" (no ratio published).
"""

import statistics

DRIFT_LIMIT_PCT = 2.0
PAIRED_MIN_GROUPS = 5
PAIRED_TOLERANCE = 0.01
POWER_LIMIT_PCT = 5.0

NORMAL = {"groups": 5, "samples": 12, "warmup": 10}
# Untimed calls of every arm before a cell's first group (seconds): the first group then starts
# from the loaded GPU state, not from the idle of a peer's JIT compile or of the gates.
SETTLE_S = 3.0
SUSTAINED = {"groups": 3, "samples": 300, "warmup": 20, "cooldown_s": 5.0}


def median(xs):
    xs = list(xs)
    if not xs:
        raise ValueError("median of no samples")
    return statistics.median(xs)


def group_medians(groups):
    """Per-group medians of one arm's samples (a list of lists, one per group)."""
    return [median(g) for g in groups]


def drift_pct(groups):
    """The spread between the first and the last group median, in % of the median of all samples."""
    if len(groups) < 2:
        raise ValueError(f"drift needs at least 2 groups, got {len(groups)}")
    meds = group_medians(groups)
    overall = median(t for g in groups for t in g)
    return abs(meds[0] - meds[-1]) / overall * 100.0


def per_group_ratios(num_groups, den_groups):
    """median(num) / median(den) per group: the paired ratios of two arms timed in the same groups."""
    if len(num_groups) != len(den_groups):
        raise ValueError(f"paired ratios need the same groups: {len(num_groups)} vs {len(den_groups)}")
    return [n / d for n, d in zip(group_medians(num_groups), group_medians(den_groups))]


def paired_ratio_test(ratios, min_groups=PAIRED_MIN_GROUPS, tolerance=PAIRED_TOLERANCE):
    """Passes with `min_groups` or more per-group ratios that all lie within `tolerance` (relative)
    of their median."""
    if len(ratios) < min_groups:
        return False
    mid = median(ratios)
    return all(abs(r - mid) <= tolerance * mid for r in ratios)


def aa_spread(aa_ratios):
    """Half-width of the A/A noise envelope around 1: the largest deviation of an A/A per-group
    ratio from 1."""
    if not aa_ratios:
        raise ValueError("the A/A envelope needs the A/A arm's per-group ratios")
    return max(abs(r - 1.0) for r in aa_ratios)


def classify(ratio, spread):
    """win (gdnc faster beyond the A/A noise), parity (inside it) or REGRESSION (gdnc slower)."""
    if ratio > 1.0 + spread:
        return "win"
    if ratio < 1.0 - spread:
        return "REGRESSION"
    return "parity"


def power_capped(arms):
    """The arms of a cell that reached the power limit in POWER_LIMIT_PCT % or more of their samples."""
    return sorted(name for name, a in arms.items() if a["power_limited_pct"] >= POWER_LIMIT_PCT)


def decide_normal(arms, ours, peer, aa):
    """The decision for one cell of one run under the normal protocol.

    `arms` maps an arm's name to {"groups": [[ms, ...], ...], "power_limited_pct": float}; `ours`,
    `peer` and `aa` name the gdnc arm, the compared peer and the A/A copy. Returns a dict with
    status "published", "power-capped" or "unstable", and the numbers behind it."""
    for name in (ours, peer, aa):
        if name not in arms:
            raise KeyError(f"cell has no arm '{name}' (arms: {', '.join(sorted(arms))})")
    ms = {n: median(t for g in a["groups"] for t in g) for n, a in arms.items()}
    drift = {n: drift_pct(a["groups"]) for n, a in arms.items()}
    ratios = per_group_ratios(arms[peer]["groups"], arms[ours]["groups"])
    aa_ratios = per_group_ratios(arms[aa]["groups"], arms[ours]["groups"])
    spread = aa_spread(aa_ratios)
    ratio = median(ratios)
    out = {"ms": ms, "drift_pct": drift, "ratios": ratios, "aa_ratios": aa_ratios, "aa_spread": spread,
           "ratio": ratio, "ratio_of_medians": ms[peer] / ms[ours], "capped_arms": power_capped(arms)}
    if out["capped_arms"]:
        out.update(status="power-capped", published=False, by=None, cls=None)
        return out
    if drift[ours] <= DRIFT_LIMIT_PCT and drift[peer] <= DRIFT_LIMIT_PCT:
        by = "drift"
    elif paired_ratio_test(ratios):
        by = "paired"
    else:
        out.update(status="unstable", published=False, by=None, cls=None)
        return out
    out.update(status="published", published=True, by=by, cls=classify(ratio, spread))
    return out


def sustained_order(arms):
    """The block order of one sustained group: a mirrored pair of blocks per arm (A B B A)."""
    return list(arms) + list(arms)[::-1]


def decide_sustained(blocks, ours, peer):
    """The decision for a power-capped cell re-timed under the sustained protocol.

    `blocks` maps an arm to its block medians per group: {arm: [[block median, ...], ...]} (one
    inner list per group, two blocks each). Returns status "published" or "under-cap" with the
    value per arm (median of all block medians), its [min, max] and the drift across groups."""
    out = {"ms": {}, "range": {}, "drift_pct": {}}
    for name in (ours, peer):
        if name not in blocks:
            raise KeyError(f"sustained record has no arm '{name}'")
        groups = blocks[name]
        flat = [b for g in groups for b in g]
        out["ms"][name] = median(flat)
        out["range"][name] = [min(flat), max(flat)]
        out["drift_pct"][name] = drift_pct(groups)
    out["ratio"] = out["ms"][peer] / out["ms"][ours]
    stable = all(out["drift_pct"][n] <= DRIFT_LIMIT_PCT for n in (ours, peer))
    out["status"] = "published" if stable else "under-cap"
    out["published"] = stable
    return out
