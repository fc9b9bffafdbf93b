"""Part of the gpuprov lab simulation: the NVIDIA kernel modules of a lab host.

The lab's containers share the controller's kernel, which has no NVIDIA module (and may have no module
support at all). This module keeps the simulated kernel's module list in the run-time state and renders
what a real kernel shows from it: /proc/modules (bind-mounted when the kernel has that file),
/sys/module/<name>, /proc/driver/nvidia, the driver links of the GPUs in /sys/bus/pci/devices, the
/dev/nvidia* nodes and this boot's kernel log. ``modprobe``, ``rmmod``, ``lsmod`` and
``nvidia-modprobe`` are served from here for nvidia*/nouveau and handed to the real kmod otherwise.

Modules are "loaded" from the files the DKMS packages installed (/lib/modules/$(uname -r)/updates/dkms),
with the version and licence their modinfo carries, and refused the way the real driver refuses: no GPU
to drive, a version other than the loaded nvidia module's, unloading while in use.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

from . import core

# name → (size in bytes for open/proprietary, modules it depends on)
MODULES: dict[str, tuple[int, int, tuple[str, ...]]] = {
    "nvidia": (14299136, 62210048, ()),
    "nvidia_uvm": (1875968, 1875968, ("nvidia",)),
    "nvidia_modeset": (1540096, 1540096, ("nvidia",)),
    "nvidia_drm": (126976, 126976, ("nvidia_modeset",)),
    "nvidia_peermem": (16384, 16384, ("nvidia",)),
    "nouveau": (2732032, 2732032, ()),
}
REAL_KMOD = "/bin/kmod"
NVIDIA_MAJOR = 195
UVM_MAJOR = 510
CAPS_MAJOR = 511
BLACKLIST_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/lib/modprobe.d", "/lib/modprobe.d")
# modprobe options that ask about kmod's configuration rather than load anything: the real one answers.
QUERY_OPTIONS = ("-c", "--showconfig", "--show-depends", "-D", "-R", "--resolve-alias", "--dump-modversions")


def canonical(name: str) -> str:
    return name.replace("-", "_")


def is_sim(name: str) -> bool:
    return canonical(Path(name).name.removesuffix(".ko")) in MODULES


# ------------------------------------------------------------------------------------- module files


def read_modinfo(path: Path) -> dict[str, str]:
    """The .modinfo section of an ELF module: key=value strings, as modinfo(8) reads them."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not an ELF64 object")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = []
    for i in range(shnum):
        off = shoff + i * shentsize
        name, _type, _flags, _addr, s_off, s_size = struct.unpack_from("<IIQQQQ", data, off)
        sections.append((name, s_off, s_size))
    _, str_off, _ = sections[shstrndx]
    info: dict[str, str] = {}
    for name, s_off, s_size in sections:
        end = data.index(b"\0", str_off + name)
        if data[str_off + name : end] != b".modinfo":
            continue
        for item in data[s_off : s_off + s_size].split(b"\0"):
            key, sep, value = item.decode(errors="replace").partition("=")
            if sep:
                info.setdefault(key, value)
    return info


def module_file(host: core.Host, name: str) -> Path | None:
    """The installed .ko for a simulated module (DKMS installs to updates/dkms)."""
    name = canonical(name)
    if name == "nouveau":
        return None  # in-tree: always available in the simulated kernel
    base = host.modules_dir()
    for sub in ("updates/dkms", "updates", "extra", "kernel/drivers/video"):
        for stem in (name.replace("_", "-"), name):
            f = base / sub / f"{stem}.ko"
            if f.is_file():
                return f
    return None


def blacklisted(host: core.Host, name: str) -> bool:
    """`blacklist NAME` in a modprobe.d file (honoured for automatic loading, as the kernel does)."""
    for d in BLACKLIST_DIRS:
        dirp = host.p(d)
        if not dirp.is_dir():
            continue
        for f in sorted(dirp.glob("*.conf")):
            try:
                lines = f.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                words = line.split("#", 1)[0].split()
                if len(words) >= 2 and words[0] == "blacklist" and canonical(words[1]) == canonical(name):
                    return True
    return False


# ------------------------------------------------------------------------------------------ queries


def loaded(st: dict[str, Any], name: str) -> dict[str, Any] | None:
    name = canonical(name)
    return next((m for m in st["modules"] if m["name"] == name), None)


