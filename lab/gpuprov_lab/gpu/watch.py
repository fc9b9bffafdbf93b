"""Part of the gpuprov lab simulation: faults injected by the controller, applied while the host runs.

faults.json changes at any time (``gpuprov lab fault``). :func:`sync` brings the simulated hardware in
line with it: when a fault first shows, its time is recorded (so an Xid appears in the kernel log at
the moment it "happened") and its boot (so a reboot clears what a reboot clears, recovery.py), and the
PCIe link attributes in sysfs follow the ``pcie`` fault. Every simulated tool calls it before
answering, and gpuprov-lab-faultwatch.service calls it every second.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

from . import core, kmod, recovery

fault_key = core.fault_key


def sync(host: core.Host) -> None:
    with host.locked() as st:
        recovery.note_boot(host, st)
        keys = {fault_key(f) for f in host.faults()}
        seen = st["fault_seen"]
        # An Xid a GPU reset cleared stays in this boot's kernel log, as on real hardware: the log keeps
        # the boot's lines until the next boot (whose state starts without them).
        logged = {k for k in seen if recovery.cleared_in_boot(host, k)}
        for k in list(seen):
            if k not in keys and k not in logged:
                del seen[k]  # removed by the controller, or cleared by a reboot
        for k in sorted(keys):
            seen.setdefault(k, round(host.uptime(st), 6))
        kmod.users(st)  # daemons that died no longer hold the driver
        kmod.render(host, st)
    with contextlib.suppress(OSError):
        update_links(host)


def link_now(host: core.Host, dev: dict[str, Any]) -> tuple[int, int]:
    """Current PCIe generation and width: the maximum, unless a pcie fault degrades that GPU."""
    gen, width = int(dev.get("link_gen_max", 3)), int(dev.get("link_width_max", 1))
    if dev.get("kind") == "gpu" and host.has_fault("pcie", dev["index"]):
        return max(1, gen - 2), max(1, width // 2)
    return gen, width


def link_speed(gen: int) -> str:
    rate = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0"}.get(gen, "64.0")
    return f"{rate} GT/s PCIe"


def update_links(host: core.Host) -> None:
    """Re-read the pcie faults into the GPUs' current_link_speed/width (faults change while the host runs)."""
    root = host.p("/sys/bus/pci/devices")
    for g in host.gpus():
        d = root / g["pci_address"]
        if not (d / ".gpuprov-sim").exists():
            continue
        gen, width = link_now(host, {**g, "kind": "gpu"})
        for name, value in (("current_link_speed", link_speed(gen)), ("current_link_width", str(width))):
            f = d / name
            with contextlib.suppress(OSError):
                if f.read_text().strip() != value:
                    core.write_text(f, value + "\n", 0o444)


def _holder_died(host: core.Host) -> bool:
    """A daemon that held the driver is gone (killed, crashed): its reference must go too."""
    try:
        st = json.loads((host.run_dir() / "state.json").read_text())
    except (OSError, ValueError):
        return False
    return any(not core.pid_alive(int(pid)) for pid in st.get("users", {}).values())


def main(prog: str, argv: list[str], **_: str) -> int:
    host = core.Host()
    interval = float(argv[0]) if argv else 1.0
    last = None
    while True:
        try:
            stamp = host.p(core.FAULTS).stat().st_mtime_ns
        except OSError:
            stamp = None
        if stamp != last or _holder_died(host):
            try:
                sync(host)
                last = stamp
            except Exception as exc:  # keep watching; say what went wrong
                sys.stderr.write(f"{prog}: {exc}\n")
        time.sleep(interval)
