#!/usr/bin/env bash
# Cloud to edge (issue 31), release builds, REPEATS times each:
#  - down-bench: COUNT messages published in the cloud until a local QoS 1 subscriber on the
#    edge has them, at RATE a second (latency) and as fast as the publisher goes (throughput):
#    ours (`downlink::send` into JetStream, cloud-bridge, edge-node; and a plain NATS
#    publisher into the downlink's stream; and one `send --lines` of LINES messages, to the
#    connected edge and spread over 100 edges not connected) against a Mosquitto bridge
#    (`topic # in 1`) from a cloud Mosquitto to an edge Mosquitto, in the same run;
#  - fleet-bench's BROADCAST phase: one message to every one of EDGES simulated edges through
#    `downlink::send` (what `cloud-bridge send --all` runs): how long storing took, when every
#    edge had it, the bridge's CPU and RSS.
# Prints JSON lines. Usage: scripts/bench-downlink.sh [REPEATS=3] [COUNT=2000] [RATE=200] [EDGES=1000] [LINES=10000]
# BASELINE=DIR (a directory holding another build's edge-node, cloud-bridge and down-bench;
# down-bench runs the binaries beside it) alternates that build's down-bench runs with this
# one's, the order swapped each round, each line marked "build": "baseline" or "head".
# PUBLISH_COUNT (default 20000) is the count of the NATS publisher's run and the Mosquitto
# bridge's throughput run: COUNT's 2,000 go by in a fifth of a second, too short to tell
# builds apart on a shared host.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"
repeats=${1:-3}
count=${2:-2000}
rate=${3:-200}
edges=${4:-1000}
lines=${5:-10000}
export PUBLISH_COUNT=${PUBLISH_COUNT:-20000}
cargo build --release --locked --quiet -p edge-node -p cloud-bridge -p e2e-tests \
  --bin edge-node --bin cloud-bridge --bin down-bench --bin fleet-bench
down_bench() { # DIR NAME
  "$1/down-bench" "$count" "$rate" 256 "$lines" 2> /dev/null | sed "s/^{/{\"build\":\"$2\",/"
}
for round in $(seq "$repeats"); do
  if [[ -z "${BASELINE:-}" ]]; then
    target/release/down-bench "$count" "$rate" 256 "$lines" 2> /dev/null
  elif (( round % 2 )); then
    down_bench "$BASELINE" baseline; down_bench target/release head
  else
    down_bench target/release head; down_bench "$BASELINE" baseline
  fi
done
for _ in $(seq "$repeats"); do
  BROADCAST=1 target/release/fleet-bench "$edges" 0 10 3 jetstream 0 400 8 2> /dev/null | grep '"broadcast"'
done