def holders(st: dict[str, Any], name: str) -> list[str]:
    """Loaded modules that depend on name (its "used by" list)."""
    return [m["name"] for m in reversed(st["modules"]) if canonical(name) in m.get("deps", [])]


def users(st: dict[str, Any]) -> dict[str, int]:
    """Processes holding /dev/nvidia* open (daemons register themselves), pruned of dead ones. Only a
    process that sees the daemons' PIDs may judge them: a pod's container (the operator's validator runs
    nvidia-smi) has PIDs of its own, where every daemon of the host would look dead."""
    ns = core.pid_namespace()
    if st.get("users_pid_ns") not in (None, ns):
        return dict(st["users"])
    alive = {prog: pid for prog, pid in st["users"].items() if core.pid_alive(int(pid))}
    st["users"] = alive
    return alive


def add_user(host: core.Host, prog: str, pid: int) -> None:
    """A daemon holds /dev/nvidia* open from now on (it counts in the nvidia module's references)."""
    with host.locked() as st:
        users(st)
        st["users"][prog] = pid
        st["users_pid_ns"] = core.pid_namespace()
        render(host, st)


def remove_user(host: core.Host, prog: str) -> None:
    with host.locked() as st:
        st["users"].pop(prog, None)
        render(host, st)


def refcount(st: dict[str, Any], name: str) -> int:
    n = len(holders(st, name))
    if canonical(name) == "nvidia":
        n += len(users(st))
    return n


def driver_version(st: dict[str, Any]) -> str | None:
    m = loaded(st, "nvidia")
    return m["version"] if m else None


def visible_gpus(host: core.Host) -> list[dict[str, Any]]:
    """GPUs the driver can see: on the bus and not "fallen off" (gpu-missing)."""
    return [g for g in host.gpus() if not host.has_fault("gpu-missing", g["index"])]


def nvrm_banner(m: dict[str, Any]) -> str:
    kind = (
        "NVIDIA UNIX Open Kernel Module for x86_64"
        if m["flavour"] == "open"
        else "NVIDIA UNIX x86_64 Kernel Module"
    )
    return f"{kind}  {m['version']}  Release Build  ({m['builder']})  {m['built']}"


# ------------------------------------------------------------------------------------------- errors


class KmodError(core.SimError):
    pass


# -------------------------------------------------------------------------------------------- load


def load(host: core.Host, name: str, prog: str = "modprobe") -> list[str]:
    """Load a simulated module (and what it depends on); return the names newly loaded."""
    done: list[str] = []
    with host.locked() as st:
        _load(host, st, canonical(name), prog, done)
        render(host, st)
    return done


