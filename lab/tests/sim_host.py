"""A simulated lab host in a temporary directory, for the tests of the lab's GPU simulation.

The GPU stand-in (lab/gpuprov_lab/gpu, /usr/lib/gpuprov-lab/gpu in a host) runs here
against a root directory (GPUPROV_SIM_ROOT) instead of /: the profile and faults files the lab writes,
the sim packages extracted from the .debs the mirror serves, and the NVIDIA modules built from the DKMS
package's own Makefile with the system C compiler, as dkms does on a lab host.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from gpuprov_lab.gpu import boot, core, daemons, dcgm, dmesg, kmod, smi, watch
from gpuprov_lab.sim import catalog, debs, nvidia, nvml, profiles

from provisioner.probes import PROBES_BY_NAME
from provisioner.probes.base import ProbeResult

__all__ = ["KERNEL", "SimHost", "boot", "core", "daemons", "dcgm", "dmesg", "kmod", "smi", "watch"]
KERNEL = os.uname().release
DRIVER = "580.159.04"


@cache
def deb_dir() -> Path:
    """Every sim package built once per test session."""
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="gpuprov-simdebs-"))
    atexit.register(shutil.rmtree, out, True)
    for pkg in catalog.gpu_packages():
        debs.build_deb(pkg, out)
    return out


def find_deb(name: str, version: str) -> Path:
    matches = sorted(deb_dir().glob(f"{name}_{version.split(':')[-1]}*.deb"))
    if not matches:
        raise FileNotFoundError(f"no sim package {name} {version}")
    return matches[0]


class SimHost:
    """One lab host's root directory, its profile and the simulated tools run against it."""

    def __init__(self, root: Path, profile: str, hostname: str = "gpu1") -> None:
        self.root = root
        self.profile = profile
        (root / "etc/gpuprov-lab").mkdir(parents=True, exist_ok=True)
        doc = profiles.profile_document(profile, hostname)
        (root / "etc/gpuprov-lab/profile.json").write_text(json.dumps(doc))
        config = nvml.mock_config(doc)
        if config is not None:  # as `gpuprov lab up` writes it
            (root / "etc/gpuprov-lab/nvml-mock.yaml").write_text(config)
        self.set_faults([])
        self.host = core.Host(root)

    # ------------------------------------------------------------------------------- the machine

    def set_faults(self, faults: list[dict[str, Any]]) -> None:
        (self.root / "etc/gpuprov-lab/faults.json").write_text(json.dumps({"faults": faults}))

    def install(self, *names: str, version: str = DRIVER) -> None:
        """Unpack sim packages (files only, as far as these tests need them)."""
        for name in names:
            v = version
            if name.startswith("linux-headers"):
                v = nvidia.headers_package().version
            subprocess.run(["dpkg-deb", "-x", str(find_deb(name, v)), str(self.root)], check=True)

    def build_modules(
        self, version: str = DRIVER, flavour: str = "open", headers: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """What dkms does on a lab host: the package's Makefile, then the .ko files into updates/dkms."""
        pkg = "nvidia-kernel-open-dkms" if flavour == "open" else "nvidia-kernel-dkms"
        self.install(pkg, *(["linux-headers-" + KERNEL] if headers else []), version=version)
        build = self.root / "var/lib/dkms/build"
        shutil.rmtree(build, ignore_errors=True)
        shutil.copytree(self.root / f"usr/src/nvidia-{version}", build)
        res = subprocess.run(
            [
                "make",
                "-C",
                str(build),
                "modules",
                f"KERNEL_UNAME={KERNEL}",
                f"NV_FLAVOUR={flavour}",
                f"SIM_CHECK={sys.executable} -m gpuprov_lab.gpu.dkmsbuild",
            ],
            env={**os.environ, "GPUPROV_SIM_ROOT": str(self.root)},
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode == 0:
            dest = self.root / f"lib/modules/{KERNEL}/updates/dkms"
            dest.mkdir(parents=True, exist_ok=True)
            for ko in build.glob("*.ko"):
                shutil.copy(ko, dest / ko.name)
        return res

    def driver(self, version: str = DRIVER, flavour: str = "open") -> None:
        """The driver installed (userspace and modules) and the host booted with it loaded."""
        self.install("libnvidia-ml1", "libcuda1", "nvidia-smi", "nvidia-modprobe", version=version)
        res = self.build_modules(version, flavour)
        assert res.returncode == 0, res.stdout + res.stderr
        self.boot()

    def boot(self) -> None:
        shutil.rmtree(self.root / "run", ignore_errors=True)
        assert boot.boot(self.host) == 0

    # ---------------------------------------------------------------------------------- tools

    def run(self, fn: Callable[..., int], *args: Any, **kwargs: Any) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with (
            _env(GPUPROV_SIM_ROOT=str(self.root)),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            rc = fn(*args, **kwargs)
        return rc, out.getvalue(), err.getvalue()

    def smi(self, *args: str, driver: str = DRIVER, cuda: str = "13.0") -> tuple[int, str]:
        rc, out, _ = self.run(smi.main, "nvidia-smi", list(args), driver=driver, cuda=cuda)
        return rc, out

    def kmod(self, prog: str, *args: str) -> tuple[int, str, str]:
        return self.run(kmod.main, prog, list(args))

    def dmesg(self) -> str:
        return self.run(dmesg.main, "dmesg", [])[1]

    # ----------------------------------------------------------------------------------- probes

    def pci_probe(self) -> str:
        """The pci-devices.txt probe's sysfs branch, run over this root's /sys."""
        body = PROBES_BY_NAME["pci-devices.txt"].command
        body = "\n".join(ln for ln in body.splitlines() if "lspci" not in ln)
        body = body.replace("/sys/bus/pci/devices", f"{self.root}/sys/bus/pci/devices")
        return subprocess.run(["sh", "-c", body], capture_output=True, text=True, check=True).stdout

    def probe_results(self) -> dict[str, ProbeResult]:
        """What the verification probes would collect from this host."""
        rc, xml = self.smi("-q", "-x")
        vrc, version = self.smi("--version")
        results = {
            "os-release": ProbeResult("os-release", 0, 'ID=debian\nVERSION_ID="12"\n'),
            "pci-devices.txt": ProbeResult("pci-devices.txt", 0, self.pci_probe()),
            "nvidia-smi-q.xml": ProbeResult("nvidia-smi-q.xml", rc, xml),
            "nvidia-smi-version.txt": ProbeResult("nvidia-smi-version.txt", vrc, version),
            "kernel-log.txt": ProbeResult("kernel-log.txt", 0, self.dmesg()),
            "modules.txt": ProbeResult(
                "modules.txt", 0, (self.root / "run/gpuprov-lab/proc-modules").read_text()
            ),
        }
        for name, path in (
            ("proc-driver-nvidia-version", "proc/driver/nvidia/version"),
            ("sys-module-nvidia-version", "sys/module/nvidia/version"),
        ):
            f = self.root / path
            results[name] = (
                ProbeResult(name, 0, f.read_text())
                if f.exists()
                else ProbeResult(name, 1, "", f"/{path}: No such file or directory")
            )
        return results


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
