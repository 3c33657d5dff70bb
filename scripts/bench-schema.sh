#!/usr/bin/env bash
# Schema validation (issue 32):
#   1. validation throughput per core, per kind (`schema-bench`: the shared trace's telemetry
#      readings as JSON, Avro and Protobuf, and its inference results as JSON, validated by the
#      shipped shared::schema on one thread), medians of REPEATS;
#   2. the local QoS1 path with validation: a cloud-bridge (SQLite sink, a development PKI)
#      where `cloud-bridge schema register` registers a JSON Schema, an edge-node that stages it
#      over the bridge and binds bench/json/# to it; mqtt-bench (1 publisher, 1 subscriber, QoS1,
#      ~1 KiB JSON payloads at RATE msg/s) on the bound topic, on an unbound topic of the same
#      edge-node with the same payloads, and on Mosquitto as the peer; interleaved, REPEATS
#      rounds of SECONDS each, medians.
#   3. other clients beside a flood of large bound publishes (issue 43, finding 11): a
#      publisher of FLOOD_BYTES JSON payloads (objects of small detections, what costs a
#      validator) at FLOOD msg/s on the bound topic (no subscriber),
#      and mqtt-bench at 1,000 msg/s on an unbound topic of the same broker, whose latency is
#      what the flood's validation costs everyone else; against the same flood on an unbound
#      topic of the same edge-node, and on Mosquitto (no validation there), interleaved,
#      REPEATS rounds of SECONDS, medians.
# EDGE_NODE_BIN runs another edge-node build (an earlier commit's, to compare).
# Usage: scripts/bench-schema.sh [REPEATS=3] [SECONDS=8] [RATE=2500] [FLOOD=100]
#        [FLOOD_BYTES=262144]. Prints Markdown tables.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"
repeats=${1:-3}
seconds=${2:-8}
rate=${3:-2500}
flood=${4:-100}
flood_bytes=${5:-262144}
cargo build --release --locked --quiet -p edge-node -p cloud-bridge -p e2e-tests \
  --bin edge-node --bin cloud-bridge --bin mqtt-bench --bin schema-bench
bin=target/release
mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
. scripts/bench-common.sh

for _ in $(seq "$repeats"); do
  "$bin/schema-bench" ../shared/data/edge-trace-20k.jsonl 2 >> "$work/throughput.jsonl"
done

"$bin/cloud-bridge" certs init --dir "$work/certs" --edge edge-1 > /dev/null
"$bin/cloud-bridge" model keygen --dir "$work/certs" > /dev/null
sed -e 's/^bind = "127.0.0.1:4433"/bind = "127.0.0.1:0"/' -e 's/^bind = "127.0.0.1:9465"/bind = "127.0.0.1:0"/' \
  -e "s|\"certs/|\"$work/certs/|" -e "s|^path = \"central.db\"|path = \"$work/central.db\"|" \
  -e 's/^level = "info"/level = "warn"/' config/cloud.toml > "$work/cloud.toml"
printf '\n[models]\ndir = "%s/model-store"\nsigning_key = "%s/certs/model-signing.pk8"\npoll = "500ms"\n' "$work" "$work" >> "$work/cloud.toml"
cat > "$work/bench.schema.json" <<'EOJ'
{"type": "object", "required": ["seq", "sent", "device", "cpu_pct"],
 "properties": {"seq": {"type": "integer", "minimum": 0}, "sent": {"type": "integer", "minimum": 0},
  "device": {"type": "string", "maxLength": 64}, "cpu_pct": {"type": "number", "minimum": 0, "maximum": 100},
  "pad": {"type": "string"}}}
EOJ
"$bin/cloud-bridge" schema register --config "$work/cloud.toml" --subject bench --kind json "$work/bench.schema.json" > /dev/null
"$bin/cloud-bridge" run --config "$work/cloud.toml" --ready-file "$work/cloud-ready.json" 2> "$work/cloud.log" &
pids+=("$!")
for _ in $(seq 100); do [ -s "$work/cloud-ready.json" ] && break; sleep 0.1; done
quic=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["quic"])' "$work/cloud-ready.json")

sed -e 's/^bind = "127.0.0.1:1883"/bind = "127.0.0.1:0"/' -e 's/^bind = "127.0.0.1:9464"/bind = "127.0.0.1:0"/' \
  -e 's/^level = "info"/level = "warn"/' -e "s|^path = \"spool/spool.db\"|path = \"$work/spool/spool.db\"|" \
  config/edge.toml > "$work/edge.toml"
cat >> "$work/edge.toml" <<EOC

[uplink]
server = "$quic"
server_name = "localhost"
ca = "$work/certs/fleet-ca.pem"
cert = "$work/certs/edge-edge-1.pem"
key = "$work/certs/edge-edge-1.key"

[models]
dir = "$work/models"
public_key = "$work/certs/model-signing.pub"

[[schema]]
topic = "bench/json/#"
subject = "bench"
mode = "enforce"
EOC
"${EDGE_NODE_BIN:-$bin/edge-node}" run --config "$work/edge.toml" --ready-file "$work/ready.json" 2> "$work/edge.log" &
edge_pid=$!; pids+=("$edge_pid")
for _ in $(seq 100); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
read -r eport http < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["mqtt"]["local"].rsplit(":",1)[1], d["http"])' "$work/ready.json")
for _ in $(seq 300); do
  staged=$(curl -s "http://$http/metrics" | sed -n 's/^edge_schema_staged_version{subject="bench"} //p')
  [ "${staged:-0}" != 0 ] && break; sleep 0.1
