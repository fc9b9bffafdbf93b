"""A rolling change's plan, the pure part: batch size, counts and `--limit` names checked (bad input: exit
2), and the waves that follow from the hosts to change: canaries first, then batches of a fixed size or
a share of the hosts to change, in inventory order. Nothing here touches a host."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import InputError

_BATCH = re.compile(r"(?P<n>\d+)(?P<pct>%?)")

# A host's action in the plan. The state file and the dry-run JSON have said "upgrade" since the driver
# upgrade was the only rolling change; every client's plan keeps the word.
CHANGE = "upgrade"
SKIP = "skip"


# ----------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class BatchSize:
    """`--batch N` (hosts per batch) or `--batch P%` (share of the hosts to change, rounded up)."""

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


def first_control_plane(inv: Any, inventory: Any, needed_for: str | None = None) -> Any | None:
    """The inventory's first kube_control_plane host, through which the change drives the cluster; None
    when it has none, which is bad input when the change cannot go without (`needed_for` says why)."""
    control = inv.select("kube_control_plane") if "kube_control_plane" in inv.group_names else []
    if not control and needed_for:
        raise InputError(f"{inventory}: {needed_for}: the inventory needs a kube_control_plane host")
    return control[0] if control else None


def check_limit_names(limit: str | None, host_names: Sequence[str], group_names: Sequence[str]) -> None:
    """Every plain name in `--limit` must be a host or group of the inventory.

    Ansible quietly ignores an unknown name in a pattern (`gpu1,gpu9` selects gpu1 alone); for a rolling
    change a typo must stop the run instead of shrinking it. Globs and regexes are left to Ansible.
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


# -------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Target:
    """What a run changes its hosts to, as its record names it (a driver version, "declared-mig-layouts")."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class HostPlan:
    host: str
    action: str  # CHANGE | SKIP
    current: str | None  # what the host has now, in the client's words, when known
    reason: str = ""
    kube: bool = False  # cordon/drain through the control plane
    probe_error: str | None = None


@dataclass
class Plan:
    target: Target
    canary: list[str] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)  # after the canary batch
    hosts: dict[str, HostPlan] = field(default_factory=dict)  # every selected host, inventory order

    @property
    def waves(self) -> list[list[str]]:
        """Every batch in the order it runs; the canaries (when any) are the first."""
        return ([self.canary] if self.canary else []) + self.batches

    @property
    def to_change(self) -> list[str]:
        return [h for wave in self.waves for h in wave]

    @property
    def skipped(self) -> list[str]:
        return [h for h, p in self.hosts.items() if p.action == SKIP]

    def fill_waves(self, hosts: Sequence[str], batch: BatchSize, canary: int) -> None:
        """The hosts to change, in order, as the canary batch and then batches of `batch`; a share is of
        all the hosts to change, canaries included."""
        self.canary = list(hosts[:canary])
        rest = list(hosts[canary:])
        size = batch.size_for(len(hosts)) if hosts else 1
        self.batches = [rest[i : i + size] for i in range(0, len(rest), size)]

    def named_waves(self) -> list[tuple[str, list[str]]]:
        """The waves as a dry run names them: "canary", then "batch 1", "batch 2", ..."""
        first = 0 if self.canary else 1
        return [
            ("canary" if self.canary and i == 0 else f"batch {i + first}", w)
            for i, w in enumerate(self.waves)
        ]

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
        plan = cls(target=Target(str(doc["target"])))
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
