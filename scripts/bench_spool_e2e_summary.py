"""Helpers for scripts/bench-spool-e2e.sh.

--kind commit|window: reads the node's /metrics on stdin and the load's JSON line, prints one JSON
line (commit: PUBACK rate and latency, records the spool holds; window: histogram quantiles).
--report: reads all JSON lines and prints Markdown tables of medians.
"""
import argparse
import json
import statistics
import sys


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def quantile(text, name, q):
    """Upper bound of the histogram bucket holding quantile q."""
    buckets = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    total = buckets[-1][1] if buckets else 0
    for le, count in buckets:
        if total and count >= q * total:
            return le
    return float("nan")


def collect(args):
    text = sys.stdin.read()
    load = json.load(open(args.load))
    if args.kind == "commit":
        held = metric(text, 'edge_spool_class_records{class="%s"}' % args.cls)
        print(json.dumps({"kind": "commit", "durability": load["label"], "acked": load["acked"],
                          "acked_rate": load["acked_rate"], "held": held,
                          "p50_us": load["puback_p50_us"], "p99_us": load["puback_p99_us"]}))
    else:
        name = "edge_spool_puback_to_commit_seconds"
        print(json.dumps({"kind": "window", "acked": load["acked"], "count": metric(text, name + "_count"),
                          "p50_ms": quantile(text, name, 0.5) * 1000, "p99_ms": quantile(text, name, 0.99) * 1000}))


def report():
    runs = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
    med = statistics.median
    if any(x.get("kind") == "commit" for x in runs):
        print("| durability | PUBACKed msg/s | all PUBACKed held in spool | PUBACK p50 ms | PUBACK p99 ms |")
        print("|---|---|---|---|---|")
        for d in ("normal", "full"):
            r = [x for x in runs if x.get("kind") == "commit" and x["durability"] == d]
            ok = all(x["held"] == x["acked"] for x in r)
            print(f"| {d} | {med(x['acked_rate'] for x in r):.0f} | {'yes' if ok else 'NO'} "
                  f"| {med(x['p50_us'] for x in r) / 1000:.2f} | {med(x['p99_us'] for x in r) / 1000:.2f} |")
        print()
    w = [x for x in runs if x.get("kind") == "window"]
    if w:
        print("| PUBACK-to-commit window at 5,000 msg/s | p50 ms (bucket bound) | p99 ms (bucket bound) |")
        print("|---|---|---|")
        print(f"| normal | {med(x['p50_ms'] for x in w):.2f} | {med(x['p99_ms'] for x in w):.2f} |")
        print()
    base = [x for x in runs if x.get("label") == "local-edge-direct"]
    b99 = med(x["p99_us"] for x in base) / 1000
    variants = [("telemetry central (spooled)", "local-central"),
                ("telemetry central, writer held at nice 10", "local-central-nice10")]
    variants = [(name, [x for x in runs if x.get("label") == label]) for name, label in variants]
    variants = [(name, r) for name, r in variants if r]
    print("| local QoS1 1,000 msg/s + 5,000 msg/s telemetry | p50 ms | p99 ms | lost |")
    print("|---|---|---|---|")
    for name, r in [("telemetry edge-direct (no spool)", base)] + variants:
        print(f"| {name} | {med(x['p50_us'] for x in r) / 1000:.2f} | {med(x['p99_us'] for x in r) / 1000:.2f} "
              f"| {sum(x['lost'] for x in r)} |")
    print()
    for name, spooled in variants:
        s99 = med(x["p99_us"] for x in spooled) / 1000
        ratios = [s["p99_us"] / b["p99_us"] for b, s in zip(base, spooled) if b["p99_us"]]
        print(f"p99 ratio {name} / not spooled: {s99 / b99:.2f} (median of medians); per repeat: "
              + ", ".join(f"{x:.2f}" for x in ratios))

p = argparse.ArgumentParser()
p.add_argument("--load")
p.add_argument("--class", dest="cls")
p.add_argument("--kind")
p.add_argument("--report", action="store_true")
a = p.parse_args()
report() if a.report else collect(a)
