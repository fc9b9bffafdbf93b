"""Admission of pods by the lab's simulated API server: ResourceQuota (GPUs, MIG devices, the "must
specify" rule), the quota controller's status, LimitRange, and the namespace-annotation plugins
PodTolerationRestriction and PodNodeSelector, on and off with --enable-admission-plugins. The API
server's request handler runs in-process (no listener) against a store in a temporary directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpuprov_lab.sim import kube_admission, kube_api
from gpuprov_lab.sim.kube_host import Host
from gpuprov_lab.sim.kube_store import ApiError

ADMIN = kube_api.User("kubernetes-admin", ["kubeadm:cluster-admins", "system:authenticated"])
NS = "team-a"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


class Api:
    def __init__(self, root: Path, enable: str = "NodeRestriction") -> None:
        host = Host(root=root)
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kube-apiserver", "namespace": "kube-system"},
            "spec": {
                "containers": [
                    {
                        "name": "kube-apiserver",
                        "image": "registry.k8s.io/kube-apiserver:v1.36.3",
                        "command": ["kube-apiserver", f"--enable-admission-plugins={enable}"],
                    }
                ]
            },
        }
        host.write("/etc/kubernetes/manifests/kube-apiserver.yaml", json.dumps(manifest))
        self.server = kube_api.ApiServer(host)  # settings read from the manifest, as on a lab host

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        return self.server.handle(method, path, data, ADMIN, "application/json")[1]

    def namespace(self, name: str, annotations: dict[str, str] | None = None) -> None:
        meta: dict[str, Any] = {"name": name}
        if annotations:
            meta["annotations"] = annotations
        self.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})

    def create(self, plural: str, body: dict[str, Any], ns: str = NS) -> Any:
        return self.call("POST", f"/api/v1/namespaces/{ns}/{plural}", body)

    def pod(self, name: str, ns: str = NS, **spec: Any) -> Any:
        return self.create(
            "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}, ns
        )

    def refused(self, name: str, ns: str = NS, **spec: Any) -> ApiError:
        with pytest.raises(ApiError) as err:
            self.pod(name, ns, **spec)
        return err.value

    def quota(self, name: str, hard: dict[str, str], ns: str = NS) -> None:
        self.create("resourcequotas", {"metadata": {"name": name}, "spec": {"hard": hard}}, ns)
        self.server.controllers.resource_quotas()  # the quota controller's first sync

    def used(self, name: str, ns: str = NS) -> dict[str, str]:
        self.server.controllers.resource_quotas()
        return self.call("GET", f"/api/v1/namespaces/{ns}/resourcequotas/{name}")["status"]["used"]


def gpu_container(n: int | str, resource: str = "nvidia.com/gpu", **extra: Any) -> dict[str, Any]:
    return {
        "name": "cuda",
        "image": "nvcr.io/nvidia/cuda:12.8.0-base",
        "resources": {"limits": {resource: str(n)}},
        **extra,
    }


@pytest.fixture
def api(tmp_path: Path) -> Api:
    a = Api(tmp_path)
    a.namespace(NS)
    return a


def test_gpu_quota_admits_four_one_gpu_pods_and_refuses_the_fifth(api: Api) -> None:
    api.quota("gpu-quota", {"requests.nvidia.com/gpu": "4", "pods": "10"})
    for i in range(4):
        pod = api.pod(f"gpu-{i}", containers=[gpu_container(1)])
        # Extended resources are set as limits; the API defaults the request from the limit.
        assert pod["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    err = api.refused("gpu-4", containers=[gpu_container(1)])
    assert (err.code, err.reason) == (403, "Forbidden")
    assert err.message == (
        'pods "gpu-4" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, '
        "used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4"
    )
    assert api.used("gpu-quota") == {"requests.nvidia.com/gpu": "4", "pods": "4"}
    # A finished pod no longer counts (pods.go QuotaV1Pod); its GPU can be asked for again.
    api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/gpu-0/status", {"status": {"phase": "Succeeded"}})
    assert api.used("gpu-quota")["requests.nvidia.com/gpu"] == "3"
    err = api.refused("two", containers=[gpu_container(2)])
    assert err.message.endswith(
        "requested: requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=3, "
        "limited: requests.nvidia.com/gpu=4"
    )
    api.pod("gpu-5", containers=[gpu_container(1)])
    assert api.used("gpu-quota") == {"requests.nvidia.com/gpu": "4", "pods": "4"}


def test_quota_on_a_mig_device_resource(api: Api) -> None:
    api.quota("mig", {"requests.nvidia.com/mig-1g.18gb": "2"})
    api.pod("a", containers=[gpu_container(1, "nvidia.com/mig-1g.18gb")])
    api.pod("full-gpus-are-not-mig-slices", containers=[gpu_container(1)])
    api.pod("b", containers=[gpu_container(1, "nvidia.com/mig-1g.18gb")])
    err = api.refused("c", containers=[gpu_container(1, "nvidia.com/mig-1g.18gb")])
    assert "exceeded quota: mig, requested: requests.nvidia.com/mig-1g.18gb=1, used: " in err.message
    assert api.used("mig") == {"requests.nvidia.com/mig-1g.18gb": "2"}


def test_quota_on_cpu_and_memory_needs_every_container_to_ask(api: Api) -> None:
    api.quota("compute", {"requests.cpu": "2", "requests.memory": "4Gi", "requests.nvidia.com/gpu": "2"})
    err = api.refused("bare", containers=[gpu_container(1)])
    assert err.message == (
        'pods "bare" is forbidden: failed quota: compute: must specify requests.cpu for: cuda; '
        "must specify requests.memory for: cuda"
    )
    sized = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1500m", "memory": "3Gi"}}
    api.pod("ok", containers=[{"name": "cuda", "image": "x", "resources": sized}])
    err = api.refused("more", containers=[{"name": "cuda", "image": "x", "resources": sized}])
    assert err.message == (
        'pods "more" is forbidden: exceeded quota: compute, '
        "requested: requests.cpu=1500m,requests.memory=3Gi, used: requests.cpu=1500m,requests.memory=3Gi, "
        "limited: requests.cpu=2,requests.memory=4Gi"
    )
    assert api.used("compute") == {
        "requests.cpu": "1500m",
        "requests.memory": "3Gi",
        "requests.nvidia.com/gpu": "1",
    }


def test_limit_range_max_gpus_per_container(api: Api) -> None:
    api.create(
        "limitranges",
        {
            "metadata": {"name": "gpus"},
            "spec": {"limits": [{"type": "Container", "max": {"nvidia.com/gpu": "2"}}]},
        },
    )
    lr = api.call("GET", f"/api/v1/namespaces/{NS}/limitranges/gpus")
    # SetDefaults_LimitRangeItem: the max becomes the default limit and the default request.
    assert lr["spec"]["limits"][0]["default"] == {"nvidia.com/gpu": "2"}
    assert lr["spec"]["limits"][0]["defaultRequest"] == {"nvidia.com/gpu": "2"}
    err = api.refused("big", containers=[gpu_container(4)])
    assert (err.code, err.message) == (
        403,
        'pods "big" is forbidden: maximum nvidia.com/gpu usage per Container is 2, but limit is 4',
    )
    api.pod("two", containers=[gpu_container(2)])
    plain = api.pod("plain", containers=[{"name": "app", "image": "busybox"}])
    assert plain["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "2"},
        "requests": {"nvidia.com/gpu": "2"},
    }
    assert plain["metadata"]["annotations"]["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: nvidia.com/gpu request for container app; "
        "nvidia.com/gpu limit for container app"
    )


def test_limit_range_min_without_a_request(api: Api) -> None:
    api.create(
        "limitranges",
        {"metadata": {"name": "cpu"}, "spec": {"limits": [{"type": "Container", "min": {"cpu": "500m"}}]}},
    )
    err = api.refused(
        "small", containers=[{"name": "app", "image": "x", "resources": {"requests": {"cpu": "100m"}}}]
    )
    assert (
        err.message
        == 'pods "small" is forbidden: minimum cpu usage per Container is 500m, but request is 100m'
    )


WHITELIST = [
    GPU_TOLERATION,
    {"operator": "Exists", "effect": "NoExecute"},  # DefaultTolerationSeconds' not-ready/unreachable
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
]
ANNOTATIONS = {
    kube_admission.NS_DEFAULT_TOLERATIONS: json.dumps([GPU_TOLERATION]),
    kube_admission.NS_TOLERATIONS_WHITELIST: json.dumps(WHITELIST),
}
FOREIGN = {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}


def test_toleration_restriction_only_when_the_plugin_is_enabled(tmp_path: Path) -> None:
    off = Api(tmp_path / "off")
    off.namespace("gpu-team", ANNOTATIONS)
    pod = off.pod("p", "gpu-team", containers=[{"name": "a", "image": "x"}], tolerations=[FOREIGN])
    assert GPU_TOLERATION not in pod["spec"]["tolerations"] and FOREIGN in pod["spec"]["tolerations"]

    on = Api(tmp_path / "on", "NodeRestriction,PodTolerationRestriction")
    assert "PodTolerationRestriction" in on.server.controllers.admission_plugins()
    on.namespace("gpu-team", ANNOTATIONS)
    pod = on.pod("p", "gpu-team", containers=[{"name": "a", "image": "x"}])
    assert GPU_TOLERATION in pod["spec"]["tolerations"]
    err = on.refused("q", "gpu-team", containers=[{"name": "a", "image": "x"}], tolerations=[FOREIGN])
    assert err.message == (
        "pod tolerations (possibly merged with namespace default tolerations) conflict with its "
        "namespace whitelist"
    )
    # A namespace without annotations restricts nothing.
    on.namespace("open")
    on.pod("q", "open", containers=[{"name": "a", "image": "x"}], tolerations=[FOREIGN])


def test_pod_node_selector_from_the_namespace(tmp_path: Path) -> None:
    api = Api(tmp_path, "NodeRestriction,PodNodeSelector")
    api.namespace("h200", {kube_admission.NS_NODE_SELECTOR: "nvidia.com/gpu.product=NVIDIA-H200"})
    pod = api.pod("p", "h200", containers=[{"name": "a", "image": "x"}], nodeSelector={"zone": "a"})
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200", "zone": "a"}
    err = api.refused(
        "q", "h200", containers=[{"name": "a", "image": "x"}], nodeSelector={"nvidia.com/gpu.product": "A100"}
    )
    assert (
        err.message
        == 'pods "q" is forbidden: pod node label selector conflicts with its namespace node label selector'
    )
    off = Api(tmp_path / "off")
    off.namespace("h200", {kube_admission.NS_NODE_SELECTOR: "nvidia.com/gpu.product=NVIDIA-H200"})
    assert "nodeSelector" not in off.pod("p", "h200", containers=[{"name": "a", "image": "x"}])["spec"]


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1", "1"),
        ("1500m", "1500m"),
        ("2000m", "2"),
        ("3Gi", "3Gi"),
        ("1536Mi", "1536Mi"),
        ("2k", "2k"),
        ("0.5", "500m"),
    ],
)
def test_quantities_print_like_the_api(text: str, canonical: str) -> None:
    assert str(kube_admission.Quantity.parse(text)) == canonical


def test_describe_quota(api: Api) -> None:
    api.quota("gpu-quota", {"requests.nvidia.com/gpu": "4"})
    api.pod("a", containers=[gpu_container(3)])
    api.used("gpu-quota")
    text = kube_admission.describe_quota(api.call("GET", f"/api/v1/namespaces/{NS}/resourcequotas/gpu-quota"))
    assert "requests.nvidia.com/gpu  3     4" in text
