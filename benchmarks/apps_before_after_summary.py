"""Summarises benchmarks/apps_before_after.sh's lines: per app, the median over rounds of each build's
step_time_ms_median and peak_in_use_mb, and after/before ratios (below 1: the after build is faster)."""
import json
import statistics
import sys
from collections import defaultdict

times, peaks = defaultdict(list), defaultdict(list)
with open(sys.argv[1]) as lines:
    for text in lines:
        record = json.loads(text)
        side, app = record["label"].split()
        times[(app, side)].append(record["line"]["step_time_ms_median"])
        peaks[(app, side)].append(record["line"].get("peak_in_use_mb", float("nan")))

print("| app | before ms (rounds) | after ms (rounds) | after/before | peak MB before / after |")
print("|---|---|---|---|---|")
for app in sorted({app for app, _ in times}):
    before, after = times[(app, "before")], times[(app, "after")]
    b, a = statistics.median(before), statistics.median(after)
    runs = lambda values: ", ".join(f"{v:.0f}" for v in values)
    print(f"| {app} | {b:.1f} ({runs(before)}) | {a:.1f} ({runs(after)}) | {a / b:.3f} | "
          f"{statistics.median(peaks[(app, 'before')]):.0f} / {statistics.median(peaks[(app, 'after')]):.0f} |")
