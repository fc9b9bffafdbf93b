"""The real fleet behind `gpuprov upgrade-driver`: hosts over SSH, the cluster through kubectl on the
first control-plane host (provisioner.rollout.kube), and the driver change through
playbooks/upgrade_driver.yml (the nvidia_driver role, the same code bootstrap runs).

- Probes are the verification probes (one read-only script per host over paramiko), parsed by the same
  parsers and the driver.loaded check, so "loaded driver", "GPUs seen" and "Xid" mean here exactly what
  they mean in `gpuprov verify`.
- One ansible-runner run per batch (the batch's hosts as --limit): the playbook sets the fact
  gpuprov_upgrade_step as each step starts, which becomes the host's step in the state file as it happens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioner.checks import PASS, HostFacts, evaluate
from provisioner.checks.driver import installed_version
from provisioner.content import PLAYBOOKS_DIR
from provisioner.errors import GpuprovError
from provisioner.executors import ExecutorError
from provisioner.expectations import Expectations
from provisioner.mig import parse_mig_devices
from provisioner.probes import kernel_log, smi
from provisioner.probes.base import ProbeResult, or_default
from provisioner.probes.host import HOST_FACTS, pci_gpus
from provisioner.probes.kernel_log import KERNEL_LOG
from provisioner.probes.smi import SMI_XML
from provisioner.rollout.hosts import SshFleet, read_identity
from provisioner.rollout.model import ChangeOutcome
from provisioner.upgrade.plan import DriverProbe, DriverTarget
from provisioner.upgrade.rollout import ANNOTATION, INSTALLING, REBOOTING, RELOADING, STOPPING, StepFn

PLAYBOOK = PLAYBOOKS_DIR / "upgrade_driver.yml"
# The playbook reports its progress through these facts (a step name, a reboot's reason).
STEP_FACT = "gpuprov_upgrade_step"
NOTE_FACT = "gpuprov_upgrade_note"
STEPS = (STOPPING, INSTALLING, RELOADING, REBOOTING)
# What the probe reads: the loaded driver, the GPUs on the bus and seen by the driver, the kernel log.
PROBES = (HOST_FACTS, SMI_XML, KERNEL_LOG)
NOTES = {
    "reload-impossible": "the old driver's modules could not be unloaded (still in use)",
    "kernel-changed": "the running kernel is not the one the new modules were built for",
}


# ------------------------------------------------------------------------------------------ probing


def probe_from_results(host: str, results: Mapping[str, ProbeResult], node: str | None) -> DriverProbe:
    """A DriverProbe from raw probe results (pure: tested on recorded hosts)."""
    facts = HostFacts(host, results)
    loaded_check = evaluate(facts, Expectations(), ["driver.loaded"])[0]
    return DriverProbe(
        host=host,
        loaded=or_default(lambda: installed_version(facts), None),
        gpus_pci=or_default(lambda: len(pci_gpus(facts)), 0),
        gpus_driver=or_default(lambda: len(smi.smi_log(facts).gpus), None),
        xids=or_default(lambda: tuple(e.line for e in kernel_log.xids(facts)), ()),
        node=node,
        driver_ok=loaded_check.status == PASS,
        driver_detail=loaded_check.detail,
    )


# -------------------------------------------------------------------------------------------- fleet


class RealFleet(SshFleet[DriverProbe]):
    """GPU hosts over SSH and ansible-runner; the cluster through kubectl on the control plane."""

    probe_timeout = 180.0  # seconds for a host's probes

    def __init__(
        self,
        *,
        hosts: Sequence[Any],
        control_plane: Any | None,
        inventory_path: Path,
        record: Path | None,
        install_version: str,
        progress: Callable[[str | None, str], None],
    ) -> None:
        super().__init__(hosts, control_plane, annotation=ANNOTATION)
        self.inventory_path = inventory_path
        self.record = record
        self.install_version = install_version
        self.progress = progress
        self._installs = 0

    # -- probes

    def _probe_one(self, name: str) -> DriverProbe:
        from provisioner.verification import collect

        try:
            with self._session(name) as (ex, sudo):
                results = collect(ex, PROBES, self.probe_timeout, become=bool(sudo))
                who = read_identity(ex)
                # The MIG devices: a driver reload destroys them; the MIG manager must bring them back.
                listing = ex.run([*sudo, "nvidia-smi", "-L"], 60)
        except ExecutorError as exc:
            return DriverProbe(name, error=exc.reason)
        try:
            mig_devices = parse_mig_devices(listing.stdout) if listing.rc == 0 else None
        except ValueError as exc:
            # Unknown MIG devices would let the upgrade skip waiting for them to come back.
            return DriverProbe(name, error=str(exc))
        node = who.pop("node")
        return replace(probe_from_results(name, results, node), **who, mig_devices=mig_devices)

    # -- the driver change

    def extravars(self, target: DriverTarget, reboot_allowed: bool) -> dict[str, Any]:
        """Run-scoped values for the playbook: the target's branch and the exact version it resolved to,
        and who reloads or reboots."""
        return {
            "nvidia_driver_branch": target.branch,
            "nvidia_driver_version": self.install_version,
            # The playbook unloads before and loads after the install; the role must not do it itself.
            "nvidia_driver_reload_modules": False,
            "nvidia_driver_reboot_allowed": False,
            "gpuprov_upgrade_reboot_allowed": bool(reboot_allowed),
        }

    def upgrade(
        self, hosts: Sequence[str], target: DriverTarget, *, reboot_allowed: bool, on_step: StepFn
    ) -> dict[str, ChangeOutcome]:
        from provisioner.runner import Event, run_playbook

        if self.record is None:
            raise GpuprovError("upgrade without a run record")
        if not PLAYBOOK.is_file():
            raise GpuprovError(f"{PLAYBOOK}: playbook missing from this installation")
        self._installs += 1
        where = self.record / f"install-{self._installs:02d}"
        notes: dict[str, str] = {}

        def on_event(ev: Event) -> None:
            if ev.host is None or ev.kind != "runner_on_ok":
                return
            step = ev.facts.get(STEP_FACT)
            if isinstance(step, str) and step in STEPS:
                on_step(ev.host, step)
            note = ev.facts.get(NOTE_FACT)
            if isinstance(note, str) and note in NOTES:
                notes[ev.host] = NOTES[note]

        result = run_playbook(
            PLAYBOOK,
            self.inventory_path,
            record_dir=where,
            hosts=list(hosts),
            forks=max(1, len(hosts)),
            extravars=self.extravars(target, reboot_allowed),
            on_event=on_event,
        )
        out: dict[str, ChangeOutcome] = {}
        for h in hosts:
            stats = result.stats.get(h)
            # A failure that a block rescued (the unload of modules in use) is not the host's failure: the
            # final stats say whether the host failed; the last failure event says why.
            failures = [f for f in result.failures if f.host == h]
            failed = stats is not None and (stats.failed > 0 or stats.unreachable > 0)
            if failed or (stats is None and failures and not result.interrupted):
                f = failures[-1] if failures else None
                what = "unreachable" if f and f.unreachable else ((f.stage if f else None) or "upgrade")
                why = f"{f.task}: {f.message}" if f else f"the playbook failed ({result.status})"
                out[h] = ChangeOutcome("failed", f"{what}: {why}".strip())
            elif h in result.reboot_pending:
                why = notes.get(h, "the new driver needs a reboot")
                out[h] = ChangeOutcome(
                    "reboot-pending",
                    f"{why}; {self.install_version} is installed and loads at the next boot "
                    "(reboot the host, then --resume; or run with --reboot-allowed)",
                )
            elif result.interrupted:
                out[h] = ChangeOutcome("interrupted", "canceled")
            elif h in result.stats:
                out[h] = ChangeOutcome("ok")
            else:
                out[h] = ChangeOutcome(
                    "failed", f"upgrade: the playbook did not run on {h} ({result.status})"
                )
        return out
