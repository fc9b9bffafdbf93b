"""Part of the gpuprov lab simulation: the "hardware" of a lab host, set up once per boot.

Run by gpuprov-lab-hardware.service early at boot (before journald), from /etc/gpuprov-lab/profile.json:

- a fresh boot id bind-mounted over /proc/sys/kernel/random/boot_id (a container restart is a reboot);
- tmpfs over /sys/bus/pci/devices with the profile's GPUs and NVSwitches (the machine's own devices
  stay out), each with the sysfs attributes lspci and the probes read;
- tmpfs over /sys/module (the kernel's own entries copied in) and /proc/driver, and the generated
  module list bind-mounted over /proc/modules where the kernel has one;
- this boot's kernel log, and the modules udev would load: nouveau unless blacklisted, and the
  NVIDIA modules when DKMS installed them for the running kernel;
- first, what a reboot clears of the injected faults (recovery.py): every Xid, the volatile ECC counts,
  a pending row remap (activated); remap failures, PCIe link faults and missing GPUs stay.

All of it happens in the container's own mount namespace: nothing of the machine running the lab
changes. With a test root (GPUPROV_SIM_ROOT) the same files are written without mounting.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import core, kmod, recovery, watch


def _mount(host: core.Host, *args: str) -> str | None:
    """mount(8) on a lab host; an error message or None. No-op for a test root."""
    if not host.on_host:
        return None
    res = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    return res.stderr.strip() or f"mount {' '.join(args)}: exit {res.returncode}" if res.returncode else None


def _is_mountpoint(path: Path) -> bool:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            if line.split()[4] == str(path):
                return True
    return False


def _tmpfs(host: core.Host, path: str, problems: list[str]) -> Path:
    target = host.p(path)
    if host.on_host:
        if not target.is_dir():
            problems.append(f"{path}: not present in this kernel")
            return target
        if not _is_mountpoint(target) or not (target / ".gpuprov-sim").exists():
            name = f"gpuprov-{path.strip('/').replace('/', '-')}"
            msg = _mount(host, "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", name, str(target))
            if msg:
                problems.append(msg)
                return target
    else:
        target.mkdir(parents=True, exist_ok=True)
    (target / ".gpuprov-sim").touch()
    return target


def _bind_file(host: core.Host, source: Path, target: str, problems: list[str]) -> bool:
    t = host.p(target)
    if not host.on_host:
        t.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, t)
        return True
    if not t.exists():
        return False
    msg = _mount(host, "--bind", str(source), str(t)) or _mount(host, "-o", "remount,bind,ro", str(t))
    if msg:
        problems.append(msg)
        return False
    return True


# ---------------------------------------------------------------------------------------------- PCI


def config_space(dev: dict[str, Any]) -> bytes:
    """The first 256 bytes of a type-0 PCI config header (what lspci reads)."""
    b = bytearray(256)
    struct.pack_into("<HH", b, 0, int(dev["vendor_id"], 16), int(dev["device_id"], 16))
    struct.pack_into("<HH", b, 4, 0x0406, 0x0010)
    cls = int(dev["class"], 16)
    b[8] = int(dev.get("revision", "0xa1"), 16)
    b[9], b[10], b[11] = cls & 0xFF, (cls >> 8) & 0xFF, (cls >> 16) & 0xFF
    b[14] = 0
    struct.pack_into("<HH", b, 0x2C, int(dev["subsystem_vendor_id"], 16), int(dev["subsystem_device_id"], 16))
    b[0x34] = 0x40
    # PCI Express capability (id 0x10) so lspci -vv shows the link.
    b[0x40], b[0x41] = 0x10, 0x00
    return bytes(b)


def pci_devices(host: core.Host) -> list[dict[str, Any]]:
    prof = host.profile()
    devs: list[dict[str, Any]] = [dict(d, kind="other") for d in prof.get("other_devices", [])]
    for g in prof["gpus"]:
        devs.append(dict(g, address=g["pci_address"], kind="gpu", revision=g.get("revision", "0xa1")))
    for s in prof["nvswitches"]:
        devs.append(dict(s, address=s["pci_address"], kind="nvswitch", link_gen_max=4, link_width_max=2))
    return sorted(devs, key=lambda d: d["address"])


def write_pci(host: core.Host, root: Path) -> None:
    for dev in pci_devices(host):
        d = root / dev["address"]
        d.mkdir(parents=True, exist_ok=True)
        (d / ".gpuprov-sim").touch()
        cls = int(dev["class"], 16)
        numa = dev.get("numa_node", 0)
        ids = ("vendor_id", "device_id", "subsystem_vendor_id", "subsystem_device_id")
        vendor, device, sub_vendor, sub_device = (int(dev[k], 16) for k in ids)
        files = {
            "vendor": dev["vendor_id"],
            "device": dev["device_id"],
            "subsystem_vendor": dev["subsystem_vendor_id"],
            "subsystem_device": dev["subsystem_device_id"],
            "class": f"0x{cls:06x}",
            "revision": dev.get("revision", "0x00"),
            "numa_node": str(numa),
            "local_cpulist": "0-15" if numa == 0 else "16-31",
            "irq": str(64 + len(dev["address"]) % 7),
            "enable": "1",
            "broken_parity_status": "0",
            "d3cold_allowed": "1",
            "modalias": f"pci:v{vendor:08X}d{device:08X}sv{sub_vendor:08X}sd{sub_device:08X}"
            f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}",
            "resource": "0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n" * 1,
        }
        if dev["kind"] != "other":
            gen, width = watch.link_now(host, dev)
            files |= {
                "max_link_speed": watch.link_speed(int(dev["link_gen_max"])),
                "max_link_width": str(dev["link_width_max"]),
                "current_link_speed": watch.link_speed(gen),
                "current_link_width": str(width),
            }
        for name, value in files.items():
            text = str(value)
            core.write_text(d / name, text if text.endswith("\n") else text + "\n", 0o444)
        (d / "config").write_bytes(config_space(dev))
        if dev["kind"] == "gpu":
            # The kernel shows "reset" (write-only) for a device with a reset method and lists the
            # methods in "reset_method" (Linux Documentation/ABI/testing/sysfs-bus-pci); a real H200
            # shows both, with function-level reset ("flr"). NVIDIA's MIG service reboots the host when
            # a GPU lacks "reset" (mig-parted deployments/systemd/utils.sh, assert_gpu_reset_available:
            # "e.g. GPU passthrough virtualization"). Nothing reads a write here.
            core.write_text(d / "reset", "", 0o200)
            core.write_text(d / "reset_method", "flr\n", 0o644)
        core.write_text(
            d / "uevent",
            f"PCI_CLASS={cls:X}\nPCI_ID={vendor:04X}:{device:04X}\nPCI_SUBSYS_ID={sub_vendor:04X}:{sub_device:04X}\n"
            f"PCI_SLOT_NAME={dev['address']}\nMODALIAS={files['modalias']}\n",
        )


# -------------------------------------------------------------------------------------- /sys/module


def copy_sys_module(source: Path, target: Path) -> None:
    """The kernel's own /sys/module entries (built-in modules and their parameters) into the tmpfs."""
    if not source.is_dir():
        return
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        if entry.name in kmod.MODULES:
            continue
        d = target / entry.name
        d.mkdir(exist_ok=True)
        for name in ("version", "srcversion", "initstate", "refcnt", "coresize", "taint", "uevent"):
            with contextlib.suppress(OSError):
                (d / name).write_text((entry / name).read_text())
        params = entry / "parameters"
        if params.is_dir():
            (d / "parameters").mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                for p in params.iterdir():
                    with contextlib.suppress(OSError):
                        (d / "parameters" / p.name).write_text(p.read_text())


