#!/usr/bin/env bash
# Drain rate of a spool backlog (COUNT 1 KiB telemetry messages) from a release edge-node over
# QUIC into JetStream through a release cloud-bridge, against raw async-nats pipelined
# publishing of the same messages into a stream made the same way, in the same run (before and
# after each drain, each phase on a fresh nats-server). Loopback, no impairment. Usage: scripts/bench-drain.sh [COUNT=200000] [REPEATS=3]. Prints a Markdown row.
# TOPICS (default 16) spreads the backlog over that many topics; BATCHES (auto, fast, atomic,
# off) picks the bridge's JetStream batch publishing (the sink's `batches` key).
# SINK=kafka drains into a single-node Kafka 4.x broker (KRaft, started per round) instead, and
# the peer is `drain-bench kafka-raw`: one transactional rdkafka producer writing the same
# records, 1,024 to a transaction (the edge's batch), before and after the drain on the same broker.
# CRASH=1 leaves the filled spool as a power cut does (not closed cleanly), so the edge checks it at start.
# START_ONLY=1 measures only the edge's start to its first uplink commit (no drain, no peer);
# COLD=1 drops the page cache before each start (root), as a reboot does. EDGE_NODE=path runs
# another edge-node build (an A/B of the start), CLOUD_BRIDGE=path another cloud-bridge build.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/drain-configs.sh
export PATH="$(scripts/install-test-deps.sh):$PATH"
count=${1:-200000}
repeats=${2:-3}
cargo build --release --locked --quiet -p edge-node -p cloud-bridge -p e2e-tests --bin edge-node --bin cloud-bridge --bin drain-bench
bin=target/release

. scripts/bench-common.sh
wait_file() { for _ in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.1; done; echo "no $1" >&2; return 1; }

