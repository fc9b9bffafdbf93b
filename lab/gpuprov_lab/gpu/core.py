"""Part of the gpuprov lab simulation: paths, profile, faults and run-time state of a lab host.

A :class:`Host` is the machine the simulated tools run on. Its ``root`` is ``/`` on a lab host and a
temporary directory in unit tests (GPUPROV_SIM_ROOT). Run-time state is one JSON document under
/run/gpuprov-lab, changed under a lock, so concurrent tools (modprobe from a role, nvidia-smi from a
probe, the fault watcher) see one consistent "kernel".

An injected fault is an event on the GPU: which boot first showed it, and whether a GPU reset or a
reboot has since cleared it (see recovery.py), is kept in FAULT_EVENTS, outside /run, so a cleared
fault stays cleared across reboots while it stays in faults.json.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROFILE = "/etc/gpuprov-lab/profile.json"
FAULTS = "/etc/gpuprov-lab/faults.json"
# NVIDIA's mock NVML configuration of this host's GPUs, without its system section (see kmod._render_nvml).
NVML_TEMPLATE = "/etc/gpuprov-lab/nvml-mock.yaml"
RUN = "/run/gpuprov-lab"
# Injected fault (its key) → {"boot": boot id that first showed it, "cleared": "reset"/"reboot"}; kept
# across reboots (a container restart keeps /var/lib).
FAULT_EVENTS = "/var/lib/gpuprov-lab/fault-events.json"
SIMULATED = "SIMULATED (gpuprov lab)"


class SimError(Exception):
    """A simulated tool cannot proceed; the message is what the real tool would print."""

    def __init__(self, message: str, rc: int = 1) -> None:
        super().__init__(message)
        self.rc = rc


class Host:
    """One lab host as the simulated tools see it."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root if root is not None else os.environ.get("GPUPROV_SIM_ROOT") or "/")
        self._profile: dict[str, Any] | None = None

    # ------------------------------------------------------------------------------------- paths

    def p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    @property
    def on_host(self) -> bool:
        """True on a real lab host (root /), where mounts and device nodes are made for real."""
        return self.root == Path("/")

    def kernel_release(self) -> str:
        return os.environ.get("GPUPROV_SIM_KERNEL") or os.uname().release

    def modules_dir(self) -> Path:
        return self.p(f"/lib/modules/{self.kernel_release()}")

    def run_dir(self) -> Path:
        d = self.p(RUN)
        d.mkdir(parents=True, exist_ok=True)
        return d

    # ----------------------------------------------------------------------------------- profile

    def profile(self) -> dict[str, Any]:
        """profile.json; a host without one has no GPU (the control plane)."""
        if self._profile is None:
            try:
                doc = json.loads(self.p(PROFILE).read_text())
            except (OSError, ValueError):
                doc = {}
            doc.setdefault("gpus", [])
            doc.setdefault("nvswitches", [])
            doc.setdefault("other_devices", [])
            doc.setdefault("hostname", os.uname().nodename)
            self._profile = doc
        return self._profile

    def gpus(self) -> list[dict[str, Any]]:
        return list(self.profile()["gpus"])

    def nvswitches(self) -> list[dict[str, Any]]:
        return list(self.profile()["nvswitches"])

    # ------------------------------------------------------------------------------------ faults

    def injected(self) -> list[dict[str, Any]]:
        """The faults the controller injected (read live: it rewrites the file at any time)."""
        try:
            doc = json.loads(self.p(FAULTS).read_text())
        except (OSError, ValueError):
            return []
        return [f for f in doc.get("faults", []) if isinstance(f, dict) and "kind" in f]

    def fault_events(self) -> dict[str, dict[str, Any]]:
        """FAULT_EVENTS: fault key → its event record."""
        try:
            doc = json.loads(self.p(FAULT_EVENTS).read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in doc.get("events", {}).items() if isinstance(v, dict)}

    def save_fault_events(self, events: dict[str, dict[str, Any]]) -> None:
        """Write FAULT_EVENTS (callers hold :meth:`locked`)."""
        path = self.p(FAULT_EVENTS)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"events": events}, indent=1, sort_keys=True))
        os.replace(tmp, path)

    def faults(self) -> list[dict[str, Any]]:
        """The faults in force now: injected and not cleared by a GPU reset or a reboot since."""
        events = self.fault_events()
        return [f for f in self.injected() if not events.get(fault_key(f), {}).get("cleared")]

    def cleared_faults(self) -> list[dict[str, Any]]:
        """Injected faults that a GPU reset or a reboot cleared (what they leave: a remapped row, the
        aggregate ECC count)."""
        events = self.fault_events()
        return [f for f in self.injected() if events.get(fault_key(f), {}).get("cleared")]

    def has_fault(self, kind: str, index: int | None = None) -> bool:
        return _any_fault(self.faults(), kind, index)

    def had_fault(self, kind: str, index: int | None = None) -> bool:
        """A fault of this kind happened on the GPU and was cleared."""
        return _any_fault(self.cleared_faults(), kind, index)

    # ------------------------------------------------------------------------------------- state

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The run-time state, locked; changes made to the dict are saved on exit."""
        run = self.run_dir()
        with open(run / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._load_state()
            before = json.dumps(state, sort_keys=True)
            try:
                yield state
            finally:
                # Saved also when a tool fails half-way: the kernel logs a refused load, for example.
                if json.dumps(state, sort_keys=True) != before:
                    tmp = run / "state.json.tmp"
                    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
                    os.replace(tmp, run / "state.json")

    def state(self) -> dict[str, Any]:
        """A snapshot of the run-time state (no lock held afterwards)."""
        with self.locked() as st:
            return json.loads(json.dumps(st))

    def _load_state(self) -> dict[str, Any]:
        try:
            st = json.loads((self.run_dir() / "state.json").read_text())
        except (OSError, ValueError):
            st = {}
        st.setdefault("boot_id", str(uuid.uuid4()))
        st.setdefault("boot_time", time.time())
        st.setdefault("modules", [])  # loaded modules, in load order
        st.setdefault("users", {})  # process name → pid holding /dev/nvidia*
        st.setdefault("klog", [])  # [uptime, line] of this boot
        st.setdefault("fault_seen", {})  # fault key → uptime it first showed
        st.setdefault("persistence", {})  # bus id → true/false
        st.setdefault("mig", {})  # bus id → MIG mode and GPU/compute instances (see mig.py)
        return st

    def uptime(self, st: dict[str, Any]) -> float:
        return max(0.0, time.time() - float(st["boot_time"]))

    def log(self, st: dict[str, Any], *lines: str, at: float | None = None) -> None:
        """Append lines to this boot's kernel log (as printk would, with the time since boot)."""
        t = self.uptime(st) if at is None else at
        for i, line in enumerate(lines):
            st["klog"].append([round(t + i * 0.000013, 6), line])


def fault_key(f: dict[str, Any]) -> str:
    """One injected fault's identity: the whole entry, with the id ``gpuprov lab fault`` gives each GPU
    fault (an entry written without one, as older labs did, is its own key)."""
    return json.dumps(f, sort_keys=True)


def _any_fault(faults: list[dict[str, Any]], kind: str, index: int | None) -> bool:
    return any(f.get("kind") == kind and (index is None or f.get("gpu", 0) == index) for f in faults)


def pid_namespace() -> str | None:
    """This process's PID namespace ("pid:[4026531836]"), None where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write a file in place (bind-mounted files must keep their inode); a file that already says
    this is left alone, so a reader without CAP_DAC_OVERRIDE (a systemd unit with a narrow
    CapabilityBoundingSet, such as the toolkit's nvidia-cdi-refresh.service) can run the simulated
    tools over state a privileged caller rendered."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text() == text:
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    with contextlib.suppress(OSError):
        path.chmod(mode)
