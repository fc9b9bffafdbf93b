"""upgrade-driver, the pure part: the target driver, what a host reports of its driver, the plan that
follows and the judgement of an upgraded host.

Nothing here touches a host. Hosts already at the target are skipped; the rest are upgraded in the
rollout's waves (provisioner.rollout.plan), in inventory order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.errors import InputError
from provisioner.rollout.model import HostProbe
from provisioner.rollout.plan import CHANGE, SKIP, BatchSize, HostPlan, Plan, Target

_TARGET = re.compile(r"\d{3}(\.\d+){0,2}")


@dataclass(frozen=True)
class DriverTarget:
    """The driver to upgrade to: a branch ("580": any 580.x will do) or a version ("580.159.04")."""

    text: str

    @property
    def is_branch(self) -> bool:
        return "." not in self.text

    @property
    def branch(self) -> str:
        return self.text.split(".", 1)[0]

    def matches(self, version: str | None) -> bool:
        """Is a loaded driver `version` at this target? Components compare one by one (580.159 ≠ 580.15)."""
        if not version:
            return False
        want = self.text.split(".")
        return version.strip().split(".")[: len(want)] == want

    def __str__(self) -> str:
        return self.text


def parse_target(text: str | None) -> DriverTarget:
    """`--to`: a three-digit branch, optionally with minor and patch ("580", "580.159", "580.159.04")."""
    if text is None or not text.strip():
        raise InputError("--to is required: the driver branch (580) or version (580.159.04) to upgrade to")
    value = text.strip()
    if _TARGET.fullmatch(value):
        return DriverTarget(value)
    hint = ""
    if re.fullmatch(r"\d{3}(\.\d+){1,2}-\S+", value):
        hint = f" (give the driver version without the package revision: {value.split('-', 1)[0]})"
    raise InputError(f"--to {value!r}: expected a driver branch like 580 or a version like 580.159.04{hint}")


# -------------------------------------------------------------------------------------- host facts


@dataclass
class DriverProbe(HostProbe):
    """What a host reported of its driver before (or after) the upgrade; read-only."""

    loaded: str | None = None  # loaded kernel module / nvidia-smi driver version; None: none loaded
    gpus_pci: int = 0  # NVIDIA GPUs on the PCI bus
    gpus_driver: int | None = None  # GPUs the driver sees (None: unknown, e.g. no driver loaded)
    xids: tuple[str, ...] = ()  # NVRM Xid lines in this boot's kernel log
    driver_ok: bool = False  # driver.loaded passed: module loaded and nvidia-smi answers
    driver_detail: str = ""
    # GPU index → MIG profile → devices (`nvidia-smi -L`); None: not read. A driver reload destroys the
    # GPU instances: the upgrade checks they are back as they were.
    mig_devices: dict[int, dict[str, int]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "loaded": self.loaded,
            "gpus_pci": self.gpus_pci,
            "gpus_driver": self.gpus_driver,
            "xids": list(self.xids),
            "node": self.node,
            "driver_ok": self.driver_ok,
            "driver_detail": self.driver_detail,
            "error": self.error,
            "machine_id": self.machine_id,
            "address": self.address,
            "node_error": self.node_error,
            "mig_devices": None
            if self.mig_devices is None
            else {str(i): dict(c) for i, c in self.mig_devices.items()},
        }

    @classmethod
    def from_dict(cls, host: str, doc: Mapping[str, Any]) -> DriverProbe:
        return cls(
            host=host,
            loaded=doc.get("loaded"),
            gpus_pci=int(doc.get("gpus_pci") or 0),
            gpus_driver=doc.get("gpus_driver"),
            xids=tuple(doc.get("xids") or ()),
            node=doc.get("node"),
            driver_ok=bool(doc.get("driver_ok")),
            driver_detail=str(doc.get("driver_detail") or ""),
            error=doc.get("error"),
            machine_id=doc.get("machine_id"),
            address=doc.get("address"),
            node_error=doc.get("node_error"),
            mig_devices=None
            if doc.get("mig_devices") is None
            else {int(i): {str(p): int(n) for p, n in c.items()} for i, c in doc["mig_devices"].items()},
        )


def judge(before: DriverProbe, after: HostProbe, target: DriverTarget) -> list[str]:
    """Why the upgraded host is not right (empty: it is): driver loaded and answering, at the target,
    as many GPUs seen by the driver as before, and no Xid that was not in the kernel log before."""
    if after.error or not isinstance(after, DriverProbe):
        return [f"not reachable after the upgrade: {after.error}"]
    problems: list[str] = []
    if not after.driver_ok:
        problems.append(f"driver.loaded: {after.driver_detail or 'driver not loaded'}")
    if not target.matches(after.loaded):
        problems.append(f"driver.version: {after.loaded or 'no driver'} loaded, expected {target}")
    expected = before.gpus_driver if before.gpus_driver is not None else before.gpus_pci
    if after.gpus_driver is None or after.gpus_driver != expected:
        seen = "unknown" if after.gpus_driver is None else str(after.gpus_driver)
        problems.append(f"gpu.count: the driver sees {seen} GPU(s), {expected} before the upgrade")
    earlier = set(before.xids)
    new = [line for line in after.xids if line not in earlier]
    if new:
        first = new[0].strip()[:160]
        problems.append(f"gpu.xid: {len(new)} new Xid event(s) since the upgrade began: {first}")
    return problems


# -------------------------------------------------------------------------------------------- plan


def build_plan(
    hosts: Sequence[str],
    probes: Mapping[str, DriverProbe],
    target: DriverTarget,
    batch: BatchSize,
    canary: int = 0,
    kube: bool = False,
) -> Plan:
    """Order and group the hosts. A host that could not be probed stays in the plan (it is probed again
    when its batch starts, and fails there if it still cannot be reached)."""
    plan = Plan(target=Target(target.text))
    upgrade: list[str] = []
    for name in hosts:
        probe = probes.get(name)
        if probe is not None and probe.error is None and target.matches(probe.loaded):
            plan.hosts[name] = HostPlan(
                name, SKIP, probe.loaded, f"already at {target}: {probe.loaded} loaded", kube=kube
            )
            continue
        current = probe.loaded if probe is not None else None
        error = probe.error if probe is not None else "not probed"
        plan.hosts[name] = HostPlan(name, CHANGE, current, kube=kube, probe_error=error)
        upgrade.append(name)
    plan.fill_waves(upgrade, batch, canary)
    return plan


def needs(host: HostPlan, drain: bool, reboot_allowed: bool) -> list[str]:
    """What the host will go through, in order (for --dry-run)."""
    if host.action == SKIP:
        return []
    steps = ["cordon", "drain" if drain else "evict GPU pods"] if host.kube else []
    steps += ["stop GPU services", "unload modules", "unhold, install, hold", "reload modules"]
    if reboot_allowed:
        steps[-1] += " (reboot if reload is impossible)"
    steps += ["verify"] + (["uncordon"] if host.kube else [])
    return steps


def render_plan(
    plan: Plan, *, drain: bool, reboot_allowed: bool, max_fail: int, install_version: str = ""
) -> str:
    """The dry-run text: batches in order, each host's from → to and what it needs."""
    kind = "branch" if DriverTarget(plan.target.text).is_branch else "version"
    installs = (
        f", installs {install_version}" if install_version and install_version != plan.target.text else ""
    )
    lines = [f"upgrade-driver plan: target {plan.target} ({kind}{installs})"]
    if not plan.waves:
        lines.append("nothing to upgrade: every selected GPU host is already at the target")
    for label, wave in plan.named_waves():
        lines.append(f"{label} ({len(wave)} host{'s' if len(wave) != 1 else ''}, in parallel):")
        for name in wave:
            p = plan.hosts[name]
            current = p.current or ("unknown" if p.probe_error else "no driver loaded")
            note = f"  [not probed: {p.probe_error}]" if p.probe_error else ""
            lines.append(f"  {name:<20} {current} → {plan.target}{note}")
            lines.append(f"  {'':<20} {', '.join(needs(p, drain, reboot_allowed))}")
    for name in plan.skipped:
        lines.append(f"skip   {name:<20} {plan.hosts[name].reason}")
    if plan.waves and not any(p.kube for p in plan.hosts.values()):
        lines.append("no kube_control_plane host in the inventory: hosts are not cordoned or drained")
    stop = "any failure" if max_fail == 0 else f"more than {max_fail} failure(s)"
    if plan.canary:
        stop += "; any canary failure"
    lines.append(f"stops starting new batches after {stop}")
    return "\n".join(lines) + "\n"
