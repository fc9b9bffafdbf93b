"""`gpuprov upgrade-driver` on the lab, node by node, through the real CLI.

Uses the session lab of tests/conftest.py (cp1 + a GPU host per containerd generation). The Debian 13
GPU hosts (NVIDIA's debian13 repository: driver 590 and later) roll from 590.48.01 to 595.91.07; in this
order: dry run (nothing changes) → a drain that times out (`drain-block`: host failed, uncordoned,
untouched) → an install that fails (`install-fail`, --max-fail 0: the rollout stops, the other host is
untouched and schedulable) → --resume once the fault is cleared (the rest completes, batch after batch) →
a rerun (every host already at the target: skipped). The Debian 12 host with NVSwitches is bootstrapped
at 570 (group_vars in a copy of the lab's inventory directory) and moved to 580: a branch switch, whose
fabric manager changes its package name (nvidia-fabricmanager-570 → nvidia-fabricmanager). The module
leaves every host uncordoned and without faults.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from labkit import Lab, gpuprov

from provisioner.content import PLAYBOOKS_DIR, ROLES_DIR

pytestmark = pytest.mark.lab
LAB_PHASE = "reprovisions"  # see tests/conftest.py

# The Debian 13 hosts: the lab inventory's 590 release, then the next one NVIDIA's debian13 repository has.
OLD = "590.48.01"
NEW = "595.91.07"
# The Debian 12 host: 570 before, the nvidia_driver role's default (what `--to 580` resolves to) after.
OLD_DEBIAN12 = "570.195.03"
NEW_DEBIAN12 = "580.159.04"
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
NEEDS_FILES = (
    PLAYBOOKS_DIR / "site.yml",
    PLAYBOOKS_DIR / "upgrade_driver.yml",
    ROLES_DIR / "nvidia_driver" / "tasks" / "upgrade.yml",
    ROLES_DIR / "nvidia_driver" / "tasks" / "unload.yml",
)


def _missing() -> list[str]:
    missing = [
        m for m in ("provisioner.bootstrap", "provisioner.inventory") if importlib.util.find_spec(m) is None
    ]
    return missing + [str(p.relative_to(PLAYBOOKS_DIR.parent)) for p in NEEDS_FILES if not p.is_file()]


@dataclass
class Fleet570:
    lab: Lab
    inventory: Path
    home: Path
    gpu_hosts: list[str]  # the Debian 13 GPU hosts, which roll together
    debian12_hosts: list[str]

    def upgrade(self, *args: str, timeout: float = 1800) -> tuple[int, dict[str, Any], str]:
        # Every rollout is limited to one Debian release's hosts (one CUDA repository, one target).
        limit = [] if "--limit" in args or "--resume" in args else ["--limit", ",".join(self.gpu_hosts)]
        res = gpuprov(
            "upgrade-driver", "-i", str(self.inventory), "--format", "json", *args, *limit,
            timeout=timeout, env={"GPUPROV_HOME": str(self.home)},
        )  # fmt: skip
        try:
            summary = json.loads(res.stdout) if res.stdout.strip() else {}
        except ValueError:
            pytest.fail(
                f"upgrade-driver printed no JSON (rc {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr}"
            )
        return res.returncode, summary, res.stderr

    def loaded(self, host: str) -> str | None:
        res = self.lab.ssh(host, "cat /proc/driver/nvidia/version 2>/dev/null || true")
        m = re.search(r"Kernel Module\b.*?\s(\d+\.\d+\.\d+)\s", res.stdout)
        return m.group(1) if m else None

    def node(self, name: str) -> dict[str, Any]:
        res = self.lab.ssh("cp1", f"{KUBECTL} get node {name} -o json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def schedulable(self, name: str) -> bool:
        return not self.node(name).get("spec", {}).get("unschedulable", False)

    def annotation(self, name: str) -> str | None:
        return (self.node(name)["metadata"].get("annotations") or {}).get("gpuprov.io/driver-upgrade")

    def fault(self, host: str, kind: str) -> None:
        res = self.lab.cli("lab", "fault", host, kind)
        assert res.returncode == 0, res.stderr


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet570]:
    missing = _missing()
    if missing:  # checked before asking for the lab, so that no lab is brought up for nothing
        pytest.skip(f"the rolling upgrade on the lab needs {', '.join(missing)}, not in this checkout yet")
    lab: Lab = request.getfixturevalue("lab")
    base = tmp_path_factory.mktemp("upgrade")
    inv_dir = base / "inventory"
    (inv_dir / "group_vars").mkdir(parents=True)
    inventory = inv_dir / "hosts.yml"
    shutil.copyfile(lab.inventory, inventory)
    (inv_dir / "group_vars" / "gpu_nodes.yml").write_text(
        f"# The Debian 12 GPU hosts before their upgrade: driver {OLD_DEBIAN12} (the Debian 13 hosts'\n"
        "# settings are host variables of the lab's inventory, which win over these).\n"
        f'nvidia_driver_branch: "570"\nnvidia_driver_version: "{OLD_DEBIAN12}"\n'
        "# CUDA 13.0 (the default) needs a 580 driver; 12.8 runs on both.\n"
        'cuda_toolkit_versions: ["12.8"]\n'
    )
    env = Fleet570(
        lab, inventory, base / "home", lab.hosts_on("trixie", "trixie-containerd2"), lab.hosts_on("bookworm")
    )
    assert len(env.gpu_hosts) >= 2 and env.debian12_hosts, lab.hosts
    try:
        # Verification is bootstrap's own business (tests/integration/test_bootstrap_lab.py); here the
        # loaded driver is checked below, on every GPU host.
        res = gpuprov("bootstrap", "-i", str(inventory), "--yes", "--skip", "verify", "--format", "json",
                      timeout=3600, env={"GPUPROV_HOME": str(env.home)})  # fmt: skip
        assert res.returncode == 0, f"bootstrap failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        for host in env.gpu_hosts:
            assert env.loaded(host) == OLD, host
            assert env.schedulable(host), host
        for host in env.debian12_hosts:
            assert env.loaded(host) == OLD_DEBIAN12, host
        yield env
    finally:
        for host in lab.hosts:
            lab.cli("lab", "fault", host, "clear")
            if host in env.gpu_hosts + env.debian12_hosts:
                lab.ssh("cp1", f"{KUBECTL} uncordon {host}")


def by_host(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in summary["hosts"]}


def test_dry_run_plans_and_touches_nothing(fleet: Fleet570) -> None:
    first, second = fleet.gpu_hosts[:2]
    res = gpuprov(
        "upgrade-driver", "-i", str(fleet.inventory), "--to", NEW, "--batch", "1", "--canary", "1",
        "--limit", ",".join(fleet.gpu_hosts), "--dry-run", env={"GPUPROV_HOME": str(fleet.home)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert f"target {NEW} (version)" in res.stdout
    assert f"canary (1 host, in parallel):\n  {first:<20} {OLD} → {NEW}" in res.stdout
    assert f"batch 1 (1 host, in parallel):\n  {second:<20} {OLD} → {NEW}" in res.stdout
    assert "cordon, drain, stop GPU services" in res.stdout
    assert not (fleet.home / "runs").exists() or not any((fleet.home / "runs").glob("*-upgrade-driver*"))
    for host in fleet.gpu_hosts:
        assert fleet.loaded(host) == OLD
        assert fleet.schedulable(host)


def test_drain_timeout_leaves_the_host_untouched_and_uncordoned(fleet: Fleet570) -> None:
    host = fleet.gpu_hosts[-1]
    fleet.fault(host, "drain-block")
    try:
        rc, summary, stderr = fleet.upgrade("--to", NEW, "--limit", host, "--drain-timeout", "15")
    finally:
        fleet.fault(host, "clear")
    assert rc == 1, stderr
    row = by_host(summary)[host]
    assert row["result"] == "failed", row
    assert row["reason"].startswith("drain: kubectl drain (timeout 15s):"), row["reason"]
    assert "the host was not touched" in row["reason"]
    assert fleet.schedulable(host)
    assert fleet.annotation(host) is None
    assert fleet.loaded(host) == OLD
    state = json.loads((Path(summary["record"]) / "state.json").read_text())
    steps = [h[0] for h in state["hosts"][host]["history"]]
    assert steps == ["probing", "cordoning", "draining", "uncordoning", "failed"]  # never got to the driver


def test_failed_install_stops_the_rollout_with_the_rest_untouched(fleet: Fleet570) -> None:
    first, rest = fleet.gpu_hosts[0], fleet.gpu_hosts[1:]
    fleet.fault(first, "install-fail")
    rc, summary, stderr = fleet.upgrade("--to", NEW, "--batch", "1", "--max-fail", "0")
    assert rc == 1, stderr
    rows = by_host(summary)
    assert rows[first]["result"] == "failed", rows[first]
    assert rows[first]["cordoned"] is True
    assert summary["status"] == "stopped" and summary["resumable"]
    # The failed host stays out of scheduling, annotated with the reason.
    assert not fleet.schedulable(first)
    assert (fleet.annotation(first) or "").startswith("failed: ")
    for host in rest:
        assert rows[host]["result"] == "not-started", rows[host]
        assert fleet.loaded(host) == OLD, host  # still on its working driver
        assert fleet.schedulable(host), host  # never cordoned
        assert f"{host:<20} cordoning" not in stderr


def test_resume_after_clearing_the_fault_completes_the_rest(fleet: Fleet570) -> None:
    fleet.fault(fleet.gpu_hosts[0], "clear")
    rc, summary, stderr = fleet.upgrade("--resume")
    assert rc == 0, (summary, stderr[-3000:])
    rows = by_host(summary)
    assert summary["status"] == "finished" and not summary["resumable"]
    for host in fleet.gpu_hosts:
        assert rows[host]["result"] == "upgraded", rows[host]
        assert (rows[host]["from"], rows[host]["to"]) == (OLD, NEW)
        assert fleet.loaded(host) == NEW, host
        assert fleet.schedulable(host), host
        assert fleet.annotation(host) is None, host
    # Batches of one: each host started only after the one before had finished.
    state = json.loads((Path(summary["record"]) / "state.json").read_text())
    spans = []
    for host in fleet.gpu_hosts:
        history = state["hosts"][host]["history"]
        start = max(t for step, t, *_ in history if step == "probing")
        end = next(t for step, t, *_ in reversed(history) if step == "upgraded")
        spans.append((start, end))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end


def test_hosts_at_the_target_are_skipped(fleet: Fleet570) -> None:
    rc, summary, stderr = fleet.upgrade("--to", NEW, "--batch", "2")
    assert rc == 0, stderr
    for row in by_host(summary).values():
        assert row["result"] == "skipped", row
        assert row["reason"] == f"already at {NEW}: {NEW} loaded"
    assert "cordoning" not in stderr
    state = json.loads((Path(summary["record"]) / "state.json").read_text())
    for host in fleet.gpu_hosts:
        assert [h[0] for h in state["hosts"][host]["history"]] == ["probing", "skipped"]


def test_a_branch_switch_replaces_the_fabric_manager(fleet: Fleet570) -> None:
    """570 → 580 on the Debian 12 host with NVSwitches: from 580 on NVIDIA's fabric manager and NVSwitch
    library have no branch in their names, so the 570 ones are removed and the new ones installed; the
    node comes back schedulable with the GPU Operator's operands running again. (Keeping a MIG layout
    across an upgrade needs MIG devices the lab's device plugin cannot see: tested with fakes,
    test_upgrade_fakes.py.)"""
    host = next(h for h in fleet.debian12_hosts if fleet.lab.hosts[h].profile == "h100-sxm-8")
    rc, summary, stderr = fleet.upgrade("--to", "580", "--limit", host)
    assert rc == 0, (summary, stderr[-3000:])
    row = by_host(summary)[host]
    assert row["result"] == "upgraded" and (row["from"], row["to"]) == (OLD_DEBIAN12, NEW_DEBIAN12), row
    assert fleet.loaded(host) == NEW_DEBIAN12
    assert fleet.schedulable(host)
    fields = "${Package} ${Version} ${db:Status-Abbrev}\\n"
    query = f"dpkg-query -W -f='{fields}' 'nvidia-fabricmanager*' 'libnvidia-nscq*'"
    res = fleet.lab.ssh(host, f"{query}; systemctl is-active nvidia-fabricmanager")
    rows = [ln.split() for ln in res.stdout.splitlines() if len(ln.split()) >= 3]
    # Installed ones (dpkg keeps a removed package's configuration files: status rc).
    installed = {r[0]: r[1:] for r in rows if r[2][1:2] == "i"}
    assert installed["nvidia-fabricmanager"][0] == f"{NEW_DEBIAN12}-1", installed
    assert installed["libnvidia-nscq"][0] == f"{NEW_DEBIAN12}-1", installed
    assert installed["nvidia-fabricmanager"][1].startswith("h"), installed  # held
    assert "nvidia-fabricmanager-570" not in installed and "libnvidia-nscq-570" not in installed, installed
    assert res.stdout.strip().endswith("active")
