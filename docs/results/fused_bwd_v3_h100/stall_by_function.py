#!/usr/bin/env python3
"""Warp-stall samples of the fused walk by the template function each instruction was inlined into.

usage: stall_by_function.py PROGRAM.sass PROFILE_SASS.csv[.xz] TEMPLATE [N]

PROGRAM.sass: `nvdisasm -gi -c program.cubin` of the profiled program (the same NVRTC rebuilds the
same cubin); PROFILE_SASS.csv: scripts/ncu_profile.sh's profile_sass.csv of that program alone;
TEMPLATE: the walk_bwd_fused_sm90.cuh it was built from. Prints each function's share of the samples
with its top stall reasons, then the N template lines with the most samples (30 by default).

Unlike docs/results/fused_bwd_profile_h100/stall_by_role.py (roles by line ranges from `nvdisasm -g`,
where an inlined helper's code counts for the helper's lines), this follows `-gi`'s inlined-at chain
out to the outermost role function (producer, algebra, values, owner, body, store_e_half), so a
role's mbarrier retry loops and inlined helpers count for the role and for the role's line that
called them.
"""
import collections
import csv
import lzma
import re
import sys

ROLES = {"producer", "algebra", "values", "owner", "body", "store_e_half"}
WALK = "walk_bwd_fused_sm90.cuh"


def number(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    sass_path, csv_path, template = sys.argv[1:4]
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    lines = open(template).read().split("\n")
    starts = [(i, m.group(1)) for i, l in enumerate(lines, 1) if (m := re.search(r"static void (\w+)\(", l))]

    def function_of(line):
        name = None
        for start, f in starts:
            if line >= start:
                name = f
        return name

    # Each instruction: the outermost line of a role function in its inlined-at chain.
    insts, chain, in_block = [], [], False
    for raw in open(sass_path):
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?', raw)
        if m:
            if not in_block:
                chain = []
            in_block = True
            if m.group(1).endswith(WALK):
                chain.append(int(m.group(2)))
            if m.group(3) and m.group(3).endswith(WALK):
                chain.append(int(m.group(4)))
            continue
        if re.match(r"\s*/\*[0-9a-f]+\*/\s+", raw):
            in_block = False
            role = line = None
            for l in chain:
                if function_of(l) in ROLES:
                    role, line = function_of(l), l
            if role is None and chain:
                role, line = function_of(chain[-1]), chain[-1]
            insts.append((role, line))

    opener = lzma.open if csv_path.endswith(".xz") else open
    rows = list(csv.reader(opener(csv_path, "rt")))
    header, data = rows[1], sorted(rows[2:], key=lambda r: int(r[0], 16))
    if len(data) != len(insts):
        sys.exit(f"{csv_path}: {len(data)} instructions, {sass_path}: {len(insts)}; not the same program")
    samples = header.index("Warp Stall Sampling (All Samples)")
    executed = header.index("Instructions Executed")
    stalls = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]

    total = sum(number(r[samples]) for r in data)
    by_role = collections.defaultdict(collections.Counter)
    by_line = collections.defaultdict(collections.Counter)
    runs = collections.Counter()
    for (role, line), r in zip(insts, data):
        runs[role] += number(r[executed])
        for counter in (by_role[role], by_line[(role, line)]):
            counter["_all"] += number(r[samples])
            for i in stalls:
                counter[header[i][6:]] += number(r[i])

    def reasons(c, n):
        return ", ".join(f"{k} {v / total * 100:.1f}" for k, v in c.most_common(n + 1) if k != "_all")

    print("role: share of samples, executed warp-instr, top stalls")
    for role, c in sorted(by_role.items(), key=lambda x: -x[1]["_all"]):
        print(f"{str(role):14s} {c['_all'] / total * 100:5.1f}%  exe {runs[role]:.3g}  {reasons(c, 5)}")
    print("hot lines")
    for (role, line), c in sorted(by_line.items(), key=lambda x: -x[1]["_all"])[:top]:
        text = lines[line - 1].strip()[:70] if line else ""
        print(f"{c['_all'] / total * 100:5.2f}% {str(role):10s} {line} [{reasons(c, 3)}] {text}")


if __name__ == "__main__":
    main()
