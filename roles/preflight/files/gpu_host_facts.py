#!/usr/bin/env python3
"""Read-only probe of what preflight and nvidia_driver decide on: NVIDIA PCI devices, the loaded driver,
nouveau, Secure Boot, kernel headers, the kernels installed in /boot, dpkg/apt locks, free disk and memory.
One JSON document on stdout.

gpuprov's verification runs this same file for its PCI, kernel module, driver and Secure Boot facts
(`--sections pci,modules,driver,secure_boot --all-pci`), so the role and `gpuprov verify` read those facts
one way: here.

It reads /sys and /proc directly (lspci, mokutil and modinfo may be absent on a host), in one process so
that hundreds of hosts cost one round trip each, and changes nothing: locks are queried with F_GETLK,
never taken. Runs on the target's own Python 3 (3.8 or newer).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
from typing import Any

PCI = "/sys/bus/pci/devices"
NVIDIA = "0x10de"
EFI_SECURE_BOOT = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
LOCKS = (
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/lib/apt/lists/lock",
    "/var/cache/apt/archives/lock",
)
WATCHED_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem", "nouveau")


def read(path: str, default: str = "") -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return default


def pci_devices(all_vendors: bool = False, root: str = PCI) -> list[dict[str, str]]:
    """Functions on the PCI bus (NVIDIA's only, unless all_vendors): address, vendor and device ids,
    class, revision, bound driver. Read from sysfs, as lspci does."""
    out: list[dict[str, str]] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        d = os.path.join(root, name)
        vendor = read(os.path.join(d, "vendor")).lower()
        if not vendor or (vendor != NVIDIA and not all_vendors):
            continue  # (an entry without a vendor id is no PCI function)
        driver = os.path.join(d, "driver")
        out.append(
            {
                "address": name,
                "vendor": vendor,
                "device": read(os.path.join(d, "device")).lower(),
                "class": read(os.path.join(d, "class")).lower(),
                "revision": read(os.path.join(d, "revision")).lower(),
                "driver": os.path.basename(os.readlink(driver)) if os.path.islink(driver) else "",
            }
        )
    return out


def loaded_modules() -> dict[str, dict[str, Any]]:
    """The NVIDIA modules and nouveau that are loaded, with their reference count and the modules that
    use them: from /proc/modules, else from /sys/module/<name> (initstate, refcnt, holders/), which a
    kernel also exposes for every loaded module."""
    mods: dict[str, dict[str, Any]] = {}
    if os.path.exists("/proc/modules"):
        for line in read("/proc/modules").splitlines():
            parts = line.split()
            if parts and parts[0] in WATCHED_MODULES:
                users = parts[3] if len(parts) > 3 else "-"
                mods[parts[0]] = {
                    "refcount": int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0,
                    "used_by": [u for u in users.split(",") if u and u != "-"],
                }
        return mods
    for name in WATCHED_MODULES:
        d = f"/sys/module/{name}"
        if read(f"{d}/initstate") != "live":
            continue
        refcnt = read(f"{d}/refcnt", "0")
        try:
            holders = sorted(os.listdir(f"{d}/holders"))
        except OSError:
            holders = []
        mods[name] = {"refcount": int(refcnt) if refcnt.isdigit() else 0, "used_by": holders}
    return mods


def loaded_driver() -> dict[str, Any]:
    """Version and flavour of the loaded kernel module (the running driver, not the installed one)."""
    proc = read("/proc/driver/nvidia/version")
    first = proc.splitlines()[0] if proc else ""
    version = read("/sys/module/nvidia/version")
    if not version and first:
        m = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", first + " ")
        version = m.group(1) if m else ""
    flavor = ""
    if first:
        flavor = "open" if "Open Kernel Module" in first else "proprietary"
    return {"loaded": bool(version), "version": version, "flavor": flavor, "proc_version": first}


def secure_boot() -> dict[str, str]:
    """enabled / disabled / not_applicable (legacy BIOS) / unknown, and how that was found."""
    if shutil.which("mokutil"):
        try:
            res = subprocess.run(
                ["mokutil", "--sb-state"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=20,
                check=False,
            )
            text = res.stdout.lower()
            if "secureboot enabled" in text:
                return {"state": "enabled", "source": "mokutil --sb-state"}
            if "secureboot disabled" in text:
                return {"state": "disabled", "source": "mokutil --sb-state"}
            if "not supported" in text:
                return {"state": "not_applicable", "source": "mokutil: EFI variables not supported"}
        except (OSError, subprocess.SubprocessError):
            pass
    if not os.path.isdir("/sys/firmware/efi"):
        return {"state": "not_applicable", "source": "no /sys/firmware/efi (legacy BIOS boot)"}
    try:
        with open(EFI_SECURE_BOOT, "rb") as f:
            data = f.read()
        if len(data) >= 5:  # 4 bytes of attributes, then the value
            return {"state": "enabled" if data[4] == 1 else "disabled", "source": "EFI SecureBoot variable"}
    except OSError:
        pass
    return {"state": "unknown", "source": "EFI boot; neither mokutil nor the SecureBoot variable answered"}


def headers(kernel: str, query_apt: bool) -> dict[str, Any]:
    """Whether the running kernel's headers are installed, else what apt would install for them."""
    pkg = f"linux-headers-{kernel}"
    lists = [
        os.path.join("/var/lib/apt/lists", n)
        for n in (os.listdir("/var/lib/apt/lists") if os.path.isdir("/var/lib/apt/lists") else [])
        if "_Packages" in n
    ]
    out: dict[str, Any] = {
        "kernel": kernel,
        "build_dir": os.path.isdir(f"/lib/modules/{kernel}/build"),
        "package": pkg,
        "candidate": "",
        # apt's package lists: without them apt cannot tell whether the headers exist.
        "apt_lists": len(lists),
        "apt_lists_newest": int(max((os.path.getmtime(p) for p in lists), default=0)),
    }
    if query_apt and not out["build_dir"] and shutil.which("apt-cache"):
        try:
            res = subprocess.run(
                ["apt-cache", "policy", pkg],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                timeout=60,
                check=False,
            )
            m = re.search(r"^\s*Candidate:\s*(\S+)", res.stdout, re.M)
            if m and m.group(1) != "(none)":
                out["candidate"] = m.group(1)
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def lock_holder(path: str) -> int | None:
    """PID holding a write lock on path (dpkg and apt lock with fcntl), 0 when free, None when absent."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        # struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
        fmt = "hhqqi"
        req = struct.pack(fmt, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        res = fcntl.fcntl(fd, fcntl.F_GETLK, req + b"\0" * (32 - len(req)))
        l_type, _, _, _, pid = struct.unpack(fmt, res[: struct.calcsize(fmt)])
        return 0 if l_type == fcntl.F_UNLCK else pid
    except OSError:
        return None
    finally:
        os.close(fd)


def free_mb(path: str) -> dict[str, Any]:
    """Free space for unprivileged writers on the filesystem that holds path (or its nearest parent)."""
    while path and path != "/" and not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path or "/")
    return {"path": path or "/", "free_mb": st.f_bavail * st.f_frsize // (1024 * 1024)}


def boot_kernels(boot: str = "/boot") -> list[str]:
    """Kernel images installed in /boot: a package install that adds one means the host must boot it."""
    try:
        names = os.listdir(boot)
    except OSError:
        return []
    return sorted(os.path.join(boot, n) for n in names if n.startswith("vmlinuz-"))


def memory_mb() -> int:
    m = re.search(r"^MemTotal:\s+(\d+)\s+kB", read("/proc/meminfo"), re.M)
    return int(m.group(1)) // 1024 if m else 0


def locks_held() -> dict[str, dict[str, Any]]:
    locks = {}
    for p in LOCKS:
        pid = lock_holder(p)
        if pid:
            locks[p] = {"pid": pid, "process": read(f"/proc/{pid}/comm", "?")}
    return locks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--disk", action="append", default=[], help="path whose free space to report")
    ap.add_argument("--headers-apt", action="store_true", help="ask apt about the headers package")
    ap.add_argument("--sections", default="", help="comma-separated sections to read (default: all)")
    ap.add_argument("--all-pci", action="store_true", help="list every PCI function, not NVIDIA's only")
    args = ap.parse_args()
    readers = {
        "pci": lambda: pci_devices(args.all_pci),
        "modules": loaded_modules,
        "driver": loaded_driver,
        "secure_boot": secure_boot,
        "headers": lambda: headers(os.uname().release, args.headers_apt),
        "boot_kernels": boot_kernels,
        "locks_held": locks_held,
        "disk": lambda: {p: free_mb(p) for p in args.disk},
        "memory_mb": memory_mb,
        "nvidia_smi": lambda: shutil.which("nvidia-smi") or "",
    }
    wanted = [w for w in args.sections.split(",") if w] or list(readers)
    unknown = [w for w in wanted if w not in readers]
    if unknown:
        ap.error("unknown section(s): " + ", ".join(unknown))
    print(json.dumps({name: readers[name]() for name in wanted}, sort_keys=True))


if __name__ == "__main__":
    main()
