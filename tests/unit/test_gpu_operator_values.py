"""The chart values the gpu_operator role sets, against the real GPU Operator v26.7.0 chart.

The role's value expression (roles/gpu_operator/tasks/values.yml) is rendered with Ansible's own
templar for each way a fleet can be set up; every key it sets must exist in the real chart's
values.yaml (a key the chart does not have is silently ignored by helm: `operator.defaultRuntime`,
removed in v25.3.0, was), and the real helm must render the real chart with those values into a
ClusterPolicy that says what the role meant.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuprov_lab import vendor

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "gpu_operator"
VALUES_TASKS = ROLE / "tasks" / "values.yml"
# (host toolkit?, every host's containerd with the nvidia default runtime?) → cdi.enabled expected
FLEETS = [
    pytest.param(False, False, True, id="operator-toolkit"),
    pytest.param(True, False, True, id="host-toolkit-cdi"),
    pytest.param(True, True, False, id="host-toolkit-nvidia-default-runtime"),
]


def _task(name_start: str, tasks_file: Path = VALUES_TASKS) -> dict[str, Any]:
    tasks = yaml.safe_load(tasks_file.read_text())
    return next(t for t in tasks if t["name"].startswith(name_start))


def _render(expr: str, variables: dict[str, Any]) -> Any:
    # Imported here: ansible reads its configuration once, when first imported, and the inventory code
    # sets its own before that (tests share one process).
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template(expr))


def role_env(hostvars: dict[str, dict[str, Any]] | None = None, **knobs: Any) -> dict[str, Any]:
    """The role's defaults and vars with an inventory of cp1 and two GPU hosts (their own variables in
    `hostvars`) and the knobs every host gets."""
    hosts = ["gpu1", "gpu2"]
    host_vars = {"cp1": {}, "gpu1": {}, "gpu2": {}, **(hostvars or {})}
    for name in host_vars:
        host_vars[name] = {**knobs, "inventory_hostname": name, **host_vars[name]}
        host_vars[name].setdefault("ansible_facts", {"nodename": name.upper()})
    return {
        **yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
        **yaml.safe_load((ROLE / "vars" / "main.yml").read_text()),
        **knobs,
        "groups": {"kube_control_plane": ["cp1"], "gpu_nodes": hosts, "k8s_cluster": ["cp1", *hosts]},
        "hostvars": host_vars,
        "gpu_operator_values": {},
    }


def wanted_values(
    host_toolkit: bool,
    nvidia_default: bool,
    user_values: dict | None = None,
    facts: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
) -> dict:
    """What the role's two set_fact tasks compute for a fleet of two GPU hosts (`facts`: what the tasks
    before them found in the cluster)."""
    decide = _task("Decide who installs the toolkit")
    hosts = ["gpu1", "gpu2"]
    env = {
        **(env or role_env()),
        "__gpu_operator_mig_pending": False,
        "__gpu_operator_servicemonitor_crd": False,
        **(facts or {}),
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
    # Plain data (Ansible tags its strings), as the role writes it for helm: JSON.
    return json.loads(
        json.dumps(_render(note["ansible.builtin.set_fact"]["__gpu_operator_wanted_values"], env))
    )


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


def chart_reads(path: str) -> bool:
    """A chart template reads `.Values.<path>` (values.yaml documents some keys only in comments, such
    as dcgmExporter.config.name, which templates/clusterpolicy.yaml reads)."""
    policy = vendor.artifact("gpu-operator", "chart/templates/clusterpolicy.yaml").read_text()
    return f".Values.{path} " in policy or f".Values.{path}}}" in policy


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
    unknown = [p for p in leaves(values) if not chart_has(chart_values, p) and not chart_reads(p)]
    assert not unknown, f"the role sets values the v26.7.0 chart does not have: {unknown}"


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
    # The operator image is the release's (the chart was packaged as v26.7.0).
    (operator,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-operator"]
    images = [c["image"] for c in operator["spec"]["template"]["spec"]["containers"]]
    assert images == ["nvcr.io/nvidia/gpu-operator:v26.7.0"]
    # CRDs are applied by the role, so the chart's pre-upgrade CRD job is off.
    hooks = [d["metadata"]["name"] for d in docs if d["kind"] == "Job"]
    assert not any("upgrade-crd" in h for h in hooks), hooks


# ---- GPU sharing, MIG and monitoring ---------------------------------------------------------------

PROFILES = {
    "ts4": {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    },
    "mps2": {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
}
POOL_TOLERATION = {"key": "gpuprov.io/pool", "operator": "Exists", "effect": "NoSchedule"}


def feature_values(pending: bool = False, crd: bool = True, pools: bool = True, **knobs: Any) -> dict:
    hostvars = {"gpu1": {"gpuprov_gpu_sharing": "ts4", "gpuprov_mig_config": "all-1g.18gb"}}
    if pools:
        hostvars["gpu2"] = {"gpuprov_node_pool": "train"}
    env = role_env(hostvars, gpuprov_gpu_sharing_profiles=PROFILES, **knobs)
    facts = {"__gpu_operator_mig_pending": pending, "__gpu_operator_servicemonitor_crd": crd}
    return wanted_values(True, False, facts=facts, env=env)


def test_sharing_mig_and_monitoring_values(chart_values: dict[str, Any]) -> None:
    custom = {"version": "v1", "mig-configs": {"half": [{"devices": "all", "mig-enabled": True}]}}
    values = feature_values(gpuprov_mig_strategy="mixed", gpuprov_mig_custom_configs=custom)
    assert values["mig"] == {"strategy": "mixed"}
    assert values["devicePlugin"] == {"config": {"name": "gpuprov-device-plugin-config", "default": "none"}}
    assert values["dcgmExporter"] == {
        "config": {"name": "gpuprov-dcgm-exporter-counters"},
        "serviceMonitor": {"enabled": True},
    }
    assert values["migManager"] == {
        "gpuClientsConfig": {"name": "gpuprov-gpu-clients"},
        "config": {"name": "gpuprov-mig-parted-config"},
    }
    # The pool taint is tolerated on top of the chart's own tolerations, which stay.
    assert values["daemonsets"]["tolerations"] == chart_values["daemonsets"]["tolerations"] + [
        POOL_TOLERATION
    ]
    nfd = chart_values["node-feature-discovery"]["worker"]["tolerations"]
    assert values["node-feature-discovery"]["worker"]["tolerations"] == [*nfd, POOL_TOLERATION]
    unknown = [p for p in leaves(values) if not chart_has(chart_values, p) and not chart_reads(p)]
    assert not unknown, unknown


def test_without_crd_pool_or_operator_defaults_those_values_stay_out() -> None:
    values = feature_values(pending=True, crd=False, pools=False)
    assert values["mig"] == {"strategy": "single"}
    assert values["dcgmExporter"]["serviceMonitor"] == {"enabled": False}
    assert (
        "migManager" not in values and "daemonsets" not in values and "node-feature-discovery" not in values
    )
    # Without custom configs only the gpu clients ConfigMap is named.
    assert feature_values()["migManager"] == {"gpuClientsConfig": {"name": "gpuprov-gpu-clients"}}


def test_user_values_still_win() -> None:
    env = role_env(gpuprov_gpu_sharing_profiles=PROFILES)
    values = wanted_values(True, False, user_values={"mig": {"strategy": "mixed"}}, env=env)
    assert values["mig"] == {"strategy": "mixed"}


def test_real_helm_renders_sharing_mig_and_monitoring(tmp_path: Path, chart_values: dict[str, Any]) -> None:
    custom = {"version": "v1", "mig-configs": {"half": [{"devices": "all", "mig-enabled": True}]}}
    values = feature_values(gpuprov_mig_strategy="mixed", gpuprov_mig_custom_configs=custom)
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    res = subprocess.run(
        [str(vendor.helm()), "template", "gpu-operator", str(vendor.gpu_operator_chart()), "--namespace",
         "gpu-operator", "--values", str(tmp_path / "values.yaml")],
        capture_output=True, text=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    (policy,) = [d for d in docs if d["kind"] == "ClusterPolicy"]
    spec = policy["spec"]
    assert spec["mig"]["strategy"] == "mixed"
    assert spec["devicePlugin"]["config"] == {"name": "gpuprov-device-plugin-config", "default": "none"}
    assert spec["dcgmExporter"]["config"] == {"name": "gpuprov-dcgm-exporter-counters"}
    assert spec["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    assert spec["migManager"]["config"]["name"] == "gpuprov-mig-parted-config"
    assert spec["migManager"]["gpuClientsConfig"] == {"name": "gpuprov-gpu-clients"}
    assert POOL_TOLERATION in spec["daemonsets"]["tolerations"]
    # The exporter stays the one the chart pins; the chart makes none of gpuprov's ConfigMaps itself.
    assert spec["dcgmExporter"]["version"] == chart_values["dcgmExporter"]["version"]
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    assert not names & {"gpuprov-device-plugin-config", "gpuprov-dcgm-exporter-counters"}


def test_the_device_plugin_configmap_holds_every_profile_and_none() -> None:
    from provisioner import sharing

    env = role_env(gpuprov_gpu_sharing_profiles=PROFILES)
    data = _render("{{ __gpu_operator_sharing_data }}", env)
    assert sorted(data) == ["mps2", "none", "ts4"]
    strategies = {k: sharing.parse_config(str(v), k).strategy for k, v in data.items()}
    assert strategies == {"mps2": "mps", "none": "none", "ts4": "time-slicing"}


def _node_label_todo(nodes: list[dict[str, Any]], label_mig: bool) -> list[str]:
    task = _task("Work out the labels", ROLE / "tasks" / "node_labels.yml")
    hostvars = {"gpu1": {"gpuprov_gpu_sharing": "ts4", "gpuprov_mig_config": "all-1g.18gb"}}
    env = role_env(hostvars, gpuprov_gpu_sharing_profiles=PROFILES)
    env.update(task["vars"])
    env["__gpu_operator_label_mig"] = label_mig
    env["__gpu_operator_nodes"] = {"stdout": json.dumps({"items": nodes})}
    todo = _render(task["ansible.builtin.set_fact"]["__gpu_operator_label_todo"], env)
    return [f"{t['node']} {t['label']}" for t in todo]


def test_node_labels_name_each_nodes_profile_and_mig_config_pending_first() -> None:
    nodes = [
        {"metadata": {"name": "gpu1", "labels": {"nvidia.com/mig.config": "all-disabled"}}},
        {"metadata": {"name": "gpu2", "labels": {"nvidia.com/device-plugin.config": "none"}}},
    ]
    assert _node_label_todo(nodes, label_mig=True) == [
        "gpu1 nvidia.com/device-plugin.config=ts4",
        "gpu1 nvidia.com/mig.config.state=pending",
        "gpu1 nvidia.com/mig.config=all-1g.18gb",
    ]
    assert _node_label_todo(nodes, label_mig=False) == ["gpu1 nvidia.com/device-plugin.config=ts4"]
    done = {"nvidia.com/device-plugin.config": "ts4", "nvidia.com/mig.config": "all-1g.18gb"}
    nodes[0]["metadata"]["labels"] = done
    assert _node_label_todo(nodes, label_mig=True) == []


def _operator_default(name: str) -> dict[str, Any]:
    """The operator's own ConfigMap as the operator creates it in the cluster."""
    assets = {
        "default-mig-parted-config": "0400_configmap.yaml",
        "default-gpu-clients": "0410_configmap.yaml",
    }
    return yaml.safe_load(
        vendor.artifact("gpu-operator", f"assets/state-mig-manager/{assets[name]}").read_text()
    )


