"""Part of the gpuprov lab simulation: faults injected by the controller, applied while the host runs.

faults.json changes at any time (``gpuprov lab fault``). :func:`sync` brings the simulated hardware in
line with it: when a fault first shows, its time is recorded (so an Xid appears in the kernel log at
the moment it "happened"), and the PCIe link attributes in sysfs follow the ``pcie`` fault. Every
simulated tool calls it before answering, and gpuprov-lab-faultwatch.service calls it every second.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

from gpuprovsim import core


def fault_key(f: dict[str, object]) -> str:
    return json.dumps(f, sort_keys=True)


def sync(host: core.Host) -> None:
    faults = host.faults()
    keys = {fault_key(f) for f in faults}
    with host.locked() as st:
        seen = st["fault_seen"]
        for k in list(seen):
            if k not in keys:
                del seen[k]  # cleared: the lab "repaired" it
        for k in sorted(keys):
            seen.setdefault(k, round(host.uptime(st), 6))
        from gpuprovsim import kmod

        kmod.users(st)  # daemons that died no longer hold the driver
        kmod.render(host, st)
    from gpuprovsim import boot  # boot imports this module

    with contextlib.suppress(OSError):
        boot.update_links(host)


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
