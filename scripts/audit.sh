#!/usr/bin/env bash
# Checks Cargo.lock against the offline RustSec snapshot in ../shared/advisory-db (no machine
# here can fetch the live database). Accepted warnings and their reasons: .cargo/audit.toml.
# cargo-audit is built once per machine and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
db="${ADVISORY_DB:-../shared/advisory-db}"
[ -d "$db" ] || { echo "advisory database not found at $db" >&2; exit 1; }
if ! cargo audit --version >/dev/null 2>&1; then
  echo "building cargo-audit (once per machine)" >&2
  cargo install cargo-audit --locked --quiet
fi
# cargo-audit wants a writable copy (it takes a lock file inside the database directory).
work="target/advisory-db"
rm -rf "$work"
mkdir -p target
cp -r "$db" "$work"
chmod -R u+w "$work"
for lock in Cargo.lock shared/fuzz/Cargo.lock edge-node/fuzz/Cargo.lock; do
  echo "$lock"
  cargo audit --db "$work" --no-fetch --stale --deny warnings --file "$lock"
done
