#!/usr/bin/env bash
# The main job end to end on the embedded defaults: a cloud-bridge with its SQLite sink and a
# development PKI, an edge-node with the example config bridged to it over QUIC (mutual TLS),
# real MQTT clients (3.1.1 and 5) publishing inference results (delivered locally) and
# telemetry (spooled, then sent to the cloud exactly once), a model version published in the
# cloud and staged on the edge (then a fine-tune of it, as a delta), and what both ends
# measured.
# Everything on free loopback ports and in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"

echo "== building edge-node and cloud-bridge"
cargo build --locked --quiet -p edge-node -p cloud-bridge
bin=target/debug/edge-node
cloud=target/debug/cloud-bridge

work=$(mktemp -d)
edge_pid=""
cloud_pid=""
cleanup() {
  [ -n "$edge_pid" ] && kill "$edge_pid" 2>/dev/null || true
  [ -n "$cloud_pid" ] && kill "$cloud_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== cloud-bridge: a development fleet CA, certificates, the SQLite sink"
"$cloud" certs init --dir "$work/certs" --edge edge-1 | sed 's/^/   /'
sed -e 's/^bind = "127.0.0.1:4433"/bind = "127.0.0.1:0"/' -e 's/^bind = "127.0.0.1:9465"/bind = "127.0.0.1:0"/' \
  -e "s|\"certs/|\"$work/certs/|" -e "s|^path = \"central.db\"|path = \"$work/central.db\"|" \
  -e 's/^level = "info"/level = "warn"/' config/cloud.toml > "$work/cloud.toml"
"$cloud" model keygen --dir "$work/certs" | sed 's/^/   /'
cat >> "$work/cloud.toml" <<EOC

[models]
dir = "$work/model-store"
signing_key = "$work/certs/model-signing.pk8"
poll = "500ms"
EOC
"$cloud" run --config "$work/cloud.toml" --ready-file "$work/cloud-ready.json" 2> "$work/cloud.log" &
cloud_pid=$!
for _ in $(seq 100); do [ -s "$work/cloud-ready.json" ] && break; sleep 0.1; done
[ -s "$work/cloud-ready.json" ] || { echo "cloud-bridge did not start:"; cat "$work/cloud.log"; exit 1; }
read -r quic chttp < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["quic"], d["http"])' "$work/cloud-ready.json")
echo "   cloud-bridge running: QUIC on udp/$quic, metrics on http://$chttp/metrics"

echo "== a schema registered in the cloud for the edge's telemetry (JSON Schema; delivered to edges as a signed model)"
cat > "$work/telemetry.schema.json" <<'EOS'
{"type": "object", "required": ["cpu", "temp_c"],
 "properties": {"cpu": {"type": "number", "minimum": 0}, "temp_c": {"type": "number"}}}
EOS
"$cloud" schema register --config "$work/cloud.toml" --subject telemetry --kind json "$work/telemetry.schema.json" | sed 's/^/   /'

# The example config, on free ports so the demo never collides with a running broker.
sed -e 's/^bind = "127.0.0.1:1883"/bind = "127.0.0.1:0"/' -e 's/^bind = "127.0.0.1:9464"/bind = "127.0.0.1:0"/' \
  -e "s|^path = \"spool/spool.db\"|path = \"$work/spool/spool.db\"|" config/edge.toml > "$work/edge.toml"
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
follow = ["yolo-edge"]

# The cloud may publish to ops/# here, nothing else.
[[downlink]]
filter = "ops/#"
max_qos = 1

# Telemetry must match the registry's newest version of subject "telemetry".
[[schema]]
topic = "telemetry/+/metrics"
subject = "telemetry"
mode = "enforce"
EOC
"$bin" check-config --config "$work/edge.toml" > /dev/null

RUST_LOG=warn "$bin" run --config "$work/edge.toml" --ready-file "$work/ready.json" 2> "$work/edge.log" &
edge_pid=$!
for _ in $(seq 100); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
[ -s "$work/ready.json" ] || { echo "edge-node did not start:"; cat "$work/edge.log"; exit 1; }
read -r mqtt http < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["mqtt"]["local"], d["http"])' "$work/ready.json")
port=${mqtt##*:}
echo "== edge-node running: MQTT on $mqtt, metrics on http://$http/metrics"

for _ in $(seq 300); do
  staged=$(curl -s "http://$http/metrics" | sed -n 's/^edge_schema_staged_version{subject="telemetry"} //p')
  [ "${staged:-0}" != 0 ] && break; sleep 0.1
done
echo "   schema telemetry staged on the edge and in use for telemetry/+/metrics: version $staged"

echo "== a subscriber on inference/# and two publishers (MQTT 3.1.1 and 5), QoS1"
mosquitto_sub -h 127.0.0.1 -p "$port" -V mqttv5 -q 1 -t 'inference/#' -v -C 6 -W 15 > "$work/received" &
sub_pid=$!
sleep 0.5
for i in 1 2 3; do
  mosquitto_pub -h 127.0.0.1 -p "$port" -V mqttv311 -q 1 -t "inference/yolo-edge/v3.2.1/cam-0$i" \
    -m "{\"frame\":$i,\"detections\":[{\"cls\":\"person\",\"conf\":0.9}]}"
  mosquitto_pub -h 127.0.0.1 -p "$port" -V mqttv5 -q 1 -t "inference/ppe-detector/v1.4.0/cam-0$i" \
    -D publish user-property trace-id "demo-$i" -m "{\"frame\":$i,\"detections\":[]}"
done
wait "$sub_pid"
sed 's/^/   received: /' "$work/received"

echo "== telemetry (class 'telemetry', route central): spooled, sent to the cloud over QUIC, not delivered locally"
for i in 1 2 3 4 5; do
  mosquitto_pub -h 127.0.0.1 -p "$port" -V mqttv5 -q 1 -t "telemetry/cam-0$i/metrics" \
    -D publish user-property trace-id "demo-$i" -m "{\"cpu\":0.$i,\"temp_c\":4$i}"
done
echo "   a reading that does not match the schema, from an MQTT 5 client (paho):"
echo '["telemetry/cam-09/metrics", "{\"cpu\": \"high\", \"temp_c\": 41}"]' \
  | python3 tests/python/paho_publish_v5.py 127.0.0.1 "$port" 1 \
  | python3 -c 'import json, sys
code, reason = json.loads(sys.stdin.readline())
print(f"   refused: PUBACK reason code 0x{code:02x} (Payload format invalid), Reason String: {reason}")'
for _ in $(seq 100); do
  n=$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("select count(*) from records where topic like \"telemetry/%\"").fetchone()[0])' "$work/central.db" 2>/dev/null || echo 0)
  [ "$n" -ge 5 ] && break; sleep 0.1
