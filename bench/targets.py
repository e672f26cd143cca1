#!/usr/bin/env python3
"""Issue 19's speed targets, checked over one or more runs of bench/run.sh.

    python3 bench/targets.py bench/out/bench-A.csv [bench/out/bench-B.csv ...]

For every target and every run: the ratio of run.sh's medians ("med") and the median of the
per-round ratios ("pair", the rounds run the targets back to back), and whether both meet the
target. Then, over all the runs given, the median of the runs' paired values, and the number of
runs that met the target on both. A run's idle RSS comes from the summary (.txt) next to its CSV.

One run meeting every target is luck when the runs scatter around the line; the median over
several runs is the steadier reading (bench/RESULTS.md). Standard library only.
"""
import csv
import os
import re
import statistics
import sys

# (label, scenario, metric column, kind, reference target, bound)
#   kind "higher": ratio bearerd/ref >= bound; "lower": ratio <= bound;
#   "latency": difference bearerd - ref (µs) <= bound.
TARGETS = [
    ("64 keep-alive, req/s >= 1.0x", "small_c64", "rps", "higher", "nginx", 1.0),
    ("64 keep-alive, CPU <= 1.0x", "small_c64", "cpu_us_per_req", "lower", "nginx", 1.0),
    ("new conn c16, CPU <= 1.0x", "newconn_c16", "cpu_us_per_req", "lower", "nginx", 1.0),
    ("new conn c16, req/s >= 1.0x", "newconn_c16", "rps", "higher", "nginx", 1.0),
    ("new conn -t2 -c64, CPU <= 1.0x", "newconn_c64t2", "cpu_us_per_req", "lower", "nginx", 1.0),
    ("new conn -t2 -c64, req/s >= 1.0x", "newconn_c64t2", "rps", "higher", "nginx", 1.0),
    ("1 MiB, CPU per MiB <= 1.0x", "big_c8", "cpu_us_per_req", "lower", "nginx", 1.0),
    ("h2c >= 1.3x", "h2c_c4m16", "rps", "higher", "nginx", 1.3),
    ("p50 at 1 conn within +5 us", "small_c1", "p50_us", "latency", "nginx", 5.0),
    ("access log on >= 0.90x of off", "small_c64", "rps", "higher", "bearerd", 0.9),
]
IDLE_RSS_BOUND_KIB = 16 * 1024


def load(path):
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.setdefault((r["scenario"], r["target"]), {})[r["round"]] = r
    return rows


def value(row, column):
    try:
        return float(row[column])
    except (KeyError, TypeError, ValueError):
        return None


def compare(kind, b, ref):
    return b - ref if kind == "latency" else (b / ref if ref else None)


def met(kind, x, bound):
    return x is not None and (x >= bound if kind == "higher" else x <= bound)


def evaluate(rows, scenario, column, kind, ref, subject="bearerd"):
    """(med, pair) for one target in one run, or (None, None) when it has no data."""
    b_rounds = rows.get((scenario, subject), {})
    r_rounds = rows.get((scenario, ref), {})
    if ref == "bearerd":  # the access-log target: bearerd_log against bearerd
        b_rounds = rows.get((scenario, "bearerd_log"), {})
    bs = [v for v in (value(r, column) for r in b_rounds.values()) if v is not None]
    rs = [v for v in (value(r, column) for r in r_rounds.values()) if v is not None]
    if not bs or not rs:
        return None, None
    med = compare(kind, statistics.median(bs), statistics.median(rs))
    pairs = []
    for k, row in b_rounds.items():
        if k in r_rounds:
            b, r = value(row, column), value(r_rounds[k], column)
            if b is not None and r is not None and (kind == "latency" or r > 0):
                pairs.append(compare(kind, b, r))
    return med, (statistics.median(pairs) if pairs else None)


def idle_rss(csv_path):
    txt = os.path.splitext(csv_path)[0] + ".txt"
    try:
        with open(txt) as f:
            m = re.search(r"^idle RSS bearerd\s+(\d+) KiB", f.read(), re.M)
            return int(m.group(1)) if m else None
    except OSError:
        return None


def fmt(kind, x):
    if x is None:
        return "-"
    return f"{x:+.0f}us" if kind == "latency" else f"{x:.2f}"


def main(paths):
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs = [(os.path.basename(p), load(p), idle_rss(p)) for p in paths]
    width = max(len(t[0]) for t in TARGETS) + 2
    print("per run: med / pair (* = not met on both); then the median of the runs' pair values")
    print(" " * width + "  ".join(f"{'run ' + str(i + 1):>13}" for i in range(len(runs))) + "   median  met")
    all_met_runs = [True] * len(runs)
    for label, scenario, column, kind, ref, bound in TARGETS:
        cells, pairs, count = [], [], 0
        for i, (_, rows, _) in enumerate(runs):
            med, pair = evaluate(rows, scenario, column, kind, ref)
            ok = met(kind, med, bound) and met(kind, pair, bound)
            count += ok
            all_met_runs[i] &= ok
            if pair is not None:
                pairs.append(pair)
            cells.append(f"{fmt(kind, med)}/{fmt(kind, pair)}{'' if ok else '*'}")
        pooled = statistics.median(pairs) if pairs else None
        verdict = "yes" if met(kind, pooled, bound) else "NO"
        print(f"{label:<{width}}" + "  ".join(f"{c:>13}" for c in cells) + f"   {fmt(kind, pooled):>6}  {verdict} ({count}/{len(runs)} runs)")
    rss = [r for _, _, r in runs]
    cells = [f"{r / 1024:.1f}MiB" + ("" if r <= IDLE_RSS_BOUND_KIB else "*") if r else "-" for r in rss]
    known = [r for r in rss if r]
    for i, r in enumerate(rss):
        all_met_runs[i] &= r is not None and r <= IDLE_RSS_BOUND_KIB
    pooled = statistics.median(known) / 1024 if known else None
    print(f"{'idle RSS <= 16 MiB':<{width}}" + "  ".join(f"{c:>13}" for c in cells)
          + (f"   {pooled:5.1f}M  {'yes' if pooled <= 16 else 'NO'}" if pooled else ""))
    print()
    print("runs meeting every target: " + (", ".join(f"run {i + 1} ({runs[i][0]})" for i, ok in enumerate(all_met_runs) if ok) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
