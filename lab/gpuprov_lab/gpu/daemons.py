"""Part of the gpuprov lab simulation: nvidia-persistenced and nv-fabricmanager.

Both are forking daemons under systemd (Type=forking with a PID file), as the real ones are. While they
run they hold the NVIDIA device files open, so the nvidia module's reference count includes them and it
cannot be unloaded. They refuse to start the way the real ones do: persistenced when the driver cannot
be initialised (not loadable, or a different version than the daemon's), fabric manager when the host
has no NVSwitch or when its version is not the loaded driver's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable

from . import core, kmod, watch

PERSISTENCED_PID = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"
FABRICMANAGER_PID = "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
FABRICMANAGER_LOG = "/var/log/fabricmanager.log"


def _daemonize(host: core.Host, pidfile: str, run: Callable[[], None], stop: Callable[[], None]) -> int:
    """Fork into the background (parent returns once the PID file exists), then run until SIGTERM."""
    pid_path = host.p(pidfile)
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        ok = os.read(read_end, 1)
        return 0 if ok == b"1" else 1
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    def terminate(_sig: int, _frame: object) -> None:
        stop()
        with contextlib.suppress(OSError):
            pid_path.unlink()
        os._exit(0)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    try:
        run()
        pid_path.write_text(f"{os.getpid()}\n")
        os.write(write_end, b"1")
    except Exception:
        os.write(write_end, b"0")
        os._exit(1)
    os.close(write_end)
    while True:
        time.sleep(3600)


# ------------------------------------------------------------------------------- nvidia-persistenced


def persistenced_check(host: core.Host, version: str) -> str | None:
    """Why the daemon cannot initialise (its syslog line), or None."""
    watch.sync(host)
    if not kmod.ensure_loaded(host):
        return (
            "Failed to query NVIDIA devices. Please ensure that the NVIDIA device files (/dev/nvidia*) "
            "exist, and that user 0 has read and write permissions for those files."
        )
    loaded = kmod.driver_version(host.state())
    if loaded != version:
        return (
            f"Failed to initialize NVML: Driver/library version mismatch (module {loaded}, daemon {version})"
        )
    return None


def set_all_persistence(host: core.Host, on: bool) -> None:
    with host.locked() as st:
        module = kmod.loaded(st, "nvidia") or {}
        bound = set(module.get("bound", []))
        for g in host.gpus():
            if g["pci_address"] in bound:
                st["persistence"][g["bus_id"]] = on


def persistenced(host: core.Host, argv: list[str], version: str) -> int:
    if "--version" in argv or "-v" in argv:
        sys.stdout.write(f"\nnvidia-persistenced:  version {version}\n\n")
        return 0
    if host.on_host and os.geteuid() != 0:
        sys.stderr.write("nvidia-persistenced must be run as root\n")
        return 1
    problem = persistenced_check(host, version)
    if problem:
        sys.stderr.write(f"nvidia-persistenced: {problem}\n")
        sys.stderr.write("nvidia-persistenced failed to initialize. Check syslog for more details.\n")
        return 1
    persistence = "--no-persistence-mode" not in argv

    def run() -> None:
        kmod.add_user(host, "nvidia-persistenced", os.getpid())
        set_all_persistence(host, persistence)

    def stop() -> None:
        set_all_persistence(host, False)
        kmod.remove_user(host, "nvidia-persistenced")

    return _daemonize(host, PERSISTENCED_PID, run, stop)


# ---------------------------------------------------------------------------------- fabric manager


def _fm_log(host: core.Host, level: str, message: str) -> None:
    f = host.p(FABRICMANAGER_LOG)
    f.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%b %d %Y %H:%M:%S")
    with open(f, "a") as fh:
        fh.write(f"[{stamp}] [{level}] [tid {os.getpid()}] {message}\n")


def fabricmanager_check(host: core.Host, version: str) -> str | None:
    """Why fabric manager cannot start (what it logs), or None."""
    watch.sync(host)
    st = host.state()
    loaded = kmod.driver_version(st)
    if loaded is None:
        return (
            "request to query NVSwitch device information from NVSwitch driver failed with "
            "error:ERROR Operating System [NV_ERR_OPERATING_SYSTEM]"
        )
    if loaded != version:
        return (
            f"fabric manager NVIDIA GPU driver interface version {version} don't match with driver version "
            f"{loaded}. Please update with matching NVIDIA driver package."
        )
    module = kmod.loaded(st, "nvidia") or {}
    if not host.nvswitches() or not module.get("bound_switches"):
        return (
            "request to query NVSwitch device information from NVSwitch driver failed with "
            "error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]"
        )
    return None


def fabricmanager(host: core.Host, argv: list[str], version: str) -> int:
    if "--version" in argv or "-v" in argv:
        sys.stdout.write(f"Fabric Manager version is : {version}\n")
        return 0
    _fm_log(
        host, "INFO", f"Fabric Manager version {version} is running with the following configuration options"
    )
    problem = fabricmanager_check(host, version)
    if problem:
        _fm_log(host, "ERROR", problem)
        sys.stderr.write(f"{problem}\n")
        return 1
    switches = len(host.nvswitches())

    def run() -> None:
        kmod.add_user(host, "nv-fabricmanager", os.getpid())
        with host.locked() as st:
            st["fabric"] = "configured"
        _fm_log(host, "INFO", f"Successfully configured {switches} NVSwitch devices")
        _fm_log(
            host,
            "INFO",
            "Successfully configured all the available NVSwitches to route GPU NVLink traffic. NVLink "
            "Peer-to-Peer support will be enabled once the GPUs are successfully registered with the "
            "NVLink fabric.",
        )

    def stop() -> None:
        with host.locked() as st:
            st.pop("fabric", None)
        kmod.remove_user(host, "nv-fabricmanager")
        _fm_log(host, "INFO", "Fabric Manager stopped")

    return _daemonize(host, FABRICMANAGER_PID, run, stop)


def main(prog: str, argv: list[str], driver: str = "", **_: str) -> int:
    host = core.Host()
    if prog == "nvidia-persistenced":
        return persistenced(host, argv, driver)
    if prog == "nv-fabricmanager":
        return fabricmanager(host, argv, driver)
    sys.stderr.write(f"gpuprov lab daemons: unknown program {prog}\n")
    return 2
