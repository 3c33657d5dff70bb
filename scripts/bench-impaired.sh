#!/usr/bin/env bash
# Drain rate over a bad link, against an MQTT-over-TCP bridge on the same link: two network
# namespaces joined by scripts/tunlink.py (25 ms each way, so 50 ms RTT, and LOSS loss each
# way; this kernel has no netem), then
#  - ours: a spool backlog of COUNT 1 KiB telemetry messages on a release edge-node in A,
#    drained over QUIC into a release cloud-bridge and nats-server (JetStream) in B; timed from
#    the edge's start to the bridge's last commit;
#  - the peer: the same COUNT messages queued in Mosquitto A for its bridge to Mosquitto B
#    (QoS1, clean session off, defaults otherwise), timed from B's start to a QoS1 subscriber
#    on B having all of them.
# Background processes are started with `ip netns exec` itself (which execs them), so their
# pids are theirs and kill reaches them.
# Usage: sudo scripts/bench-impaired.sh [COUNT=20000] [LOSS=0.01] [REPEATS=1] [PAYLOAD=x|random]
# (`x`: 1,024 x, which compresses to almost nothing; `random`: 1,024 random letters, which
# zstd shrinks to about 0.6). Prints a Markdown row. Root (network namespaces, TUN).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/drain-configs.sh
export PATH="$(scripts/install-test-deps.sh):$PATH"
count=${1:-20000}
loss=${2:-0.01}
repeats=${3:-1}
payload=${4:-x}
cargo build --release --locked --quiet -p edge-node -p cloud-bridge -p e2e-tests --bin edge-node --bin cloud-bridge --bin drain-bench
bin=$PWD/target/release

work=$(mktemp -d)
A=ehbA$$
B=ehbB$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  sleep 0.5
  ip netns del "$A" 2> /dev/null || true
  ip netns del "$B" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
wait_file() { for _ in $(seq 300); do [ -s "$1" ] && return 0; sleep 0.1; done; echo "no $1" >&2; return 1; }
inA() { ip netns exec "$A" "$@"; }
inB() { ip netns exec "$B" "$@"; }
now() { date +%s.%N; }

python3 scripts/tunlink.py --a "$A" --b "$B" --delay-ms 25 --loss "$loss" --ready "$work/link" 2> "$work/link.log" &
pids+=($!)
wait_file "$work/link"
"$bin/cloud-bridge" certs init --dir "$work/certs" --edge edge-1 > /dev/null