"$bin/cloud-bridge" certs init --dir "$work/certs" --edge edge-1 > /dev/null
# Each phase gets a fresh nats-server (same binary, same flags, its own store): on a shared
# one, the phase that runs second paid for the first's state (its million dedup ids, which the
# Go GC scans), 30-40 % more nats-server CPU for the same drain.
start_nats() {
  nport=$(free_port)
  mkdir -p "$work/nats-$1"
  nats-server -js -a 127.0.0.1 -p "$nport" -sd "$work/nats-$1" > /dev/null 2>&1 &
  nats_pid=$!; pids+=("$nats_pid")
  for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$nport") 2>/dev/null && break; sleep 0.1; done
}
# The peer runs before and after each drain and the drain is compared with the mean of the
# two: this host's speed drifts over minutes, and a peer run on one side only carried that
# drift into the ratio.
raw_run() {
  if [ "${SINK:-}" = kafka ]; then
    # The broker's and the peer's CPU seconds beside its rate, as the drain prints its own.
    local broker_before; broker_before=$(cpu "$broker_pid")
    local TIMEFORMAT='%U %S'
    { time "$bin/drain-bench" kafka-raw "$bootstrap" "$count" 2>&3 > "$work/raw.json"; } 3>&2 2> "$work/raw.time"
    echo "cpu s: raw producer $(awk '{printf "%.2f", $1 + $2}' "$work/raw.time"), kafka $(python3 -c 'import sys; print(f"{float(sys.argv[1]) - float(sys.argv[2]):.2f}")' "$(cpu "$broker_pid")" "$broker_before")" >&2
    cat "$work/raw.json"
    return
  fi
  start_nats "raw-$1"
  "$bin/drain-bench" raw "nats://127.0.0.1:$nport" "$count"
  kill "$nats_pid"; wait "$nats_pid" 2>/dev/null || true
}
# SINK=kafka: one broker a round (drain-bench kafka-broker prints its address and stops it on
# SIGTERM); `nats_pid` and `nport` stand for it below.
start_kafka() {
  "$bin/drain-bench" kafka-broker > "$work/kafka-$1.addr" 2> "$work/kafka-$1.log" &
  kafka_pid=$!; pids+=("$kafka_pid")
  for _ in $(seq 600); do [ -s "$work/kafka-$1.addr" ] && break; sleep 0.1; done
  bootstrap=$(head -1 "$work/kafka-$1.addr")
  [ -n "$bootstrap" ] || { echo "no Kafka broker: $(tail -5 "$work/kafka-$1.log")" >&2; exit 1; }
  broker_pid=$(pgrep -P "$kafka_pid" java | head -1)
}
# CPU seconds process $1 has used so far.
cpu() { awk -v t="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / t}' "/proc/$1/stat"; }
for r in $(seq "$repeats"); do
  if [ "${SINK:-}" = kafka ]; then
    start_kafka "$r"
    # A fresh JVM compiles its hot paths during the first run it serves: the first of the
    # phases on each broker took twice the broker CPU of the later ones (1.7-2.0 s against
    # 0.8-1.0 s for 100,000 records), and the drain that came second rode on that warm-up.
    # One discarded peer run first, so every measured phase meets a warm broker, as a
    # production cluster is.
    raw_run "$r-warm-up" > /dev/null
  fi
  [ -n "${START_ONLY:-}" ] || raw_before=$(raw_run "$r-before")
  if [ "${SINK:-}" = kafka ]; then
    nats_pid=$broker_pid; sink_url=$bootstrap
  else
    start_nats "drain-$r"; sink_url="nats://127.0.0.1:$nport"
  fi

  "$bin/drain-bench" fill "$work/spool-$r.db" "$count" x "${TOPICS:-16}" ${CRASH:+crash} > /dev/null
  if [ -n "${COLD:-}" ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
  cloud_config "$work/cloud-$r.toml" 127.0.0.1:0 127.0.0.1:0 "$sink_url" "$work/certs"
  "${CLOUD_BRIDGE:-$bin/cloud-bridge}" run --config "$work/cloud-$r.toml" --ready-file "$work/cloud-$r.json" 2> "$work/cloud-$r.log" &
  cloud_pid=$!; pids+=("$cloud_pid")
  wait_file "$work/cloud-$r.json"
  read -r quic chttp < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["quic"], d["http"])' "$work/cloud-$r.json")
  edge_config "$work/edge-$r.toml" "$work/spool-$r.db" "$quic" "$work/certs"
  sink_before=$(cpu "$nats_pid")
  start=$(date +%s.%N)
  "${EDGE_NODE:-$bin/edge-node}" run --config "$work/edge-$r.toml" --ready-file "$work/edge-$r.json" 2> "$work/edge-$r.log" &
  edge_pid=$!; pids+=("$edge_pid")
  # One kept-alive HTTP connection polled every 100 ms: a curl per poll cost a tenth of a core,
  # and a scrape every 20 ms a tenth of the bridge's runtime CPU (its process figures read from
  # /proc at each), both taken from the pipeline being measured. The rate is taken between the
  # first poll that saw records and the first that saw the last count before the end, so the
  # poll interval does not stretch the drain, nor a pause before its last records (it took a
  # whole linger, 1 s of a 2 s drain, until the edge timed its records from when it knew them).
  target=$count; [ -z "${START_ONLY:-}" ] || target=1
  read -r first first_n last last_n < <(python3 - "$chttp" "$target" <<'EOP'
import http.client, sys, time
conn = http.client.HTTPConnection(sys.argv[1])
first = last = None
while True:
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    done = sum(int(float(l.split()[1])) for l in body.splitlines() if l.startswith("bridge_records_total "))
    now = time.time()
    if first is None and done > 0:
        first = (now, done)
    if done >= int(sys.argv[2]):
        break
    if done > 0 and (last is None or done > last[1]):
        last = (now, done)
    time.sleep(0.1)
if last is None or last[0] <= first[0]:
    last = (now, done)
print(f"{first[0]} {first[1]} {last[0]} {last[1]}")
EOP
  )
  end=$(date +%s.%N)
  # KEEP_METRICS=PREFIX keeps the bridge's /metrics after each drain as PREFIX-ROUND, the
  # edge's as PREFIX-ROUND-edge.
  if [ -n "${KEEP_METRICS:-}" ]; then
    curl -s "http://$chttp/metrics" > "$KEEP_METRICS-$r"
    ehttp=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["http"])' "$work/edge-$r.json")
    curl -s "http://$ehttp/metrics" > "$KEEP_METRICS-$r-edge"
  fi
  # CPU seconds each process used during the drain, to see who is busy.
  sink_during=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) - float(sys.argv[2]):.2f}")' "$(cpu "$nats_pid")" "$sink_before")
  echo "cpu s: edge-node $(cpu "$edge_pid"), cloud-bridge $(cpu "$cloud_pid"), ${SINK:-nats-server} $sink_during" >&2
  if [ -n "${START_ONLY:-}" ]; then
    python3 -c 'import sys; print(f"edge start to first commit: {float(sys.argv[1]) - float(sys.argv[2]):.2f} s")' "$first" "$start" >&2
    kill "$edge_pid" "$cloud_pid" "$nats_pid" 2>/dev/null || true
    wait "$edge_pid" "$cloud_pid" "$nats_pid" 2>/dev/null || true
    rm -f "$work/spool-$r.db"*
    continue
  fi
  drained=$(python3 - "$start" "$end" "$count" "$first" "$first_n" "$last" "$last_n" <<'EOP'
import json, sys
start, end, count = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
first, first_n = float(sys.argv[4]), int(sys.argv[5])
last, last_n = float(sys.argv[6]), int(sys.argv[7])
# From the first commit seen on: process start, the spool's integrity check and the QUIC
# handshake are not the drain; they are printed apart.
# A drain over within one poll has no two polls inside it: then up to the end, as before.
rate = (last_n - first_n) / (last - first) if last_n > first_n and last > first else (count - first_n) / max(end - first, 1e-3)
print(f"edge start to first commit: {first - start:.2f} s; first commit to the last record: {end - first:.2f} s", file=sys.stderr)
print(json.dumps({"bridge_msg_per_s": round(rate)}))
EOP
  )
  kill "$edge_pid" "$cloud_pid" 2>/dev/null || true
  [ "${SINK:-}" = kafka ] || kill "$nats_pid" 2>/dev/null || true
  wait "$edge_pid" "$cloud_pid" 2>/dev/null || true
  # KEEP_LOGS=PREFIX keeps both processes' logs as PREFIX-ROUND-edge.log and -cloud.log.
  if [ -n "${KEEP_LOGS:-}" ]; then
    cp "$work/edge-$r.log" "$KEEP_LOGS-$r-edge.log"
    cp "$work/cloud-$r.log" "$KEEP_LOGS-$r-cloud.log"
  fi
  raw_after=$(raw_run "$r-after")
  if [ "${SINK:-}" = kafka ]; then kill "$kafka_pid"; wait "$kafka_pid" 2>/dev/null || true; fi
  python3 - "$raw_before" "$raw_after" "$drained" <<'EOP'
import json, sys
before, after, drained = (json.loads(a) for a in sys.argv[1:4])
raw = (before["raw_msg_per_s"] + after["raw_msg_per_s"]) / 2
print(f"raw before {before['raw_msg_per_s']:.0f}, after {after['raw_msg_per_s']:.0f} msg/s", file=sys.stderr)
print(json.dumps({"bridge_msg_per_s": drained["bridge_msg_per_s"], "raw_msg_per_s": round(raw), "ratio": round(drained["bridge_msg_per_s"] / raw, 3)}))
EOP
done | tee "$work/runs.jsonl" >&2
[ -z "${START_ONLY:-}" ] || exit 0
python3 - "$work/runs.jsonl" "$count" <<'EOP'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = statistics.median
print(f"| {int(sys.argv[2]):,} x 1 KiB | {med(r['bridge_msg_per_s'] for r in runs):,.0f} | {med(r['raw_msg_per_s'] for r in runs):,.0f} | {med(r['ratio'] for r in runs):.2f} ({', '.join(str(r['ratio']) for r in runs)}) |")
EOP
