"""Medians of spool-bench runs as Markdown table rows (scripts/bench-spool.sh)."""
import json
import statistics
import sys

runs = [json.loads(l) for l in sys.stdin if l.strip()]
for d in ("normal", "full"):
    r = [x for x in runs if x.get("durability") == d]
    rate = statistics.median(x["msg_per_s"] for x in r)
    p50 = statistics.median(x["commit_p50_us"] for x in r) / 1000
    p99 = statistics.median(x["commit_p99_us"] for x in r) / 1000
    print(f"| {d} | {r[0]['batch']} | {rate:.0f} | {p50:.2f} | {p99:.2f} |")
# The drain of the normal spool, as the uplink reads and acks it.
drains = [x for x in runs if "drain" in x]
if drains:
    rate = statistics.median(x["drain_msg_per_s"] for x in drains)
    cpu = statistics.median(x["drain_cpu_us_per_record"] for x in drains)
    print(f"| drain (read {drains[0]['batch']}, 8 ahead, acked) | {rate:.0f} msg/s | {cpu:.2f} us CPU per record |")