# ----------------------------------------------------------------------------------------- the boot


def kernel_banner(host: core.Host) -> list[str]:
    try:
        version = Path("/proc/version").read_text().strip()
    except OSError:
        version = f"Linux version {host.kernel_release()}"
    lines = [
        version,
        f"Command line: BOOT_IMAGE=/boot/vmlinuz-{host.kernel_release()} root=/dev/sda1 ro quiet",
        "gpuprov lab: this kernel log is SIMULATED (gpuprov lab) for the host's simulated hardware",
    ]
    for dev in pci_devices(host):
        cls = int(dev["class"], 16)
        lines.append(
            f"pci {dev['address']}: [{dev['vendor_id'][2:]}:{dev['device_id'][2:]}] type 00 class 0x{cls:06x}"
            + (" PCIe Endpoint" if dev["kind"] != "other" else "")
        )
    return lines


def boot(host: core.Host) -> int:
    problems: list[str] = []
    run = host.run_dir()
    with host.locked() as st:
        if st.get("booted"):
            # The unit ran already this boot (a restart of the unit is not a reboot).
            kmod.render(host, st)
            return 0
        st["booted"] = True
        recovery.note_boot(host, st)  # what the reboot cleared is gone before the driver loads
        core.write_text(run / "boot_id", st["boot_id"] + "\n", 0o444)
        host.log(st, *kernel_banner(host), at=0.0)
    _bind_file(host, run / "boot_id", "/proc/sys/kernel/random/boot_id", problems)
    pci = _tmpfs(host, "/sys/bus/pci/devices", problems)
    write_pci(host, pci)
    _tmpfs(host, "/sys/bus/pci/drivers", problems)
    real = run / "host-sys-module"
    if host.on_host:
        copy_sys_module(Path("/sys/module"), real)
    module_dir = _tmpfs(host, "/sys/module", problems)
    copy_sys_module(real, module_dir)
    shutil.rmtree(real, ignore_errors=True)
    # The machine's own /proc/driver/nvidia means a real NVIDIA driver in the shared kernel: no device
    # nodes are made then (they would reach real GPUs); see kmod._render_dev.
    if host.on_host and host.p("/proc/driver/nvidia").exists():
        core.write_text(run / "real-nvidia-driver", "the machine running the lab has an NVIDIA driver\n")
        problems.append("a real NVIDIA driver is loaded on the machine running the lab: no GPU device nodes")
    _tmpfs(host, "/proc/driver", problems)
    with host.locked() as st:
        modules = host.p("/proc/modules")
        if host.on_host and modules.exists():
            with contextlib.suppress(OSError):
                st["base_modules"] = modules.read_text()
        kmod.render(host, st)
    if host.on_host and host.p("/proc/modules").exists():
        _bind_file(host, run / "proc-modules", "/proc/modules", problems)
    elif not host.on_host:
        (host.p("/proc")).mkdir(exist_ok=True)
    coldplug(host)
    watch.sync(host)
    for p in problems:
        sys.stderr.write(f"gpuprov-lab-hardware: {p}\n")
    essential = [p for p in problems if "/sys/bus/pci/devices" in p or "boot_id" in p]
    return 1 if essential else 0


def coldplug(host: core.Host) -> None:
    """What udev does at boot for the GPUs: load the driver whose modalias matches."""
    if not host.gpus():
        return
    if kmod.module_file(host, "nvidia") is not None and not kmod.blacklisted(host, "nvidia"):
        for name in ("nvidia", "nvidia_uvm"):
            try:
                kmod.load(host, name, "modprobe")
            except core.SimError as exc:
                sys.stderr.write(f"gpuprov-lab-hardware: {exc}\n")
                break
    elif not kmod.blacklisted(host, "nouveau"):
        with contextlib.suppress(core.SimError):
            kmod.load(host, "nouveau", "modprobe")


def main(prog: str, argv: list[str], **_: str) -> int:
    host = core.Host()
    if argv[:1] == ["--check"]:
        # Used by `gpuprov lab up` to see that the emulation loads at all.
        host.profile()
        return 0
    if os.geteuid() != 0 and host.on_host:
        sys.stderr.write(f"{prog}: must run as root\n")
        return 1
    return boot(host)
