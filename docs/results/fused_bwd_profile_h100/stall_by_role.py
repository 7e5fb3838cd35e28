#!/usr/bin/env python3
"""Warp-stall samples of one kernel by warp role, from an Nsight Compute source page.

usage: stall_by_role.py PROGRAM.sass[.xz] PROFILE_SASS.csv[.xz] KERNEL FILE ROLE=LO-HI ...

PROGRAM.sass: `nvdisasm -g -c program.cubin` of the profiled program (the kernel cache entry of
the same source: gdnc compile SPEC --target sm_90a, then the entry's program.cubin); its line
info ties each instruction to the last line of FILE (a template) seen above it, and ROLE=LO-HI
names the roles by FILE's line ranges. PROFILE_SASS.csv: scripts/ncu_profile.sh's
profile_sass.csv (the `--page source --print-source sass` page), KERNEL its "Kernel Name".
An mbarrier wait's retry loop is out of line ([MOV;] TRYWAIT; @!P BRA itself; BRA back): it is
counted for the role of the code it returns to, and apart from the role's other samples
("mbar-wait"), as is every branch into it.
"""
import collections, csv, io, lzma, re, sys


def text(path):
    return lzma.open(path, "rt").read() if path.endswith(".xz") else open(path).read()


def main():
    sass_path, csv_path, kernel, fname = sys.argv[1:5]
    ranges = []
    for arg in sys.argv[5:]:
        name, span = arg.split("=")
        lo, hi = span.split("-")
        ranges.append((int(lo), int(hi), name))

    def role_of(line):
        for lo, hi, name in ranges:
            if line is not None and lo <= line <= hi:
                return name
        return "other"

    labels, ins, pending, cur = {}, [], [], None
    for l in text(sass_path).split("\n"):
        m = re.search(r'//## File "([^"]+)", line (\d+)', l)
        if m:
            if m.group(1).endswith(fname):
                cur = int(m.group(2))
            continue
        m = re.match(r"\s*\.(L_x_\d+):", l)
        if m:
            pending.append(m.group(1))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", l)
        if m:
            off = int(m.group(1), 16)
            for p in pending:
                labels[p] = off
            pending = []
            ins.append((off, m.group(2).strip(), cur))
    role, waits = {}, set()
    line_at = {o: ln for o, _, ln in ins}
    text_at = {o: s for o, s, _ in ins}
    for o, s, ln in ins:
        role[o] = role_of(ln)
    # Out-of-line retry blocks: a label whose first instruction is a TRYWAIT. A branch to one is
    # a wait of the code around the branch; the block itself (TRYWAIT; @!P BRA itself; BRA back)
    # belongs to the code it returns to.
    index_of = {o: k for k, (o, _, _) in enumerate(ins)}

    def starts_retry(off):
        k = index_of.get(off)
        for j in range(k, min(k + 3, len(ins))) if k is not None else ():
            if "TRYWAIT" in ins[j][1]:
                return True
            if "BRA" in ins[j][1]:
                return False
        return False

    retry = {lab for lab, off in labels.items() if starts_retry(off)}
    for k, (o, s, ln) in enumerate(ins):
        m = re.search(r"(L_x_\d+)", s)
        if "BRA" in s and m and m.group(1) in retry:
            waits.add(o)
        if "TRYWAIT" not in s:
            continue
        waits.add(o)
        if k + 2 < len(ins) and ins[k + 2][1].startswith("BRA"):
            m = re.search(r"(L_x_\d+)", ins[k + 2][1])
            if m and m.group(1) in labels:
                r = role_of(line_at.get(labels[m.group(1)]))
                for j in (k, k + 1, k + 2):
                    role[ins[j][0]] = r
    rows = list(csv.reader(io.StringIO(text(csv_path))))
    data, hdr, on = [], None, False
    for r in rows:
        if r and r[0] == "Kernel Name":
            on = r[1] == kernel
            continue
        if on and r and r[0] == "Address":
            hdr = r
            continue
        if on and hdr and r:
            data.append(r)
    ix = {h: k for k, h in enumerate(hdr)}
    base = int(data[0][0], 16)
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total, wait, size = collections.Counter(), collections.Counter(), collections.Counter()
    busy = collections.defaultdict(collections.Counter)
    for o, _, _ in ins:
        size[role[o]] += 16
    for r in data:
        o = int(r[0], 16) - base
        s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        rl = role.get(o, "other")
        total[rl] += s
        if o in waits:
            wait[rl] += s
            continue
        for c in stall_cols:
            v = int(r[ix[c]] or 0)
            if v:
                busy[rl][c[6:]] += v
    print(f"{kernel}: {len(ins)} instructions ({len(ins) * 16 / 1024:.1f} KB)")
    for rl in sorted(total, key=lambda k: -total[k]):
        b = sum(busy[rl].values())
        print(f"{rl:10s} {size[rl] / 1024:6.1f} KB code, {total[rl]:7d} samples, mbar-wait {100 * wait[rl] / max(1, total[rl]):3.0f} %;"
              " the rest: " + ", ".join(f"{k} {100 * v / max(1, b):.0f} %" for k, v in busy[rl].most_common(6)))


if __name__ == "__main__":
    main()