def _load(host: core.Host, st: dict[str, Any], name: str, prog: str, done: list[str]) -> None:
    if loaded(st, name):
        return
    size_open, size_prop, deps = MODULES[name]
    for dep in deps:
        if not loaded(st, dep):
            _load(host, st, dep, prog, done)
    kernel = host.kernel_release()
    if name == "nouveau":
        entry = {"name": name, "version": "", "flavour": "in-tree", "size": size_open, "deps": []}
        lines = []
        for g in host.gpus():
            chip = {"Hopper": "180000a1", "Ampere": "170000a1", "Ada Lovelace": "192000a1"}.get(
                g["architecture"], "1b0000a1"
            )
            lines += [
                f"nouveau {g['pci_address']}: unknown chipset ({chip})",
                f"nouveau: probe of {g['pci_address']} failed with error -22",
            ]
        host.log(st, *lines)
        _add(host, st, entry)
        done.append(name)
        return
    f = module_file(host, name)
    if f is None:
        raise KmodError(f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{kernel}")
    try:
        info = read_modinfo(f)
    except (OSError, ValueError, struct.error) as exc:
        raise KmodError(f"{prog}: ERROR: could not insert '{name}': Exec format error ({exc})") from exc
    flavour = "open" if "GPL" in info.get("license", "") else "proprietary"
    version = info.get("version", "")
    vermagic = info.get("vermagic", "").split(" ", 1)[0]
    if vermagic and vermagic != kernel:
        host.log(st, f"{name}: disagrees about version of symbol module_layout")
        raise KmodError(f"{prog}: ERROR: could not insert '{name}': Exec format error")
    nvidia = loaded(st, "nvidia")
    if name != "nvidia" and nvidia and nvidia["version"] != version:
        host.log(st, f"{name}: disagrees about version of symbol nvUvmInterfaceRegisterGpu")
        raise KmodError(f"{prog}: ERROR: could not insert '{name}': Invalid argument")
    lines: list[str] = []
    if not st.get("tainted"):
        st["tainted"] = True
        lines += [
            f"{name}: loading out-of-tree module taints kernel.",
            f"{name}: module verification failed: signature and/or required key missing - tainting kernel",
        ]
    if flavour == "proprietary" and not st.get("tainted_license"):
        st["tainted_license"] = True
        lines += [
            f"{name}: module license 'NVIDIA' taints kernel.",
            "Disabling lock debugging due to kernel taint",
        ]
    built = time.strftime("%a %b %e %H:%M:%S UTC %Y", time.gmtime(f.stat().st_mtime))
    entry = {
        "name": name,
        "version": version,
        "flavour": flavour,
        "size": size_open if flavour == "open" else size_prop,
        "deps": list(deps),
        "builder": f"root@{host.profile().get('hostname', 'localhost')}",
        "built": built,
        "file": str(f),
    }
    if name == "nvidia":
        lines += _nvidia_probe(host, entry)
        if entry.get("refused"):
            host.log(st, *lines)
            raise KmodError(f"{prog}: ERROR: could not insert 'nvidia': No such device")
    elif name == "nvidia_uvm":
        lines.append(f"nvidia-uvm: Loaded the UVM driver, major device number {UVM_MAJOR}.")
    elif name == "nvidia_modeset":
        banner = nvrm_banner(entry).replace("Kernel Module", "Kernel Mode Setting Driver")
        lines.append(f"nvidia-modeset: Loading {banner}")
    elif name == "nvidia_drm":
        for i, g in enumerate(visible_gpus(host)):
            bus = int(g["pci_address"].split(":")[1], 16)
            lines += [
                f"[drm] [nvidia-drm] [GPU ID 0x0000{bus:02x}00] Loading driver",
                f"[drm] Initialized nvidia-drm 0.0.0 for {g['pci_address']} on minor {i + 1}",
            ]
    elif name == "nvidia_peermem":
        host.log(st, *lines, "nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -2)")
        raise KmodError(
            f"{prog}: ERROR: could not insert 'nvidia_peermem': Unknown symbol in module, "
            "or unknown parameter (see dmesg)"
        )
    host.log(st, *lines)
    _add(host, st, entry)
    done.append(name)


def _nvidia_probe(host: core.Host, entry: dict[str, Any]) -> list[str]:
    """What nvidia.ko prints while probing the GPUs; sets entry["refused"] when it binds none."""
    lines: list[str] = []
    gpus = visible_gpus(host)  # the lab's GPUs are Turing to Hopper: both module flavours drive them
    for g in (g for g in host.gpus() if g not in gpus):
        lines += [
            f"NVRM: GPU {g['pci_address']}: RmInitAdapter failed! (0x22:0x56:667)",
            f"NVRM: GPU {g['pci_address']}: rm_init_adapter failed, device minor number {g['minor_number']}",
        ]
    if not gpus:
        entry["refused"] = True
        return [*lines, "NVRM: No NVIDIA GPU found."]
    entry["bound"] = [g["pci_address"] for g in gpus]
    entry["bound_switches"] = [s["pci_address"] for s in host.nvswitches()]
    return [
        *lines,
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 240",
        "",
        f"NVRM: loading {nvrm_banner(entry)}",
    ]


def _add(host: core.Host, st: dict[str, Any], entry: dict[str, Any]) -> None:
    entry["at"] = round(host.uptime(st), 6)
    entry["addr"] = 0xFFFFFFFFC0400000 + 0x40C000 * len(st["modules"])
    st["modules"].append(entry)


# ------------------------------------------------------------------------------------------ unload


def unload(host: core.Host, name: str, prog: str = "rmmod", with_deps: bool = False) -> list[str]:
    """Unload a module; with_deps (modprobe -r) also drops the modules it used that are now unused."""
    removed: list[str] = []
    with host.locked() as st:
        name = canonical(name)
        m = loaded(st, name)
        if m is None:
            if prog == "rmmod":
                raise KmodError(f"rmmod: ERROR: Module {name} is not currently loaded")
            raise KmodError(f"modprobe: FATAL: Module {name} is not in kernel.")
        held = holders(st, name)
        if held or refcount(st, name):
            render(host, st)  # the reference counts shown must be the ones just judged
            if prog == "rmmod":
                if held:
                    raise KmodError(f"rmmod: ERROR: Module {name} is in use by: {' '.join(held)}")
                raise KmodError(f"rmmod: ERROR: Module {name} is in use")
            raise KmodError(f"modprobe: FATAL: Module {name} is in use.")
        _remove(host, st, m)
        removed.append(name)
        if with_deps:
            queue = list(m.get("deps", []))
            while queue:
                dep = queue.pop(0)
                dm = loaded(st, dep)
                if dm and not refcount(st, dep):
                    _remove(host, st, dm)
                    removed.append(dep)
                    queue += dm.get("deps", [])
        render(host, st)
    return removed


def _remove(host: core.Host, st: dict[str, Any], m: dict[str, Any]) -> None:
    st["modules"] = [x for x in st["modules"] if x["name"] != m["name"]]
    msg = {
        "nvidia_uvm": "nvidia-uvm: Unloaded the UVM driver.",
        "nvidia_modeset": "nvidia-modeset: Unloading",
        "nvidia_drm": "[drm] [nvidia-drm] [GPU ID 0x00000000] Unloading driver",
    }.get(m["name"])
    if msg:
        host.log(st, msg)
    if m["name"] == "nvidia":
        st["persistence"] = {}


# ------------------------------------------------------------------------------------------ render


def proc_modules_text(host: core.Host, st: dict[str, Any]) -> str:
    """/proc/modules: newest first; "name size refcnt holders, state address (taints)"."""
    lines = []
    for m in reversed(st["modules"]):
        held = holders(st, m["name"])
        used = "".join(f"{h}," for h in held) or "-"
        taint = "" if m["flavour"] == "in-tree" else ("(OE)" if m["flavour"] == "open" else "(POE)")
        lines.append(
            f"{m['name']} {m['size']} {refcount(st, m['name'])} {used} Live 0x{m['addr']:016x}"
            + (f" {taint}" if taint else "")
        )
    base = st.get("base_modules", "")
    return "\n".join(lines) + ("\n" if lines else "") + base


def render(host: core.Host, st: dict[str, Any]) -> None:
    """Make every kernel-facing file agree with the module state."""
    core.write_text(host.run_dir() / "proc-modules", proc_modules_text(host, st))
    _render_sys_module(host, st)
    _render_proc_driver(host, st)
    _render_pci_drivers(host, st)
    _render_dev(host, st)
    _render_nvml(host, st)


# CUDA version the driver of a branch reports (nvidia-smi's "CUDA Version"; the H200 capture: 580 → 13.0).
BRANCH_CUDA = {"570": "12.8", "575": "12.9", "580": "13.0", "590": "13.1", "595": "13.2"}


def nvml_gpus(host: core.Host, st: dict[str, Any]) -> list[dict[str, Any]]:
    """GPUs NVML enumerates: bound when the module loaded and still on the bus (gpu-missing hides one),
    in bus order."""
    module = loaded(st, "nvidia") or {}
    bound = set(module.get("bound", []))
    return [g for g in visible_gpus(host) if g["pci_address"] in bound]


def _render_nvml(host: core.Host, st: dict[str, Any]) -> None:
    """NVIDIA's mock NVML reads MOCK_NVML_CONFIG (set for every process of a lab host, see
    /etc/environment and systemd's DefaultEnvironment). While the nvidia module is loaded that file is
    the host's device description (/etc/gpuprov-lab/nvml-mock.yaml, written by `gpuprov lab up` as JSON,
    which YAML reads too) with the loaded driver's versions and only the GPUs NVML would enumerate (a GPU
    that fell off the bus is gone, the others renumbered in bus order, as NVML does); without the module
    there is no file and nvmlInit fails."""
    target = host.run_dir() / "nvml.yaml"
    version = driver_version(st)
    template = host.p(core.NVML_TEMPLATE)
    if version is None or not template.is_file():
        target.unlink(missing_ok=True)
        return
    cuda = BRANCH_CUDA.get(version.split(".")[0], "13.0")
    major, minor = cuda.split(".")
    lines = template.read_text().splitlines(keepends=True)
    header = "".join(ln for ln in lines if ln.startswith("#"))
    doc = json.loads("".join(ln for ln in lines if not ln.startswith("#")))
    seen = {g["bus_id"].upper() for g in nvml_gpus(host, st)}
    devices = [d for d in doc.get("devices") or [] if str(d["pci"]["bus_id"]).upper() in seen]
    for index, device in enumerate(devices):
        device["index"] = index
    system = {
        "driver_version": version,
        "nvml_version": f"{major}.{version}",
        "cuda_version": cuda,
        "cuda_version_major": int(major),
        "cuda_version_minor": int(minor),
    }
    text = header + json.dumps({"system": system, **doc, "devices": devices}, indent=1) + "\n"
    if not target.is_file() or target.read_text() != text:
        tmp = target.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, target)
    # The same file in the simulated module's sysfs directory (a lab-only file): the GPU Operator's
    # operands see the host's /sys and little else of it, and the lab's inventory points their
    # MOCK_NVML_CONFIG here. It goes away with the module, as NVML's answers do.
    module_dir = host.p(OPERAND_NVML).parent
    if module_dir.parent.is_dir():
        core.write_text(host.p(OPERAND_NVML), text, 0o444)


