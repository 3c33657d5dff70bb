#!/usr/bin/env bash
# Fuzzes the ehb/1 frame decoder and both session state machines with cargo fuzz (libFuzzer,
# AddressSanitizer): each target runs SECONDS (default 60), starting from the committed corpus
# in shared/fuzz/corpus/<target>, which keeps what the run found new (minimise it with
# `cargo fuzz cmin` before committing). A crash stops the run and leaves its input in
# shared/fuzz/artifacts/<target>/. cargo fuzz needs nightly compiler flags; on the stable
# toolchain RUSTC_BOOTSTRAP=1 allows them, for this build only, in its own target dir.
# Usage: scripts/fuzz.sh [SECONDS=60] [TARGET...]   (targets: frames, session)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(frames session)
if ! cargo fuzz --version > /dev/null 2>&1; then
  cargo install --locked cargo-fuzz
fi
cd shared/fuzz
for t in "${targets[@]}"; do
  echo "== fuzz $t for ${secs}s"
  RUSTC_BOOTSTRAP=1 cargo fuzz run --target-dir ../../target/fuzz "$t" "corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 2>&1 |
    grep -E '^(#[0-9]+ *DONE|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)|SUMMARY|panicked|ERROR' || true
  if compgen -G "artifacts/$t/crash-*" > /dev/null; then
    echo "crash inputs in shared/fuzz/artifacts/$t/" >&2
    exit 1
  fi
done
