"""The vendor's real binaries the lab's Kubernetes and GPU Operator run (xz-compressed in the vendor
directory), unpacked once into the cache and checked against the vendor's SHA256SUMS."""

from __future__ import annotations

import hashlib
import lzma
import os
from pathlib import Path

from gpuprov_lab import paths, vendor
from gpuprov_lab.errors import LabError

KUBERNETES = ("kubeadm", "kubelet", "kubectl", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
              "kube-proxy", "pause")  # fmt: skip


def _expected(kind: str, name: str) -> str | None:
    """The sha256 the vendor's SHA256SUMS.unpacked gives for bin/<name>, if it lists it."""
    sums = vendor.vendor_dir() / kind / "SHA256SUMS.unpacked"
    if not sums.is_file():
        return None
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*").split("/")[-1] in (name, f"{name}.xz"):
            return parts[0]
    return None


def unpacked(kind: str, name: str) -> Path:
    """bin/<name> of a vendor artifact, decompressed (bin/<name>.xz) or as stored, made executable."""
    plain = vendor.vendor_dir() / kind / "bin" / name
    packed = plain.with_name(name + ".xz")
    if not packed.exists():
        return vendor.artifact(kind, f"bin/{name}")
    src = vendor.artifact(kind, f"bin/{name}.xz")
    stamp = os.stat(src)
    key = paths.digest(str(src), str(stamp.st_size), str(int(stamp.st_mtime)))[:12]
    out = paths.cache_root() / "real" / "vendor-bin" / kind / key / name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{name}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    with lzma.open(src) as fin, open(tmp, "wb") as fout:
        while chunk := fin.read(1 << 20):
            digest.update(chunk)
            fout.write(chunk)
    want = _expected(kind, name)
    if want and digest.hexdigest() != want:
        tmp.unlink()
        raise LabError(f"vendor artifact {kind}/bin/{name}.xz unpacks to sha256 {digest.hexdigest()}, "
                       f"not {want} as its SHA256SUMS.unpacked says")  # fmt: skip
    tmp.chmod(0o755)
    os.replace(tmp, out)
    return out


def kubernetes(name: str) -> Path:
    if name not in KUBERNETES:
        raise LabError(f"no Kubernetes binary {name!r} (known: {', '.join(KUBERNETES)})")
    return unpacked("kubernetes", name)


def version(name: str) -> str:
    """What a vendored Kubernetes binary says of its version (v1.36.3)."""
    from gpuprov_lab import proc

    argv = (
        [str(kubernetes(name)), "version", "-o", "short"]
        if name == "kubeadm"
        else [str(kubernetes(name)), "--version"]
    )
    out = proc.run(argv, what=f"{name} --version").stdout.strip()
    return out.split()[-1]
