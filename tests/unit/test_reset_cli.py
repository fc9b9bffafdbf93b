"""`gpuprov reset` refuses bad input with exit 2 before any host is touched, and takes the stages back
in reverse bootstrap order, one play per stage of playbooks/reset.yml, each its role's reset entry
point."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from cli_inventory import assert_untouched, inventory, write_inventory
from cli_inventory import gpuprov as run_gpuprov

from provisioner.reset.verb import NOT_RESET, RESETTABLE, reset_stages
from provisioner.stages import STAGE_NAMES

REPO = Path(__file__).resolve().parents[2]
INVENTORY = inventory("gpu1: {ansible_host: 192.0.2.11}")


def gpuprov(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_gpuprov(home, *args, input="", timeout=60)


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    return write_inventory(tmp_path, INVENTORY, group_vars=True)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(["--only", "driver", "--yes"], "--only: unknown stage driver", id="unknown-stage"),
        pytest.param(["--skip", "kubelet", "--yes"], "--skip: unknown stage kubelet", id="unknown-skip"),
        pytest.param(
            ["--only", "preflight", "--yes"], "preflight has nothing to take back", id="preflight-not-reset"
        ),
        pytest.param(
            ["--only", "gpu_tenants", "--yes"],
            "go with the cluster (reset kubernetes)",
            id="tenants-not-reset",
        ),
        pytest.param(
            ["--only", "docker", "--remove-crds", "--yes"],
            "--remove-crds: the gpu_operator stage is not among those reset",
            id="crds-without-operator",
        ),
        pytest.param(["--skip", ",".join(RESETTABLE), "--yes"], "leave no stage", id="nothing-left"),
        pytest.param(["--limit", "gpu9", "--yes"], "no host selected by --limit gpu9", id="limit-nothing"),
        pytest.param([], "without --yes", id="needs-yes-without-terminal"),
    ],
)
def test_bad_input_is_refused_before_any_host_is_touched(
    tmp_path: Path, inv: Path, args: list[str], said: str
) -> None:
    r = gpuprov(tmp_path, "reset", "-i", str(inv), *args)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr
    assert "Traceback" not in r.stderr
    assert_untouched(tmp_path)


def test_a_bad_setting_names_its_file_and_key(tmp_path: Path, inv: Path) -> None:
    (inv.parent / "group_vars" / "all.yml").write_text("gpuprov_reboot_allowed: perhaps\n")
    r = gpuprov(tmp_path, "reset", "-i", str(inv), "--yes")
    assert r.returncode == 2
    assert "group_vars/all.yml: gpuprov_reboot_allowed: expected a boolean" in r.stderr
    assert_untouched(tmp_path)


def test_the_inventory_is_required(tmp_path: Path) -> None:
    r = gpuprov(tmp_path, "reset", "--yes")
    assert r.returncode == 2 and "-i/--inventory is required" in r.stderr


def test_stages_go_back_in_reverse_bootstrap_order() -> None:
    assert reset_stages([], []) == list(reversed(RESETTABLE))
    assert reset_stages(["docker", "nvidia_driver", "kubernetes"], []) == [
        "kubernetes",
        "docker",
        "nvidia_driver",
    ]
    assert reset_stages([], ["gpu_operator"])[0] == "kubernetes"
    # Every bootstrap stage is either taken back or says why not.
    assert set(RESETTABLE) | set(NOT_RESET) >= set(STAGE_NAMES)
    assert [s for s in STAGE_NAMES if s in RESETTABLE] == list(RESETTABLE)


def test_the_playbook_has_one_play_per_stage_in_reverse_each_the_roles_reset() -> None:
    plays = yaml.safe_load((REPO / "playbooks" / "reset.yml").read_text())
    names = [p["name"] for p in plays]
    assert names == ["Facts", *reversed(RESETTABLE), "proof"]
    site = {p["name"]: p for p in yaml.safe_load((REPO / "playbooks" / "site.yml").read_text())}
    for play in plays[1:-1]:
        stage = play["name"]
        assert play["tags"] == [stage]
        assert site[stage]["hosts"].split(":")[0] in ("kube_control_plane", "gpu_nodes", "k8s_cluster")
        assert play["hosts"] == "kube_control_plane:gpu_nodes", stage  # every host: its ledger decides
        (task,) = play["tasks"]
        assert task["ansible.builtin.import_role"] == {"name": stage, "tasks_from": "reset"}
        assert (REPO / "roles" / stage / "tasks" / "reset.yml").is_file()
    assert plays[-1]["tags"] == ["always"]


def test_the_ledger_knows_the_same_stages_in_the_same_order() -> None:
    ledger_vars = yaml.safe_load((REPO / "roles" / "host_ledger" / "vars" / "main.yml").read_text())
    assert ledger_vars["__host_ledger_order"] == list(RESETTABLE)


@pytest.mark.parametrize("stage", RESETTABLE)
def test_every_stage_brackets_its_run_with_the_ledger(stage: str) -> None:
    tasks = yaml.safe_load((REPO / "roles" / stage / "tasks" / "main.yml").read_text())
    imports = [t.get("ansible.builtin.import_role", {}) for t in tasks]
    assert imports[0] == {"name": "host_ledger", "tasks_from": "start"}, stage
    assert imports[-1] == {"name": "host_ledger", "tasks_from": "end"}, stage
    assert tasks[0]["vars"]["host_ledger_stage"] == stage and tasks[-1]["vars"]["host_ledger_stage"] == stage
    reset = yaml.safe_load((REPO / "roles" / stage / "tasks" / "reset.yml").read_text())
    used = [t.get("ansible.builtin.import_role", {}).get("tasks_from") for t in reset]
    assert used.index("plan") < used.index("undo"), stage
