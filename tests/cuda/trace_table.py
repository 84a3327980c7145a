#!/usr/bin/env python3
"""The decode timeline (src/cuda/cu_trace.h) as tables: one decode step's launches in graph order
and the kernels summed over the step, each with the time it adds to the step's critical path.

    python3 tests/cuda/trace_table.py TRACE_FILE [SRC_DIR]

A launch's records are its blocks' (start, wait returned, end) in the GPU's nanosecond clock.
Per launch: 'span' first block start to last block end; 'wait' first block start to the last
block's return from griddepcontrol.wait (time spent scheduled while the predecessor drained);
'marks' the blocks' median time after the wait at each CU_MARK point the kernel has (thread 0's);
'adds' the launch's last end minus the latest last end of the launches before it (what the step
would lose if the launch cost nothing and nothing waited on it: the critical path's share; 0 for
the second stream's L2 prefetches, which the step joins only before the lm_head)."""
import os
import re
import struct
import sys
from collections import defaultdict

REC = struct.Struct("<QQQQIIIIIII4x")  # grid, t0, t1, t2, site, block, sm, mk[3], pad (cu_trace_rec)


def fnv(name):
    h = 2166136261
    for ch in name.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


def sites(src):
    """site id -> 'kernel (file:line)' for every CU_PDL() in the sources"""
    out = {}
    for fn in sorted(os.listdir(src)):
        if not fn.endswith((".cu", ".h")):
            continue
        kern = "?"
        with open(os.path.join(src, fn)) as f:
            for i, line in enumerate(f, 1):
                m = re.search(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(", line)
                if m:
                    kern = m.group(1)
                if "CU_PDL()" in line and "define" not in line:
                    out[((fnv(fn) << 16) & 0xFFFFFFFF) | (i & 0xFFFF)] = "%s (%s:%d)" % (kern, fn, i)
    return out


def read(path):
    runs = []
    with open(path, "rb") as f:
        while True:
            head = f.readline()
            if not head:
                break
            tag, steps, n = head.split()
            assert tag == b"lily-trace", head
            data = f.read(int(n) * REC.size)
            runs.append((int(steps), [REC.unpack_from(data, i * REC.size) for i in range(int(n))]))
    return runs


def marks(rs):
    """the blocks' median (us after their wait) at each mark point, and at the end"""
    out = []
    for i in range(3):
        v = sorted(r[7 + i] for r in rs if r[7 + i])
        out.append("%.2f" % (v[len(v) // 2] / 1e3) if v else "-")
    v = sorted(r[3] - r[2] for r in rs)
    out.append("%.2f" % (v[len(v) // 2] / 1e3))
    return " / ".join(out)


def main():
    path = sys.argv[1]
    src = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "..", "src", "cuda")
    names = sites(src)
    for steps, recs in read(path):
        # %gridid tells apart only grids that run at the same time (a graph's replays reuse them):
        # a launch is a (site, gridid)'s run of blocks, a new one starting once a block starts
        # after every block so far has ended (a launch's blocks all start before the
        # predecessor's wait returns; the site's previous launch, two or more back, has ended)
        by = defaultdict(list)
        for r in recs:
            by[(r[4], r[0])].append(r)
        launches = []
        for (site, grid), rs in by.items():
            rs.sort(key=lambda r: r[1])
            cur = []
            for r in rs + [None]:
                if cur and (r is None or r[1] > max(c[3] for c in cur)):
                    launches.append(dict(grid=grid, site=site, blocks=len(cur), t0=cur[0][1], t1=max(c[2] for c in cur),
                                         t2=max(c[3] for c in cur), sms=len(set(c[6] for c in cur)), marks=marks(cur)))
                    cur = []
                if r is not None:
                    cur.append(r)
        launches.sort(key=lambda l: (l["t0"], l["grid"]))
        per = len(launches) // steps
        if per * steps != len(launches):
            print("warning: %d launches over %d steps" % (len(launches), steps))
        # the middle step: warm, with neighbours on both sides
        k = steps // 2
        step = launches[k * per:(k + 1) * per]
        s0 = step[0]["t0"]
        total = max(l["t2"] for l in step) - s0
        print("## one decode step (%d of %d), %d launches, %.1f us (%.1f tok/s)\n" % (k + 1, steps, per, total / 1e3, 1e9 / total))
        print("| # | kernel | blocks | SMs | start us | span us | wait us | adds us | marks 0 / 1 / 2 / end (us after wait) |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        done = s0
        agg = defaultdict(lambda: [0, 0.0, 0.0])
        for i, l in enumerate(step):
            name = names.get(l["site"], "site %08x" % l["site"])
            # the second stream's prefetches join only before the lm_head: off the path
            side = name.startswith("k_l2_prefetch")
            adds = 0 if side else max(0, l["t2"] - done)
            done = done if side else max(done, l["t2"])
            a = agg[name]
            a[0] += 1
            a[1] += (l["t2"] - l["t0"]) / 1e3
            a[2] += adds / 1e3
            print("| %d | %s | %d | %d | %.2f | %.2f | %.2f | %.2f | %s |" % (i, name, l["blocks"], l["sms"], (l["t0"] - s0) / 1e3,
                                                                           (l["t2"] - l["t0"]) / 1e3, (l["t1"] - l["t0"]) / 1e3,
                                                                           adds / 1e3, l["marks"]))
        print("\n## by kernel (the step above)\n")
        print("| kernel | launches | span us | adds us | % of step |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name, (n, sp, ad) in sorted(agg.items(), key=lambda kv: -kv[1][2]):
            print("| %s | %d | %.1f | %.1f | %.1f |" % (name, n, sp, ad, 100 * ad * 1e3 / total))
        tots = []
        for j in range(steps):
            st = launches[j * per:(j + 1) * per]
            if st:
                tots.append((max(l["t2"] for l in st) - st[0]["t0"]) / 1e3)
        print("\nsteps (us): " + ", ".join("%.1f" % t for t in tots))


if __name__ == "__main__":
    main()
