#!/usr/bin/env bash
# Fuzzes the ehb/1 frame decoder and both session state machines (shared/fuzz: frames, session)
# and every MQTT client packet through the broker's codec and core (edge-node/fuzz: mqtt) with
# cargo fuzz (libFuzzer, AddressSanitizer): each target runs SECONDS (default 60), starting from
# its committed corpus in <crate>/fuzz/corpus/<target>, which keeps what the run found new
# (minimise it with `cargo fuzz cmin` before committing). A crash stops the run and leaves its
# input in <crate>/fuzz/artifacts/<target>/. cargo fuzz needs nightly compiler flags; on the stable
# toolchain RUSTC_BOOTSTRAP=1 allows them, for this build only, in its own target dir.
# Usage: scripts/fuzz.sh [SECONDS=60] [TARGET...]   (targets: frames, session, mqtt)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(frames session mqtt)
if ! cargo fuzz --version > /dev/null 2>&1; then
  cargo install --locked cargo-fuzz
fi
top=$PWD
for t in "${targets[@]}"; do
  case "$t" in mqtt) cd "$top/edge-node/fuzz" ;; *) cd "$top/shared/fuzz" ;; esac
  echo "== fuzz $t for ${secs}s"
  RUSTC_BOOTSTRAP=1 cargo fuzz run --target-dir ../../target/fuzz "$t" "corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 2>&1 |
    grep -E '^(#[0-9]+ *DONE|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)|SUMMARY|panicked|ERROR' || true
  if compgen -G "artifacts/$t/crash-*" > /dev/null; then
    echo "crash inputs in $PWD/artifacts/$t/" >&2
    exit 1
  fi
done
