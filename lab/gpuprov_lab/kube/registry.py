"""The lab's container registry: Debian's docker-registry (the CNCF distribution registry), serving the
lab's images the way an air-gapped site serves them to containerd through a registry mirror.

Images are stored under the upstream registry's name (``registry.k8s.io/kube-apiserver``,
``nvcr.io/nvidia/gpu-operator``), and the hosts' containerd reaches them through hosts.toml mirrors
with ``override_path`` (``http://<gateway>:5000/v2/registry.k8s.io``), which the kubernetes role writes
from ``gpuprov_registry_mirror_url``. The storage is built once per image set into the cache by pushing
through the registry's own HTTP API (so what containerd pulls is what the registry itself stored), and
each lab serves it read-only on its gateway.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from gpuprov_lab import debian, paths, proc
from gpuprov_lab.errors import LabError
from gpuprov_lab.kube import oci

SUITE = "bookworm"
PACKAGE = "docker-registry"
BINARY = "usr/bin/docker-registry"
PORT = 5000


def binary() -> Path:
    """The real registry, from Debian's docker-registry package."""
    return debian.unpacked(SUITE, PACKAGE).path(BINARY)


def _config(root: Path, addr: str, readonly: bool) -> str:
    return json.dumps(
        {
            "version": 0.1,
            "log": {"level": "warn", "formatter": "text"},
            "storage": {
                "filesystem": {"rootdirectory": str(root)},
                "maintenance": {
                    "uploadpurging": {"enabled": False},
                    "readonly": {"enabled": readonly},
                },
                "delete": {"enabled": False},
            },
            "http": {"addr": addr},
        }
    )


def _start(root: Path, addr: str, readonly: bool, conf: Path, log: Path) -> subprocess.Popen[bytes]:
    conf.write_text(_config(root, addr, readonly))  # JSON is YAML
    return proc.spawn([str(binary()), "serve", str(conf)], log, cwd="/")


def _answers(base: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/v2/", timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


def _wait(child: subprocess.Popen[bytes], base: str, log: Path) -> None:
    proc.wait_started(child, lambda: _answers(base), 30, log, "the lab registry")


def _request(method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        return urllib.request.urlopen(req, timeout=300)
    except urllib.error.HTTPError as exc:
        if method == "HEAD" and exc.code == 404:
            return None
        body = exc.read().decode(errors="replace")[:300]
        raise LabError(f"registry: {method} {url}: HTTP {exc.code}: {body}") from exc


def push(base: str, built: oci.Built) -> None:
    """One image through the registry's HTTP API: blobs (once each), then the manifest by tag."""
    name = built.ref.rsplit(":", 1)[0]
    tag = built.ref.rsplit(":", 1)[1]
    for dg, blob in built.blobs().items():
        if _request("HEAD", f"{base}/v2/{name}/blobs/{dg}") is not None:
            continue
        with _request("POST", f"{base}/v2/{name}/blobs/uploads/", b"") as r:
            location = r.headers["Location"]
        url = urllib.parse.urljoin(base + "/", location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": dg})
        with _request("PUT", url, blob, {"Content-Type": "application/octet-stream"}):
            pass
    with _request(
        "PUT", f"{base}/v2/{name}/manifests/{tag}", built.manifest, {"Content-Type": oci.MEDIA_MANIFEST}
    ):
        pass


def storage(images: Iterable[oci.Image], progress=lambda _m: None) -> Path:  # type: ignore[no-untyped-def]
    """The registry storage holding these images, built once per image set (cached by what the images
    are made of, oci.fingerprint)."""
    images = list(images)
    key = paths.digest(*(oci.fingerprint(i) for i in images), str(binary()))[:16]
    root = paths.cache_root() / "registry" / f"images-{key}"
    if (root / ".complete").exists():
        return root
    progress(f"registry: building and storing {len(images)} image(s) (once; cached)")
    built = [oci.build(i) for i in images]
    tmp = root.with_name(root.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    child = _start(tmp / "data", f"127.0.0.1:{port}", False, tmp / "config.yml", tmp / "registry.log")
    try:
        _wait(child, base, tmp / "registry.log")
        for b in built:
            push(base, b)
    finally:
        proc.stop_pid(child.pid, timeout=10)
    (tmp / "images.txt").write_text("".join(f"{b.ref} {b.digest}\n" for b in built))
    (tmp / ".complete").touch()
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    for old in root.parent.glob("images-*"):
        if old != root and not old.name.endswith(f".tmp-{os.getpid()}"):
            shutil.rmtree(old, ignore_errors=True)
    return root


# ---------------------------------------------------------------------------------- a lab's registry


def server_pid(pid_file: Path) -> int | None:
    return proc.recorded_pid(pid_file, "docker-registry")


def ensure_server(store: Path, bind: str, state_dir: Path, progress=lambda _m: None) -> int:  # type: ignore[no-untyped-def]
    """Serve the storage read-only on bind:PORT for one lab; (re)start when missing or serving another."""
    pid_file, conf, log = state_dir / "registry.pid", state_dir / "registry.yml", state_dir / "registry.log"
    base = f"http://{bind}:{PORT}"
    want = _config(store / "data", f"{bind}:{PORT}", True)
    pid = server_pid(pid_file)
    if pid and conf.exists() and conf.read_text() == want and _answers(base):
        return pid
    if pid:
        stop_server(pid_file)
    progress(f"registry: serving the lab's images on {base}")
    child = _start(store / "data", f"{bind}:{PORT}", True, conf, log)
    pid_file.write_text(f"{child.pid}\n")
    _wait(child, base, log)
    return child.pid


def stop_server(pid_file: Path) -> bool:
    return proc.stop_recorded(pid_file, "docker-registry")