# Where operands read the mock NVML's configuration (/sys/module/nvidia exists while the module is loaded).
OPERAND_NVML = "/sys/module/nvidia/gpuprov-lab/nvml.yaml"


def _render_sys_module(host: core.Host, st: dict[str, Any]) -> None:
    root = host.p("/sys/module")
    names = {m["name"] for m in st["modules"]}
    for name in MODULES:
        d = root / name
        if name not in names:
            if d.is_dir() and (d / ".gpuprov-sim").exists():
                _rmtree(d)
            continue
        m = loaded(st, name)
        assert m is not None
        d.mkdir(parents=True, exist_ok=True)
        (d / ".gpuprov-sim").touch()
        core.write_text(d / "initstate", "live\n")
        core.write_text(d / "refcnt", f"{refcount(st, name)}\n")
        core.write_text(d / "coresize", f"{m['size']}\n")
        core.write_text(
            d / "taint", "" if m["flavour"] == "in-tree" else ("OE\n" if m["flavour"] == "open" else "POE\n")
        )
        if m["version"]:
            core.write_text(d / "version", f"{m['version']}\n")
            src = hashlib.md5(m["version"].encode()).hexdigest()[:23].upper()
            core.write_text(d / "srcversion", f"{src}\n")
        hd = d / "holders"
        hd.mkdir(exist_ok=True)
        want = set(holders(st, name))
        for existing in hd.iterdir():
            if existing.name not in want:
                existing.unlink()
        for h in want:
            link = hd / h
            if not link.is_symlink():
                link.symlink_to(f"../../{h}")
        (d / "parameters").mkdir(exist_ok=True)


