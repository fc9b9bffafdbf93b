"""The chart values the gpu_operator role sets, against the real GPU Operator v25.10.0 chart.

The role's value expression (roles/gpu_operator/tasks/values.yml) is rendered with Ansible's own
templar for each way a fleet can be set up; every key it sets must exist in the real chart's
values.yaml (a key the chart does not have is silently ignored by helm: `operator.defaultRuntime`,
removed in v25.3.0, was), and the real helm must render the real chart with those values into a
ClusterPolicy that says what the role meant.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuprov_lab import vendor

ROOT = Path(__file__).resolve().parents[2]
VALUES_TASKS = ROOT / "roles" / "gpu_operator" / "tasks" / "values.yml"
# (host toolkit?, every host's containerd with the nvidia default runtime?) → cdi.enabled expected
FLEETS = [
    pytest.param(False, False, True, id="operator-toolkit"),
    pytest.param(True, False, True, id="host-toolkit-cdi"),
    pytest.param(True, True, False, id="host-toolkit-nvidia-default-runtime"),
]


def _task(name_start: str) -> dict[str, Any]:
    tasks = yaml.safe_load(VALUES_TASKS.read_text())
    return next(t for t in tasks if t["name"].startswith(name_start))


def _render(expr: str, variables: dict[str, Any]) -> Any:
    # Imported here: ansible reads its configuration once, when first imported, and the inventory code
    # sets its own before that (tests share one process).
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template(expr))


def wanted_values(host_toolkit: bool, nvidia_default: bool, user_values: dict | None = None) -> dict:
    """What the role's two set_fact tasks compute for a fleet of two GPU hosts."""
    decide = _task("Decide who installs the toolkit")
    hosts = ["gpu1", "gpu2"]
    env: dict[str, Any] = {
        **decide.get("vars", {}),
        "gpu_operator_toolkit_enabled": "auto",
        "gpu_operator_values": user_values or {},
        "__gpu_operator_host_toolkit": host_toolkit,
        "__gpu_operator_gpu_hosts": hosts,
        "__gpu_operator_nvidia_default_hosts": hosts if nvidia_default else [],
        "__gpu_operator_cdi_hosts": [] if nvidia_default else hosts,
    }
    facts = decide["ansible.builtin.set_fact"]
    env["__gpu_operator_wanted_toolkit"] = _render(facts["__gpu_operator_wanted_toolkit"], env)
    env["__gpu_operator_cdi"] = _render(facts["__gpu_operator_cdi"], env)
    note = _task("Note the values the release must have")
    env.update(note.get("vars", {}))
    env.update({"gpu_operator_driver_enabled": "auto", "__gpu_operator_host_driver": True})
    return _render(note["ansible.builtin.set_fact"]["__gpu_operator_wanted_values"], env)


def leaves(data: Any, prefix: str = "") -> list[str]:
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in leaves(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


def chart_has(values: dict[str, Any], path: str) -> bool:
    node: Any = values
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


@pytest.fixture(scope="module")
def chart_values() -> dict[str, Any]:
    return yaml.safe_load(vendor.artifact("gpu-operator", "chart/values.yaml").read_text())


@pytest.mark.parametrize(("host_toolkit", "nvidia_default", "cdi"), FLEETS)
def test_every_key_the_role_sets_is_in_the_real_chart(
    host_toolkit: bool, nvidia_default: bool, cdi: bool, chart_values: dict[str, Any]
) -> None:
    values = wanted_values(host_toolkit, nvidia_default)
    assert values["cdi"]["enabled"] is cdi
    assert values["toolkit"]["enabled"] is (not host_toolkit)
    unknown = [p for p in leaves(values) if not chart_has(chart_values, p)]
    assert not unknown, f"the role sets values the v25.10.0 chart does not have: {unknown}"


def test_the_sample_inventory_values_are_in_the_real_chart(chart_values: dict[str, Any]) -> None:
    for path in sorted((ROOT / "inventory").rglob("*.yml")):
        doc = yaml.safe_load(path.read_text()) or {}
        user = doc.get("gpu_operator_values") if isinstance(doc, dict) else None
        if user:
            unknown = [p for p in leaves(user) if not chart_has(chart_values, p)]
            assert not unknown, f"{path}: gpu_operator_values keys not in the chart: {unknown}"


@pytest.mark.parametrize(("host_toolkit", "nvidia_default", "cdi"), FLEETS)
def test_real_helm_renders_the_cluster_policy_the_role_means(
    host_toolkit: bool, nvidia_default: bool, cdi: bool, tmp_path: Path
) -> None:
    values = wanted_values(host_toolkit, nvidia_default)
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    res = subprocess.run(
        [
            str(vendor.helm()),
            "template",
            "gpu-operator",
            str(vendor.gpu_operator_chart()),
            "--namespace",
            "gpu-operator",
            "--values",
            str(tmp_path / "values.yaml"),
        ],
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    (policy,) = [d for d in docs if d["kind"] == "ClusterPolicy"]
    assert policy["spec"]["cdi"]["enabled"] is cdi
    assert policy["spec"]["toolkit"]["enabled"] is (not host_toolkit)
    assert policy["spec"]["driver"]["enabled"] is False
    # The operator image is the release's (the chart was packaged as v25.10.0).
    (operator,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-operator"]
    images = [c["image"] for c in operator["spec"]["template"]["spec"]["containers"]]
    assert images == ["nvcr.io/nvidia/gpu-operator:v25.10.0"]
    # CRDs are applied by the role, so the chart's pre-upgrade CRD job is off.
    hooks = [d["metadata"]["name"] for d in docs if d["kind"] == "Job"]
    assert not any("upgrade-crd" in h for h in hooks), hooks
