"""Medians of scripts/bench-local.sh's runs as a Markdown table, with the ratios to Mosquitto."""
import json
import statistics
import sys

path, idle_kb, loaded_kb, repeats, seconds = sys.argv[1:6]
mosq_idle_kb = sys.argv[6] if len(sys.argv) > 6 else None
device_idle_kb = sys.argv[7].split() if len(sys.argv) > 7 else []
runs = [json.loads(l) for l in open(path) if l.strip()]


def case(r):
    return (r.get("generator", "rust"), r["rate"], r.get("subscribers", 1))


order = {"rust": 0, "paho": 1, "persistent": 2, "mqttjs-tcp": 3, "mqttjs-ws": 4}
cases = sorted({case(r) for r in runs}, key=lambda c: (order.get(c[0], 5), c[1] == 0, c[2], c[1]))


def med(c, label, field):
    return statistics.median(r[field] for r in runs if case(r) == c and r["label"] == label)


def cpu_us(c, label):
    """The broker's CPU time per delivered message (microseconds), median over rounds; None for
    runs recorded before the script measured it."""
    per = [
        r["broker_cpu_s"] * 1e6 / max(r.get("received_total", r["received"]), 1)
        for r in runs
        if case(r) == c and r["label"] == label and "broker_cpu_s" in r
    ]
    return statistics.median(per) if per else None


def per_message(c, label, field, scale=1.0):
    """A broker figure of the runs (`field`) per delivered message, median over rounds; None
    where no run recorded it."""
    per = [
        r[field] * scale / max(r.get("received_total", r["received"]), 1)
        for r in runs
        if case(r) == c and r["label"] == label and r.get(field) is not None
    ]
    return statistics.median(per) if per else None


def ratio(c, field, scale=1.0):
    e, m = per_message(c, "edge-node", field, scale), per_message(c, "mosquitto", field, scale)
    return None if e is None or m is None else (e, m)


def name(c):
    generator, rate, subs = c
    what = "max" if rate == 0 else f"{rate} msg/s"
    fan = f", 1 pub + {subs} subs" if subs > 1 else ""
    return f"{generator} {what}{fan}"


print(f"{repeats} rounds of {seconds} s each (after 1 s warm-up), brokers interleaved, medians; QoS1, 1 KiB, loopback.\n")
print("| case | broker | p50 (ms) | p99 (ms) | max (ms) | lost | achieved (msg/s) | broker CPU (µs/msg) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for c in cases:
    for label in ("edge-node", "mosquitto"):
        if not any(case(r) == c and r["label"] == label for r in runs):
            continue
        lost = sum(r["lost"] for r in runs if case(r) == c and r["label"] == label)
        print(
            f"| {name(c)} | {label} | {med(c, label, 'p50_us') / 1000:.3f} | {med(c, label, 'p99_us') / 1000:.3f} | "
            f"{med(c, label, 'max_us') / 1000:.1f} | {lost} | {med(c, label, 'achieved_rate'):.0f} | "
            f"{'-' if cpu_us(c, label) is None else f'{cpu_us(c, label):.1f}'} |"
        )
print()
for c in cases:
    try:
        e99, m99 = med(c, "edge-node", "p99_us"), med(c, "mosquitto", "p99_us")
        e50, m50 = med(c, "edge-node", "p50_us"), med(c, "mosquitto", "p50_us")
        et, mt = med(c, "edge-node", "achieved_rate"), med(c, "mosquitto", "achieved_rate")
    except statistics.StatisticsError:
        continue
    peer = "Mosquitto (persistence true)" if c[0] == "persistent" else "Mosquitto"
    line = f"- {name(c)}: p99 edge-node / {peer} = {e99 / max(m99, 1):.2f}, p50 {e50 / max(m50, 1):.2f}"
    ec, mc = cpu_us(c, "edge-node"), cpu_us(c, "mosquitto")
    if ec is not None and mc is not None:
        line += f"; CPU per message {ec / max(mc, 0.001):.2f}"
    parts = []
    for field, what, scale, unit in (
        ("broker_user_s", "user", 1e6, " µs"),
        ("broker_sys_s", "system", 1e6, " µs"),
        ("broker_switches", "context switches", 1.0, ""),
        ("broker_syscalls", "system calls", 1.0, ""),
    ):
        pair = ratio(c, field, scale)
        if pair:
            parts.append(f"{what} {pair[0]:.2f}{unit} against {pair[1]:.2f}{unit} ({pair[0] / max(pair[1], 1e-9):.2f}x)")
    if parts:
        line += "; per delivered message, " + ", ".join(parts)
    if c[1] == 0:
        line += f"; throughput edge-node / Mosquitto = {et / max(mt, 1):.2f}"
    if c[0] == "persistent":
        plain = ("rust", c[1], c[2])
        try:
            p99 = med(plain, "edge-node", "p99_us")
            line += f"; p99 edge-node persistent / edge-node clean = {e99 / max(p99, 1):.2f}"
        except statistics.StatisticsError:
            pass
    print(line)
mosq = f", Mosquitto idle {int(mosq_idle_kb) / 1024:.1f} MiB" if mosq_idle_kb else ""
print(f"- edge-node RSS (release build): idle {int(idle_kb) / 1024:.1f} MiB, peak under load {int(loaded_kb) / 1024:.1f} MiB{mosq}")
if device_idle_kb:
    kb = sorted(int(k) for k in device_idle_kb)
    print(
        f"- edge-node RSS, the `device` build the images ship: idle {statistics.median(kb) / 1024:.2f} MiB"
        f" (median of {len(kb)} starts, {kb[0]}-{kb[-1]} kB)"
    )