def _render_proc_driver(host: core.Host, st: dict[str, Any]) -> None:
    d = host.p("/proc/driver/nvidia")
    m = loaded(st, "nvidia")
    if m is None:
        if d.exists():
            _rmtree(d)
        return
    d.mkdir(parents=True, exist_ok=True)
    gcc = "gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) "
    core.write_text(d / "version", f"NVRM version: {nvrm_banner(m)}\nGCC version:  {gcc}\n", 0o444)
    core.write_text(
        d / "params",
        "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n"
        "DeviceFileGID: 0\nDeviceFileMode: 438\nInitializeSystemMemoryAllocations: 1\n"
        "UsePageAttributeTable: 4294967295\nEnableMSI: 1\nEnableGpuFirmware: 18\n"
        "EnableStreamMemOPs: 0\nOpenRmEnableUnsupportedGpus: 1\n",
        0o444,
    )
    core.write_text(d / "registry", 'Binary: ""\n', 0o444)
    gd = d / "gpus"
    gd.mkdir(exist_ok=True)
    bound = set(m.get("bound", []))
    for existing in gd.iterdir():
        if existing.name not in bound:
            _rmtree(existing)
    for g in host.gpus():
        if g["pci_address"] not in bound:
            continue
        info = (
            f"Model: \t\t {g['name']}\n"
            f"IRQ:   \t\t {64 + g['index']}\n"
            f"GPU UUID: \t {g['uuid']}\n"
            f"Video BIOS: \t {g['vbios'].lower()}\n"
            "Bus Type: \t PCIe\n"
            "DMA Size: \t 52 bits\n"
            "DMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {g['pci_address']}\n"
            f"Device Minor: \t {g['minor_number']}\n"
            f"GPU Firmware: \t {m['version']}\n"
            "GPU Excluded:\t No\n"
        )
        core.write_text(gd / g["pci_address"] / "information", info, 0o444)