def _mig_facts(custom: dict[str, Any], present: tuple[str, ...]) -> dict[str, Any]:
    task = _task("Derive gpuprov's MIG manager ConfigMaps", ROLE / "tasks" / "mig_config.yml")
    env = role_env(gpuprov_mig_custom_configs=custom)
    env.update(task["vars"])
    env["__gpu_operator_mig_defaults"] = {
        "stdout": json.dumps({"items": [_operator_default(n) for n in present]})
    }
    return {k: _render(v, env) for k, v in task["ansible.builtin.set_fact"].items()}


def test_gpu_clients_are_the_operators_plus_gpuprovs_host_services() -> None:
    facts = _mig_facts({}, ("default-mig-parted-config", "default-gpu-clients"))
    assert facts["__gpu_operator_mig_pending"] is False
    clients = yaml.safe_load(facts["__gpu_operator_gpu_clients_data"]["clients.yaml"])
    default = yaml.safe_load(_operator_default("default-gpu-clients")["data"]["clients.yaml"])
    services = clients["systemd-services"]
    assert (
        clients["version"] == "v1"
        and services[: len(default["systemd-services"])] == default["systemd-services"]
    )
    for unit in ("nvidia-persistenced.service", "nvidia-fabricmanager.service", "nvidia-dcgm.service"):
        assert services.count(unit) == 1
    assert facts["__gpu_operator_mig_config_data"] is None  # no custom configs: the operator's own


