#!/usr/bin/env bash
# Local QoS1 path: edge-node against Mosquitto (persistence off, set_tcp_nodelay true), both
# measured in one run by the same load generators, interleaved, REPEATS rounds of SECONDS each
# case (after 1 s of warm-up), medians:
#   - the Rust generator (mqtt-bench, rumqttc): 1 publisher and 1 subscriber at 1,000, 2,500 and
#     5,000 msg/s; 1 publisher and 10 subscribers at 1,000 msg/s (fan-out); unthrottled (max
#     sustained throughput);
#   - paho-mqtt (Python, what many users run): 1 publisher and 1 subscriber at 1,000 and 2,500
#     msg/s (paho itself is the bottleneck above that);
#   - paho with 1 publisher and 10 subscribers at 300 msg/s (fan-out);
#   - the Rust generator with a persistent-session subscriber (Clean Session 0) at 1,000 and
#     2,500 msg/s, against a second Mosquitto with `persistence true` (edge-node stores what it
#     queues for such a session, and acknowledges its publisher once stored);
#   - MQTT.js (tests/node, Node and the `mqtt` package, with its defaults: Nagle on) with one
#     connection that subscribes and publishes, over TCP and over WebSocket, at 1,000 msg/s
#     and unthrottled (100 in flight);
# all QoS1, 1 KiB payloads, loopback; each broker's CPU time over each case (per delivered
# message in the table); plus edge-node's RSS idle and under load, and idle for the
# `device` build the images ship (3 starts, 3 s after each is ready).
# Usage: scripts/bench-local.sh [REPEATS=3] [SECONDS=8]. Prints a Markdown table of medians.
# BENCH_CASES (";"-separated "generator rate subscribers") picks cases.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"
repeats=${1:-3}
seconds=${2:-8}

. scripts/bench-common.sh
need node nodejs npm
need npm nodejs npm
# perf counts each broker's context switches and system calls over a case: steady figures beside
# its CPU time, which moves with the host's load.
need perf linux-perf
[ -d tests/node/node_modules/mqtt ] || (cd tests/node && npm ci --no-audit --no-fund --silent >&2)
cargo build --release --locked --quiet -p edge-node -p e2e-tests --bin edge-node --bin mqtt-bench
cargo build --profile device --locked --quiet -p edge-node
bin=target/release
mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)

rss_kb() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }
# utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/PID/stat; the command
# name before them is in parentheses and may hold spaces).
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12, $13}'; }
clk_tck=$(getconf CLK_TCK)

# edge-node with the example config (probe on, as in production) on free ports.
sed -e 's/^bind = "127.0.0.1:1883"/bind = "127.0.0.1:0"/' -e 's/^bind = "127.0.0.1:9464"/bind = "127.0.0.1:0"/' \
  -e 's/^level = "info"/level = "warn"/' config/edge.toml > "$work/edge.toml"
# A WebSocket listener beside the TCP one, for the MQTT.js cases.
python3 - "$work/edge.toml" <<'EOP'
import sys
path = sys.argv[1]
text = open(path).read()
local = 'name = "local"\nbind = "127.0.0.1:0"\nanonymous = true\n'
assert local in text, "config/edge.toml's local listener moved"
ws = '\n[[listener]]\nname = "ws"\nbind = "127.0.0.1:0"\nanonymous = true\nwebsocket = true\n'
open(path, "w").write(text.replace(local, local + ws, 1))
EOP
"$bin/edge-node" run --config "$work/edge.toml" --ready-file "$work/ready.json" 2> "$work/edge.log" &
edge_pid=$!; pids+=("$edge_pid")

mport=$(free_port)
wsport=$(free_port)
mosquitto_peer_conf "$mport" > "$work/mosquitto.conf"
cat >> "$work/mosquitto.conf" <<EOC
listener $wsport 127.0.0.1
protocol websockets
EOC
"$mosquitto_bin" -c "$work/mosquitto.conf" &
mosq_pid=$!; pids+=("$mosq_pid")
# The persistent-session peer: Mosquitto with its persistence on (it saves its state every
# autosave_interval, 30 min by default, and at a clean stop).
pport=$(free_port)
mkdir -p "$work/mosquitto-data"
sed -e "s/^listener $mport /listener $pport /" -e 's/^persistence false/persistence true/' -e "/^listener $wsport /,\$d" \
  "$work/mosquitto.conf" > "$work/mosquitto-persist.conf"
echo "persistence_location $work/mosquitto-data/" >> "$work/mosquitto-persist.conf"
"$mosquitto_bin" -c "$work/mosquitto-persist.conf" &
mosq_persist_pid=$!; pids+=("$mosq_persist_pid")

