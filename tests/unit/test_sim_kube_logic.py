"""Pure pieces of the lab's simulated Kubernetes: JSONPath, Go templates, selectors, merge patches,
durations, containerd and sysctl configuration, kubectl's pod status column, helm --set, the object
store's API semantics, and the bootstrap-token JWS and CA pin."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from gpuprov_lab.sim import kube_ctl, kube_helm, kube_pki, kube_store
from gpuprov_lab.sim import kube_jsonpath as jp
from gpuprov_lab.sim import kube_util as u
from gpuprov_lab.sim.kube_host import Host, containerd_config

NODES = {
    "kind": "List",
    "items": [
        {
            "metadata": {"name": "cp1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "status": {"allocatable": {"cpu": "2"}, "conditions": [{"type": "Ready", "status": "True"}]},
        },
        {
            "metadata": {"name": "gpu1", "labels": {}},
            "status": {
                "allocatable": {"cpu": "8", "nvidia.com/gpu": "1"},
                "conditions": [{"type": "Ready", "status": "False"}],
            },
        },
    ],
}


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("{.items[*].metadata.name}", "cp1 gpu1"),
        ("{.items[1].status.allocatable.nvidia\\.com/gpu}", "1"),
        (
            '{range .items[*]}{.metadata.name}{"\\t"}{.status.allocatable.cpu}{"\\n"}{end}',
            "cp1\t2\ngpu1\t8\n",
        ),
        ('{.items[?(@.metadata.name=="gpu1")].status.conditions[?(@.type=="Ready")].status}', "False"),
        ("{.items[0].status.allocatable}", '{"cpu":"2"}'),
        ("{.items[0].missing.field}", ""),
        (".items[-1].metadata.name", "gpu1"),
        ("{.items[*].metadata.labels.node-role\\.kubernetes\\.io/control-plane}", ""),
    ],
)
def test_jsonpath(template: str, want: str) -> None:
    assert jp.render(template, NODES) == want


def test_jsonpath_out_of_range_index_is_an_error() -> None:
    with pytest.raises(jp.JSONPathError):
        jp.render("{.items[5].metadata.name}", NODES)


def test_label_and_field_selectors() -> None:
    reqs = u.parse_label_selector("app=x,tier!=db,env in (a,b),!gone,has")
    assert u.labels_match(reqs, {"app": "x", "env": "b", "has": ""})
    assert not u.labels_match(reqs, {"app": "x", "env": "c", "has": ""})
    assert not u.labels_match(reqs, {"app": "x", "env": "a", "has": "", "gone": "1"})
    with pytest.raises(u.SelectorError):
        u.parse_label_selector("a=b,,(")
    pod = {"spec": {"nodeName": "gpu1"}, "status": {"phase": "Running"}}
    assert u.fields_match(u.parse_field_selector("spec.nodeName=gpu1,status.phase!=Failed"), pod)
    assert not u.fields_match(u.parse_field_selector("spec.nodeName=gpu2"), pod)
    sel = {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "k", "operator": "In", "values": ["1"]}]}
    assert u.match_label_selector(sel, {"app": "x", "k": "1"})
    assert not u.match_label_selector(sel, {"app": "x", "k": "2"})


def test_patches() -> None:
    assert u.merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}
    last = {"metadata": {"labels": {"a": "1", "b": "2"}}, "data": {"k": "v"}}
    new = {"metadata": {"labels": {"a": "1"}}, "data": {"k": "v2"}}
    live = {"metadata": {"labels": {"a": "1", "b": "2", "added": "by-someone"}}, "data": {"k": "v"}}
    assert u.three_way_patch(last, new, live) == {"metadata": {"labels": {"b": None}}, "data": {"k": "v2"}}
    assert u.three_way_patch(new, new, {**new, "status": {}}) == {}


@pytest.mark.parametrize(
    ("seconds", "go", "age"),
    [
        (30, "30s", "30s"),
        (240, "4m0s", "4m"),
        (330, "5m30s", "5m30s"),
        (3600, "1h0m0s", "60m"),
        (0.5, "500ms", "0s"),
    ],
)
def test_durations(seconds: float, go: str, age: str) -> None:
    assert u.go_duration(seconds) == go
    assert u.human_age(seconds) == age
    assert u.parse_duration(go) == pytest.approx(seconds)


def test_parse_duration_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        u.parse_duration("5 minutes")


def host_with(tmp_path: Path, files: dict[str, str]) -> Host:
    h = Host(root=tmp_path)
    for path, text in files.items():
        h.write(path, text)
    return h


def test_containerd_config_versions(tmp_path: Path) -> None:
    h = host_with(
        tmp_path,
        {
            "/etc/containerd/config.toml": (
                'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
                '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = '
                "true\n"
            ),
            "/etc/containerd/conf.d/99-nvidia.toml": (
                'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
                '  runtime_type = "io.containerd.runc.v2"\n'
            ),
        },
    )
    cc = containerd_config(h)
    # Imports are merged by containerd itself (`containerd config dump` on a lab host, where 1.x lets an
    # imported plugin table replace config.toml's); off-host only config.toml is read.
    assert cc.cri_enabled and cc.systemd_cgroup() and not cc.has_runtime("nvidia")
    assert cc.source == "/etc/containerd/config.toml" and not cc.enable_cdi
    h.write("/etc/containerd/config.toml", 'disabled_plugins = ["cri"]\n')
    assert not containerd_config(h).cri_enabled
    h.write(
        "/etc/containerd/config.toml",
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n"
        "  SystemdCgroup = false\n",
    )
    cc = containerd_config(h)
    assert cc.cri_enabled and not cc.systemd_cgroup() and not cc.has_runtime("nvidia")
    (tmp_path / "etc/containerd/config.toml").unlink()
    assert not containerd_config(h).systemd_cgroup()  # containerd's default is cgroupfs


def test_sysctl_configuration_order(tmp_path: Path) -> None:
    h = host_with(
        tmp_path,
        {
            "/usr/lib/sysctl.d/50-default.conf": "net.ipv4.ip_forward = 0\n",
            "/etc/sysctl.d/99-kubernetes.conf": "# k8s\nnet.ipv4.ip_forward = 1\n",
            "/etc/sysctl.d/10-early.conf": "net/ipv4/ip_forward=0\n",
        },
    )
    assert h.sysctl_configured("net.ipv4.ip_forward") == "1"
    h.write("/etc/sysctl.conf", "net.ipv4.ip_forward=0\n")
    assert h.sysctl_configured("net.ipv4.ip_forward") == "0"
    assert h.sysctl_configured("net.bridge.bridge-nf-call-iptables") is None


def _pod(
    init: list[dict[str, object]], main: list[dict[str, object]], deleting: bool = False
) -> dict[str, object]:
    meta: dict[str, object] = {"name": "p"}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "initContainers": [{"name": f"i{i}"} for i in range(len(init))] or None,
            "containers": [{"name": f"c{i}"} for i in range(len(main))],
        },
        "status": {"phase": "Pending", "initContainerStatuses": init, "containerStatuses": main},
    }


def test_pod_status_column() -> None:
    running = {"ready": True, "restartCount": 0, "state": {"running": {}}}
    crash = {"ready": False, "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    done = {"restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    waiting = {"restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
    assert kube_ctl.pod_status(_pod([], [running]))[:2] == ("1/1", "Pending")
    run_pod = _pod([], [running])
    run_pod["status"]["phase"] = "Running"  # type: ignore[index]
    assert kube_ctl.pod_status(run_pod) == ("1/1", "Running", "0")
    assert kube_ctl.pod_status(_pod([], [crash])) == ("0/1", "CrashLoopBackOff", "4")
    assert kube_ctl.pod_status(_pod([done, crash], [waiting]))[1] == "Init:CrashLoopBackOff"
    assert kube_ctl.pod_status(_pod([done, waiting], [waiting]))[1] == "Init:1/2"
    assert kube_ctl.pod_status(_pod([], [running], deleting=True))[1] == "Terminating"


def test_helm_set_values() -> None:
    vals: dict[str, object] = {}
    kube_helm.apply_set(vals, "driver.enabled=false,a.b[1].c=3,list={x,y},s=007")
    kube_helm.apply_set(vals, "str=true", as_string=True)
    assert vals == {
        "driver": {"enabled": False},
        "a": {"b": [{}, {"c": 3}]},
        "list": ["x", "y"],
        "s": "007",
        "str": "true",
    }
    with pytest.raises(kube_helm.HelmError):
        kube_helm.apply_set({}, "novalue")


def test_store_api_semantics(tmp_path: Path) -> None:
    s = kube_store.Store(tmp_path / "store.json")
    cms, pods, ns = s.res("configmaps"), s.res("pods"), s.res("namespaces")
    assert s.lookup("ds").rid == "daemonsets.apps" and s.lookup("daemonsets.apps").kind == "DaemonSet"
    with pytest.raises(kube_store.ApiError, match='namespaces "nope" not found'):
        s.create(cms, {"metadata": {"name": "c", "namespace": "nope"}})
    s.create(cms, {"metadata": {"name": "c", "namespace": "default"}, "data": {"k": "v"}})
    with pytest.raises(kube_store.ApiError, match='configmaps "c" already exists') as err:
        s.create(cms, {"metadata": {"name": "c", "namespace": "default"}})
    assert err.value.code == 409
    before = s.get(cms, "default", "c")
    same = s.patch(cms, "default", "c", {"data": {"k": "v"}})
    assert same["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    changed = s.patch(cms, "default", "c", {"data": {"k": "w"}})
    assert changed["metadata"]["generation"] == 2
    s.create(
        pods,
        {"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": "n1", "containers": []}},
    )
    marked = s.delete(pods, "default", "p")
    assert marked["metadata"]["deletionTimestamp"] and s.find(pods, "default", "p") is not None
    s.delete(pods, "default", "p", grace=0)
    assert s.find(pods, "default", "p") is None
    with pytest.raises(kube_store.ApiError, match="may not be deleted"):
        s.delete(ns, "", "kube-system")
    s.flush()
    again = kube_store.Store(tmp_path / "store.json")
    assert again.get(cms, "default", "c")["data"] == {"k": "w"}


def test_bootstrap_token_jws() -> None:
    payload = "apiVersion: v1\nkind: Config\n"
    sig = kube_pki.jws_detached(payload, "abcdef", "0123456789abcdef")
    header, empty, _ = sig.split(".")
    assert empty == "" and header
    assert kube_pki.jws_valid(sig, payload, "abcdef", "0123456789abcdef")
    assert not kube_pki.jws_valid(sig, payload, "abcdef", "0123456789abcdeX")
    assert not kube_pki.jws_valid(sig, payload + " ", "abcdef", "0123456789abcdef")
    assert kube_pki.TOKEN_RE.match(kube_pki.new_token())


def test_ca_pin_is_the_sha256_of_the_public_key_info(tmp_path: Path) -> None:
    h = Host(root=tmp_path)
    ca = kube_pki.make_ca(h, "kubernetes")
    (tmp_path / "ca.crt").write_text(ca.cert)
    pub = subprocess.run(
        ["openssl", "x509", "-pubkey", "-noout", "-in", str(tmp_path / "ca.crt")],
        capture_output=True,
        check=True,
    ).stdout
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-outform", "der"], input=pub, capture_output=True, check=True
    ).stdout
    assert kube_pki.spki_pin(h, ca.cert) == "sha256:" + hashlib.sha256(der).hexdigest()
    leaf = kube_pki.make_cert(h, ca, "system:node:gpu1", ["system:nodes"])
    info = kube_pki.cert_info(h, leaf.cert)
    assert "CN=system:node:gpu1" in info["subject"] and "O=system:nodes" in info["subject"]
    assert "CN=kubernetes" in info["issuer"]


def test_controllers_share_pod_lists_until_the_store_changes(tmp_path: Path) -> None:
    """A controllers' pass lists the same pods many times: one copy per store version, never a stale one."""
    from types import SimpleNamespace

    from gpuprov_lab.sim import kube_ctrl

    s = kube_store.Store(tmp_path / "store.json")
    pods = s.res("pods")

    def pod(name: str, ns: str = "default") -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": "n1", "containers": []}}

    s.create(pods, pod("a"))
    ctrl = kube_ctrl.Controllers(SimpleNamespace(store=s, host=None, settings=None))  # type: ignore[arg-type]
    first = ctrl._pods("default")
    assert [p["metadata"]["name"] for p in first] == ["a"]
    assert ctrl._pods("default") is first  # same version: the same list
    assert [p["metadata"]["name"] for p in ctrl._pods()] == ["a"]
    s.create(pods, pod("b"))
    assert [p["metadata"]["name"] for p in ctrl._pods("default")] == ["a", "b"]
    s.delete(pods, "default", "a", grace=0)
    assert [p["metadata"]["name"] for p in ctrl._pods()] == ["b"]
    s.patch(pods, "default", "b", {"metadata": {"labels": {"x": "1"}}})
    assert ctrl._pods("default")[0]["metadata"]["labels"] == {"x": "1"}
    s.remove_now(pods, "default", "b")
    assert ctrl._pods("default") == []


def test_kubelet_looks_at_the_container_runtime_once_per_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pod's status needs the runtime's state; systemctl is asked once per RUNTIME_TTL, not per pod."""
    from types import SimpleNamespace

    from gpuprov_lab.sim import kube_let

    calls: list[str] = []
    clock = [100.0]

    def fake_state(host: object, cgroup_driver: str) -> tuple[bool, None]:
        calls.append(cgroup_driver)
        return True, None

    monkeypatch.setattr(kube_let, "runtime_state", fake_state)
    monkeypatch.setattr(kube_let.time, "monotonic", lambda: clock[0])
    k = kube_let.Kubelet.__new__(kube_let.Kubelet)
    k.host, k.s, k.cache = None, SimpleNamespace(cgroup_driver="systemd"), {}
    for _ in range(5):
        assert k.runtime() == (True, None)
    assert calls == ["systemd"]
    clock[0] += kube_let.RUNTIME_TTL + 0.01
    k.runtime()
    assert len(calls) == 2
