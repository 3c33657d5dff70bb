"""Medians of spool-bench runs as Markdown table rows (scripts/bench-spool.sh)."""
import json
import statistics
import sys

runs = [json.loads(l) for l in sys.stdin if l.strip()]
for d in ("normal", "full"):
    r = [x for x in runs if x["durability"] == d]
    rate = statistics.median(x["msg_per_s"] for x in r)
    p50 = statistics.median(x["commit_p50_us"] for x in r) / 1000
    p99 = statistics.median(x["commit_p99_us"] for x in r) / 1000
    print(f"| {d} | {r[0]['batch']} | {rate:.0f} | {p50:.2f} | {p99:.2f} |")