done
python3 scripts/sink_summary.py "$work/central.db"
sleep 0.3
"$bin" spool stats --config "$work/edge.toml" | python3 scripts/spool_summary.py

echo "== a model published in the cloud: announced over the bridge, fetched, verified, staged, announced on MQTT"
mosquitto_sub -h 127.0.0.1 -p "$port" -q 1 -t 'models/yolo-edge/current' -v -C 2 -W 60 > "$work/models-seen" &
msub_pid=$!
head -c $((16 << 20)) /dev/urandom > "$work/yolo-v1.bin"
"$cloud" model publish --config "$work/cloud.toml" --name yolo-edge --version 1 "$work/yolo-v1.bin" | sed 's/^/   /'
for _ in $(seq 300); do [ -L "$work/models/yolo-edge/current" ] && break; sleep 0.1; done
# A fine-tune: 5 % of the file rewritten in one region; only the chunks around it travel.
cp "$work/yolo-v1.bin" "$work/yolo-v2.bin"
dd if=/dev/urandom of="$work/yolo-v2.bin" bs=64K count=13 seek=80 conv=notrunc status=none
"$cloud" model publish --config "$work/cloud.toml" --name yolo-edge --version 2 "$work/yolo-v2.bin" | sed 's/^/   /'
wait "$msub_pid" || true
sed 's/^/   retained on the edge: /' "$work/models-seen"
cmp -s "$work/yolo-v2.bin" "$work/models/yolo-edge/2" && echo "   staged file $work/models/yolo-edge/2 is byte-identical to what was published"
"$bin" models list --config "$work/edge.toml" | python3 -c 'import json, sys
for m in json.load(sys.stdin):
    print("   edge-node models list:", m["name"], "current", m["current"]["version"], "kept", m["versions"])'

echo "== a command from the cloud: stored in the sink, delivered to a local app, its reply back through the spool"
# The local app: answers one request on its response topic with its correlation data.
mosquitto_sub -h 127.0.0.1 -p "$port" -V mqttv5 -q 1 -t 'ops/#' -C 1 -W 30 -F '%R %D %p' | while read -r rt cd asked; do
  mosquitto_pub -h 127.0.0.1 -p "$port" -V mqttv5 -q 1 -t "$rt" -D publish correlation-data "$cd" \
    -m "edge-1 up $(cut -d' ' -f1 /proc/uptime) s (asked: $asked)"
done &
app_pid=$!
sleep 0.5
"$cloud" send --config "$work/cloud.toml" --edge edge-1 --topic ops/uptime --payload "how long up?" --wait 20s | sed 's/^/   /'
wait "$app_pid" || true
"$cloud" send --config "$work/cloud.toml" --edge edge-1 --topic admin/reboot --payload now | sed 's/^/   /'
for _ in $(seq 100); do
  "$cloud" downlink status --config "$work/cloud.toml" --edge edge-1 | grep "refused 1" > /dev/null && break; sleep 0.1
done
"$cloud" downlink status --config "$work/cloud.toml" --edge edge-1 | sed 's/^/   /'
# sed reads the whole listing: `head` would close the pipe early, and the CLI fails writing into it.
"$cloud" downlink refused --config "$work/cloud.toml" | sed -n "1s/^/   refused by the edge: /p"

sleep 1
echo "== what the node measured"
curl -s "http://$http/metrics" | python3 scripts/metrics_summary.py
echo "   /readyz: $(curl -s "http://$http/readyz" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["status"], "-", "; ".join(c["name"]+": "+c["detail"] for c in r["checks"]))')"
curl -s "http://$chttp/metrics" | python3 scripts/metrics_summary.py --cloud
kill -TERM "$edge_pid"
wait "$edge_pid" && echo "== edge-node stopped cleanly on SIGTERM"
edge_pid=""
kill -TERM "$cloud_pid"
wait "$cloud_pid" && echo "== cloud-bridge stopped cleanly on SIGTERM"
cloud_pid=""
chart=${TMPDIR:-/tmp}/edge-hybrid-tco.svg
echo "== the TCO model on the product brief's example (config/tco-brief.toml; chart: $chart)"
"$bin" tco report --config config/tco-brief.toml --svg "$chart" | sed 's/^/   /'
