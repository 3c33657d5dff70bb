#!/usr/bin/env bash
# The main job end to end on the embedded defaults. For now (the edge gateway is what exists):
# start edge-node with the example config on free loopback ports, exchange messages with real
# MQTT clients over MQTT 3.1.1 and 5, and print what the node measured. Later issues extend it
# with the cloud bridge and synthetic inference traffic.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"

echo "== building edge-node"
cargo build --locked --quiet -p edge-node
bin=target/debug/edge-node

work=$(mktemp -d)
edge_pid=""
cleanup() {
  [ -n "$edge_pid" ] && kill "$edge_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The example config, on free ports so the demo never collides with a running broker.
sed -e 's/^bind = "127.0.0.1:1883"/bind = "127.0.0.1:0"/' -e 's/^bind = "127.0.0.1:9464"/bind = "127.0.0.1:0"/' \
  config/edge.toml > "$work/edge.toml"
"$bin" check-config --config "$work/edge.toml" > /dev/null

RUST_LOG=warn "$bin" run --config "$work/edge.toml" --ready-file "$work/ready.json" 2> "$work/edge.log" &
edge_pid=$!
for _ in $(seq 100); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
[ -s "$work/ready.json" ] || { echo "edge-node did not start:"; cat "$work/edge.log"; exit 1; }
read -r mqtt http < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["mqtt"]["local"], d["http"])' "$work/ready.json")
port=${mqtt##*:}
echo "== edge-node running: MQTT on $mqtt, metrics on http://$http/metrics"

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

echo "== telemetry (class 'telemetry', route central): spooled for the cloud, not delivered locally"
for i in 1 2 3 4 5; do
  mosquitto_pub -h 127.0.0.1 -p "$port" -V mqttv5 -q 1 -t "telemetry/cam-0$i/metrics" \
    -D publish user-property trace-id "demo-$i" -m "{\"cpu\":0.$i,\"temp_c\":4$i}"
done
sleep 0.2
"$bin" spool stats --config "$work/edge.toml" | python3 scripts/spool_summary.py

sleep 1
echo "== what the node measured"
curl -s "http://$http/metrics" | python3 scripts/metrics_summary.py
echo "   /healthz: $(curl -s "http://$http/healthz")"
kill -TERM "$edge_pid"
wait "$edge_pid" && echo "== edge-node stopped cleanly on SIGTERM"
edge_pid=""
