#!/usr/bin/env bash
# The spool end to end through MQTT, on a release edge-node (QoS1, 1 KiB payloads):
#  - commit rate per durability: 4 publishers on a `central` class as fast as PUBACKs return,
#    with PUBACK latency (for `full` the PUBACK waits for the commit) and a check that the spool
#    then holds every acknowledged message;
#  - the PUBACK-to-commit window of `normal` at 5,000 msg/s, from the node's histogram;
#  - local QoS1 p99 on an edge-direct topic at 1,000 msg/s while 5,000 msg/s go to a `central`
#    class, against the same run with that class routed edge-direct (no spool).
# Usage: scripts/bench-spool-e2e.sh [REPEATS=3] [SECONDS=6]. Prints Markdown tables of medians.
# ONLY=local runs only the local p99 comparison. PAIRED=1 adds, to each repeat of it, a spooled
# run with the spool writer held at nice 10 (`chrt -o`) instead of SCHED_IDLE, for a
# comparison in the same minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
seconds=${2:-6}
cargo build --release --locked --quiet -p edge-node -p e2e-tests --bin edge-node --bin mqtt-bench --bin spool-load
bin=target/release

work=$(mktemp -d)
edge_pid=
cleanup() {
  [ -n "$edge_pid" ] && kill "$edge_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# start_edge ROUTE: a fresh node and spool; `telemetry` takes ROUTE, `audit` is central/full.
start_edge() {
  rm -rf "$work/node"; mkdir -p "$work/node"
  cat > "$work/node/edge.toml" <<EOC
node_id = "bench-edge"
[log]
level = "warn"
[http]
bind = "127.0.0.1:0"
[[listener]]
name = "local"
bind = "127.0.0.1:0"
anonymous = true
[spool]
path = "$work/node/spool.db"
budget = "4 GiB"
[[class]]
name = "telemetry"
filters = ["telemetry/#"]
route = "$1"
priority = 3
[[class]]
name = "audit"
filters = ["audit/#"]
route = "central"
governance = "central-only"
priority = 0
EOC
  "$bin/edge-node" run --config "$work/node/edge.toml" --ready-file "$work/node/ready.json" 2> "$work/node/edge.log" &
  edge_pid=$!
  for _ in $(seq 100); do [ -s "$work/node/ready.json" ] && break; sleep 0.1; done
  [ -s "$work/node/ready.json" ] || { cat "$work/node/edge.log"; exit 1; }
  read -r port http < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["mqtt"]["local"].rsplit(":",1)[1], d["http"])' "$work/node/ready.json")
  sleep 1
}
stop_edge() { kill "$edge_pid"; wait "$edge_pid" 2>/dev/null || true; edge_pid=; }
metrics() { curl -s "http://$http/metrics"; }

{
  for r in $(seq "$repeats"); do
    for d in normal full; do
      [ "${ONLY:-}" = local ] && continue
      start_edge central
      topic=telemetry/bench; class=telemetry
      [ "$d" = full ] && { topic=audit/bench; class=audit; }
      "$bin/spool-load" --port "$port" --topic "$topic" --rate 0 --clients 4 --seconds "$seconds" --label "$d" > "$work/load.json"
      sleep 1
      metrics | python3 scripts/bench_spool_e2e_summary.py --load "$work/load.json" --class "$class" --kind commit
      stop_edge
    done

    if [ "${ONLY:-}" != local ]; then
      start_edge central
      "$bin/spool-load" --port "$port" --topic telemetry/bench --rate 5000 --clients 2 --seconds "$seconds" --label window > "$work/load.json"
      sleep 1
      metrics | python3 scripts/bench_spool_e2e_summary.py --load "$work/load.json" --class telemetry --kind window
      stop_edge
    fi

    variants="edge-direct central"
    [ -n "${PAIRED:-}" ] && variants="$variants central-nice10"
    for variant in $variants; do
      route=${variant%-nice10}
      start_edge "$route"
      if [ "$variant" = central-nice10 ]; then
        for t in /proc/"$edge_pid"/task/*; do
          [ "$(cat "$t/comm")" = spool-writer ] && chrt -o -p 0 "$(basename "$t")"
        done
      fi
      "$bin/spool-load" --port "$port" --topic telemetry/bench --rate 5000 --clients 2 --seconds $((seconds + 2)) --label bg > /dev/null &
      load_pid=$!
      sleep 1
      "$bin/mqtt-bench" --port "$port" --rate 1000 --seconds "$seconds" --warmup 0.5 --label "local-$variant"
      wait "$load_pid"
      stop_edge
    done
  done
} | tee "$work/runs.jsonl" >&2
python3 scripts/bench_spool_e2e_summary.py --report < "$work/runs.jsonl"
