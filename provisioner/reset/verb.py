"""`run_reset`: the verb. The stages chosen by --only/--skip, in reverse bootstrap order, make a run of
playbooks/reset.yml, which goes as every playbook verb's does (provisioner.playbookverb): the same
progress, record and exit codes as bootstrap. Each stage's play is its role's reset entry point working
from the host's ledger (role host_ledger); the last play, `proof`, compares each host with how gpuprov's
first stage found it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from provisioner.content import PLAYBOOKS_DIR
from provisioner.errors import InputError
from provisioner.playbookverb.run import FACTS_PLAY, PlaybookVerb, choose_and_run, need_inventory

if TYPE_CHECKING:
    from provisioner.playbookverb.run import RunControls, StageRequest, VerbResult

RESET_PLAYBOOK = PLAYBOOKS_DIR / "reset.yml"
PROOF_PLAY = "proof"
# The stages that leave something on a host, in bootstrap order (roles/host_ledger/vars/main.yml keeps the
# same list). preflight changes nothing; gpu_tenants' namespaces hold the tenants' work and go with the
# cluster when kubernetes is reset.
RESETTABLE: tuple[str, ...] = (
    "nvidia_driver",
    "nvidia_mig_manager",
    "cuda_toolkit",
    "docker",
    "nvidia_container_toolkit",
    "kubernetes",
    "gpu_operator",
)
NOT_RESET = {
    "preflight": "preflight changes nothing on a host",
    "gpu_tenants": (
        "gpu_tenants' namespaces hold the tenants' work; they go with the cluster (reset kubernetes)"
    ),
    "verify": "verify changes nothing on a host",
}


def reset_stages(only: list[str], skip: list[str]) -> list[str]:
    """--only/--skip resolved into the stages to take back, last stage first; bad names are bad input."""
    for flag, names in (("--only", only), ("--skip", skip)):
        for name in names:
            if name in NOT_RESET and flag == "--only":
                raise InputError(f"--only: {name} has nothing to take back: {NOT_RESET[name]}")
            if name not in RESETTABLE and name not in NOT_RESET:
                raise InputError(
                    f"{flag}: unknown stage {name} (stages reset takes back: {', '.join(RESETTABLE)})"
                )
    chosen = [s for s in reversed(RESETTABLE) if (not only or s in only) and s not in skip]
    if not chosen:
        raise InputError("--only/--skip leave no stage to take back")
    return chosen


def progress_filter(only: list[str], skip: list[str]) -> set[str] | None:
    """The plays whose progress to show (None: all): the plays of the stages left out still start
    (their argument checks are tagged always), only their failures show."""
    chosen = reset_stages(only, skip)
    return None if len(chosen) == len(RESETTABLE) else {FACTS_PLAY, *chosen, PROOF_PLAY}


def run_reset(request: StageRequest, *, remove_crds: bool, controls: RunControls) -> VerbResult:
    """The verb. Bad input raises InputError before any host is touched; `controls` are run.py's."""
    inventory = need_inventory(request.inventory)
    chosen = reset_stages(request.only, request.skip)
    if remove_crds and "gpu_operator" not in chosen:
        raise InputError("--remove-crds: the gpu_operator stage is not among those reset")
    spec = PlaybookVerb(
        verb="reset",
        playbook=RESET_PLAYBOOK,
        stages=chosen,
        plays=[*chosen, PROOF_PLAY],
        tags=None if len(chosen) == len(RESETTABLE) else chosen,
        checks=lambda h: [],
        expects=[],
        extravars={"host_ledger_resetting": chosen, "gpu_operator_reset_crds": remove_crds},
    )
    inv = spec.open_inventory(inventory)
    return choose_and_run(spec, inv, inventory, request.limit, controls)
