"""`gpuprov bootstrap` refuses bad input with exit 2 before any host is touched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_inventory import assert_untouched, inventory, write_inventory
from cli_inventory import gpuprov as run_gpuprov

INVENTORY = inventory("gpu1: {ansible_host: 192.0.2.11}")


def gpuprov(home: Path, *args: str, stdin: str | None = "") -> subprocess.CompletedProcess[str]:
    return run_gpuprov(home, *args, input=stdin, timeout=60)


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    return write_inventory(tmp_path, INVENTORY, group_vars=True)


def test_inventory_required(tmp_path: Path) -> None:
    r = gpuprov(tmp_path, "bootstrap", "--yes")
    assert r.returncode == 2
    assert "-i/--inventory is required" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_inventory_file(tmp_path: Path) -> None:
    r = gpuprov(tmp_path, "bootstrap", "-i", str(tmp_path / "nope.yml"), "--yes")
    assert r.returncode == 2
    assert "nope.yml: inventory not found" in r.stderr


@pytest.mark.parametrize(
    ("group_vars", "args", "said"),
    [
        pytest.param({}, ["--only", "driver", "--yes"], "--only: unknown stage driver", id="unknown-stage"),
        pytest.param(
            {"all.yml": "gpuprov_reboot_allowed: perhaps\n"},
            ["--yes"],
            "group_vars/all.yml: gpuprov_reboot_allowed: expected a boolean",
            id="bad-setting-names-file-and-key",
        ),
        pytest.param(
            {"gpu_nodes.yml": "gpuprov_mirror: http://mirror.example\n"},
            ["--yes"],
            "gpu_nodes.yml: gpuprov_mirror: unknown setting",
            id="unknown-global-setting",
        ),
        pytest.param(
            {}, ["--limit", "gpu9", "--yes"], "no host selected by --limit gpu9", id="limit-matching-nothing"
        ),
        pytest.param({}, [], "without --yes", id="needs-yes-without-terminal"),
        pytest.param(
            {},
            ["--retry-failed", "--yes"],
            "no earlier bootstrap run recorded",
            id="retry-failed-without-earlier-run",
        ),
    ],
)
def test_bad_input_is_refused_before_any_host_is_touched(
    tmp_path: Path, inv: Path, group_vars: dict[str, str], args: list[str], said: str
) -> None:
    for name, text in group_vars.items():
        (inv.parent / "group_vars" / name).write_text(text)
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv), *args)
    assert r.returncode == 2
    assert said in r.stderr
    assert_untouched(tmp_path)


def test_retry_failed_nothing_left(tmp_path: Path, inv: Path) -> None:
    record = tmp_path / "runs" / "20260101T000000Z-bootstrap"
    record.mkdir(parents=True)
    summary = {"inventory": str(inv.resolve()), "hosts": [{"host": "cp1", "status": "done"}]}
    (record / "summary.json").write_text(json.dumps(summary))
    r = gpuprov(tmp_path, "bootstrap", "-i", str(inv), "--retry-failed", "--yes")
    assert r.returncode == 0
    assert "nothing to retry" in r.stderr


def test_help_lists_every_verb_fast(tmp_path: Path) -> None:
    r = gpuprov(tmp_path, "--help")
    assert r.returncode == 0
    for verb in ("bootstrap", "verify", "check", "snapshot", "lab", "stages"):
        assert verb in r.stdout
    # --help must not import Ansible (it would make every invocation slow)
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from provisioner import cli; print('ansible' in sys.modules)"],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "False"


class _Host:
    def __init__(self, name: str, groups: list[str], hostvars: dict | None = None) -> None:
        self.name, self.groups, self.vars = name, groups, hostvars or {}


ALL_STAGES = [
    "preflight",
    "nvidia_driver",
    "cuda_toolkit",
    "docker",
    "nvidia_container_toolkit",
    "kubernetes",
    "gpu_operator",
]


def test_control_plane_is_not_verified_for_gpus() -> None:
    from provisioner.bootstrap.verb import _check_ids

    cp = _Host("cp1", ["all", "k8s_cluster", "kube_control_plane"])
    ids = _check_ids(ALL_STAGES, cp)
    assert ids == ["os.supported", "services.active", "k8s.node_ready"]


def test_gpu_worker_is_verified_for_every_stage_that_reached_it() -> None:
    from provisioner.bootstrap.verb import _check_ids

    gpu = _Host("gpu1", ["all", "k8s_cluster", "gpu_nodes"])
    ids = _check_ids(ALL_STAGES, gpu)
    for wanted in (
        "gpu.present",
        "driver.loaded",
        "cuda.version",
        "container_toolkit.runtime",
        "k8s.node_ready",
        "k8s.gpu_allocatable",
    ):
        assert wanted in ids
    # A GPU host outside the cluster gets no Kubernetes checks.
    standalone = _Host("gpu9", ["all", "gpu_nodes"])
    ids = _check_ids(ALL_STAGES, standalone)
    assert "k8s.node_ready" not in ids and "k8s.gpu_allocatable" not in ids and "driver.loaded" in ids
    assert _check_ids(["docker"], standalone) == ["services.active"]


def test_stage_catalog_matches_the_site_playbook() -> None:
    """Each stage is one play of site.yml, in order, with the host pattern the catalog says."""
    import yaml

    from provisioner.content import PLAYBOOKS_DIR
    from provisioner.stages import STAGES

    plays = yaml.safe_load((PLAYBOOKS_DIR / "site.yml").read_text())
    staged = [(p["name"], p["hosts"]) for p in plays if p["name"] != "Facts"]
    assert staged == [(s.name, s.hosts) for s in STAGES]


def test_progress_shows_only_the_chosen_stages_and_any_failure() -> None:
    import io

    from provisioner.playbookverb.render import PlainProgress as Progress
    from provisioner.runner import Event

    out = io.StringIO()
    progress = Progress(out, shown={"Facts", "preflight"})
    for event in (
        Event("play_start", None, "preflight", None),
        Event("runner_on_ok", "gpu1", "preflight", "check the OS", True, ""),
        # Left out by --only, yet Ansible validates the role's arguments (a task tagged always).
        Event("play_start", None, "docker", None),
        Event("runner_on_ok", "gpu1", "docker", "Validating arguments against arg spec 'main'", False, ""),
        Event("runner_on_failed", "gpu2", "docker", "Validating arguments", False, "bad value"),
    ):
        progress(event)
    progress.finish()
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines[0] == "── preflight"
    assert lines[1].split() == ["gpu1", "preflight", "changed", "1"]
    assert "── docker" not in lines
    assert not any(line.split()[:2] == ["gpu1", "docker"] for line in lines)
    assert any("gpu2" in line and "FAILED" in line and "bad value" in line for line in lines)
