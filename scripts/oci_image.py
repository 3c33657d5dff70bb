"""Builds a minimal container image archive without a container daemon.

The archive holds one layer (the binary, its config, a CA bundle, and the shared libraries the
binary needs, found by walking its ELF NEEDED entries in a library directory) and is both an
OCI image layout (oci-layout, index.json, blobs/) and a `docker save` archive (manifest.json
pointing at the same blobs), so `docker load` and `podman load` both take it. Everything in
it is deterministic: sorted entries, zero mtimes, root-owned files.

Usage: oci_image.py --arch ARCH --bin BIN --name NAME --version V --config FILE --libdir DIR
                    --out ARCHIVE
"""

import argparse
import os
import gzip
import hashlib
import io
import json
import subprocess
import tarfile

NONROOT = 65532

# Debian architecture -> (OCI architecture, variant, multiarch triplet)
ARCHES = {
    "arm64": ("arm64", None, "aarch64-linux-gnu"),
    "armhf": ("arm", "v7", "arm-linux-gnueabihf"),
    "amd64": ("amd64", None, "x86_64-linux-gnu"),
}


def elf_needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def elf_interpreter(path):
    out = subprocess.run(["readelf", "-l", path], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "Requesting program interpreter:" in line:
            return line.split(":", 1)[1].strip().rstrip("]")
    return None


def libraries(binary, libdir):
    """The shared objects `binary` needs, transitively, as {name: host path}."""

    found, todo = {}, list(elf_needed(binary))
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = os.path.join(libdir, name)
        if not os.path.exists(path):
            raise SystemExit(f"{name} (needed by {binary}) is not in {libdir}")
        found[name] = os.path.realpath(path)
        todo.extend(elf_needed(found[name]))
    return found


class Layer:
    def __init__(self):
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)
        self.entries = []

    def add_dir(self, path, mode=0o755, uid=0):
        self.entries.append((path, None, mode, uid, None))

    def add_file(self, path, data, mode=0o644, uid=0):
        self.entries.append((path, data, mode, uid, None))

    def add_link(self, path, target):
        self.entries.append((path, None, 0o777, 0, target))

    def finish(self):
        for path, data, mode, uid, link in sorted(self.entries, key=lambda e: e[0]):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mode, info.uid, info.gid, info.mtime = mode, uid, uid, 0
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                self.tar.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                self.tar.addfile(info)
            else:
                info.size = len(data)
                self.tar.addfile(info, io.BytesIO(data))
        self.tar.close()
        return self.buf.getvalue()


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def main():
    p = argparse.ArgumentParser()
    for flag in ["--arch", "--bin", "--name", "--version", "--config", "--libdir", "--out"]:
        p.add_argument(flag, required=True)
    p.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    a = p.parse_args()
    oci_arch, variant, triplet = ARCHES[a.arch]
    name, conf_name = a.name, a.config.rsplit("/", 1)[-1]

    layer = Layer()
    dirs = {"/usr", "/usr/bin", "/etc", f"/etc/{name}", f"/etc/{name}/certs", "/etc/ssl", "/etc/ssl/certs",
            "/lib", f"/lib/{triplet}", "/var", "/var/lib"}
    layer.add_file(f"/usr/bin/{name}", open(a.bin, "rb").read(), 0o755)
    layer.add_file(f"/etc/{name}/{conf_name}", open(a.config, "rb").read())
    layer.add_file("/etc/ssl/certs/ca-certificates.crt", open(a.ca_bundle, "rb").read())
    # The service's user, for tools that look it up; the image runs as it.
    layer.add_file("/etc/passwd", f"root:x:0:0:root:/:/sbin/nologin\n{name}:x:{NONROOT}:{NONROOT}::/var/lib/{name}:/sbin/nologin\n".encode())
    layer.add_file("/etc/group", f"root:x:0:\n{name}:x:{NONROOT}:\n".encode())
    layer.add_file("/etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n")
    for lib, path in libraries(a.bin, a.libdir).items():
        layer.add_file(f"/lib/{triplet}/{lib}", open(path, "rb").read(), 0o755)
    interp = elf_interpreter(a.bin)
    if interp:
        base = interp.rsplit("/", 1)[-1]
        real = open(f"{a.libdir}/{base}", "rb").read()
        lib_path = f"/lib/{triplet}/{base}"
        layer.add_file(lib_path, real, 0o755)
        if interp != lib_path:
            parent = interp.rsplit("/", 1)[0]
            if parent not in dirs:
                dirs.add(parent)
            # Relative, so it resolves inside the image root wherever that is unpacked (an
            # absolute link followed on the build machine would reach its own loader).
            layer.add_link(interp, os.path.relpath(lib_path, parent))
    for d in sorted(dirs):
        layer.add_dir(d)
    layer.add_dir(f"/var/lib/{name}", 0o750, NONROOT)
    layer.add_dir("/tmp", 0o1777)
    raw = layer.finish()
    compressed = gzip.compress(raw, mtime=0)

    config = {
        "architecture": oci_arch,
        "os": "linux",
        "config": {
            "User": f"{NONROOT}:{NONROOT}",
            "Env": ["PATH=/usr/bin"],
            "Entrypoint": [f"/usr/bin/{name}"],
            "Cmd": ["run", "--config", f"/etc/{name}/{conf_name}"],
            "WorkingDir": f"/var/lib/{name}",
            "Volumes": {f"/var/lib/{name}": {}},
            "Labels": {"org.opencontainers.image.version": a.version, "org.opencontainers.image.title": name},
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{sha256(raw)}"]},
        "history": [{"created_by": "scripts/oci_image.py"}],
    }
    if variant:
        config["variant"] = variant
    config_bytes = json.dumps(config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": f"sha256:{sha256(config_bytes)}", "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": f"sha256:{sha256(compressed)}", "size": len(compressed)}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    tag = f"{name}:{a.version}-{a.arch}"
    platform = {"architecture": oci_arch, "os": "linux"}
    if variant:
        platform["variant"] = variant
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": f"sha256:{sha256(manifest_bytes)}",
            "size": len(manifest_bytes),
            "platform": platform,
            "annotations": {"io.containerd.image.name": f"docker.io/library/{tag}", "org.opencontainers.image.ref.name": tag},
        }],
    }
    docker_manifest = [{
        "Config": f"blobs/sha256/{sha256(config_bytes)}",
        "RepoTags": [tag],
        "Layers": [f"blobs/sha256/{sha256(compressed)}"],
    }]
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        "manifest.json": json.dumps(docker_manifest).encode(),
        f"blobs/sha256/{sha256(config_bytes)}": config_bytes,
        f"blobs/sha256/{sha256(manifest_bytes)}": manifest_bytes,
        f"blobs/sha256/{sha256(compressed)}": compressed,
    }
    with tarfile.open(a.out, "w", format=tarfile.PAX_FORMAT) as out:
        for d in ["blobs", "blobs/sha256"]:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            out.addfile(info)
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(files[path]), 0o644, 0
            out.addfile(info, io.BytesIO(files[path]))
    print(json.dumps({"archive": a.out, "tag": tag, "layer_bytes": len(compressed), "unpacked_bytes": len(raw)}))


if __name__ == "__main__":
    main()
