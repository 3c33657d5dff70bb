"""Unpacks the root filesystem of an OCI image archive (as scripts/oci_image.py writes, or any
single-platform OCI layout) into a directory, checking every blob's digest on the way, as a
container runtime would. Prints the image config as JSON.

Usage: oci_unpack.py ARCHIVE DIR
"""

import gzip
import hashlib
import io
import json
import sys
import tarfile


def main():
    archive, root = sys.argv[1], sys.argv[2]
    with tarfile.open(archive) as outer:
        def blob(digest):
            data = outer.extractfile("blobs/sha256/" + digest.split(":", 1)[1]).read()
            if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                raise SystemExit(f"blob {digest} does not match its digest")
            return data

        index = json.loads(outer.extractfile("index.json").read())
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        for n, layer in enumerate(manifest["layers"]):
            raw = blob(layer["digest"])
            if layer["mediaType"].endswith("+gzip"):
                raw = gzip.decompress(raw)
            if "sha256:" + hashlib.sha256(raw).hexdigest() != config["rootfs"]["diff_ids"][n]:
                raise SystemExit(f"layer {n} does not match its diff_id")
            with tarfile.open(fileobj=io.BytesIO(raw)) as t:
                t.extractall(root, filter="tar" if hasattr(tarfile, "tar_filter") else None)
    print(json.dumps(config))


if __name__ == "__main__":
    main()