done
[ "${staged:-0}" != 0 ] || { echo "the schema was not staged"; cat "$work/edge.log"; exit 1; }

mport=$(free_port)
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\nmax_inflight_messages 100\nlog_dest none\n' "$mport" > "$work/mosquitto.conf"
"$mosquitto_bin" -c "$work/mosquitto.conf" &
pids+=("$!")
sleep 1

cases=("edge-node-bound:$eport:bench/json/r" "edge-node-unbound:$eport:bench/raw/r" "mosquitto:$mport:bench/json/r")
for r in $(seq "$repeats"); do
  for i in 0 1 2; do
    entry=${cases[$(( (i + r) % 3 ))]}
    IFS=: read -r label port topic <<< "$entry"
    "$bin/mqtt-bench" --label "$label" --port "$port" --rate "$rate" --seconds "$seconds" --json 1 --topic "$topic" >> "$work/latency.jsonl"
  done
done
checked=$(curl -s "http://$http/metrics" | sed -n 's/^edge_schema_checked_total{subject="bench",outcome="valid"} //p')

flooded=("edge-node:$eport:bench/json/flood" "edge-node-unbound:$eport:bench/raw/flood" "mosquitto:$mport:bench/json/flood")
for r in $(seq "$repeats"); do
  for i in 0 1 2; do
    IFS=: read -r label port ftopic <<< "${flooded[$(( (i + r) % 3 ))]}"
    "$bin/mqtt-bench" --label "flood" --port "$port" --rate "$flood" --seconds "$((seconds + 2))" --warmup 0 \
      --subscribers 0 --json 2 --payload "$flood_bytes" --topic "$ftopic" > /dev/null &
    flooder=$!
    sleep 1
    "$bin/mqtt-bench" --label "$label-flooded" --port "$port" --rate 1000 --seconds "$seconds" --topic bench/raw/other \
      >> "$work/flooded.jsonl"
    wait "$flooder"
  done
done
ahead=$(curl -s "http://$http/metrics" | sed -n 's/^edge_schema_validated_ahead_total //p')
python3 - "$work/throughput.jsonl" "$work/latency.jsonl" "$rate" "$checked" "$work/flooded.jsonl" "$flood" "$flood_bytes" "${ahead:-0}" <<'EOP'
import json, statistics, sys
tp = [json.loads(l) for l in open(sys.argv[1])]
print("| case | kind | avg payload bytes | validations/s per core | MB/s |")
print("|---|---|---|---|---|")
for key in dict.fromkeys((r["case"], r["kind"]) for r in tp):
    rows = [r for r in tp if (r["case"], r["kind"]) == key]
    print(f"| {key[0]} | {key[1]} | {rows[0]['avg_payload_bytes']:.0f} | "
          f"{statistics.median(r['validations_per_s'] for r in rows):,.0f} | "
          f"{statistics.median(r['mb_per_s'] for r in rows):.0f} |")
lat = [json.loads(l) for l in open(sys.argv[2])]
med = {}
print()
print(f"| broker, topic (QoS1, {sys.argv[3]} msg/s, JSON ~1 KiB) | p50 ms | p99 ms | lost | runs |")
print("|---|---|---|---|---|")
for label in ["edge-node-bound", "edge-node-unbound", "mosquitto"]:
    rows = [r for r in lat if r["label"] == label]
    p50 = statistics.median(r["p50_us"] for r in rows) / 1000
    p99 = statistics.median(r["p99_us"] for r in rows) / 1000
    med[label] = p99
    print(f"| {label} | {p50:.2f} | {p99:.2f} | {sum(r['lost'] for r in rows)} | {len(rows)} |")
print()
print(f"p99 with validation / without: **{med['edge-node-bound'] / med['edge-node-unbound']:.2f}**; "
      f"bound edge-node / Mosquitto: {med['edge-node-bound'] / med['mosquitto']:.2f}; "
      f"publishes validated: {float(sys.argv[4] or 0):,.0f}")
fl = [json.loads(l) for l in open(sys.argv[5])]
print()
print(f"| broker (unbound topic, QoS1, 1,000 msg/s, beside {sys.argv[6]} msg/s of {int(sys.argv[7]):,}-byte bound JSON) | p50 ms | p99 ms | lost | runs |")
print("|---|---|---|---|---|")
fmed = {}
for label in ["edge-node-flooded", "edge-node-unbound-flooded", "mosquitto-flooded"]:
    rows = [r for r in fl if r["label"] == label]
    p50 = statistics.median(r["p50_us"] for r in rows) / 1000
    fmed[label] = statistics.median(r["p99_us"] for r in rows) / 1000
    print(f"| {label} | {p50:.2f} | {fmed[label]:.2f} | {sum(r['lost'] for r in rows)} | {len(rows)} |")
print()
print(f"p99 beside the flood, validated / not: **{fmed['edge-node-flooded'] / fmed['edge-node-unbound-flooded']:.2f}**; "
      f"edge-node validating / Mosquitto: {fmed['edge-node-flooded'] / fmed['mosquitto-flooded']:.2f}; "
      f"validated ahead of the core's lock: {float(sys.argv[8] or 0):,.0f}")
EOP
