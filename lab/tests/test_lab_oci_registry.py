"""The lab's images and registry: images built from files without an engine are valid OCI images with the
same bytes for the same inputs, and Debian's real docker-registry stores and serves them as containerd
pulls them (manifest by tag, blobs by digest), read-only once a lab serves it."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import socket
import tarfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuprov_lab import proc
from gpuprov_lab.errors import LabError
from gpuprov_lab.kube import oci, registry


def _image(tmp_path: Path, ref: str = "registry.k8s.io/pause:3.10.2") -> oci.Image:
    src = tmp_path / "pause"
    if not src.exists():
        src.write_bytes(b"\x7fELF not really")
        src.chmod(0o755)
    image = oci.Image(ref=ref, entrypoint=["/pause"])
    image.files["/pause"] = oci.Entry(source=src)
    image.files["/etc/motd"] = oci.Entry(content=b"hello\n")
    image.files["/bin/sh"] = oci.Entry(link_to="busybox")
    image.files["/tmp"] = oci.Entry(directory=True, mode=0o1777)
    return image


def test_the_same_files_give_the_same_image(tmp_path: Path) -> None:
    a, b = oci.build(_image(tmp_path)), oci.build(_image(tmp_path))
    assert (a.layer, a.config, a.manifest) == (b.layer, b.config, b.manifest)
    assert oci.fingerprint(_image(tmp_path)) == oci.fingerprint(_image(tmp_path))
    other = _image(tmp_path)
    other.files["/etc/motd"] = oci.Entry(content=b"changed\n")
    assert oci.fingerprint(other) != oci.fingerprint(_image(tmp_path))
    assert oci.build(other).digest != a.digest


def test_the_image_is_laid_out_as_the_oci_spec_says(tmp_path: Path) -> None:
    built = oci.build(_image(tmp_path))
    manifest = json.loads(built.manifest)
    config = json.loads(built.config)
    assert manifest["config"]["digest"] == oci.digest(built.config)
    assert manifest["layers"][0] == {
        "mediaType": oci.MEDIA_LAYER, "digest": oci.digest(built.layer), "size": len(built.layer)
    }  # fmt: skip
    tar = gzip.decompress(built.layer)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(tar).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/pause"]
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        members = {m.name: m for m in t.getmembers()}
        # Parents come before their entries; everything is root's, at the fixed time.
        assert list(members) == sorted(members) and {"bin", "etc", "tmp"} <= set(members)
        assert all((m.uid, m.gid, m.mtime) == (0, 0, oci.EPOCH) for m in members.values())
        assert members["pause"].mode == 0o755 and members["etc/motd"].mode == 0o644
        assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
        assert members["tmp"].isdir() and members["tmp"].mode == 0o1777


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Debian's docker-registry on a loopback port, writable, storing under tmp_path/data."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    child = registry._start(
        tmp_path / "data", f"127.0.0.1:{port}", False, tmp_path / "c.yml", tmp_path / "r.log"
    )
    try:
        registry._wait(child, base, tmp_path / "r.log")
        yield base, tmp_path / "data"
    finally:
        proc.stop_pid(child.pid, timeout=10)


def _get(url: str, accept: str = "") -> tuple[bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read(), dict(r.headers)


def test_the_real_registry_serves_a_pushed_image_as_containerd_pulls_it(
    tmp_path: Path, served: tuple[str, Path]
) -> None:
    base, data = served
    built = oci.build(_image(tmp_path, "nvcr.io/nvidia/gpu-operator:v26.7.0"))
    registry.push(base, built)
    registry.push(base, built)  # again: blobs are there already, the tag is rewritten to the same
    body, headers = _get(f"{base}/v2/nvcr.io/nvidia/gpu-operator/manifests/v26.7.0", oci.MEDIA_MANIFEST)
    assert body == built.manifest and headers["Docker-Content-Digest"] == built.digest
    for dg, blob in built.blobs().items():
        assert _get(f"{base}/v2/nvcr.io/nvidia/gpu-operator/blobs/{dg}")[0] == blob
    # Served read-only (as each lab serves it), the same storage answers pulls and refuses pushes.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ro = f"http://127.0.0.1:{port}"
    child = registry._start(data, f"127.0.0.1:{port}", True, tmp_path / "ro.yml", tmp_path / "ro.log")
    try:
        registry._wait(child, ro, tmp_path / "ro.log")
        assert (
            _get(f"{ro}/v2/nvcr.io/nvidia/gpu-operator/manifests/v26.7.0", oci.MEDIA_MANIFEST)[0]
            == built.manifest
        )
        with pytest.raises(LabError, match="HTTP 405"):
            registry.push(ro, oci.build(_image(tmp_path, "nvcr.io/nvidia/gpu-operator:other")))
    finally:
        proc.stop_pid(child.pid, timeout=10)
