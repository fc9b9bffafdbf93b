"""`run_bootstrap`: the verb. It checks the input, runs the stage playbook, verifies, and returns a
BootstrapResult; the CLI shows the progress events it passes on and the result."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.config import validate_inventory_settings
from provisioner.content import PLAYBOOKS_DIR, role_default
from provisioner.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, InputError
from provisioner.runner import Event
from provisioner.stages import STAGE_NAMES, STAGES, VERIFY, select_stages

SITE_PLAYBOOK = PLAYBOOKS_DIR / "site.yml"
# Host statuses after which check mode's list of a host's changes is complete.
CHECKED = ("done", "reboot-pending")
FACTS_PLAY = "Facts"  # site.yml's first play, tagged always: it runs whatever the stages


@dataclass(frozen=True)
class Day2Entry:
    """A day-2 verb that runs one part of a stage through its own playbook, then verifies what it set."""

    verb: str  # the record's and summary's name
    playbook: str  # in playbooks/
    play: str  # the playbook's play, as its events name it
    stage: str  # the bootstrap stage whose settings it applies (what verification expects)
    checks: dict[str, tuple[str, ...]]  # inventory group → the checks its hosts are verified with


ENTRIES: dict[str, Day2Entry] = {
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


# ------------------------------------------------------------------------------------------ summary


@dataclass
class BootstrapResult:
    """What a bootstrap did: the summary (also in the run record) and the verification of the hosts."""

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


def _check_ids(stages: list[str], host: Any) -> list[str]:
    ids: list[str] = []
    for stage in STAGES:
        if stage.name in stages:
            ids.extend(stage.check_ids_for(host.groups))
    return list(dict.fromkeys(ids))


def _verify(hosts: list[Any], stages: list[str], entry: Day2Entry | None = None) -> dict[str, Any]:
    """Verify each host against what its stages promise; returns {host: HostReport}."""
    from provisioner.policy import Policy
    from provisioner.verification import verify_hosts

    by_checks: dict[tuple[str, ...], list[Any]] = {}
    for h in hosts:
        if entry is None:
            ids = _check_ids(stages, h)
        else:
            ids = list(dict.fromkeys(i for g, c in entry.checks.items() if g in h.groups for i in c))
        by_checks.setdefault(tuple(ids), []).append(h)
    stages = [entry.stage] if entry is not None else stages
    reports: dict[str, Any] = {}
    for ids, group in by_checks.items():
        if not ids:
            continue
        policy = Policy(path=None, hosts={h.name: expectations_for(h, stages) for h in group})
        report = verify_hosts(group, policy, checks=list(ids))
        for hr in report.hosts:
            reports[hr.host] = hr
    return reports


# ------------------------------------------------------------------------------------------ the verb


def _confirm(
    hosts: list[Any], stages: list[str], assume_yes: bool, confirm: Callable[[str], bool] | None
) -> None:
    if assume_yes:
        return
    if confirm is None:
        raise InputError(
            f"refusing to change {len(hosts)} host(s) without --yes (standard input is not a terminal)"
        )
    names = ", ".join(h.name for h in hosts[:8]) + (" ..." if len(hosts) > 8 else "")
    if not confirm(f"Bootstrap {len(hosts)} host(s) ({names}) through {', '.join(stages)}?"):
        raise InputError("not confirmed; nothing was changed")


def progress_filter(only: list[str], skip: list[str]) -> set[str] | None:
    """The plays whose progress to show (None: all). Plays of stages left out by --only/--skip still
    start (Ansible validates every role's arguments, a task tagged `always`); only their failures show."""
    plays = [s for s in select_stages(only, skip) if s in STAGE_NAMES]
    return None if len(plays) == len(STAGE_NAMES) else {FACTS_PLAY, *plays}


def _retry_limit(inventory: Path, limit: str | None) -> str | None:
    import json

    record = records.latest("bootstrap", str(inventory.resolve()))
    if record is None:
        raise InputError(f"--retry-failed: no earlier bootstrap run recorded for {inventory}")
    doc = json.loads((record / "summary.json").read_text())
    failed = [h["host"] for h in doc.get("hosts", []) if h.get("status") not in ("done",)]
    if not failed:
        return None
    names = ",".join(failed)
    return f"{names}:&{limit}" if limit else names


def run_bootstrap(
    *,
    inventory: Path | None,
    only: list[str],
    skip: list[str],
    limit: str | None,
    check: bool,
    assume_yes: bool,
    retry_failed: bool,
    forks: int,
    on_event: Callable[[Event], None] | None = None,
    notify: Callable[[str], None] | None = None,
    confirm: Callable[[str], bool] | None = None,
    entry: Day2Entry | None = None,
) -> BootstrapResult:
    """The verb (or, with `entry`, a day-2 verb running its own playbook the same way). Bad input raises
    InputError before any host is touched. `on_event` gets every playbook
    event as it happens (the live progress), `notify` a line at each phase, `confirm` the question asked
    before hosts are changed (None: nobody to ask, so only --yes goes on)."""
    from provisioner.inventory import load_inventory

    say = notify or (lambda text: None)

    if inventory is None:
        raise InputError("-i/--inventory is required (try: gpuprov lab inventory)")
    verb = entry.verb if entry is not None else "bootstrap"
    chosen = select_stages(only, skip) if entry is None else [entry.play, VERIFY]
    plays = [s for s in chosen if s in STAGE_NAMES] if entry is None else [entry.play]
    playbook = SITE_PLAYBOOK if entry is None else PLAYBOOKS_DIR / entry.playbook
    if not playbook.is_file():
        raise InputError(f"{playbook}: playbook missing from this installation")
    inv = load_inventory(inventory)
    if retry_failed:
        limit = _retry_limit(inventory, limit)
        if limit is None:
            say("bootstrap: the last run left no failed host; nothing to retry")
            return BootstrapResult(EXIT_OK)
    hosts = inv.select(limit)
    if not hosts:
        raise InputError(f"{inventory}: no host selected" + (f" by --limit {limit}" if limit else ""))
    validate_inventory_settings(inv, hosts)
    if not check:
        _confirm(hosts, chosen, assume_yes, confirm)

    record = records.new_record(verb)
    command = {
        "verb": verb,
        "inventory": str(inventory.resolve()),
        "stages": chosen,
        "limit": limit,
        "check": check,
        "forks": forks,
        "hosts": [h.name for h in hosts],
    }
    records.write_json(record / "command.json", command)
    say(f"{verb}: {len(hosts)} host(s), stages {', '.join(chosen)}; record {record}")

    outcomes = {h.name: HostOutcome(h.name, "not-run") for h in hosts}
    changes: dict[str, list[dict[str, str]]] = {}
    interrupted = False
    if plays:
        from provisioner.runner import run_playbook

        all_plays = entry is not None or len(plays) == len(STAGE_NAMES)
        shown = {FACTS_PLAY, *plays}

        def on_playbook_event(event: Event) -> None:
            if check and event.changed and event.host:
                changes.setdefault(event.host, []).append(
                    {"stage": event.stage or "-", "task": event.task or "-", "diff": event.diff}
                )
            if on_event is not None:
                on_event(event)

        result = run_playbook(
            playbook,
            inventory,
            record_dir=record,
            limit=limit,
            tags=None if all_plays else plays,
            check=check,
            forks=forks,
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
    if VERIFY in chosen and not check and not interrupted:
        ready = [h for h in hosts if outcomes[h.name].status == "done"]
        if ready:
            say(f"{verb}: verifying {len(ready)} host(s)")
            t0 = time.monotonic()
            verify_report = _verify(ready, chosen, entry)
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
        "verb": verb,
        "inventory": command["inventory"],
        "record": str(record),
        "check": check,
        "stages": chosen,
        "interrupted": interrupted,
        "hosts": [outcomes[h.name].to_dict() for h in hosts],
    }
    summary["totals"] = {
        status: sum(1 for o in outcomes.values() if o.status == status)
        for status in sorted({o.status for o in outcomes.values()})
    }
    if verify_report:
        records.write_json(record / "verify.json", {n: hr.to_dict() for n, hr in verify_report.items()})
    if check:
        # What check mode found would change, per host and task, with the diffs Ansible gave. A host
        # whose run did not finish is listed only with what it found before: an empty list would read
        # as "nothing would change" where nothing could be checked.
        summary["changes"] = {
            h.name: changes.get(h.name, [])
            for h in hosts
            if plays and (outcomes[h.name].status in CHECKED or changes.get(h.name))
        }
    records.write_json(record / "summary.json", summary)
    if interrupted:
        code = EXIT_INTERRUPTED
    else:
        code = EXIT_OK if all(o.status == "done" for o in outcomes.values()) else EXIT_FAILED
    return BootstrapResult(code, summary, verify_report, verify_s)