for r in $(seq "$repeats"); do
  # --- ours
  mkdir -p "$work/nats-$r"
  ip netns exec "$B" nats-server -js -a 10.99.0.2 -p 4222 -sd "$work/nats-$r" > /dev/null 2>&1 &
  nats_pid=$!
  pids+=("$nats_pid")
  for _ in $(seq 100); do inB bash -c 'echo > /dev/tcp/10.99.0.2/4222' 2> /dev/null && break; sleep 0.1; done
  "$bin/drain-bench" fill "$work/spool-$r.db" "$count" "$payload" > /dev/null
  cloud_config "$work/cloud.toml" 10.99.0.2:4433 127.0.0.1:9464 nats://10.99.0.2:4222 "$work/certs"
  rm -f "$work/cloud.json"
  ip netns exec "$B" "$bin/cloud-bridge" run --config "$work/cloud.toml" --ready-file "$work/cloud.json" 2> "$work/cloud-$r.log" &
  cloud_pid=$!
  pids+=("$cloud_pid")
  wait_file "$work/cloud.json"
  edge_config "$work/edge.toml" "$work/spool-$r.db" 10.99.0.2:4433 "$work/certs"
  start=$(now)
  ip netns exec "$A" "$bin/edge-node" run --config "$work/edge.toml" --ready-file "$work/edge-$r.json" 2> "$work/edge-$r.log" &
  edge_pid=$!
  pids+=("$edge_pid")
  while :; do
    done_n=$(inB curl -s http://127.0.0.1:9464/metrics | awk '/^bridge_records_total /{print $2}' | head -1)
    [ "${done_n:-0}" = "$count" ] && break
    sleep 0.1
  done
  ours=$(python3 -c "import sys; print(round(int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2]))))" "$count" "$start" "$(now)")
  kill "$edge_pid" "$cloud_pid" "$nats_pid" 2> /dev/null || true
  wait "$edge_pid" "$cloud_pid" "$nats_pid" 2> /dev/null || true

  # --- the peer: Mosquitto A bridging to Mosquitto B
  cat > "$work/mosq-a.conf" << EOC
listener 1883 127.0.0.1
allow_anonymous true
max_queued_messages 0
connection cloud
address 10.99.0.2:1883
topic telemetry/# out 1
cleansession false
clientid bench-edge-$r
restart_timeout 1 1
EOC
  printf 'listener 1883 10.99.0.2\nallow_anonymous true\nmax_queued_messages 0\nlog_type all\nlog_dest stderr\n' > "$work/mosq-b.conf"
  ip netns exec "$A" mosquitto -c "$work/mosq-a.conf" > "$work/mosq-a-$r.log" 2>&1 &
  ma=$!
  pids+=("$ma")
  for _ in $(seq 100); do inA bash -c 'echo > /dev/tcp/127.0.0.1/1883' 2> /dev/null && break; sleep 0.1; done
  # The backlog, queued while B is down.
  python3 -c "
import random, string, sys
n, kind = int(sys.argv[1]), sys.argv[2]
for _ in range(n):
    p = ''.join(random.choices(string.ascii_lowercase, k=1024)) if kind == 'random' else 'x' * 1024
    sys.stdout.write(p + '\n')
" "$count" "$payload" |
    inA mosquitto_pub -h 127.0.0.1 -t telemetry/cam-00/metrics -q 1 -l
  start=$(now)
  ip netns exec "$B" mosquitto -c "$work/mosq-b.conf" > "$work/mosq-b-$r.log" 2>&1 &
  mb=$!
  pids+=("$mb")
  for _ in $(seq 100); do inB bash -c 'echo > /dev/tcp/10.99.0.2/1883' 2> /dev/null && break; sleep 0.01; done
  # The subscriber is local to B and subscribes long before the bridge's next connect attempt
  # has crossed the link; its subscription is checked in B's log all the same.
  ip netns exec "$B" timeout 600 mosquitto_sub -h 10.99.0.2 -i bench-sub -t 'telemetry/#' -q 1 -C "$count" > "$work/sub-$r.out" &
  sub=$!
  for _ in $(seq 200); do grep -qs bench-sub "$work/mosq-b-$r.log" && break; sleep 0.01; done
  grep -qs bench-sub "$work/mosq-b-$r.log" || { echo "subscriber not seen by Mosquitto B" >&2; exit 1; }
  wait "$sub" || true
  got=$(wc -l < "$work/sub-$r.out")
  peer=$(python3 -c "import sys; print(round(int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2]))))" "$got" "$start" "$(now)")
  kill "$ma" "$mb" 2> /dev/null || true
  wait "$ma" "$mb" 2> /dev/null || true
  echo "{\"ours\": $ours, \"mosquitto_bridge\": $peer, \"peer_received\": $got}"
done | tee "$work/runs.jsonl" >&2
python3 - "$work/runs.jsonl" "$count" "$loss" "$payload" << 'EOP'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = statistics.median
ours, peer = med(r["ours"] for r in runs), med(r["mosquitto_bridge"] for r in runs)
print(f"| {int(sys.argv[2]):,} x 1 KiB ({sys.argv[4]}), 50 ms RTT, {float(sys.argv[3]):.0%} loss | {ours:,.0f} | {peer:,.0f} | {ours / peer:.2f} |")
EOP
