#!/usr/bin/env bash
# The gateway footprint: edge-node's `device` build (what the images ship) with the OTLP
# exporter (the default) and without it (`--no-default-features`, for the smallest gateways):
# binary size and idle RSS, against Mosquitto's idle RSS in the same run. Each binary starts
# on config/edge.toml with free ports (probe on, spool open), its VmRSS read 3 s after it is
# ready; ROUNDS starts each, alternating. Usage: scripts/bench-footprint.sh [ROUNDS=3].
# Builds for the host; CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"
rounds=${1:-3}
target=${CARGO_TARGET_DIR:-target}
mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)

. scripts/bench-common.sh

cargo build --profile device --locked --quiet -p edge-node
cp "$target/device/edge-node" "$work/edge-node-otlp"
cargo build --profile device --locked --quiet -p edge-node --no-default-features
cp "$target/device/edge-node" "$work/edge-node-small"

rss_kb() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }
sed -e 's/^bind = "127.0.0.1:1883"/bind = "127.0.0.1:0"/' -e 's/^bind = "127.0.0.1:9464"/bind = "127.0.0.1:0"/' \
  -e 's/^level = "info"/level = "warn"/' config/edge.toml > "$work/edge.toml"

edge_rss() {
  local dir="$work/run-$RANDOM"
  mkdir -p "$dir"
  sed -e "s|^path = \"[^\"]*spool[^\"]*\"|path = \"$dir/spool.db\"|" "$work/edge.toml" > "$dir/edge.toml"
  # exec: `$!` is the node itself; stdout away from the `$(...)` that reads this function's.
  (cd "$dir" && exec "$1" run --config "$dir/edge.toml" --ready-file "$dir/ready.json" > /dev/null 2>> "$work/edge.log") &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 100); do [ -s "$dir/ready.json" ] && break; sleep 0.1; done
  [ -s "$dir/ready.json" ] || { echo "edge-node did not start:" >&2; tail -5 "$work/edge.log" >&2; exit 1; }
  sleep 3
  rss_kb "$pid"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}
mosquitto_rss() {
  local port; port=$(free_port)
  printf 'listener %s 127.0.0.1\nallow_anonymous true\n' "$port" > "$work/mosquitto.conf"
  "$mosquitto_bin" -c "$work/mosquitto.conf" > /dev/null 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  sleep 3
  rss_kb "$pid"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

with=(); without=(); mosq=()
for _ in $(seq "$rounds"); do
  with+=("$(edge_rss "$work/edge-node-otlp")")
  without+=("$(edge_rss "$work/edge-node-small")")
  mosq+=("$(mosquitto_rss)")
done
python3 - "$(stat -c %s "$work/edge-node-otlp")" "$(stat -c %s "$work/edge-node-small")" \
  "${with[*]}" "${without[*]}" "${mosq[*]}" <<'EOP'
import statistics, sys
size_with, size_without = int(sys.argv[1]), int(sys.argv[2])
with_, without, mosq = ([int(x) for x in a.split()] for a in sys.argv[3:6])
m = lambda xs: statistics.median(xs) / 1024
print("| build | binary | idle RSS, median (per start, kB) | RSS / Mosquitto |")
print("| --- | --- | --- | --- |")
for name, size, rss in (("device, with OTLP (default)", size_with, with_), ("device, --no-default-features", size_without, without)):
    print(f"| {name} | {size / 1e6:.1f} MB | {m(rss):.2f} MiB ({', '.join(map(str, rss))}) | {m(rss) / m(mosq):.2f} |")
print(f"| Mosquitto | - | {m(mosq):.2f} MiB ({', '.join(map(str, mosq))}) | 1.00 |")
EOP
