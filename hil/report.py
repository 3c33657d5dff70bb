"""Renders the HIL scenarios' JSON lines as a Markdown report (hil/run.sh)."""
import json
import sys

path, profile, qemu = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [json.loads(line) for line in open(path) if line.strip()]


def ms(v):
    return "-" if v is None else f"{v:.1f}"


print(f"# HIL report: {path.rsplit('/', 1)[-1].removesuffix('.jsonl')}\n")
print(f"aarch64 edge-node ({profile} profile) under {qemu}, x86 cloud-bridge, nats-server JetStream,")
print("link through the UDP relay. Latency is publish-to-deliver of local QoS1 inference results,")
print("measured under emulation: a figure against the 50 ms line, not an assertion.\n")
print("| scenario | scale | inference sent / received | p50 ms | p99 ms | p99 during fault ms | under 50 ms | telemetry acked | stored | missing | duplicates | notes |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
skip = {"scenario", "scale", "inference_sent", "inference_received", "p50_ms", "p99_ms", "p99_during_fault_ms",
        "telemetry_acked", "telemetry_stored", "missing", "duplicates", "received_during_fault"}
for r in rows:
    worst = max([v for v in (r.get("p99_ms"), r.get("p99_during_fault_ms")) if v is not None], default=None)
    under = "-" if worst is None else ("yes" if worst < 50 else "no")
    notes = ", ".join(f"{k}={v}" for k, v in r.items() if k not in skip)
    print(f"| {r['scenario']} | {r['scale']} | {r.get('inference_sent')} / {r.get('inference_received')} | "
          f"{ms(r.get('p50_ms'))} | {ms(r.get('p99_ms'))} | {ms(r.get('p99_during_fault_ms'))} | {under} | "
          f"{r.get('telemetry_acked')} | {r.get('telemetry_stored')} | {r.get('missing')} | {r.get('duplicates')} | {notes} |")
