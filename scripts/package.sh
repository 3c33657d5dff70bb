#!/usr/bin/env bash
# Device images of PACKAGE for TARGET: a .deb (binary, default config, certificate directory,
# hardened systemd unit, its own system user) and an OCI image archive (binary, config, CA
# bundle and the shared libraries the binary needs; `docker load` / `podman load`), both in
# target/dist/. Prints a JSON line with the sizes.
# Usage: scripts/package.sh TARGET [PACKAGE=edge-node] [PROFILE=device]
#   TARGET: aarch64-unknown-linux-gnu | armv7-unknown-linux-gnueabihf | x86_64-unknown-linux-gnu
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: package.sh TARGET [PACKAGE] [PROFILE]}
package=${2:-edge-node}
profile=${3:-device}
case "$target" in
  aarch64-unknown-linux-gnu) arch=arm64 libdir=/usr/aarch64-linux-gnu/lib ;;
  armv7-unknown-linux-gnueabihf) arch=armhf libdir=/usr/arm-linux-gnueabihf/lib ;;
  x86_64-unknown-linux-gnu) arch=amd64 libdir=/lib/x86_64-linux-gnu ;;
  *) echo "unsupported target $target" >&2; exit 2 ;;
esac
case "$package" in
  edge-node) conf=edge.toml summary="Edge MQTT gateway with store-and-forward to a cloud bridge over QUIC" ;;
  cloud-bridge) conf=cloud.toml summary="Cloud side of the edge QUIC bridges: exactly-once into JetStream or SQLite" ;;
  *) echo "unsupported package $package" >&2; exit 2 ;;
esac
command -v readelf >/dev/null || { echo "readelf (binutils) is needed" >&2; exit 2; }
bin=$(scripts/cross-build.sh "$target" "$profile" "$package")
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
out=target/dist
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

install -D -m 0755 "$bin" "$stage/usr/bin/$package"
install -D -m 0644 "config/device/$conf" "$stage/etc/$package/$conf"
install -d -m 0750 "$stage/etc/$package/certs"
install -D -m 0644 "config/device/$package.service" "$stage/lib/systemd/system/$package.service"
install -D -m 0644 docs/DEVICE.md "$stage/usr/share/doc/$package/README.device.md"
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: $package
Version: $version
Architecture: $arch
Maintainer: edge-hybrid-bridge developers <dev@example.invalid>
Depends: libc6 (>= 2.34), adduser
Section: net
Priority: optional
Installed-Size: $(du -sk "$stage" | cut -f1)
Description: $summary
 Built for $target with the '$profile' profile. The service runs as its own system user with
 its state in /var/lib/$package; the configuration is /etc/$package/$conf.
CONTROL
echo "/etc/$package/$conf" > "$stage/DEBIAN/conffiles"
cat > "$stage/DEBIAN/postinst" <<POSTINST
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
  if ! getent passwd $package >/dev/null; then
    adduser --system --group --home /var/lib/$package --no-create-home $package >/dev/null
  fi
  # Keys in the certificate directory are readable by the service, not by other users.
  chgrp $package /etc/$package/certs
  chmod 0750 /etc/$package/certs
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
    systemctl enable $package.service >/dev/null || true
    systemctl restart $package.service >/dev/null || true
  fi
fi
POSTINST
cat > "$stage/DEBIAN/prerm" <<PRERM
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl stop $package.service >/dev/null || true
  if [ "\$1" = remove ]; then systemctl disable $package.service >/dev/null || true; fi
fi
PRERM
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm"
deb="$out/${package}_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
oci="$out/${package}_${version}_${arch}.oci.tar"
image=$(python3 scripts/oci_image.py --arch "$arch" --bin "$bin" --name "$package" --version "$version" \
  --config "config/device/$conf" --libdir "$libdir" --out "$oci")
python3 - "$bin" "$deb" "$oci" "$image" "$target" "$package" <<'PY'
import json, os, sys
binary, deb, oci, image, target, package = sys.argv[1:]
image = json.loads(image)
print(json.dumps({
    "package": package, "target": target,
    "binary": binary, "binary_bytes": os.path.getsize(binary),
    "deb": deb, "deb_bytes": os.path.getsize(deb),
    "oci": oci, "oci_bytes": os.path.getsize(oci), "oci_unpacked_bytes": image["unpacked_bytes"],
}))
PY