for _ in $(seq 100); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
eport=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mqtt"]["local"].rsplit(":",1)[1])' "$work/ready.json")
ewsport=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mqtt"]["ws"].rsplit(":",1)[1])' "$work/ready.json")
sleep 3
idle_rss=$(rss_kb "$edge_pid")
mosq_idle_rss=$(rss_kb "$mosq_pid")

( while kill -0 "$edge_pid" 2>/dev/null; do rss_kb "$edge_pid" >> "$work/rss"; sleep 0.2; done ) &
pids+=("$!")

brokers=("mosquitto:$mport" "edge-node:$eport")
# Each case: generator, rate (0 = unthrottled), subscribers.
cases=("rust 1000 1" "rust 2500 1" "rust 5000 1" "rust 1000 10" "rust 0 1" "paho 1000 1" "paho 2500 1"
  "paho 300 10" "persistent 1000 1" "persistent 2500 1" "mqttjs-tcp 1000 1" "mqttjs-tcp 0 1" "mqttjs-ws 1000 1"
  "mqttjs-ws 0 1")
# BENCH_CASES="rust 2500 1;persistent 2500 1" runs only those.
if [ -n "${BENCH_CASES:-}" ]; then IFS=';' read -r -a cases <<< "$BENCH_CASES"; fi
for r in $(seq "$repeats"); do
  for case in "${cases[@]}"; do
    read -r generator rate subs <<< "$case"
    # Alternate which broker goes first, round by round.
    for i in 0 1; do
      entry=${brokers[$(( (i + r) % 2 ))]}
      label=${entry%%:*} port=${entry##*:}
      broker_pid=$edge_pid
      [ "$label" = mosquitto ] && broker_pid=$mosq_pid
      if [ "$generator" = persistent ]; then
        [ "$label" = mosquitto ] && port=$pport broker_pid=$mosq_persist_pid
      fi
      read -r user0 sys0 <<< "$(cpu_ticks "$broker_pid")"
      perf stat -x, -e context-switches,raw_syscalls:sys_enter -p "$broker_pid" -o "$work/perf" 2> /dev/null &
      perf_pid=$!
      if [ "$generator" = persistent ]; then
        "$bin/mqtt-bench" --label "$label" --port "$port" --rate "$rate" --subscribers "$subs" --seconds "$seconds" --persistent 1 > "$work/line"
      elif [ "$generator" = rust ]; then
        "$bin/mqtt-bench" --label "$label" --port "$port" --rate "$rate" --subscribers "$subs" --seconds "$seconds" > "$work/line"
      elif [ "$generator" = mqttjs-tcp ]; then
        node tests/node/mqttjs_bench.js "mqtt://127.0.0.1:$port" "$rate" "$seconds" "$label" "$generator" > "$work/line"
      elif [ "$generator" = mqttjs-ws ]; then
        [ "$label" = mosquitto ] && port=$wsport || port=$ewsport
        node tests/node/mqttjs_bench.js "ws://127.0.0.1:$port/mqtt" "$rate" "$seconds" "$label" "$generator" > "$work/line"
      else
        python3 tests/python/paho_bench.py 127.0.0.1 "$port" "$rate" "$seconds" "$label" 5 "$subs" > "$work/line"
      fi
      # The broker's CPU time over the case (both its threads' user and system time): on two
      # shared cores what a broker spends is taken from the generator, so it shows in latency.
      read -r user1 sys1 <<< "$(cpu_ticks "$broker_pid")"
      kill -INT "$perf_pid" 2> /dev/null || true
      wait "$perf_pid" 2> /dev/null || true
      python3 scripts/bench_case.py "$work/line" "$generator" "$((user1 - user0))" "$((sys1 - sys0))" "$clk_tck" "$work/perf" \
        >> "$work/results.jsonl"
    done
  done
done
loaded_rss=$(sort -n "$work/rss" | tail -1)
kill "$edge_pid"
wait "$edge_pid" 2>/dev/null || true

device_rss=()
for _ in 1 2 3; do
  rm -f "$work/ready.json"
  target/device/edge-node run --config "$work/edge.toml" --ready-file "$work/ready.json" 2>> "$work/edge.log" &
  device_pid=$!
  for _ in $(seq 100); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
  sleep 3
  device_rss+=("$(rss_kb "$device_pid")")
  kill "$device_pid"
  wait "$device_pid" 2>/dev/null || true
done
python3 scripts/bench_summary.py "$work/results.jsonl" "$idle_rss" "$loaded_rss" "$repeats" "$seconds" "$mosq_idle_rss" "${device_rss[*]}"
