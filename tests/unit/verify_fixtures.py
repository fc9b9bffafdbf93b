"""Host snapshots for the verification tests, built from the real H200 capture.

tests/fixtures/hosts/h200-ubuntu2404/ holds real outputs under the capture's own names. `h200_probes()`
turns them into probe results in the snapshot contract's names; the fault variants change only what
the fault changes (one XML element, one kernel-log line), so every other byte is the real host's.
The capture has no kernel log: `kernel_log()` writes boot lines in dmesg's format around the real
NVRM version line, and fault variants add `NVRM: Xid` lines in the driver's format.
"""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from provisioner.probes.base import RC_NOT_APPLICABLE, ProbeResult
from provisioner.verification import write_host_snapshot

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h200-ubuntu2404"
BUS = "0000:00:06.0"
# Bus ids of an 8-GPU HGX board, for multi-GPU variants built from the single real GPU.
HGX_BUSES = (
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
)

Probes = dict[str, tuple[int, str, str]]  # name → (rc, stdout, stderr)

# What a healthy GPU host outside Kubernetes verifies as without a policy, check by check: the H200 capture
# here, and the real H200 and H100 hosts' snapshots (tests/fixtures/snapshots).
HEALTHY_WITHOUT_POLICY = {
    "os.supported": "pass",
    "gpu.present": "pass",
    "gpu.count": "pass",
    "driver.loaded": "pass",
    "driver.version": "skip",  # no expectation without a policy: never a pass by default
    "driver.userspace_match": "pass",
    "gpu.persistence": "pass",
    "gpu.ecc": "pass",
    "gpu.memory_remap": "pass",
    "gpu.pcie_link": "pass",
    "gpu.throttle": "pass",
    "gpu.xid": "pass",
    "cuda.version": "pass",
    "packages.held": "skip",
    "container_toolkit.runtime": "skip",
    "services.active": "skip",
    "k8s.node_ready": "skip",
    "k8s.gpu_allocatable": "skip",
    "gpu.sharing": "skip",
    "mig.config": "skip",
    "monitoring.dcgm_exporter": "skip",
    "tenants.quota": "skip",
    "dcgm.diag": "skip",
    "container.smoke": "skip",
}


def raw(name: str) -> str:
    return (CAPTURE / name).read_text()


def pci_line(bus: str, device: str = "2335", cls: str = "0302") -> str:
    names = {"0302": "3D controller", "0300": "VGA compatible controller", "0680": "Bridge"}
    return f"{bus} {names[cls]} [{cls}]: NVIDIA Corporation Device [10de:{device}] (rev a1)"


def pci_from_sysfs_capture() -> str:
    """The capture's sysfs line → the lspci -Dnn line our probe prints when lspci is absent."""
    lines = []
    for line in raw("sysfs-pci-nvidia.txt").splitlines():
        m = re.match(r"(\S+) vendor=0x(\w+) device=0x(\w+) class=0x(\w{4})", line)
        assert m, line
        lines.append(pci_line(m.group(1), m.group(3), m.group(4)))
    return "\n".join(lines) + "\n"


def packages_from_dpkg_l() -> tuple[str, str]:
    """dpkg -l → (packages.tsv, apt-holds.txt) as dpkg-query and dpkg --get-selections print them."""
    tsv, holds = [], []
    for line in raw("dpkg-l.txt").splitlines():
        m = re.match(r"^([a-z][a-zA-Z])\s+(\S+)\s+(\S+)\s+\S+\s", line)
        if not m:
            continue
        name = m.group(2).split(":", 1)[0]
        tsv.append(f"{name}\t{m.group(3)}\t{m.group(1)} ")
        if m.group(1).startswith("h"):
            holds.append(name)
    return "\n".join(tsv) + "\n", "\n".join(holds) + "\n"


def nvrm_version_line() -> str:
    return raw("proc-driver-nvidia-version.txt").splitlines()[0].removeprefix("NVRM version: ")


def kernel_log(*extra: str) -> str:
    lines = [
        "[    0.000000] Linux version 6.8.0-87-generic (buildd@lcy02-amd64-011) #88-Ubuntu SMP",
        "[    4.211093] nvidia: loading out-of-tree module taints kernel.",
        f"[    4.402761] NVRM: loading {nvrm_version_line()}",
        "[    4.978120] nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64  "
        "580.159.04",
        *extra,
    ]
    return "\n".join(lines) + "\n"


def xid_line(xid: int, pci: str = "0000:00:06", text: str = "", t: float = 8123.456789) -> str:
    return f"[{t:12.6f}] NVRM: Xid (PCI:{pci}): {xid}, pid=41223, name=python3, {text}".rstrip(", ")


