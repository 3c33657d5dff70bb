#!/usr/bin/env bash
# Bytes a model version adds to the store: a 64 MiB file of random bytes (seeded), then a copy
# with about 5 % rewritten in three contiguous regions (as a fine-tune of a few layers does),
# both published with `cloud-bridge model publish` into a fresh directory store. Prints the
# new bytes of the second version against its size. Usage: scripts/bench-model-delta.sh [MIB=64]
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-64}
cargo build --release --locked --quiet -p cloud-bridge
bin=$(pwd)/target/release/cloud-bridge
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 - "$mib" <<'PY'
import random, sys
size = int(sys.argv[1]) << 20
rng = random.Random(4543)
v1 = bytearray(rng.randbytes(size))
v2 = bytearray(v1)
region = size // 60
for start in (size // 8, size // 2, size * 7 // 8):
    v2[start:start + region] = rng.randbytes(region)
open("v1.bin", "wb").write(v1)
open("v2.bin", "wb").write(v2)
PY
"$bin" model keygen --dir keys > /dev/null
printf '[server]\nbind = "127.0.0.1:0"\ncert = "x"\nkey = "x"\nclient_ca = "x"\n[sink]\nkind = "sqlite"\npath = "c.db"\n[models]\ndir = "models"\nsigning_key = "keys/model-signing.pk8"\n' > cloud.toml
"$bin" model publish --config cloud.toml --name m --version 1 v1.bin
out=$("$bin" model publish --config cloud.toml --name m --version 2 v2.bin)
echo "$out"
python3 - "$out" <<'PY'
import re, sys
size, new = re.search(r": (\d+) bytes in .* \((\d+) bytes\)", sys.argv[1]).groups()
print(f"new bytes for a 5 % change: {int(new):,} of {int(size):,} = {int(new) / int(size):.3f}")
PY
