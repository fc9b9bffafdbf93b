"""Bad input, as a careless or hostile user gives it: each case exits 2 (or reports an error status),
names the file or key, prints no traceback, and touches nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests/fixtures/snapshots/h200-device/vm"


def gpuprov(*args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
        cwd=REPO,
    )


def no_traceback(res: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in res.stderr and "Traceback" not in (res.stdout or ""), res.stderr


def test_a_binary_policy_file_is_named(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_bytes(b"\x00\xff\xfe binary")
    res = gpuprov("verify", "--snapshot", str(SNAPSHOT), "--policy", str(policy))
    no_traceback(res)
    assert res.returncode == 2 and str(policy) in res.stderr and "not a text file" in res.stderr


def test_a_full_stdout_is_one_line_not_a_traceback() -> None:
    with open("/dev/full", "w") as full:
        res = gpuprov("verify", "--snapshot", str(SNAPSHOT), stdout=full.fileno())
    no_traceback(res)
    assert res.returncode == 2 and "cannot write the output: No space left on device" in res.stderr


def test_a_closed_pipe_is_quiet() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisioner", "verify", "--snapshot", str(SNAPSHOT), "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err


@pytest.mark.parametrize("where", ["/proc/gpuprov-snapshot", "/sys/gpuprov-snapshot"])
def test_an_unwritable_snapshot_destination_is_refused_before_probing(where: str) -> None:
    res = gpuprov("snapshot", "--local", "-o", where)
    no_traceback(res)
    assert res.returncode == 2 and where in res.stderr
    assert "probing" not in res.stdout.lower()


def test_a_snapshot_destination_under_a_file_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = gpuprov("snapshot", "--local", "-o", str(blocker / "snap"))
    no_traceback(res)
    assert res.returncode == 2 and str(blocker) in res.stderr
    assert blocker.read_text() == "x"


def test_verify_output_under_proc_is_refused_before_probing(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(SNAPSHOT, snap / "vm")
    res = gpuprov("verify", "--snapshot", str(snap), "-o", "/proc/gpuprov-report.json")
    no_traceback(res)
    assert res.returncode == 2 and "/proc/gpuprov-report.json" in res.stderr


SAMPLE = REPO / "inventory/sample/hosts.yml"


@pytest.mark.parametrize("limit", ["[", "a b", "~gpu[12", "gpu1;reboot"])
def test_a_limit_ansible_would_misread_is_refused(limit: str) -> None:
    """A lone '[' makes Ansible select every host: refused before any host is reached."""
    res = gpuprov("verify", "-i", str(SAMPLE), "--limit", limit)
    no_traceback(res)
    assert res.returncode == 2 and f"--limit {limit}" in res.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0"])
def test_a_drain_timeout_that_is_no_duration_is_refused(value: str) -> None:
    res = gpuprov("upgrade-driver", "-i", str(SAMPLE), "--to", "580", "--drain-timeout", value, "--dry-run")
    no_traceback(res)
    assert res.returncode == 2 and "--drain-timeout" in res.stderr
    assert "NaN" not in res.stdout and "Infinity" not in res.stdout


@pytest.mark.parametrize(
    ("settings", "key", "why"),
    [
        ("nvidia_driver_branch: abc", "nvidia_driver_branch", "must be a driver branch"),
        ('nvidia_driver_branch: "580.5"', "nvidia_driver_branch", "must be a driver branch"),
        ('nvidia_driver_version: "580.1; reboot"', "nvidia_driver_version", "must be a full driver version"),
        ('nvidia_driver_version: "$(id)"', "nvidia_driver_version", "must be a full driver version"),
        ('nvidia_driver_branch: "580"\nnvidia_driver_version: "570.1"', "nvidia_driver_version", "in branch"),
        ('nvidia_driver_package_revision: "1ubuntu1"', "nvidia_driver_package_revision", "revision like"),
    ],
)
def test_driver_settings_in_the_wrong_form_are_refused_before_connecting(
    tmp_path: Path, settings: str, key: str, why: str
) -> None:
    """The role refuses these too, but only once connected: gpuprov names the file and key first."""
    inv = tmp_path / "inv"
    shutil.copytree(SAMPLE.parent, inv)
    (inv / "group_vars" / "gpu_nodes.yml").write_text(settings + "\n")
    res = gpuprov("bootstrap", "-i", str(inv / "hosts.yml"), "--yes")
    no_traceback(res)
    assert res.returncode == 2, res.stderr
    assert key in res.stderr and why in res.stderr
    assert str(inv / "group_vars" / "gpu_nodes.yml") in res.stderr


GPU_SETTINGS_CASES = [
    pytest.param(
        "all.yml",
        "gpuprov_gpu_sharing_profiles:\n  ts4:\n    sharing:\n      timeSlicing:\n        resources:\n"
        "          - {name: gpu, replica: 4}\n",
        "gpuprov_gpu_sharing_profiles",
        "unknown key 'replica'",
        id="bad-sharing-profile",
    ),
    pytest.param(
        "gpu_nodes.yml",
        "gpuprov_gpu_sharing_profiles:\n  mps2:\n    sharing:\n      mps:\n        resources:\n"
        "          - {name: gpu, replicas: 2}\ngpuprov_gpu_sharing: mps2\ngpuprov_mig_config: all-1g.18gb\n",
        "gpuprov_gpu_sharing",
        "MPS cannot share MIG-enabled GPUs",
        id="mps-on-mig-host",
    ),
    pytest.param("all.yml", "gpuprov_mig_strategy: both\n", "gpuprov_mig_strategy",
                 "not one of: single, mixed", id="unknown-strategy"),
    pytest.param("all.yml", "gpuprov_tenants:\n  - {name: team-a, gpus: many}\n", "gpuprov_tenants",
                 ".gpus: expected a whole number", id="bad-tenant"),
]  # fmt: skip


@pytest.mark.parametrize("verb", [("bootstrap",), ("sharing", "apply"), ("tenants", "apply")])
@pytest.mark.parametrize(("file", "settings", "key", "why"), GPU_SETTINGS_CASES)
def test_gpu_sharing_mig_and_tenant_settings_are_refused_before_connecting(
    tmp_path: Path, file: str, settings: str, key: str, why: str, verb: tuple[str, ...]
) -> None:
    """bootstrap and the day-2 verbs read the same settings the same way (addresses in the sample
    inventory are TEST-NET: a verb that tried to connect would hang or fail differently)."""
    inv = tmp_path / "inv"
    shutil.copytree(SAMPLE.parent, inv)
    where = inv / "group_vars" / file
    if where.name == "all.yml":
        where = inv / "group_vars" / "all" / "gpu_settings.yml"
    where.write_text(settings)
    res = gpuprov(*verb, "-i", str(inv / "hosts.yml"), "--yes")
    no_traceback(res)
    assert res.returncode == 2, res.stderr
    assert f"{key}: " in res.stderr and why in res.stderr and str(where) in res.stderr, res.stderr
    first_host = "gpu1" if file == "gpu_nodes.yml" else "cp1"
    assert f"(host {first_host}" in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (
            "gpuprov_mig_config: 'all 1g;reboot'\n",
            "gpuprov_mig_config: 'all 1g;reboot' is no Kubernetes label value",
        ),
        (
            "gpuprov_mig_config: all-1g.18gb\ngpuprov_mig_strategy: sometimes\n",
            "gpuprov_mig_strategy: 'sometimes' is not one of: single, mixed",
        ),
    ],
)
def test_mig_apply_refuses_bad_layout_settings_before_connecting(
    tmp_path: Path, settings: str, why: str
) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(SAMPLE.parent, inv)
    (inv / "group_vars" / "gpu_nodes.yml").write_text(settings)
    res = gpuprov("mig", "apply", "-i", str(inv / "hosts.yml"))
    no_traceback(res)
    assert res.returncode == 2 and why in res.stderr and "gpu1" in res.stderr, res.stderr
    assert str(inv / "group_vars" / "gpu_nodes.yml") in res.stderr


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_a_port_that_is_no_tcp_port_is_refused(tmp_path: Path, port: str) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    gpu1: {{ansible_host: 192.0.2.1, ansible_port: {port}}}\n")
    res = gpuprov("verify", "-i", str(inv))
    no_traceback(res)
    assert res.returncode == 2 and "ansible_port" in res.stderr and "gpu1" in res.stderr


POLICY_CASES = [
    ("gpu.xid.ignore: [-1]\n", "gpu.xid.ignore", "is not an Xid"),
    ("gpu.xid.ignore: [99999999999]\n", "gpu.xid.ignore", "is not an Xid"),
    ("gpu.count: 8\ngpu.count: 7\n", "line 2", "duplicate key 'gpu.count'"),
    ("a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n", "line 2", "aliases are not allowed"),
]


@pytest.mark.parametrize(("text", "where", "why"), POLICY_CASES)
def test_a_policy_with_impossible_or_ambiguous_values_is_refused(
    tmp_path: Path, text: str, where: str, why: str
) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_text(text)
    res = gpuprov("verify", "--snapshot", str(SNAPSHOT), "--policy", str(policy))
    no_traceback(res)
    assert res.returncode == 2 and str(policy) in res.stderr and where in res.stderr and why in res.stderr
    assert len(res.stderr) < 1000


@pytest.mark.parametrize(("section", "name"), [("groups", "gpu_nodez"), ("hosts", "gpu-017")])
def test_policy_groups_and_hosts_must_exist_in_the_inventory(tmp_path: Path, section: str, name: str) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_text(f"{section}:\n  {name}:\n    gpu.count: 7\n")
    res = gpuprov("verify", "-i", str(SAMPLE), "--policy", str(policy))
    no_traceback(res)
    assert res.returncode == 2 and f"{section}.{name}: no such" in res.stderr and str(policy) in res.stderr


def test_type_errors_speak_yaml_not_python(tmp_path: Path) -> None:
    """Ansible wraps inventory values in its own classes: their names never reach a message."""
    inv = tmp_path / "inv"
    shutil.copytree(SAMPLE.parent, inv)
    (inv / "group_vars" / "gpu_nodes.yml").write_text("nvidia_driver_modules: nvidia\n")
    res = gpuprov("bootstrap", "-i", str(inv / "hosts.yml"), "--yes")
    no_traceback(res)
    assert res.returncode == 2 and "expected list, got string 'nvidia'" in res.stderr, res.stderr
    assert "_Ansible" not in res.stderr


def test_progress_lines_and_summary_tables_show_host_words_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Failure reasons quote hosts and kubectl (Ansible messages, stderr lines): as text, escaped."""
    import io

    from provisioner.playbookverb import render as bootstrap
    from provisioner.rollout import render as upgrade

    hostile = "dpkg error\x1b]0;owned\x07\x1b[2J [/bold]"
    out = io.StringIO()
    upgrade.Progress(out)("gpu1", hostile)
    bootstrap.PlainProgress(out)._print(hostile)
    assert "\x1b" not in out.getvalue() and out.getvalue().count("\\x1b]0;owned\\x07") == 2
    row = {"host": "gpu1", "from": "570", "to": "580", "result": "failed", "duration_s": 1.0}
    row["reason"] = hostile
    upgrade.render_summary(
        {"target": "580", "hosts": [row], "totals": {"failed": 1}, "status": "finished", "record": "r",
         "resumable": False, "stop_reason": ""}, "table",
    )  # fmt: skip
    brow = {"host": "gpu1", "status": "failed", "ok": 1, "changed": 0, "failed": 1, "unreachable": 0,
            "skipped": 0, "reason": hostile}  # fmt: skip
    summary = {"hosts": [brow], "totals": {"failed": 1}, "record": "r", "check": False}
    bootstrap.render_summary(summary, "table", {})
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "[/bold]" in printed
