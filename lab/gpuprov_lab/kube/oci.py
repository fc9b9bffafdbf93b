"""OCI images of real binaries, built without a container engine or a registry.

An image here is one layer of files (the vendor's binaries, the Debian libraries they load) and a
config (entrypoint, environment), written the way the OCI image spec lays them out: a gzip'd tar
layer, a config whose rootfs.diff_ids names the uncompressed layer, and a manifest naming both by
digest. The same inputs give the same bytes (sorted entries, fixed times and owners, gzip without a
timestamp), so an image is rebuilt and pushed again only when what it carries changes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# Every entry in a layer carries this mtime (2025-01-01T00:00:00Z), as the lab's packages do.
EPOCH = 1735689600
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


@dataclass(frozen=True)
class Entry:
    """One file of an image: from a file on this machine, from bytes, a symlink, or a directory."""

    source: Path | None = None
    content: bytes | None = None
    mode: int | None = None  # default: the source's mode, else 0o644 (0o755 for a directory)
    link_to: str | None = None
    directory: bool = False


@dataclass
class Image:
    """What goes into one image: its reference (registry/repository:tag) and its files."""

    ref: str
    files: dict[str, Entry] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(
        default_factory=lambda: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    )
    labels: dict[str, str] = field(default_factory=dict)
    user: str = ""

    @property
    def repository(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]

    def add_tree(self, root: Path, rels: list[str] | None = None, *, prefix: str = "/") -> None:
        """Add files of an unpacked tree (a Debian package's), keeping symlinks as symlinks."""
        for path in sorted(root.rglob("*")) if rels is None else [root / r for r in rels]:
            rel = path.relative_to(root).as_posix()
            if rel.startswith((".complete", "usr/share/doc", "usr/share/man", "usr/share/lintian")):
                continue
            dest = str(PurePosixPath(prefix) / rel)
            if path.is_symlink():
                self.files[dest] = Entry(link_to=str(Path(path.readlink())))
            elif path.is_file():
                self.files[dest] = Entry(source=path)


def fingerprint(image: Image) -> str:
    """What the image is made of, cheaply: its config and each file's path, mode and source (a file on
    this machine by path, size and mtime; bytes by digest). Equal fingerprints build equal images."""
    h = hashlib.sha256()
    h.update(
        json.dumps([image.ref, image.entrypoint, image.cmd, image.env, image.labels, image.user]).encode()
    )
    for path in sorted(image.files):
        e = image.files[path]
        if e.directory:
            part = f"D {path} {e.mode}"
        elif e.link_to is not None:
            part = f"L {path} {e.link_to}"
        elif e.content is not None:
            part = f"C {path} {e.mode} {hashlib.sha256(e.content).hexdigest()}"
        else:
            st = e.source.stat()  # type: ignore[union-attr]
            part = f"F {path} {e.mode} {e.source} {st.st_size} {st.st_mtime_ns} {st.st_mode}"
        h.update(part.encode() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class Built:
    """An image as a registry stores it: blobs by digest and the manifest."""

    ref: str
    layer: bytes
    config: bytes
    manifest: bytes

    @property
    def digest(self) -> str:
        return digest(self.manifest)

    def blobs(self) -> dict[str, bytes]:
        return {digest(self.config): self.config, digest(self.layer): self.layer}


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar_layer(files: dict[str, Entry]) -> bytes:
    """The layer's tar: every parent directory, then the entries, in path order, owned by root."""
    buf = io.BytesIO()
    names: dict[str, Entry | None] = {}
    for path in files:
        clean = PurePosixPath("/" + path.lstrip("/"))
        for parent in reversed(clean.parents):
            if str(parent) != "/":
                names.setdefault(str(parent).lstrip("/"), None)
        names[str(clean).lstrip("/")] = files[path]
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(names):
            entry = names[name]
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = EPOCH, 0, 0, "", ""
            if entry is None or entry.directory:
                info.type = tarfile.DIRTYPE
                info.mode = entry.mode if entry is not None and entry.mode is not None else 0o755
                tar.addfile(info)
            elif entry.link_to is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link_to, 0o777
                tar.addfile(info)
            else:
                data = entry.content if entry.content is not None else entry.source.read_bytes()  # type: ignore[union-attr]
                mode = entry.mode
                if mode is None:
                    mode = (entry.source.stat().st_mode & 0o7777) if entry.source is not None else 0o644
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build(image: Image) -> Built:
    """The image's layer, config and manifest (the same bytes for the same files)."""
    tar = _tar_layer(image.files)
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", compresslevel=6, mtime=0) as z:
        z.write(tar)
    layer = gz.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2025-01-01T00:00:00Z",
        "config": {
            k: v
            for k, v in (
                ("Env", image.env),
                ("Entrypoint", image.entrypoint or None),
                ("Cmd", image.cmd or None),
                ("Labels", image.labels or None),
                ("User", image.user or None),
            )
            if v is not None
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(tar)]},
        "history": [
            {"created": "2025-01-01T00:00:00Z", "created_by": "gpuprov lab (lab/gpuprov_lab/kube/oci.py)"}
        ],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": digest(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": digest(layer), "size": len(layer)}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return Built(ref=image.ref, layer=layer, config=config_bytes, manifest=manifest_bytes)