def h200_probes() -> Probes:
    """The real host as the probe set would have collected it."""
    tsv, holds = packages_from_dpkg_l()
    na = RC_NOT_APPLICABLE
    return {
        "os-release": (0, raw("os-release"), ""),
        "pci-devices.txt": (0, pci_from_sysfs_capture(), ""),
        "nvidia-smi-q.xml": (0, raw("nvidia-smi-q-x.xml"), ""),
        "nvidia-smi-version.txt": (0, raw("nvidia-smi-version.txt"), ""),
        "proc-driver-nvidia-version": (0, raw("proc-driver-nvidia-version.txt"), ""),
        "sys-module-nvidia-version": (0, raw("sys-module-nvidia-version.txt"), ""),
        "kernel-log.txt": (0, kernel_log(), ""),
        "nvcc-version.txt": (0, raw("nvcc-version.txt"), ""),
        "packages.tsv": (0, tsv, ""),
        "apt-holds.txt": (0, holds, ""),
        "services.tsv": (na, "", "no systemd on this host (systemctl absent or not booted with systemd)"),
        "secureboot.txt": (0, "SecureBoot not applicable (legacy BIOS boot: no /sys/firmware/efi)\n", ""),
        "docker-daemon.json": (na, "", "/etc/docker/daemon.json: absent"),
        "containerd-config.toml": (na, "", "/etc/containerd/config.toml: absent"),
        "containerd-config-dump.toml": (na, "", "containerd not installed"),
        "kube-node.json": (na, "", "not a Kubernetes node: no /etc/kubernetes/admin.conf or kubelet.conf"),
        "dcgmi-diag.json": (na, "", "dcgmi not installed"),
    }


def results(probes: Mapping[str, tuple[int | None, str, str]]) -> dict[str, ProbeResult]:
    return {name: ProbeResult(name, rc, out, err, 0.01) for name, (rc, out, err) in probes.items()}


def write_snapshot(root: Path, host: str, probes: Mapping[str, tuple[int, str, str]]) -> Path:
    return write_host_snapshot(root, host, results(probes), None, "2026-12-02T15:03:54Z")


# ------------------------------------------------------------------------------------- XML edits


def xml_root(xml: str | None = None) -> ET.Element:
    return ET.fromstring(xml if xml is not None else raw("nvidia-smi-q-x.xml"))


def xml_text(root: ET.Element) -> str:
    return '<?xml version="1.0" ?>\n' + ET.tostring(root, encoding="unicode")


def set_gpu(xml: str, path: str, value: str, gpu: int = 0) -> str:
    """Change one element of one GPU in nvidia-smi -q -x output."""
    root = xml_root(xml)
    el = root.findall("gpu")[gpu].find(path)
    assert el is not None, path
    el.text = value
    return xml_text(root)


def multi_gpu_xml(n: int = 8, drop: tuple[int, ...] = ()) -> str:
    """The real H200 <gpu> repeated on an HGX board's bus ids (minus `drop`, as if lost by the driver)."""
    root = xml_root()
    template = root.find("gpu")
    assert template is not None
    root.remove(template)
    kept = 0
    for i, bus in enumerate(HGX_BUSES[:n]):
        if i in drop:
            continue
        g = copy.deepcopy(template)
        long_bus = "0000" + bus
        g.set("id", long_bus)
        g.find("pci/pci_bus_id").text = long_bus  # type: ignore[union-attr]
        g.find("pci/pci_bus").text = bus.split(":")[1]  # type: ignore[union-attr]
        g.find("minor_number").text = str(i)  # type: ignore[union-attr]
        g.find("uuid").text = f"GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c00879{i:02x}"  # type: ignore[union-attr]
        root.append(g)
        kept += 1
    root.find("attached_gpus").text = str(kept)  # type: ignore[union-attr]
    return xml_text(root)


def multi_gpu_pci(n: int = 8) -> str:
    return "".join(pci_line(bus) + "\n" for bus in HGX_BUSES[:n])


def invoke_verb(verb: str, *args: str) -> tuple[int, str, str]:
    """`gpuprov VERB ARGS` as `main` runs it: (exit code, stdout, the error's text). The return value is
    the exit code; a GpuprovError gives its own, a usage error click's."""
    from typer.testing import CliRunner

    from provisioner.cli import app
    from provisioner.errors import GpuprovError

    result = CliRunner().invoke(app, [verb, *args], standalone_mode=False)
    exc = result.exception
    if isinstance(exc, GpuprovError):
        return exc.exit_code, result.stdout, str(exc)
    if exc is not None:
        shown = exc.format_message() if hasattr(exc, "format_message") else str(exc)  # click's usage text
        return int(getattr(exc, "exit_code", 1)), result.stdout, shown
    return int(result.return_value), result.stdout, ""