def _render_pci_drivers(host: core.Host, st: dict[str, Any]) -> None:
    """driver -> ../../drivers/<name> links on the simulated PCI devices, as binding makes them."""
    devices = host.p("/sys/bus/pci/devices")
    if not devices.is_dir():
        return
    m = loaded(st, "nvidia")
    bound = set(m.get("bound", [])) if m else set()
    switches = set(m.get("bound_switches", [])) if m else set()
    for d in devices.iterdir():
        if not (d / ".gpuprov-sim").exists():
            continue
        link = d / "driver"
        want = "nvidia" if d.name in bound else "nvidia-nvswitch" if d.name in switches else None
        have = os.readlink(link).rsplit("/", 1)[-1] if link.is_symlink() else None
        if have == want:
            continue
        if link.is_symlink():
            link.unlink()
        if want:
            link.symlink_to(f"../../drivers/{want}")
        _driver_links(host, d.name, have, want)
        uevent = d / "uevent"
        if uevent.exists():
            lines = [ln for ln in uevent.read_text().splitlines() if not ln.startswith("DRIVER=")]
            core.write_text(uevent, "\n".join(([f"DRIVER={want}"] if want else []) + lines) + "\n")


def _driver_links(host: core.Host, address: str, old: str | None, new: str | None) -> None:
    """/sys/bus/pci/drivers/<driver>/<address> links, so tools that resolve the driver link find it."""
    drivers = host.p("/sys/bus/pci/drivers")
    if not (drivers / ".gpuprov-sim").exists():
        return
    if old and (drivers / old / address).is_symlink():
        (drivers / old / address).unlink()
    if new:
        (drivers / new).mkdir(exist_ok=True)
        link = drivers / new / address
        if not link.is_symlink():
            link.symlink_to(f"../../devices/{address}")


def _render_dev(host: core.Host, st: dict[str, Any]) -> None:
    """/dev/nvidia* nodes, as the driver's udev rules and nvidia-modprobe create them."""
    m = loaded(st, "nvidia")
    if m is None:
        return
    if (host.run_dir() / "real-nvidia-driver").exists():
        return  # the shared kernel has a real NVIDIA driver: these nodes would open its real GPUs
    dev = host.p("/dev")
    nodes: list[tuple[str, int, int]] = [("nvidiactl", NVIDIA_MAJOR, 255)]
    for g in host.gpus():
        if g["pci_address"] in m.get("bound", []):
            nodes.append((f"nvidia{g['minor_number']}", NVIDIA_MAJOR, int(g["minor_number"])))
    if loaded(st, "nvidia_uvm"):
        nodes += [("nvidia-uvm", UVM_MAJOR, 0), ("nvidia-uvm-tools", UVM_MAJOR, 1)]
    if loaded(st, "nvidia_modeset"):
        nodes.append(("nvidia-modeset", NVIDIA_MAJOR, 254))
    nodes += [("nvidia-caps/nvidia-cap1", CAPS_MAJOR, 1), ("nvidia-caps/nvidia-cap2", CAPS_MAJOR, 2)]
    for rel, major, minor in nodes:
        path = dev / rel
        if path.exists() or path.is_symlink():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if host.on_host:
                os.mknod(path, 0o20666, os.makedev(major, minor))
            else:
                path.write_text(f"char {major}:{minor}\n")
            path.chmod(0o666 if "caps" not in rel else 0o400)
        except OSError as exc:
            sys.stderr.write(f"gpuprov lab: cannot create {path}: {exc.strerror}\n")


def _rmtree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    for child in path.iterdir():
        _rmtree(child)
    path.rmdir()


# -------------------------------------------------------------------------------------------- CLIs


