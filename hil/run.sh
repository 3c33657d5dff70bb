#!/usr/bin/env bash
# The full hardware-in-the-loop run: builds the edge-node for HIL_TARGET (default
# aarch64-unknown-linux-gnu; armv7-unknown-linux-gnueabihf too) in the device profile (the
# image users get), runs every scenario at the issue's lengths one after another (they share
# two cores with the emulator), and writes hil/reports/<date>.md from their JSON lines.
# Usage: hil/run.sh [PROFILE=device]     (about 15 minutes after the build)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-device}
# Before PATH changes below: build scripts that watch PATH would rebuild everything otherwise.
export HIL_TARGET=${HIL_TARGET:-aarch64-unknown-linux-gnu}
case "$HIL_TARGET" in
  aarch64-unknown-linux-gnu) qemu=qemu-aarch64 ;;
  armv7-unknown-linux-gnueabihf) qemu=qemu-arm ;;
  *) echo "HIL_TARGET=$HIL_TARGET: aarch64-unknown-linux-gnu or armv7-unknown-linux-gnueabihf" >&2; exit 2 ;;
esac
HIL_EDGE_BIN=$(scripts/cross-build.sh "$HIL_TARGET" "$profile" edge-node)
export PATH="$(scripts/install-test-deps.sh):$PATH"
export HIL_EDGE_BIN HIL_SCALE=full HIL_IMAGE_PROFILE="$profile"
stamp=$(date -u +%Y-%m-%dT%H%M)
export HIL_REPORT="$PWD/hil/reports/$stamp.jsonl"
status=0
cargo nextest run --locked -p hil --test-threads 1 --no-fail-fast || status=$?
python3 hil/report.py "$HIL_REPORT" "$profile" "$HIL_TARGET, $($qemu --version | head -1)" > "hil/reports/$stamp.md"
cat "hil/reports/$stamp.md"
exit $status