def test_custom_mig_configs_join_the_operators_and_a_taken_name_is_refused() -> None:
    from provisioner import mig

    custom = {"version": "v1", "mig-configs": {"half": [{"devices": "all", "mig-enabled": False}]}}
    facts = _mig_facts(custom, ("default-mig-parted-config", "default-gpu-clients"))
    merged = mig.parse_config(facts["__gpu_operator_mig_config_data"]["config.yaml"], "config.yaml")
    assert "half" in merged and "all-1g.18gb" in merged and "all-disabled" in merged
    assert facts["__gpu_operator_mig_collisions"] == []
    taken = {"version": "v1", "mig-configs": {"all-balanced": [{"devices": "all", "mig-enabled": False}]}}
    assert _mig_facts(taken, ("default-mig-parted-config", "default-gpu-clients"))[
        "__gpu_operator_mig_collisions"
    ] == ["all-balanced"]


def test_before_the_operator_made_its_defaults_the_mig_configmaps_wait() -> None:
    facts = _mig_facts({}, ())
    assert facts["__gpu_operator_mig_pending"] is True
    assert facts["__gpu_operator_gpu_clients_data"] is None


# Names and types from NVIDIA/dcgm-exporter 4.4.1-4.6.0 etc/default-counters.csv (the exporter the
# chart pins); the clock events bitmask under its current DCGM name.
REQUIRED_COUNTERS = {
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "gauge",
}


