"""The day-2 verbs: one part of a stage, through its own playbook, run and verified as every playbook verb
is (run.py): `sharing apply` (GPU sharing profiles and node labels) and `tenants apply` (tenants and
their GPU quotas)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from provisioner.content import PLAYBOOKS_DIR
from provisioner.playbookverb.run import (
    PlaybookVerb,
    RunControls,
    VerbResult,
    choose_and_run,
    need_inventory,
)
from provisioner.stages import VERIFY


@dataclass(frozen=True)
class Day2Entry:
    """A day-2 verb that runs one part of a stage through its own playbook, then verifies what it set."""

    verb: str  # the record's and summary's name
    playbook: str  # in playbooks/
    play: str  # the playbook's play, as its events name it
    stage: str  # the bootstrap stage whose settings it applies (what verification expects)
    checks: dict[str, tuple[str, ...]]  # inventory group → the checks its hosts are verified with

    def spec(self) -> PlaybookVerb:
        return PlaybookVerb(
            verb=self.verb,
            playbook=PLAYBOOKS_DIR / self.playbook,
            stages=[self.play, VERIFY],
            plays=[self.play],
            tags=None,
            checks=lambda h: list(
                dict.fromkeys(i for g, c in self.checks.items() if g in h.groups for i in c)
            ),
            expects=[self.stage],
        )


DAY2: dict[str, Day2Entry] = {
    "sharing": Day2Entry(
        "sharing-apply",
        "sharing.yml",
        "sharing",
        "gpu_operator",
        {"gpu_nodes": ("gpu.sharing", "k8s.gpu_allocatable")},
    ),
    "tenants": Day2Entry(
        "tenants-apply",
        "tenants.yml",
        "gpu_tenants",
        "gpu_operator",
        {"kube_control_plane": ("tenants.quota",)},
    ),
}


def run_day2(name: str, *, inventory: Path | None, controls: RunControls) -> VerbResult:
    """A day-2 verb (DAY2's `name`) on every host of the inventory. Bad input raises InputError before any
    host is touched; `controls` are run.py's."""
    inventory = need_inventory(inventory)
    spec = DAY2[name].spec()
    inv = spec.open_inventory(inventory)
    return choose_and_run(spec, inv, inventory, None, controls)
