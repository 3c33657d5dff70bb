#!/usr/bin/env bash
# Where an idle edge's memory on the bridge goes (issue 46): EDGES simulated edges (fleet-bench,
# JetStream sink) connect to a cloud-bridge built without mimalloc, so that heaptrack's preload
# sees its allocations, and stay idle SECONDS. Prints fleet-bench's idle line, then heaptrack's
# peak consumers, each with its bytes per edge and the frames that name its owner.
# Usage: scripts/bench-idle-heap.sh [EDGES=2000] [SECONDS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(scripts/install-test-deps.sh):$PATH"
edges=${1:-2000}
seconds=${2:-5}
. scripts/bench-common.sh
need heaptrack heaptrack
need zstd zstd

cargo build --release --locked --quiet -p e2e-tests --bin fleet-bench
cargo build --release --locked --quiet -p cloud-bridge --bin cloud-bridge --no-default-features
cp target/release/cloud-bridge "$work/cloud-bridge"
# The shipped build back in place for the other benches.
cargo build --release --locked --quiet -p cloud-bridge --bin cloud-bridge

# The bridge under heaptrack's preload, as `heaptrack` runs a program, but exec'd so that
# fleet-bench's pid is the bridge's.
cat > "$work/bridge.sh" <<EOF
#!/bin/sh
mkfifo "$work/fifo"
/usr/lib/heaptrack/libexec/heaptrack_interpret < "$work/fifo" | zstd -q -c > "$work/heap.zst" &
LD_PRELOAD=/usr/lib/heaptrack/libheaptrack_preload.so DUMP_HEAPTRACK_OUTPUT="$work/fifo" exec "$work/cloud-bridge" "\$@"
EOF
chmod +x "$work/bridge.sh"
BRIDGE_BIN="$work/bridge.sh" target/release/fleet-bench "$edges" 0 10 "$seconds" jetstream 0 500 8 2> /dev/null |
  grep '"idle"'
# The interpreter ends once the bridge is gone.
for _ in $(seq 100); do pgrep -f heaptrack_interpret > /dev/null || break; sleep 0.2; done
heaptrack_print -f "$work/heap.zst" --print-peaks 1 --print-allocators 0 --print-temporary 0 \
  --print-leaks 0 --peak-limit 30 --sub-peak-limit 1 2> /dev/null > "$work/peaks.txt"
python3 - "$work/peaks.txt" "$edges" <<'EOF'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
edges = int(sys.argv[2])
units = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}
# Frames that only allocate: the owner is the first frame after them.
plumbing = re.compile(r"^(alloc::|hashbrown::|core::|std::|tokio::runtime::|tokio::sync::mpsc::|_\$LT\$alloc|0x[0-9a-f]+$)")
for i, line in enumerate(lines):
    m = re.match(r"^([\d.]+)([KMG]?) peak memory consumed over (\d+) calls from", line)
    if not m:
        continue
    site = lines[i + 1].strip()
    owner = next((l.strip() for l in lines[i + 3:i + 40] if l.startswith("    ") and not l.strip().startswith("in ")
                  and not plumbing.match(l.strip())), "")
    per_edge = float(m.group(1)) * units[m.group(2)] / edges
    short = lambda f: re.sub(r"::h[0-9a-f]{16}$", "", f)[:90]
    print(f"{per_edge:8.0f} B/edge  {int(m.group(3)) / edges:6.1f} calls/edge  {short(site)}  <- {short(owner)}")
for line in lines:
    if line.startswith(("peak heap memory consumption", "peak RSS")):
        print(line)
EOF
