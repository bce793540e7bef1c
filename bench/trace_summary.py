"""Summaries of bench/cupti_trace.cpp's CSVs in DIR: per process, what ran on the GPU (per
second of the steady middle of the trace), in how many bursts; with several processes, the
gaps where no process ran a kernel. Usage: python3 bench/trace_summary.py DIR"""
import collections, glob, sys, os
def load(path):
    rows = []
    for line in open(path):
        p = line.rstrip("\n").split(",")
        if len(p) < 8: continue
        rows.append((p[0], int(p[1]), int(p[2]), p[4], p[5], p[6], int(p[7])))
    rows.sort(key=lambda r: r[1]); return rows
d = sys.argv[1]
allrows = {}
for path in sorted(glob.glob(d + "/trace.*.csv")):
    rows = load(path)
    if not rows: continue
    name = os.path.basename(path)
    allrows[name] = rows
    t0, t1 = rows[0][1], rows[-1][2]
    # steady part: middle 60 %
    a, b = t0 + (t1 - t0) * 0.3, t0 + (t1 - t0) * 0.9
    mid = [r for r in rows if a <= r[1] < b]
    secs = (b - a) / 1e9
    print(f"== {name}: {len(rows)} records, {secs:.1f} s steady")
    agg = collections.defaultdict(lambda: [0, 0])
    for r in mid:
        key = r[0] + " " + r[5][:70]
        agg[key][0] += 1; agg[key][1] += r[2] - r[1]
    for k, (n, ns) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"  {n/secs:9.1f}/s  {ns/max(n,1)/1e3:9.1f} us each  {ns/secs/1e6:7.2f} ms/s  {k}")
    for gapus in (20, 200):
        bursts, last_end, busy = 0, None, 0
        for r in mid:
            if last_end is None or r[1] - last_end > gapus * 1000: bursts += 1
            last_end = r[2] if last_end is None else max(last_end, r[2])
        print(f"  bursts (gap > {gapus} us): {bursts/secs:.1f}/s")
    kern = [r for r in mid if r[0] == "K"]
    print(f"  kernels {len(kern)/secs:.1f}/s, kernel time {sum(r[2]-r[1] for r in kern)/secs/1e6:.2f} ms/s")
if len(allrows) > 1:
    # interleaving of kernels of all processes: gaps where the GPU ran no kernel of anyone
    ev = sorted((r[1], r[2], name) for name, rows in allrows.items() for r in rows if r[0] == "K")
    t0, t1 = ev[0][0], ev[-1][1]; a, b = t0 + (t1 - t0) * 0.3, t0 + (t1 - t0) * 0.9
    ev = [e for e in ev if a <= e[0] < b]; secs = (b - a) / 1e9
    idle, switches, end, prev, switch_idle = 0, 0, ev[0][1], ev[0][2], 0
    for s, e, n in ev[1:]:
        gap = max(0, s - end)
        idle += gap
        if n != prev: switches += 1; switch_idle += gap
        prev = n; end = max(end, e)
    print(f"== all: kernel-idle {idle/secs/1e6:.1f} ms/s, process switches {switches/secs:.0f}/s, idle at switches {switch_idle/secs/1e6:.1f} ms/s ({switch_idle/max(switches,1)/1e3:.1f} us each)")
