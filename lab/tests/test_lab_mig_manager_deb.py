"""The lab packs NVIDIA's nvidia-mig-manager .deb from NVIDIA's packaging: a valid package with the real
binary and NVIDIA's systemd deployment, where NVIDIA's Makefile installs them, served at the release
URL's path."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from gpuprov_lab import vendor
from gpuprov_lab.sim import migmanager


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migmanager.build_deb(tmp_path_factory.mktemp("deb"))


def _dpkg(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], capture_output=True, text=True, check=True).stdout


def test_control_is_nvidias(deb: Path) -> None:
    assert deb.name == "nvidia-mig-manager_0.15.0-1_amd64.deb"
    info = _dpkg("--info", str(deb))
    for line in ("Package: nvidia-mig-manager", "Version: 0.15.0-1", "Architecture: amd64",
                 "Maintainer: NVIDIA CORPORATION <cudatools@nvidia.com>", "Section: utils",
                 "Description: NVIDIA MIG Partition Editor and Systemd Service"):  # fmt: skip
        assert f" {line}\n" in info, line
    assert "Depends: libc6 (>= " in info and "${" not in info and "@SECTION@" not in info
    assert _dpkg("--ctrl-tarfile", str(deb)) is not None
    conffiles = subprocess.run(["dpkg-deb", "--info", str(deb), "conffiles"], capture_output=True, text=True,
                               check=True).stdout  # fmt: skip
    assert conffiles.split() == ["/etc/systemd/system/nvidia-mig-manager.service.d/override.conf"]
    postinst = subprocess.run(["dpkg-deb", "--info", str(deb), "postinst"], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    assert "maybe_add_hooks_symlink" in postinst and "#DEBHELPER#" not in postinst


def test_contents_are_the_real_files_where_nvidias_makefile_puts_them(deb: Path, tmp_path: Path) -> None:
    listing = {
        line.split()[-1].lstrip("."): line.split()[0] for line in _dpkg("--contents", str(deb)).splitlines()
    }
    expected = {
        "/usr/bin/nvidia-mig-parted": "-rwxr-xr-x",
        "/lib/systemd/system/nvidia-mig-manager.service": "-rw-r--r--",
        "/lib/systemd/system/nvidia-gpu-reset.target": "-rw-r--r--",
        "/etc/profile.d/nvidia-mig-parted.sh": "-rw-r--r--",
        "/etc/systemd/system/nvidia-mig-manager.service.d/override.conf": "-rw-r--r--",
        "/etc/nvidia-mig-manager/service.sh": "-rwxr-xr-x",
        "/etc/nvidia-mig-manager/utils.sh": "-rw-r--r--",
        "/etc/nvidia-mig-manager/hooks.sh": "-rw-r--r--",
        "/etc/nvidia-mig-manager/hooks-default.yaml": "-rw-r--r--",
        "/etc/nvidia-mig-manager/hooks-minimal.yaml": "-rw-r--r--",
        "/etc/nvidia-mig-manager/config-default.yaml": "-rw-r--r--",
    }
    for path, mode in expected.items():
        assert listing.get(path) == mode, path
    assert "/var/lib/nvidia-mig-manager/" in listing
    subprocess.run(["dpkg-deb", "--extract", str(deb), str(tmp_path)], check=True)
    sums = dict(
        reversed(line.split())
        for line in vendor.artifact("mig-parted", "SHA256SUMS").read_text().splitlines()
    )
    binary = (tmp_path / "usr/bin/nvidia-mig-parted").read_bytes()
    assert hashlib.sha256(binary).hexdigest() == sums["bin/nvidia-mig-parted"]
    for name in ("service.sh", "utils.sh", "hooks.sh", "config-default.yaml"):
        assert (tmp_path / "etc/nvidia-mig-manager" / name).read_bytes() == vendor.artifact(
            "mig-parted", f"systemd/{name}"
        ).read_bytes()


def test_the_build_is_reproducible_and_served_at_the_release_path(deb: Path) -> None:
    files = migmanager.mirror_files()
    assert list(files) == ["mig-parted/v0.15.0/nvidia-mig-manager_0.15.0-1_amd64.deb"]
    assert files[migmanager.MIRROR_PATH] == deb.read_bytes()
