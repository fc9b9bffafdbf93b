"""The lab's GPU Operator (lab/gpuprov_lab/sim/kube_operator.py) derives its operands from NVIDIA's real
v26.7.0 manifests and the real ClusterPolicy (the real chart rendered by the real helm with the values
the gpu_operator role sets), applying the transforms of the operator's object_controls.go."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
from gpuprov_lab import vendor
from gpuprov_lab.sim import kube, kube_helm
from gpuprov_lab.sim import kube_operator as op


@pytest.fixture(scope="module", autouse=True)
def _vendor_env() -> Any:
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUPROV_LAB_REAL_HELM", str(vendor.helm()))
    mp.setenv("GPUPROV_LAB_OPERATOR_ASSETS", str(vendor.artifact("gpu-operator", "assets")))
    yield
    mp.undo()


def _policy_spec(values: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The ClusterPolicy's spec the real chart renders for ``values``."""
    from gpuprov_lab.sim import kube_testing as kt

    chart = kube_helm.load_chart_archive(kube.chart_tgz())
    h = kube_helm.Helm(kt.SimHost(root=tmp, name="x"), {}, io.StringIO(), io.StringIO())

    class NoServer:
        def request(self, *a: object, **k: object) -> dict[str, str]:
            return {"gitVersion": "v1.36.3"}

    h._client = NoServer()  # type: ignore[assignment]
    _m, docs, _c, _n = kube_helm.render(h, chart, values, "gpu-operator", "gpu-operator", 1, True)
    return next(d for d in docs if d["kind"] == "ClusterPolicy")["spec"]


ROLE_VALUES = {"driver": {"enabled": False}, "toolkit": {"enabled": False}, "operator": {"upgradeCRD": False}}


@pytest.fixture(scope="module")
def cdi_spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _policy_spec({**ROLE_VALUES, "cdi": {"enabled": True}}, tmp_path_factory.mktemp("cdi"))


@pytest.fixture(scope="module")
def envvar_spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _policy_spec({**ROLE_VALUES, "cdi": {"enabled": False}}, tmp_path_factory.mktemp("envvar"))


def _daemonset(state: str, spec: dict[str, Any]) -> dict[str, Any]:
    ds = copy.deepcopy(next(o for o in op.state_objects(state) if o["kind"] == "DaemonSet"))
    op.common(ds, spec)
    op.transform(ds, spec, [])
    return ds


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def test_the_device_plugin_hands_gpus_out_as_cdi_devices_when_cdi_is_on(cdi_spec: dict) -> None:
    ds = _daemonset("state-device-plugin", cdi_spec)
    pod = ds["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    names = [c["name"] for c in pod["containers"]] + [c["name"] for c in pod["initContainers"]]
    # No devicePlugin.config.name: the config-manager containers go (handleDevicePluginConfig).
    assert names == ["nvidia-device-plugin", "toolkit-validation"]
    ctr = pod["containers"][0]
    assert ctr["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    env = _env(ctr)
    assert env["DEVICE_LIST_STRATEGY"] == "cdi-annotations,cdi-cri"
    assert env["CDI_ANNOTATION_PREFIX"] == "cdi.k8s.io/"
    assert "NVIDIA_CDI_HOOK_PATH" not in env  # the toolkit is the host's: the plugin uses nvidia-ctk
    assert pod["initContainers"][0]["image"] == "nvcr.io/nvidia/gpu-operator:v26.7.0"


def test_the_device_plugin_keeps_envvar_when_cdi_is_off(envvar_spec: dict) -> None:
    env = _env(_daemonset("state-device-plugin", envvar_spec)["spec"]["template"]["spec"]["containers"][0])
    assert env["DEVICE_LIST_STRATEGY"] == "envvar" and "CDI_ENABLED" not in env


def test_the_users_device_plugin_env_comes_last(cdi_spec: dict) -> None:
    spec = copy.deepcopy(cdi_spec)
    spec["devicePlugin"]["env"] = [{"name": "DEVICE_LIST_STRATEGY", "value": "envvar"}]
    env = _env(_daemonset("state-device-plugin", spec)["spec"]["template"]["spec"]["containers"][0])
    assert env["DEVICE_LIST_STRATEGY"] == "envvar"


def test_the_validator_keeps_driver_and_toolkit_validation(cdi_spec: dict) -> None:
    pod = _daemonset("state-operator-validation", cdi_spec)["spec"]["template"]["spec"]
    inits = [c["name"] for c in pod["initContainers"]]
    assert inits == ["driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation"]
    plugin = _env(pod["initContainers"][3])
    assert plugin["VALIDATOR_RUNTIME_CLASS"] == "nvidia"
    spec = copy.deepcopy(cdi_spec)
    spec["devicePlugin"]["enabled"] = False
    pod = _daemonset("state-operator-validation", spec)["spec"]["template"]["spec"]
    assert "plugin-validation" not in [c["name"] for c in pod["initContainers"]]


def test_an_empty_image_is_a_reconcile_error(cdi_spec: dict) -> None:
    spec = copy.deepcopy(cdi_spec)
    spec["devicePlugin"].update({"repository": "", "version": "", "image": ""})
    with pytest.raises(op.OperatorError, match="ENV DEVICE_PLUGIN_IMAGE"):
        _daemonset("state-device-plugin", spec)


def test_daemonset_settings_apply_to_every_operand_but_the_drivers_strategy(cdi_spec: dict) -> None:
    spec = copy.deepcopy(cdi_spec)
    spec["daemonsets"]["rollingUpdate"] = {"maxUnavailable": "2"}
    spec["daemonsets"]["tolerations"] = [{"key": "site", "operator": "Exists"}]
    ds = _daemonset("gpu-feature-discovery", spec)
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}
    assert ds["spec"]["template"]["spec"]["tolerations"] == [{"key": "site", "operator": "Exists"}]
    spec["driver"]["enabled"] = True
    driver = _daemonset("state-driver", spec)
    assert driver["spec"]["updateStrategy"]["type"] == "OnDelete"


def test_gpu_nodes_get_their_operand_labels_and_a_users_false_stays(cdi_spec: dict) -> None:
    node = {
        "metadata": {
            "name": "gpu1",
            "labels": {
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.deploy.dcgm-exporter": "false",
            },
        }
    }
    patch = op.node_label_patch(node, cdi_spec)
    assert patch[op.PRESENT] == "true"
    assert patch["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert patch["nvidia.com/gpu.deploy.mig-manager"] == "true"  # A100 without mig.capable: by product
    assert "nvidia.com/gpu.deploy.dcgm-exporter" not in patch
    assert patch["nvidia.com/mig.config"] == "all-disabled"
    plain = {"metadata": {"name": "cp1", "labels": {"nvidia.com/gpu.deploy.driver": "true"}}}
    assert op.node_label_patch(plain, cdi_spec) == {"nvidia.com/gpu.deploy.driver": None}


def test_every_asset_state_the_operator_applies_loads(cdi_spec: dict) -> None:
    kinds = {o["kind"] for state, _k, _d in op.STATES for o in op.state_objects(state)}
    assert {"DaemonSet", "ServiceAccount", "ClusterRole", "RuntimeClass", "ConfigMap"} <= kinds
    rcs = [o["metadata"]["name"] for o in op.state_objects("pre-requisites")]
    assert rcs == ["FILLED_BY_OPERATOR", "nvidia-legacy", "nvidia-cdi"]
