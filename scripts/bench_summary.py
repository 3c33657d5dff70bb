"""Medians of mqtt-bench runs as a Markdown table (scripts/bench-local.sh)."""
import json
import statistics
import sys

path, idle_kb, loaded_kb, repeats, seconds = sys.argv[1:6]
runs = [json.loads(l) for l in open(path) if l.strip()]
keys = sorted({(r["rate"], r["label"]) for r in runs}, key=lambda k: (k[0] == 0, k[0], k[1]))


def med(rate, label, field):
    return statistics.median(r[field] for r in runs if r["rate"] == rate and r["label"] == label)


print(f"{repeats} runs of {seconds} s each (after 1 s warm-up), medians; QoS1, 1 KiB, 1 pub + 1 sub, loopback.\n")
print("| rate (msg/s) | broker | p50 (ms) | p99 (ms) | max (ms) | lost | achieved (msg/s) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for rate, label in keys:
    lost = sum(r["lost"] + r["duplicates"] * 0 for r in runs if r["rate"] == rate and r["label"] == label)
    print(
        f"| {'max' if rate == 0 else rate} | {label} | {med(rate, label, 'p50_us') / 1000:.3f} | "
        f"{med(rate, label, 'p99_us') / 1000:.3f} | {med(rate, label, 'max_us') / 1000:.1f} | {lost} | "
        f"{med(rate, label, 'achieved_rate'):.0f} |"
    )
print()
for rate in sorted({r["rate"] for r in runs}, key=lambda x: (x == 0, x)):
    try:
        e99, m99 = med(rate, "edge-node", "p99_us"), med(rate, "mosquitto", "p99_us")
        e50, d50 = med(rate, "edge-node", "p50_us"), med(rate, "rumqttd-direct", "p50_us")
        et, mt = med(rate, "edge-node", "achieved_rate"), med(rate, "mosquitto", "achieved_rate")
    except statistics.StatisticsError:
        continue
    name = "max" if rate == 0 else f"{rate} msg/s"
    print(f"- {name}: edge-node p99 / Mosquitto p99 = {e99 / max(m99, 1):.2f}; "
          f"front adds {(e50 - d50) / 1000:.3f} ms at p50 over rumqttd alone; "
          f"throughput edge-node / Mosquitto = {et / max(mt, 1):.2f}")
print(f"- edge-node RSS: idle {int(idle_kb) / 1024:.1f} MiB, peak under load {int(loaded_kb) / 1024:.1f} MiB")
