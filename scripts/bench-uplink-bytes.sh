#!/usr/bin/env bash
# Uplink bytes on the shared trace: replays ../shared/data/edge-trace-20k.jsonl (20,000
# messages, about 40 s) into an edge gateway at its own pace; inference results stay
# edge-direct, the cloud-bound rest (telemetry, pre-processing counters, feedback; 5,984
# messages) goes over QUIC through a UDP relay that counts every datagram into a cloud bridge.
# One run per uplink setting below; prints a Markdown table of the batch frames the edge wrote
# (head and compressed body) and of UDP payload bytes up (everything: QUIC handshake, acks,
# pings, dictionaries), each against the messages' topic plus payload bytes. Usage: scripts/bench-uplink-bytes.sh [SPEED=1]
set -euo pipefail
cd "$(dirname "$0")/.."
speed=${1:-1}
trace=../shared/data/edge-trace-20k.jsonl
cargo build --release --locked --quiet -p e2e-tests --bin trace-replay

echo "| uplink setting | messages | topic+payload bytes | batch frame bytes | ratio | UDP bytes up | ratio | bytes/msg | batches | with dict | UDP bytes down |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
run() {
  local label=$1; shift
  local args=()
  for kv in "$@"; do args+=(--uplink "$kv"); done
  local out
  out=$(target/release/trace-replay "$trace" --speed "$speed" "${args[@]}" 2>/dev/null | grep '^{')
  python3 - "$label" "$out" <<'PY'
import json, sys
label, r = sys.argv[1], json.loads(sys.argv[2])
frames = int(r['batch_frame_bytes'])
print(f"| {label} | {r['messages']:,} | {r['topic_payload_bytes']:,} | {frames:,} | "
      f"**{frames / r['topic_payload_bytes']:.3f}** | {r['udp_up_bytes']:,} | "
      f"**{r['up_ratio']:.3f}** | {r['up_bytes_per_msg']:.1f} | {r['batches']:.0f} | {r['dict_batches']:.0f} | "
      f"{r['udp_down_bytes']:,} |")
PY
}
run "defaults (linger 1s, 4 KiB dictionaries)"
run "linger 1s, no dictionaries" 'dict_size=0'
run "linger 100ms, 4 KiB dictionaries" 'linger="100ms"'
run "linger 100ms, no dictionaries" 'linger="100ms"' 'dict_size=0'