def _exec_real(prog: str, argv: list[str]) -> int:
    os.execv(REAL_KMOD, [prog, *argv])
    return 127  # not reached


def _report(exc: core.SimError, quiet: bool = False) -> int:
    if not quiet:
        sys.stderr.write(str(exc) + "\n")
    return exc.rc


def modprobe(host: core.Host, argv: list[str]) -> int:
    flags: set[str] = set()
    names: list[str] = []
    passthrough_only = False
    for a in argv:
        if a.startswith("--") or (a.startswith("-") and len(a) > 1):
            if a in QUERY_OPTIONS:
                passthrough_only = True
            if a.startswith("--"):
                flags.add(a)
            else:
                flags.update(f"-{c}" for c in a[1:])
        else:
            names.append(a)
    remove = "-r" in flags or "--remove" in flags
    every = remove or "-a" in flags or "--all" in flags
    quiet = "-q" in flags or "--quiet" in flags
    dry = "-n" in flags or "--dry-run" in flags
    mods = names if every else names[:1]
    if passthrough_only or not any(is_sim(n) for n in mods):
        return _exec_real("modprobe", argv)
    rc = 0
    for n in mods:
        if not is_sim(n):
            real = [a for a in argv if a not in mods or a == n]
            r = os.spawnv(os.P_WAIT, REAL_KMOD, ["modprobe", *real])
            rc = rc or r
            continue
        if dry:
            continue
        try:
            if remove:
                unload(host, n, "modprobe", with_deps=True)
            else:
                load(host, n, "modprobe")
        except core.SimError as exc:
            rc = _report(exc, quiet and "not found" in str(exc))
            if remove:
                break  # kmod stops removing at the first module it cannot remove
    return rc


def rmmod(host: core.Host, argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("-")]
    if not names or not any(is_sim(n) for n in names):
        return _exec_real("rmmod", argv)
    rc = 0
    for n in names:
        if not is_sim(n):
            rc = rc or os.spawnv(os.P_WAIT, REAL_KMOD, ["rmmod", n])
            continue
        try:
            unload(host, Path(n).name.removesuffix(".ko"), "rmmod")
        except core.SimError as exc:
            rc = _report(exc)
    return rc


def lsmod_text(host: core.Host) -> str:
    text = host.run_dir().joinpath("proc-modules")
    try:
        lines = text.read_text().splitlines()
    except OSError:
        lines = []
    out = ["Module                  Size  Used by"]
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        name, size, count, used = parts[:4]
        used = "" if used == "-" else used.rstrip(",")
        out.append(f"{name:<19} {int(size):>8}  {count}" + (f" {used}" if used else ""))
    return "\n".join(out) + "\n"


def nvidia_modprobe(host: core.Host, argv: list[str], version: str = "") -> int:
    """nvidia-modprobe: load nvidia (-u: nvidia_uvm, -m: nvidia_modeset) and create the device nodes."""
    wanted = ["nvidia"]
    if "-u" in argv or "--unified-memory" in argv:
        wanted.append("nvidia_uvm")
    if "-m" in argv or "--modeset" in argv:
        wanted.append("nvidia_modeset")
    if "--version" in argv or "-v" in argv:
        sys.stdout.write(f"\nnvidia-modprobe:  version {version}\n")
        return 0
    try:
        for n in wanted:
            load(host, n, "nvidia-modprobe")
    except core.SimError:
        return 1
    return 0


def ensure_loaded(host: core.Host) -> bool:
    """What NVML does when the module is absent: run nvidia-modprobe (when installed). True when loaded."""
    st = host.state()
    if loaded(st, "nvidia"):
        return True
    if not host.p("/usr/bin/nvidia-modprobe").exists():
        return False
    try:
        load(host, "nvidia", "nvidia-modprobe")
    except core.SimError:
        return False
    return True


def main(prog: str, argv: list[str], driver: str = "", **_: str) -> int:
    host = core.Host()
    if prog == "modprobe":
        return modprobe(host, argv)
    if prog == "rmmod":
        return rmmod(host, argv)
    if prog == "lsmod":
        sys.stdout.write(lsmod_text(host))
        return 0
    if prog == "nvidia-modprobe":
        return nvidia_modprobe(host, argv, driver)
    sys.stderr.write(f"gpuprov lab kmod: unknown program {prog}\n")
    return 2
