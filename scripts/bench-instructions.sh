#!/usr/bin/env bash
# Instructions per delivered message on the local QoS1 path, edge-node against Mosquitto: both
# brokers run under valgrind's callgrind, which counts the instructions each executes in user
# space. Unlike CPU time on two shared cores, the count barely moves between runs, so a change
# of a few percent in the broker's own code shows. System time (the kernel's share) is not in
# it: scripts/bench-local.sh has each broker's user and system time and system calls.
#
# Each round and case, for each broker: the counters are zeroed, the broker idles SECONDS
# (edge-node's probe publishes and reads in the background, as in production), the counts
# are dumped; zeroed again, the case runs SECONDS, dumped again. A message's cost is the
# case's instructions less the idle rate over the case's wall time, over the messages
# delivered; the raw figure is printed beside it.
#
# Cases are slow on purpose (under callgrind a broker runs some 50 times slower): paho with
# 10 subscribers at 30 msg/s, the Rust generator with 10 subscribers at 100 msg/s and with one
# at 100 msg/s. Latencies under callgrind mean nothing and are not shown.
# Usage: scripts/bench-instructions.sh [ROUNDS=3] [SECONDS=10]. BENCH_CASES as in bench-local.sh;
# EDGE_NODE=path runs another edge-node build (an A/B against an older commit);
# CALLGRIND_KEEP=dir keeps the dumps (BROKER.out.N, idle and case alternating), for
# scripts/callgrind_top.py to say where the instructions go.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"
rounds=${1:-3}
seconds=${2:-10}

. scripts/bench-common.sh
need callgrind_control valgrind
cargo build --release --locked --quiet -p edge-node -p e2e-tests --bin edge-node --bin mqtt-bench
bin=target/release
mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
callgrind=(valgrind --tool=callgrind --compress-strings=no --compress-pos=no)

sed -e 's/^bind = "127.0.0.1:1883"/bind = "127.0.0.1:0"/' -e 's/^bind = "127.0.0.1:9464"/bind = "127.0.0.1:0"/' \
  -e 's/^level = "info"/level = "warn"/' config/edge.toml > "$work/edge.toml"
"${callgrind[@]}" --callgrind-out-file="$work/edge-node.out" "${EDGE_NODE:-$bin/edge-node}" run --config "$work/edge.toml" \
  --ready-file "$work/ready.json" 2> "$work/edge.log" &
edge_pid=$!; pids+=("$edge_pid")

mport=$(free_port)
# `user root`: Mosquitto started as root drops to the user `mosquitto`, and callgrind_control
# could then no longer reach it.
{ mosquitto_peer_conf "$mport"; echo "user $(id -un)"; } > "$work/mosquitto.conf"
"${callgrind[@]}" --callgrind-out-file="$work/mosquitto.out" "$mosquitto_bin" -c "$work/mosquitto.conf" 2> "$work/mosquitto.log" &
mosq_pid=$!; pids+=("$mosq_pid")

for _ in $(seq 600); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
[ -s "$work/ready.json" ] || { echo "edge-node did not start under callgrind" >&2; cat "$work/edge.log" >&2; exit 1; }
eport=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mqtt"]["local"].rsplit(":",1)[1])' "$work/ready.json")
sleep 5

# Zeroes the counters, runs the command (its output to OUT), dumps; prints the instructions
# and the wall seconds.
measure() {
  local label=$1 pid=$2 out=$3; shift 3
  # callgrind writes one file per dump, numbered from 1.
  local n; n=$(find "$work" -maxdepth 1 -name "$label.out.*" | wc -l)
  callgrind_control -z "$pid" > /dev/null 2>&1
  local t0; t0=$(date +%s.%N)
  "$@" > "$out"
  local t1; t1=$(date +%s.%N)
  callgrind_control -d "$pid" > /dev/null 2>&1
  local file=$work/$label.out.$((n + 1))
  for _ in $(seq 100); do grep -q '^summary:' "$file" 2> /dev/null && break; sleep 0.1; done
  echo "$(awk '/^summary:/{print $2}' "$file") $(python3 -c "print($t1 - $t0)")"
}

cases=("paho 30 10" "rust 100 10" "rust 100 1")
if [ -n "${BENCH_CASES:-}" ]; then IFS=';' read -r -a cases <<< "$BENCH_CASES"; fi
for r in $(seq "$rounds"); do
  for case in "${cases[@]}"; do
    read -r generator rate subs <<< "$case"
    for entry in "mosquitto:$mport:$mosq_pid" "edge-node:$eport:$edge_pid"; do
      IFS=: read -r label port pid <<< "$entry"
      read -r idle idle_s <<< "$(measure "$label" "$pid" /dev/null sleep "$seconds")"
      if [ "$generator" = rust ]; then
        run=("$bin/mqtt-bench" --label "$label" --port "$port" --rate "$rate" --subscribers "$subs" --seconds "$seconds")
      else
        run=(python3 tests/python/paho_bench.py 127.0.0.1 "$port" "$rate" "$seconds" "$label" 5 "$subs")
      fi
      read -r busy busy_s <<< "$(measure "$label" "$pid" "$work/line" "${run[@]}")"
      python3 - "$work/line" "$generator" "$idle" "$idle_s" "$busy" "$busy_s" >> "$work/results.jsonl" <<'EOP'
import json, sys
line, generator, idle, idle_s, busy, busy_s = sys.argv[1:7]
d = json.loads(open(line).read())
delivered = d["received_total"]
assert delivered > 0 and d["lost"] == 0, f"the case lost messages or delivered none: {d}"
idle_rate = int(idle) / float(idle_s)
d.update(generator=generator, instructions=int(busy), idle_per_s=idle_rate, delivered=delivered,
         raw_per_msg=int(busy) / delivered,
         net_per_msg=(int(busy) - idle_rate * float(busy_s)) / delivered)
print(json.dumps(d))
EOP
    done
  done
done

if [ -n "${CALLGRIND_KEEP:-}" ]; then mkdir -p "$CALLGRIND_KEEP" && cp "$work"/*.out.* "$CALLGRIND_KEEP"/; fi

python3 - "$work/results.jsonl" "$rounds" <<'EOP'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{sys.argv[2]} rounds; instructions per delivered message (callgrind, user space), medians.\n")
print("| case | broker | net of idle | raw | idle (per s) | rounds (net) |")
print("| --- | --- | --- | --- | --- | --- |")
cases = []
for r in rows:
    key = (r["generator"], r["rate"], r["subscribers"])
    if key not in cases:
        cases.append(key)
summary = []
for key in cases:
    med = {}
    for broker in ["edge-node", "mosquitto"]:
        rs = [r for r in rows if (r["generator"], r["rate"], r["subscribers"]) == key and r["label"] == broker]
        net = statistics.median(r["net_per_msg"] for r in rs)
        raw = statistics.median(r["raw_per_msg"] for r in rs)
        idle = statistics.median(r["idle_per_s"] for r in rs)
        med[broker] = net
        each = ", ".join(f"{r['net_per_msg']:,.0f}" for r in rs)
        print(f"| {key[0]} {key[1]} msg/s, {key[2]} sub(s) | {broker} | {net:,.0f} | {raw:,.0f} | {idle:,.0f} | {each} |")
    summary.append(f"- {key[0]} {key[1]} msg/s, {key[2]} sub(s): edge-node / Mosquitto = {med['edge-node'] / med['mosquitto']:.2f}")
print()
print("\n".join(summary))
EOP
