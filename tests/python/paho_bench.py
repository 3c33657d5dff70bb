"""Local-latency load with paho-mqtt, what many users run: one QoS1 publisher at a fixed rate and
SUBS QoS1 subscribers (fan-out), 1 KiB payloads carrying a sequence number and a send time.
Prints one JSON line in mqtt-bench's format (scripts/bench-local.sh).

Usage: paho_bench.py HOST PORT RATE SECONDS LABEL [VERSION=5] [SUBS=1]"""
import json
import sys
import threading
import time

import paho.mqtt.client as mqtt

host, port, rate, seconds, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
version = mqtt.MQTTv5 if (sys.argv[6] if len(sys.argv) > 6 else "5") == "5" else mqtt.MQTTv311
subscribers = int(sys.argv[7]) if len(sys.argv) > 7 else 1
warmup = 1.0
topic = f"paho-bench/{time.monotonic_ns()}"
base = time.monotonic_ns()
latencies = []
seen = set()
duplicates = 0
lock = threading.Lock()
window = [None, None]


def on_message(client, userdata, msg):
    global duplicates
    now = time.monotonic_ns() - base
    seq = int.from_bytes(msg.payload[0:8], "big")
    sent = int.from_bytes(msg.payload[8:16], "big")
    with lock:
        if (userdata, seq) in seen:
            duplicates += 1
            return
        seen.add((userdata, seq))
        if sent >= warmup * 1e9:
            if window[0] is None:
                window[0] = time.monotonic()
            window[1] = time.monotonic()
            latencies.append((now - sent) // 1000)


def client(name):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-{base}", protocol=version)
    c.max_inflight_messages_set(100)
    c.max_queued_messages_set(0)
    c.connect(host, port, keepalive=30)
    return c


subs = []
for i in range(subscribers):
    sub = client(f"paho-sub{i}")
    sub.user_data_set(i)
    sub.on_message = on_message
    done = threading.Event()
    sub.on_subscribe = lambda *a, done=done: done.set()
    sub.loop_start()
    sub.subscribe(topic, qos=1)
    if not done.wait(5):
        sys.exit("no SUBACK")
    subs.append(sub)

pub = client("paho-pub")
pub.loop_start()
payload = bytearray(1024)
seq = 0
measured_sent = 0
start = time.monotonic()
total = warmup + seconds
while True:
    elapsed = time.monotonic() - start
    if elapsed >= total:
        break
    due = int(elapsed * rate)
    while seq < due:
        sent_at = time.monotonic_ns() - base
        payload[0:8] = seq.to_bytes(8, "big")
        payload[8:16] = sent_at.to_bytes(8, "big")
        pub.publish(topic, bytes(payload), qos=1)
        if sent_at >= warmup * 1e9:
            measured_sent += 1
        seq += 1
    time.sleep(0.0005)

deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    with lock:
        if len(seen) >= seq * subscribers:
            break
    time.sleep(0.05)
pub.loop_stop()
for sub in subs:
    sub.loop_stop()
lat = sorted(latencies)


def pct(q):
    return lat[min(int(len(lat) * q), len(lat) - 1)] if lat else 0


span = (window[1] - window[0]) if window[0] is not None else 0
print(
    json.dumps(
        {
            "label": label,
            "rate": rate,
            "payload": 1024,
            "subscribers": subscribers,
            "sent": measured_sent,
            "received": len(lat),
            "lost": max(measured_sent * subscribers - len(lat), 0),
            "received_total": len(seen),
            "sent_total": seq,
            "duplicates": duplicates,
            "p50_us": pct(0.5),
            "p99_us": pct(0.99),
            "max_us": lat[-1] if lat else 0,
            "achieved_rate": len(lat) / subscribers / span if span else 0.0,
            "generator": "paho",
        }
    )
)