def counters() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in (ROLE / "files" / "dcgm-metrics.csv").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        field, kind, help_text = (c.strip() for c in line.split(","))  # exactly three columns
        assert field.startswith("DCGM_FI_") and kind in ("gauge", "counter", "label") and help_text, line
        assert field not in rows, f"{field} listed twice"
        rows[field] = kind
    return rows


def test_the_counters_csv_has_what_the_alerts_and_checks_need() -> None:
    rows = counters()
    assert {k: rows.get(k) for k in REQUIRED_COUNTERS} == REQUIRED_COUNTERS


def test_the_alerts_use_only_exported_counters() -> None:
    env = role_env()
    env["gpu_operator_prometheus_labels"] = {"release": "prometheus"}
    text = _render((ROLE / "templates" / "gpu-alerts.yaml.j2").read_text(), env)
    rule = yaml.safe_load(text)
    assert rule["kind"] == "PrometheusRule" and rule["metadata"]["name"] == "gpuprov-gpu-alerts"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert sorted(alerts) == [
        "GpuRowRemapFailure",
        "GpuTemperatureHigh",
        "GpuThrottled",
        "GpuUncorrectableEccErrors",
        "GpuXidError",
    ]
    used = {m for expr in alerts.values() for m in re.findall(r"DCGM_FI_\w+", expr)}
    assert used <= set(counters()), used - set(counters())
    summaries = [r["annotations"]["summary"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all("{{ $labels.gpu }}" in s for s in summaries)  # Prometheus's templates, not Ansible's


# promtool's tests of the alerts: synthetic exporter series and when each alert must (and must not) fire.
ALERT_TESTS = ROOT / "tests" / "fixtures" / "prometheus" / "gpu-alerts-tests.yml"


def test_the_alerts_fire_under_prometheus_own_rule_engine(tmp_path: Path) -> None:
    """The rendered PrometheusRule's groups, checked and unit-tested by Debian's real promtool: the
    expressions parse, and each alert fires on the exporter series it is for and on no other."""
    text = _render((ROLE / "templates" / "gpu-alerts.yaml.j2").read_text(), role_env())
    rule = yaml.safe_load(text)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    shutil.copyfile(ALERT_TESTS, tmp_path / "tests.yml")
    promtool = str(vendor.promtool())
    check = subprocess.run(
        [promtool, "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0 and "SUCCESS: 5 rules found" in check.stdout, check.stdout + check.stderr
    test = subprocess.run(
        [promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr
