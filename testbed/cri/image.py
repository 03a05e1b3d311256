"""An OCI image written offline (nothing can be pulled here): one layer holding the host's
static busybox (Debian's busybox-static) and the applets the tests call. containerd imports
the archive (`ctr images import`); the one image is the pod's pause image and the workload."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "sleep", "ls", "stat", "env", "cat", "ip")
DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp")
# The pause image's process: it holds the pod's namespaces and does nothing.
ENTRYPOINT = ["/bin/sleep", "2147483647"]

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def _layer() -> bytes:
    """The uncompressed layer tar, byte-for-byte the same on every run."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in DIRS:
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(entry)
        binary = BUSYBOX.read_bytes()
        entry = tarfile.TarInfo("bin/busybox")
        entry.size, entry.mode = len(binary), 0o755
        tar.addfile(entry, io.BytesIO(binary))
        for applet in APPLETS:
            entry = tarfile.TarInfo(f"bin/{applet}")
            entry.type, entry.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(entry)
    return out.getvalue()


class _Blobs:
    """Content-addressed blobs, as an OCI layout stores them."""

    def __init__(self) -> None:
        self.by_digest: dict[str, bytes] = {}

    def add(self, media_type: str, data: bytes) -> dict[str, Any]:
        """The descriptor of `data`, stored."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.by_digest[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_image_archive(reference: str, out: Path) -> None:
    """An OCI image layout in a tar at `out`, naming the image `reference`
    (e.g. localhost/rdmad-test:busybox) as containerd's importer reads it."""
    layer = _layer()
    blobs = _Blobs()
    layer_desc = blobs.add(LAYER, gzip.compress(layer, compresslevel=1, mtime=0))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ENTRYPOINT, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": blobs.add(CONFIG, json.dumps(config).encode()),
        "layers": [layer_desc],
    }
    manifest_desc = blobs.add(MANIFEST, json.dumps(manifest).encode())
    manifest_desc["annotations"] = {
        "io.containerd.image.name": reference,
        "org.opencontainers.image.ref.name": reference.rpartition(":")[2],
    }
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"}
    index["manifests"] = [manifest_desc]
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
        **{f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.by_digest.items()},
    }
    with tarfile.open(out, "w") as tar:
        for name, data in files.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
