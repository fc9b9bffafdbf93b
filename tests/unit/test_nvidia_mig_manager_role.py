"""The nvidia_mig_manager role's logic, rendered by Ansible's own templar against NVIDIA's real files
(NVIDIA/mig-parted v0.15.0 deployments/systemd, from the vendor artifacts)."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_templar import render
from gpuprov_lab import vendor

from provisioner.stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nvidia_mig_manager"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _task(tasks_file: str, name_start: str) -> dict[str, Any]:
    return next(t for t in _yaml(ROLE / "tasks" / tasks_file) if t["name"].startswith(name_start))


def role_env(**knobs: Any) -> dict[str, Any]:
    return {
        **_yaml(ROLE / "defaults" / "main.yml"),
        **_yaml(ROLE / "vars" / "main.yml"),
        "inventory_hostname": "gpu9",
        "groups": {"gpu_nodes": ["gpu9"]},
        "ansible_facts": {"architecture": "x86_64"},
        **knobs,
    }


def template(name: str, env: dict[str, Any]) -> str:
    return render((ROLE / "templates" / name).read_text(), env)


def test_the_deb_comes_from_nvidias_release_or_the_mirror() -> None:
    env = role_env()
    assert render("{{ __nvidia_mig_manager_deb_url }}", env) == (
        "https://github.com/NVIDIA/mig-parted/releases/download/v0.15.0/nvidia-mig-manager_0.15.0-1_amd64.deb"
    )
    env = role_env(gpuprov_mirror_url="http://mirror.example/base/")
    assert render("{{ __nvidia_mig_manager_deb_url }}", env) == (
        "http://mirror.example/base/mig-parted/v0.15.0/nvidia-mig-manager_0.15.0-1_amd64.deb"
    )
    from gpuprov_lab.sim import migmanager

    assert render("{{ __nvidia_mig_manager_deb_name }}", env) == migmanager.DEB_NAME
    assert f"mig-parted/v0.15.0/{migmanager.DEB_NAME}" == migmanager.MIRROR_PATH


def _settings_problems(**knobs: Any) -> list[str]:
    task = _task("manage.yml", "Check the nvidia_mig_manager settings")
    env = {**role_env(**knobs), **task["vars"]}
    return render("{{ __problems }}", env)


def test_settings_need_a_config_name_and_a_sha256_pin() -> None:
    good = {"gpuprov_mig_config": "all-1g.18gb", "nvidia_mig_manager_deb_sha256": "ab" * 32}
    assert _settings_problems(**good) == []
    problems = _settings_problems(gpuprov_mig_config="all-1g.18gb")
    assert len(problems) == 1 and "nvidia_mig_manager_deb_sha256" in problems[0]
    problems = _settings_problems(**{**good, "gpuprov_mig_config": 'x"\nEnvironment=EVIL=1'})
    assert len(problems) == 1 and "is no mig-parted config name" in problems[0]
    problems = _settings_problems(**good, nvidia_mig_manager_gpu_clients=["a.service", "b; reboot"])
    assert problems == ["nvidia_mig_manager_gpu_clients: not a systemd service name: b; reboot"]
    problems = _settings_problems(**good, gpuprov_mig_custom_configs={"mig-configs": {}})
    assert len(problems) == 1 and "version: v1" in problems[0]


def _derived(custom: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    task = _task("select.yml", "Derive the config file")
    raw = vendor.artifact("mig-parted", "systemd/config-default.yaml").read_bytes()
    env = {
        **role_env(gpuprov_mig_custom_configs=custom),
        **task["vars"],
        "__nvidia_mig_manager_default_raw": {"content": base64.b64encode(raw).decode()},
    }
    facts = {k: render(v, env) for k, v in task["ansible.builtin.set_fact"].items()}
    return facts, env


def test_without_custom_configs_the_service_reads_nvidias_default_file() -> None:
    facts, env = _derived({})
    assert facts["__nvidia_mig_manager_collisions"] == []
    assert (
        facts["__nvidia_mig_manager_config_text"]
        == vendor.artifact("mig-parted", "systemd/config-default.yaml").read_text()
    )
    assert (
        render("{{ __nvidia_mig_manager_config_file }}", env) == "/etc/nvidia-mig-manager/config-default.yaml"
    )


def test_custom_configs_join_nvidias_and_a_taken_name_is_refused() -> None:
    custom = {"version": "v1", "mig-configs": {"half-3g": [{"devices": "all", "mig-enabled": True,
                                                            "mig-devices": {"3g.71gb": 2}}]}}  # fmt: skip
    facts, env = _derived(custom)
    merged = yaml.safe_load(facts["__nvidia_mig_manager_config_text"])
    default = _yaml(vendor.artifact("mig-parted", "systemd/config-default.yaml"))
    assert merged["version"] == "v1"
    assert merged["mig-configs"] == {**default["mig-configs"], **custom["mig-configs"]}
    assert facts["__nvidia_mig_manager_collisions"] == []
    assert (
        render("{{ __nvidia_mig_manager_config_file }}", env) == "/etc/nvidia-mig-manager/gpuprov-config.yaml"
    )
    taken = {"version": "v1", "mig-configs": {"all-balanced": [{"devices": "all", "mig-enabled": False}]}}
    assert _derived(taken)[0]["__nvidia_mig_manager_collisions"] == ["all-balanced"]


def test_the_merged_file_passes_the_real_nvidia_mig_parted() -> None:
    custom = {"version": "v1", "mig-configs": {"half-3g": [{"devices": "all", "mig-enabled": True,
                                                            "mig-devices": {"3g.71gb": 2}}]}}  # fmt: skip
    text = _derived(custom)[0]["__nvidia_mig_manager_config_text"]
    argv = [str(vendor.mig_parted()), "assert", "--valid-config", "--config-file", "-", "--selected-config"]
    ok = subprocess.run([*argv, "half-3g"], input=text, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run([*argv, "nope"], input=text, capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and "selected mig-config not present: nope" in missing.stderr


@pytest.mark.parametrize("custom", [False, True])
def test_override_conf_is_what_nvidias_apply_start_hook_writes(tmp_path: Path, custom: bool) -> None:
    """utils.sh persist_config_across_reboot rewrites override.conf at every apply: gpuprov's file must be
    byte for byte what it writes, or every run would see a change and restart the service."""
    knobs: dict[str, Any] = {"gpuprov_mig_config": "all-1g.18gb"}
    if custom:
        knobs["gpuprov_mig_custom_configs"] = {"version": "v1", "mig-configs": {"x": []}}
    env = role_env(**knobs)
    ours = template("override.conf.j2", env)
    utils = vendor.artifact("mig-parted", "systemd/utils.sh").read_text()
    utils = utils.replace("/etc/systemd/system/nvidia-mig-manager.service.d", str(tmp_path))
    (tmp_path / "utils.sh").write_text(utils)
    persist = "nvidia-mig-manager::service::persist_config_across_reboot"
    script = f'systemctl() {{ :; }}; source ./utils.sh; {persist} "$1"'
    # The variables service.sh exports, as override.conf itself sets them.
    run_env = {
        "PATH": "/usr/bin:/bin",
        "MIG_PARTED_CONFIG_FILE": render("{{ __nvidia_mig_manager_config_file }}", env),
        "MIG_PARTED_HOOKS_FILE": render("{{ __nvidia_mig_manager_hooks_link }}", env),
    }
    subprocess.run(["bash", "-c", script, "x", "all-1g.18gb"], cwd=tmp_path, env=run_env, check=True)
    assert (tmp_path / "override.conf").read_text() == ours


def test_gpu_clients_come_first_in_nvidias_driver_services(tmp_path: Path) -> None:
    env = role_env()
    for name in ("hooks.sh", "utils.sh"):
        shutil.copy(vendor.artifact("mig-parted", f"systemd/{name}"), tmp_path / name)
    (tmp_path / "gpuprov-hooks.sh").write_text(template("gpuprov-hooks.sh.j2", env))
    out = subprocess.run(
        ["bash", "-c", 'source gpuprov-hooks.sh; printf "%s\\n" "${driver_services[@]}"'],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert out == [
        "nvidia-persistenced.service",
        "nvidia-fabricmanager.service",
        "nvidia-dcgm.service",
        "nvsm.service",
    ]
    # NVIDIA's stop order is the reverse: DCGM and nvsm go before fabric manager and persistenced.
    stop = subprocess.run(
        ["bash", "-c", "source gpuprov-hooks.sh; systemctl() { [ \"$1\" = -q ] && return 0; echo \"$@\"; }; "
         "stop_driver_services"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert stop == [f"stop {u}" for u in reversed(out)]


def test_gpuprov_hooks_are_nvidias_hooks_default_with_gpuprovs_script() -> None:
    env = role_env()
    ours = yaml.safe_load(template("gpuprov-hooks.yaml.j2", env))
    nvidia = _yaml(vendor.artifact("mig-parted", "systemd/hooks-default.yaml"))
    for hooks in nvidia["hooks"].values():
        for hook in hooks:
            hook["args"] = [a.replace("source hooks.sh;", "source gpuprov-hooks.sh;") for a in hook["args"]]
    assert ours == nvidia


def test_the_stage_runs_on_gpu_hosts_outside_kubernetes_after_the_driver() -> None:
    names = [s.name for s in STAGES]
    assert names.index("nvidia_mig_manager") == names.index("nvidia_driver") + 1
    stage = next(s for s in STAGES if s.name == "nvidia_mig_manager")
    assert stage.targets(["gpu_nodes"]) and not stage.targets(["gpu_nodes", "k8s_cluster"])
    assert not stage.targets(["kube_control_plane", "k8s_cluster"])
    plays = _yaml(ROOT / "playbooks" / "site.yml")
    play = next(p for p in plays if p["name"] == "nvidia_mig_manager")
    assert play["hosts"] == stage.hosts
    assert [p["name"] for p in plays].index("nvidia_mig_manager") == [p["name"] for p in plays].index(
        "nvidia_driver"
    ) + 1
    main = next(t for t in _yaml(ROLE / "tasks" / "main.yml") if "ansible.builtin.include_tasks" in t)
    assert render("{{ " + " and ".join(f"({c})" for c in main["when"]) + " }}",
                  role_env(gpuprov_mig_config="all-1g.18gb")) is True  # fmt: skip
    assert render("{{ " + " and ".join(f"({c})" for c in main["when"]) + " }}", role_env()) is False
    in_cluster = role_env(gpuprov_mig_config="all-1g.18gb", groups={"k8s_cluster": ["gpu9"]})
    assert render("{{ " + " and ".join(f"({c})" for c in main["when"]) + " }}", in_cluster) is False
