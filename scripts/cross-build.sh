#!/usr/bin/env bash
# Cross-builds a workspace binary for an ARM target with Debian's packages only (no rustup
# targets): Debian's rustc (/usr/bin/rustc, which ships an std per architecture as
# libstd-rust-web-dev:<arch>) and the cross gcc as linker and C compiler (bundled SQLite, zstd
# and ring compile with it). Installs what is missing. Each target gets its own target dir
# (Debian's rustc is another compiler than the host's, so it cannot share target/).
#
# Usage: scripts/cross-build.sh TARGET [PROFILE=device] [PACKAGE=edge-node]
#   TARGET: aarch64-unknown-linux-gnu | armv7-unknown-linux-gnueabihf | x86_64-unknown-linux-gnu
# Prints the binary's absolute path. CROSS_TARGET_DIR overrides where it builds (CI keeps one warm).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: cross-build.sh TARGET [PROFILE] [PACKAGE]}
profile=${2:-device}
package=${3:-edge-node}
case "$target" in
  aarch64-unknown-linux-gnu) arch=arm64 gnu=aarch64-linux-gnu qemu=qemu-aarch64 ;;
  armv7-unknown-linux-gnueabihf) arch=armhf gnu=arm-linux-gnueabihf qemu=qemu-arm ;;
  x86_64-unknown-linux-gnu) arch=amd64 gnu=x86_64-linux-gnu qemu= ;;
  *) echo "unsupported target $target" >&2; exit 2 ;;
esac
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=()
if [ "$arch" != amd64 ]; then
  dpkg --print-foreign-architectures | grep -qx "$arch" || { $SUDO dpkg --add-architecture "$arch"; $SUDO apt-get update -qq || true; }
  command -v "$gnu-gcc" >/dev/null || need+=("gcc-$gnu" "libc6-dev-$arch-cross")
  command -v "$qemu" >/dev/null || need+=(qemu-user)
  [ -d "/usr/lib/rustlib/$target" ] || need+=("libstd-rust-web-dev:$arch")
fi
[ -x /usr/bin/rustc ] || need+=(rustc-web)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}" >&2
  # A mirror mid-sync for one architecture must not stop the others; the install says what is missing.
  $SUDO apt-get update -qq >&2 || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >&2
fi
target_dir=${CROSS_TARGET_DIR:-target/cross}
env_target=$(echo "$target" | tr 'a-z-' 'A-Z_')
cc_target=$(echo "$target" | tr '-' '_')
# Cargo runs in a clean, fixed environment: build scripts that watch variables (cc-rs watches
# several, test runners set their own) would otherwise rebuild every dependency whenever the
# caller's environment differs (a venv first on PATH, a test runner, another clone).
cargo=$(command -v cargo)
vars=(HOME="$HOME" PATH="$(dirname "$cargo"):/usr/local/bin:/usr/bin:/bin" RUSTC=/usr/bin/rustc)
[ -n "${CARGO_HOME:-}" ] && vars+=(CARGO_HOME="$CARGO_HOME")
[ -n "${RUSTUP_HOME:-}" ] && vars+=(RUSTUP_HOME="$RUSTUP_HOME")
if [ "$arch" != amd64 ]; then
  vars+=("CARGO_TARGET_${env_target}_LINKER=$gnu-gcc" "CC_${cc_target}=$gnu-gcc" "AR_${cc_target}=$gnu-ar")
fi
env -i "${vars[@]}" "$cargo" build --locked --quiet --profile "$profile" --target "$target" \
  --target-dir "$target_dir" -p "$package" --bin "$package" >&2
echo "$(cd "$target_dir" && pwd)/$target/$profile/$package"
