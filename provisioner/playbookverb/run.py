"""A playbook verb's run: the inventory opened and the hosts chosen (bad input: exit 2, nothing touched),
then the playbook, the outcome per host, verification of the hosts that came through, the summary and
the run record. The CLI shows the progress events passed on and the result; nothing here prints."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.config import validate_inventory_settings
from provisioner.content import role_default
from provisioner.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, InputError
from provisioner.runner import Event
from provisioner.stages import VERIFY

# Host statuses after which check mode's list of a host's changes is complete.
CHECKED = ("done", "reboot-pending")
FACTS_PLAY = "Facts"  # every playbook's first play, tagged always: it runs whatever the stages


@dataclass(frozen=True)
class PlaybookVerb:
    """What one invocation of a playbook verb runs."""

    verb: str  # the record's and summary's name
    playbook: Path
    stages: list[str]  # what it does, as recorded and confirmed (VERIFY among them: verify after)
    plays: list[str]  # the playbook's plays whose progress counts ([]: no play to run)
    tags: list[str] | None  # the Ansible tags to run (None: the whole playbook)
    checks: Callable[[Any], list[str]]  # a host's verification check ids
    expects: list[str]  # the stages whose settings verification expects on the hosts
    extravars: dict[str, Any] | None = None  # given to the playbook as extra variables

    def open_inventory(self, inventory: Path) -> Any:
        """The inventory, once the playbook is known to be there."""
        from provisioner.inventory import load_inventory

        if not self.playbook.is_file():
            raise InputError(f"{self.playbook}: playbook missing from this installation")
        return load_inventory(inventory)


@dataclass(frozen=True)
class StageRequest:
    """What a stage-by-stage verb (bootstrap, reset) is asked for: the inventory, the stages --only and
    --skip name, and the hosts --limit picks."""

    inventory: Path | None
    only: list[str]
    skip: list[str]
    limit: str | None


@dataclass(frozen=True)
class RunControls:
    """How a playbook verb's run goes, as the command line asks: check mode or a change, the go-ahead to
    change hosts (`assume_yes`, else `confirm` answering yes; None: nobody to ask), the hosts worked on at
    once, and where the run is shown: `on_event` gets every playbook event as it happens (the live
    progress), `notify` a line at each phase."""

    check: bool
    assume_yes: bool
    forks: int
    on_event: Callable[[Event], None] | None = None
    notify: Callable[[str], None] | None = None
    confirm: Callable[[str], bool] | None = None


@dataclass
class VerbResult:
    """What a playbook verb did: the summary (also in the run record) and the verification of the hosts."""

    exit_code: int
    summary: dict[str, Any] | None = None  # None: nothing was run (no failed host left to retry)
    verify_report: dict[str, Any] = field(default_factory=dict)
    verify_s: float = 0.0


@dataclass
class HostOutcome:
    host: str
    status: str  # done | failed | unreachable | reboot-pending | not-run | interrupted
    stats: dict[str, int] = field(default_factory=dict)
    stages: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    reboot_pending: bool = False
    verify: str | None = None  # worst verification status, when verified
    verify_failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "status": self.status}
        out.update(
            {
                k: self.stats.get(k, 0)
                for k in ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored")
            }
        )
        out["stages"] = self.stages
        out["reason"] = self.reason
        out["reboot_pending"] = self.reboot_pending
        out["verify"] = self.verify
        if self.verify_failures:
            out["verify_failures"] = self.verify_failures
        return out


# ----------------------------------------------------------------------------------- verification


def _effective(host_vars: dict[str, Any], role: str, knob: str) -> Any:
    value = host_vars.get(knob)
    if isinstance(value, str) and "{{" in value:
        return None
    return value if value is not None else role_default(role, knob)


def expectations_for(host: Any, stages: list[str]) -> dict[str, Any]:
    """Policy keys that the stages just applied to `host` make certain (what verify should find)."""
    hv = host.vars
    gpu_host = "gpu_nodes" in host.groups
    exp: dict[str, Any] = {}
    services: list[str] = []
    if gpu_host and "nvidia_driver" in stages:
        version = _effective(hv, "nvidia_driver", "nvidia_driver_version")
        branch = _effective(hv, "nvidia_driver", "nvidia_driver_branch")
        if version:
            exp["driver.version"] = str(version)
        elif branch:
            exp["driver.version"] = str(branch)
        exp["gpu.persistence"] = True
    if gpu_host and "cuda_toolkit" in stages:
        versions = _effective(hv, "cuda_toolkit", "cuda_toolkit_versions")
        default = _effective(hv, "cuda_toolkit", "cuda_toolkit_default_version")
        if default:
            exp["cuda.version"] = str(default)
        elif isinstance(versions, list) and versions:
            exp["cuda.version"] = str(versions[-1])
    if "docker" in stages:
        services += ["docker", "containerd"]
    if gpu_host and "nvidia_container_toolkit" in stages:
        exp["container_toolkit.runtime"] = ["docker", "containerd"]
    if "kubernetes" in stages and "k8s_cluster" in host.groups:
        services += ["containerd", "kubelet"]
        exp["k8s.node"] = True
    if "gpu_operator" in stages and {"k8s_cluster", "kube_control_plane"} & set(host.groups):
        # What the operator was asked to set up: MIG layout and strategy, GPU sharing, tenants (declared in
        # the inventory) and, on GPU nodes, the DCGM exporter unless its values turn it off (the chart's
        # dcgmExporter.enabled defaults to true: NVIDIA/gpu-operator v26.7.0 deployments/gpu-operator
        # values.yaml).
        from provisioner.inventory_expectations import declared, exporter_enabled

        exp.update(
            {key: value for key, (value, _source) in declared(hv, host=host.name, groups=host.groups).items()}
        )
        if gpu_host:
            values = _effective(hv, "gpu_operator", "gpu_operator_values")
            exp["monitoring.dcgm_exporter"] = exporter_enabled(values) is not False
    if services:
        exp["services.active"] = sorted(set(services))
    return exp


def _verify(hosts: list[Any], spec: PlaybookVerb) -> dict[str, Any]:
    """Verify each host against what the run promises; returns {host: HostReport}."""
    from provisioner.policy import Policy
    from provisioner.verification import verify_hosts

    by_checks: dict[tuple[str, ...], list[Any]] = {}
    for h in hosts:
        by_checks.setdefault(tuple(spec.checks(h)), []).append(h)
    reports: dict[str, Any] = {}
    for ids, group in by_checks.items():
        if not ids:
            continue
        policy = Policy(path=None, hosts={h.name: expectations_for(h, spec.expects) for h in group})
        report = verify_hosts(group, policy, checks=list(ids))
        for hr in report.hosts:
            reports[hr.host] = hr
    return reports


# ---------------------------------------------------------------------------------- before the run


def need_inventory(inventory: Path | None) -> Path:
    if inventory is None:
        raise InputError("-i/--inventory is required (try: gpuprov lab inventory)")
    return inventory


def choose_hosts(
    inv: Any,
    inventory: Path,
    limit: str | None,
    stages: list[str],
    controls: RunControls,
    verb: str = "bootstrap",
) -> list[Any]:
    """The hosts `limit` selects, their settings valid, and (unless in check mode) the go-ahead to change
    them: --yes, or `controls.confirm` answering yes (None: nobody to ask)."""
    hosts = inv.select(limit)
    if not hosts:
        raise InputError(f"{inventory}: no host selected" + (f" by --limit {limit}" if limit else ""))
    validate_inventory_settings(inv, hosts)
    if controls.check or controls.assume_yes:
        return hosts
    if controls.confirm is None:
        raise InputError(
            f"refusing to change {len(hosts)} host(s) without --yes (standard input is not a terminal)"
        )
    names = ", ".join(h.name for h in hosts[:8]) + (" ..." if len(hosts) > 8 else "")
    if not controls.confirm(
        f"{verb.capitalize()} {len(hosts)} host(s) ({names}) through {', '.join(stages)}?"
    ):
        raise InputError("not confirmed; nothing was changed")
    return hosts


def choose_and_run(
    spec: PlaybookVerb, inv: Any, inventory: Path, limit: str | None, controls: RunControls
) -> VerbResult:
    """The verb on the hosts `limit` selects, once choose_hosts has them: bad input raises InputError
    before any host is touched."""
    hosts = choose_hosts(inv, inventory, limit, spec.stages, controls, spec.verb)
    return run(spec, inventory=inventory, hosts=hosts, limit=limit, controls=controls)


# ------------------------------------------------------------------------------------------ the run


def run(
    spec: PlaybookVerb, *, inventory: Path, hosts: list[Any], limit: str | None, controls: RunControls
) -> VerbResult:
    """Run the playbook on the chosen hosts, then verify them."""
    say = controls.notify or (lambda text: None)
    record = records.new_record(spec.verb)
    command = {
        "verb": spec.verb,
        "inventory": str(inventory.resolve()),
        "stages": spec.stages,
        "limit": limit,
        "check": controls.check,
        "forks": controls.forks,
        "hosts": [h.name for h in hosts],
    }
    records.write_json(record / "command.json", command)
    say(f"{spec.verb}: {len(hosts)} host(s), stages {', '.join(spec.stages)}; record {record}")

    outcomes = {h.name: HostOutcome(h.name, "not-run") for h in hosts}
    changes: dict[str, list[dict[str, str]]] = {}
    interrupted = False
    if spec.plays:
        from provisioner.runner import run_playbook

        shown = {FACTS_PLAY, *spec.plays}

        def on_playbook_event(event: Event) -> None:
            if controls.check and event.changed and event.host:
                changes.setdefault(event.host, []).append(
                    {"stage": event.stage or "-", "task": event.task or "-", "diff": event.diff}
                )
            if controls.on_event is not None:
                controls.on_event(event)

        result = run_playbook(
            spec.playbook,
            inventory,
            record_dir=record,
            limit=limit,
            tags=spec.tags,
            check=controls.check,
            forks=controls.forks,
            extravars=spec.extravars,
            on_event=on_playbook_event,
        )
        interrupted = result.interrupted
        for name, outcome in outcomes.items():
            stats = result.stats.get(name)
            outcome.stats = stats.as_dict() if stats else {}
            outcome.stages = {
                stage: state
                for stage, state in result.stages.get(name, {}).items()
                if stage in shown or state in ("failed", "unreachable")
            }
            failures = [f for f in result.failures if f.host == name]
            if failures:
                first = failures[0]
                outcome.status = "unreachable" if first.unreachable else "failed"
                outcome.reason = f"{first.stage or '-'}: {first.task}: {first.message}".strip()
            elif stats is not None:
                outcome.status = "done"
            elif interrupted:
                outcome.status = "interrupted"
            outcome.reboot_pending = name in result.reboot_pending
            if outcome.reboot_pending and outcome.status == "done":
                outcome.status = "reboot-pending"
                outcome.reason = "the driver change needs a reboot; gpuprov_reboot_allowed is false"
        if interrupted:
            for outcome in outcomes.values():
                if outcome.status in ("done", "not-run") and not outcome.stats:
                    outcome.status = "interrupted"
    else:
        for outcome in outcomes.values():
            outcome.status = "done"

    verify_report: dict[str, Any] = {}
    verify_s = 0.0
    if VERIFY in spec.stages and not controls.check and not interrupted:
        ready = [h for h in hosts if outcomes[h.name].status == "done"]
        if ready:
            say(f"{spec.verb}: verifying {len(ready)} host(s)")
            t0 = time.monotonic()
            verify_report = _verify(ready, spec)
            verify_s = time.monotonic() - t0
            for name, hr in verify_report.items():
                outcome = outcomes[name]
                outcome.verify = hr.status
                bad = [f for f in hr.findings if f.status in ("warn", "fail", "error")]
                outcome.verify_failures = [f"{f.id}: {f.status}: {f.detail}" for f in bad]
                if hr.error:
                    outcome.verify_failures.append(f"unreachable: {hr.error}")
                if bad or hr.error:
                    outcome.status = "verify-failed"
                    outcome.reason = outcome.verify_failures[0]

    summary = {
        "verb": spec.verb,
        "inventory": command["inventory"],
        "record": str(record),
        "check": controls.check,
        "stages": spec.stages,
        "interrupted": interrupted,
        "hosts": [outcomes[h.name].to_dict() for h in hosts],
    }
    summary["totals"] = {
        status: sum(1 for o in outcomes.values() if o.status == status)
        for status in sorted({o.status for o in outcomes.values()})
    }
    if verify_report:
        records.write_json(record / "verify.json", {n: hr.to_dict() for n, hr in verify_report.items()})
    if controls.check:
        # What check mode found would change, per host and task, with the diffs Ansible gave. A host
        # whose run did not finish is listed only with what it found before: an empty list would read
        # as "nothing would change" where nothing could be checked.
        summary["changes"] = {
            h.name: changes.get(h.name, [])
            for h in hosts
            if spec.plays and (outcomes[h.name].status in CHECKED or changes.get(h.name))
        }
    records.write_json(record / "summary.json", summary)
    if interrupted:
        code = EXIT_INTERRUPTED
    else:
        code = EXIT_OK if all(o.status == "done" for o in outcomes.values()) else EXIT_FAILED
    return VerbResult(code, summary, verify_report, verify_s)
