"""Rolling driver upgrade, the pure part: what the user asked for, and the plan that follows from it.

Nothing here touches a host. The target, batch size and counts are checked first (bad input: exit 2),
then the plan is built from what each host reported: hosts already at the target are skipped, the
rest are upgraded canaries first, then in batches of a fixed size or a share of the hosts to upgrade,
in inventory order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import InputError

_TARGET = re.compile(r"\d{3}(\.\d+){0,2}")
_BATCH = re.compile(r"(?P<n>\d+)(?P<pct>%?)")


# ----------------------------------------------------------------------------------------- inputs


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


@dataclass(frozen=True)
class BatchSize:
    """`--batch N` (hosts per batch) or `--batch P%` (share of the hosts to upgrade, rounded up)."""

    value: int
    percent: bool = False

    def size_for(self, hosts: int) -> int:
        if not self.percent:
            return self.value
        return max(1, math.ceil(hosts * self.value / 100))

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def parse_batch(text: str | int | None) -> BatchSize:
    if text is None:
        return BatchSize(1)
    value = str(text).strip()
    m = _BATCH.fullmatch(value)
    if not m:
        raise InputError(f"--batch {value!r}: expected a number of hosts (2) or a percentage (25%)")
    n, percent = int(m.group("n")), bool(m.group("pct"))
    if percent and not 1 <= n <= 100:
        raise InputError(f"--batch {value}: a percentage must be between 1% and 100%")
    if not percent and n < 1:
        raise InputError(f"--batch {value}: a batch needs at least 1 host")
    return BatchSize(n, percent)


def check_count(name: str, value: int | None, minimum: int = 0) -> int:
    if value is None:
        return minimum
    if value < minimum:
        raise InputError(f"{name} {value}: must be at least {minimum}")
    return value


def check_limit_names(limit: str | None, host_names: Sequence[str], group_names: Sequence[str]) -> None:
    """Every plain name in `--limit` must be a host or group of the inventory.

    Ansible quietly ignores an unknown name in a pattern (`gpu1,gpu9` selects gpu1 alone); for an
    upgrade a typo must stop the run instead of shrinking it. Globs and regexes are left to Ansible.
    """
    if not limit:
        return
    known = set(host_names) | set(group_names) | {"all"}
    for raw in re.split(r"[,:]", limit):
        term = raw.strip().lstrip("!&")
        if not term or term.startswith("~") or any(c in term for c in "*?[]"):
            continue
        if term not in known:
            raise InputError(f"--limit {limit}: no host or group named {term!r} in the inventory")


# -------------------------------------------------------------------------------------- host facts


@dataclass
class HostProbe:
    """What a host reported before (or after) the upgrade; read-only, nothing changed to get it."""

    host: str
    loaded: str | None = None  # loaded kernel module / nvidia-smi driver version; None: none loaded
    gpus_pci: int = 0  # NVIDIA GPUs on the PCI bus
    gpus_driver: int | None = None  # GPUs the driver sees (None: unknown, e.g. no driver loaded)
    xids: tuple[str, ...] = ()  # NVRM Xid lines in this boot's kernel log
    node: str | None = None  # the host's Kubernetes node name (its hostname, as kubeadm registers it)
    driver_ok: bool = False  # driver.loaded passed: module loaded and nvidia-smi answers
    driver_detail: str = ""
    error: str | None = None  # why the host could not be probed
    # Who the host is, to prove a node is this host before touching it: its /etc/machine-id and the
    # address it was reached at; node_error: why its hostname cannot name a node (host data is untrusted).
    machine_id: str | None = None
    address: str | None = None
    node_error: str | None = None
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
    def from_dict(cls, host: str, doc: Mapping[str, Any]) -> HostProbe:
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


# A Kubernetes node name: an RFC 1123 DNS subdomain (lower case letters, digits, '-' and '.', at most 253
# characters, each dot-separated label 1-63 characters starting and ending with a letter or digit).
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def valid_node_name(name: str) -> bool:
    return 0 < len(name) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in name.split("."))


def judge(before: HostProbe, after: HostProbe, target: DriverTarget) -> list[str]:
    """Why the upgraded host is not right (empty: it is): driver loaded and answering, at the target,
    as many GPUs seen by the driver as before, and no Xid that was not in the kernel log before."""
    if after.error:
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


@dataclass
class HostPlan:
    host: str
    action: str  # "upgrade" | "skip"
    current: str | None  # loaded driver version, when known
    reason: str = ""
    kube: bool = False  # cordon/drain through the control plane
    probe_error: str | None = None

    def needs(self, drain: bool, reboot_allowed: bool) -> list[str]:
        """What the host will go through, in order (for --dry-run)."""
        if self.action == "skip":
            return []
        steps = ["cordon", "drain" if drain else "evict GPU pods"] if self.kube else []
        steps += ["stop GPU services", "unload modules", "unhold, install, hold", "reload modules"]
        if reboot_allowed:
            steps[-1] += " (reboot if reload is impossible)"
        steps += ["verify"] + (["uncordon"] if self.kube else [])
        return steps


@dataclass
class Plan:
    target: DriverTarget
    canary: list[str] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)  # after the canary batch
    hosts: dict[str, HostPlan] = field(default_factory=dict)  # every selected GPU host, inventory order

    @property
    def waves(self) -> list[list[str]]:
        """Every batch in the order it runs; the canaries (when any) are the first."""
        return ([self.canary] if self.canary else []) + self.batches

    @property
    def to_upgrade(self) -> list[str]:
        return [h for wave in self.waves for h in wave]

    @property
    def skipped(self) -> list[str]:
        return [h for h, p in self.hosts.items() if p.action == "skip"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.text,
            "canary": list(self.canary),
            "batches": [list(b) for b in self.batches],
            "hosts": {
                h: {
                    "action": p.action,
                    "current": p.current,
                    "reason": p.reason,
                    "kube": p.kube,
                    "probe_error": p.probe_error,
                }
                for h, p in self.hosts.items()
            },
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Plan:
        plan = cls(target=DriverTarget(str(doc["target"])))
        plan.canary = list(doc.get("canary") or [])
        plan.batches = [list(b) for b in doc.get("batches") or []]
        for h, p in (doc.get("hosts") or {}).items():
            plan.hosts[h] = HostPlan(
                h,
                p["action"],
                p.get("current"),
                p.get("reason", ""),
                bool(p.get("kube")),
                p.get("probe_error"),
            )
        return plan


def build_plan(
    hosts: Sequence[str],
    probes: Mapping[str, HostProbe],
    target: DriverTarget,
    batch: BatchSize,
    canary: int = 0,
    kube: bool = False,
) -> Plan:
    """Order and group the hosts. A host that could not be probed stays in the plan (it is probed again
    when its batch starts, and fails there if it still cannot be reached)."""
    plan = Plan(target=target)
    upgrade: list[str] = []
    for name in hosts:
        probe = probes.get(name)
        if probe is not None and probe.error is None and target.matches(probe.loaded):
            plan.hosts[name] = HostPlan(
                name, "skip", probe.loaded, f"already at {target}: {probe.loaded} loaded", kube=kube
            )
            continue
        current = probe.loaded if probe is not None else None
        error = probe.error if probe is not None else "not probed"
        plan.hosts[name] = HostPlan(name, "upgrade", current, kube=kube, probe_error=error)
        upgrade.append(name)
    plan.canary = upgrade[:canary]
    rest = upgrade[canary:]
    size = batch.size_for(len(upgrade)) if upgrade else 1
    plan.batches = [rest[i : i + size] for i in range(0, len(rest), size)]
    return plan


def render_plan(
    plan: Plan, *, drain: bool, reboot_allowed: bool, max_fail: int, install_version: str = ""
) -> str:
    """The dry-run text: batches in order, each host's from → to and what it needs."""
    kind = "branch" if plan.target.is_branch else "version"
    installs = (
        f", installs {install_version}" if install_version and install_version != plan.target.text else ""
    )
    lines = [f"upgrade-driver plan: target {plan.target} ({kind}{installs})"]
    waves = plan.waves
    if not waves:
        lines.append("nothing to upgrade: every selected GPU host is already at the target")
    for i, wave in enumerate(waves, 1):
        label = "canary" if plan.canary and i == 1 else f"batch {i - (1 if plan.canary else 0)}"
        lines.append(f"{label} ({len(wave)} host{'s' if len(wave) != 1 else ''}, in parallel):")
        for name in wave:
            p = plan.hosts[name]
            current = p.current or ("unknown" if p.probe_error else "no driver loaded")
            note = f"  [not probed: {p.probe_error}]" if p.probe_error else ""
            lines.append(f"  {name:<20} {current} → {plan.target}{note}")
            lines.append(f"  {'':<20} {', '.join(p.needs(drain, reboot_allowed))}")
    for name in plan.skipped:
        lines.append(f"skip   {name:<20} {plan.hosts[name].reason}")
    if waves and not any(p.kube for p in plan.hosts.values()):
        lines.append("no kube_control_plane host in the inventory: hosts are not cordoned or drained")
    stop = "any failure" if max_fail == 0 else f"more than {max_fail} failure(s)"
    if plan.canary:
        stop += "; any canary failure"
    lines.append(f"stops starting new batches after {stop}")
    return "\n".join(lines) + "\n"
