#!/usr/bin/env bash
# The gateway footprint: edge-node's `device` build (what the images ship) with its default
# features, without the OTLP exporter (`--no-default-features --features schema`), and without
# both the exporter and schema validation (`--no-default-features`, for the smallest gateways):
# binary size and idle RSS (and of it, anonymous memory), against Mosquitto's in the same run.
# Each binary starts on config/edge.toml with free ports (probe on, spool open), its memory
# read 3 s after it is ready; ROUNDS starts each, alternating. Usage:
# scripts/bench-footprint.sh [ROUNDS=3]. Builds for the host; CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"
rounds=${1:-3}
target=${CARGO_TARGET_DIR:-target}
mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)

. scripts/bench-common.sh

cargo build --profile device --locked --quiet -p edge-node
cp "$target/device/edge-node" "$work/edge-node-default"
cargo build --profile device --locked --quiet -p edge-node --no-default-features --features schema
cp "$target/device/edge-node" "$work/edge-node-no-otlp"
cargo build --profile device --locked --quiet -p edge-node --no-default-features
cp "$target/device/edge-node" "$work/edge-node-small"

# VmRSS and, of it, anonymous memory (heap, stacks, written data): the rest is the binary's and
# the libraries' pages from the page cache, which the kernel maps in folios around each fault.
rss_kb() { awk '/^VmRSS/{r=$2} /^RssAnon/{a=$2} END{print r "/" a}' "/proc/$1/status"; }
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

default=(); no_otlp=(); small=(); mosq=()
for _ in $(seq "$rounds"); do
  default+=("$(edge_rss "$work/edge-node-default")")
  no_otlp+=("$(edge_rss "$work/edge-node-no-otlp")")
  small+=("$(edge_rss "$work/edge-node-small")")
  mosq+=("$(mosquitto_rss)")
done
python3 - "$(stat -c %s "$work/edge-node-default")" "$(stat -c %s "$work/edge-node-no-otlp")" "$(stat -c %s "$work/edge-node-small")" \
  "${default[*]}" "${no_otlp[*]}" "${small[*]}" "${mosq[*]}" <<'EOP'
import statistics, sys
sizes = [int(x) for x in sys.argv[1:4]]
runs = [[tuple(int(v) for v in x.split("/")) for x in a.split()] for a in sys.argv[4:8]]
m = lambda xs: statistics.median(xs) / 1024
mosq_rss = m([r for r, _ in runs[3]])
print("| build | binary | idle RSS, median (per start, kB) | of it anonymous, median | RSS / Mosquitto |")
print("| --- | --- | --- | --- | --- |")
names = ("device, default features (OTLP, schema)", "device, `--no-default-features --features schema`", "device, `--no-default-features`")
for name, size, rs in zip(names, sizes, runs):
    rss = [r for r, _ in rs]
    print(f"| {name} | {size / 1e6:.1f} MB | {m(rss):.2f} MiB ({', '.join(map(str, rss))}) | {m([a for _, a in rs]):.2f} MiB | {m(rss) / mosq_rss:.2f} |")
print(f"| Mosquitto | - | {mosq_rss:.2f} MiB ({', '.join(str(r) for r, _ in runs[3])}) | {m([a for _, a in runs[3]]):.2f} MiB | 1.00 |")
EOP
