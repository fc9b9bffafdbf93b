"""The lab's simulated Kubernetes end to end, off-host: simulated nodes on loopback (kube_testing) run
the same kubeadm, kubelet, API server, kubectl and helm code that lab hosts run.

One cluster (cp1 + gpu1 with one H200) serves the module; tests that change it put it back. Preflight
failures use nodes of their own."""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from gpuprov_lab.sim import kube, kube_pki
from gpuprov_lab.sim import kube_testing as kt

pytestmark = pytest.mark.slow


@dataclass
class Cluster:
    cp: kt.SimHost
    gpu: kt.SimHost
    init_out: str
    join: list[str]
    mirror_url: str
    root: Path

    def kubectl(self, *args: str) -> tuple[int, str, str]:
        return kt.Tool(self.cp).kubectl(*args)

    def helm(self, *args: str) -> tuple[int, str, str]:
        return kt.Tool(self.cp).helm(*args)

    def node(self, name: str) -> dict:
        rc, out, err = self.kubectl("get", "node", name, "-o", "json")
        assert rc == 0, err
        return json.loads(out)

    def ready(self, name: str) -> str:
        conds = self.node(name)["status"].get("conditions", [])
        return next((c["status"] for c in conds if c["type"] == "Ready"), "")


def _serve(directory: Path) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("kube")
    mirror = root / "mirror"
    for rel, data in kube.extra_mirror_files().items():
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / rel).write_bytes(data)
    srv = _serve(mirror)
    cp = kt.make_node(root / "cp1", "cp1")
    gpu = kt.make_node(root / "gpu1", "gpu1", gpus=1)
    try:
        port = kt.free_port()
        rc, out, err = kt.Tool(cp).kubeadm(
            "init",
            "--pod-network-cidr=10.244.0.0/16",
            f"--apiserver-bind-port={port}",
            "--apiserver-advertise-address=127.0.0.1",
        )
        assert rc == 0, err + out
        argv = kt.join_argv(out)
        rc, jout, jerr = kt.Tool(gpu).kubeadm(*argv)
        assert rc == 0, jerr + jout
        c = Cluster(cp, gpu, out, argv, f"http://127.0.0.1:{srv.server_address[1]}", root)
        cp.write("/root/kube-flannel.yml", (mirror / "flannel/v0.27.4/kube-flannel.yml").read_text())
        rc, out, err = c.kubectl("apply", "-f", "/root/kube-flannel.yml")
        assert rc == 0, err
        kt.wait_for(lambda: c.ready("cp1") == "True" and c.ready("gpu1") == "True", 60)
        yield c
    finally:
        gpu.services.shutdown()  # type: ignore[union-attr]
        cp.services.shutdown()  # type: ignore[union-attr]
        srv.shutdown()
        srv.server_close()
        shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------------------------- kubeadm


def test_init_prints_the_join_command_with_the_ca_pin(cluster: Cluster) -> None:
    out = cluster.init_out
    assert "Your Kubernetes control-plane has initialized successfully!" in out
    assert "export KUBECONFIG=/etc/kubernetes/admin.conf" in out
    ca = cluster.cp.read("/etc/kubernetes/pki/ca.crt") or ""
    pin = kube_pki.spki_pin(cluster.cp, ca)
    assert cluster.join[0] == "join" and cluster.join[1].startswith("127.0.0.1:")
    assert cluster.join[cluster.join.index("--discovery-token-ca-cert-hash") + 1] == pin
    for f in (
        "admin.conf",
        "super-admin.conf",
        "kubelet.conf",
        "controller-manager.conf",
        "scheduler.conf",
        "pki/ca.key",
        "pki/apiserver.crt",
        "pki/sa.pub",
        "pki/etcd/ca.crt",
        "manifests/kube-apiserver.yaml",
    ):
        assert cluster.cp.exists(f"/etc/kubernetes/{f}"), f
    cfg = yaml.safe_load(cluster.cp.read("/var/lib/kubelet/config.yaml") or "")
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["cgroupDriver"] == "systemd" and "readOnlyPort" not in cfg
    flags = cluster.gpu.read("/var/lib/kubelet/kubeadm-flags.env") or ""
    assert flags.startswith('KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/run/containerd/')
    # the joined node's kubelet runs on the certificate of its TLS bootstrap
    kc = yaml.safe_load(cluster.gpu.read("/etc/kubernetes/kubelet.conf") or "")
    assert kc["users"][0]["user"]["client-certificate"] == "/var/lib/kubelet/pki/kubelet-client-current.pem"
    assert not cluster.gpu.exists("/etc/kubernetes/bootstrap-kubelet.conf")


def test_second_init_fails_preflight_like_the_real_one(cluster: Cluster) -> None:
    rc, _out, err = kt.Tool(cluster.cp).kubeadm("init", "--pod-network-cidr=10.244.0.0/16")
    assert rc == 1
    assert "[preflight] Some fatal errors occurred:" in err
    assert "[ERROR FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml]: " in err
    assert "[ERROR Port-10250]: Port 10250 is in use" in err
    assert "[ERROR DirAvailable--var-lib-etcd]: /var/lib/etcd is not empty" in err
    assert "--ignore-preflight-errors=..." in err


def test_token_create_prints_a_working_join_command(cluster: Cluster) -> None:
    rc, out, err = kt.Tool(cluster.cp).kubeadm("token", "create", "--ttl", "30m", "--print-join-command")
    assert rc == 0, err
    assert re.fullmatch(
        r"kubeadm join 127\.0\.0\.1:\d+ --token [a-z0-9]{6}\.[a-z0-9]{16} --discovery-token-ca-cert-hash "
        r"sha256:[0-9a-f]{64} \n",
        out,
    )
    rc, out, _ = kt.Tool(cluster.cp).kubeadm("token", "list")
    assert (
        rc == 0
        and "authentication,signing" in out
        and "system:bootstrappers:kubeadm:default-node-token" in out
    )


@pytest.fixture
def stranger(cluster: Cluster) -> Iterator[kt.SimHost]:
    """A third host that tries to join (and must not)."""
    h = kt.make_node(cluster.root / "gpu9", "gpu9")
    h.env["GPUPROV_SIM_KUBEADM_TIMEOUT_DISCOVERY"] = "2s"
    yield h
    h.services.shutdown()  # type: ignore[union-attr]


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def test_join_with_a_wrong_ca_hash_fails(cluster: Cluster, stranger: kt.SimHost) -> None:
    argv = _with(cluster.join, "--discovery-token-ca-cert-hash", "sha256:" + "0" * 64)
    rc, _out, err = kt.Tool(stranger).kubeadm(*argv)
    assert rc == 1
    assert (
        "couldn't validate the identity of the API Server: cluster CA found in cluster-info ConfigMap is "
        in err
    )
    assert "are pinned" in err
    assert not stranger.exists("/etc/kubernetes/kubelet.conf")


def test_join_with_a_wrong_token_secret_fails(cluster: Cluster, stranger: kt.SimHost) -> None:
    token = cluster.join[cluster.join.index("--token") + 1]
    rc, _out, err = kt.Tool(stranger).kubeadm(*_with(cluster.join, "--token", token[:7] + "x" * 16))
    assert rc == 1
    assert (
        "failed to verify JWS signature of received cluster info object, can't trust this API Server" in err
    )


def test_join_with_an_unknown_token_fails(cluster: Cluster, stranger: kt.SimHost) -> None:
    rc, _out, err = kt.Tool(stranger).kubeadm(*_with(cluster.join, "--token", "zzzzzz.0123456789abcdef"))
    assert rc == 1
    assert 'could not find a JWS signature in the cluster-info ConfigMap for token ID "zzzzzz"' in err
    rc, _out, err = kt.Tool(stranger).kubeadm(*_with(cluster.join, "--token", "not-a-token"))
    assert rc == 1 and 'was not of the form "^([a-z0-9]{6})\\.([a-z0-9]{16})$"' in err
    assert cluster.kubectl("get", "node", "gpu9")[0] == 1


# ------------------------------------------------------------------------------------------- nodes


def test_node_json_has_the_real_shape(cluster: Cluster) -> None:
    node = cluster.node("gpu1")
    assert node["kind"] == "Node" and node["apiVersion"] == "v1"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu1"
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
    assert node["status"]["capacity"]["pods"] == "110"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert node["spec"]["podCIDR"] == "10.244.1.0/24"
    assert not node["spec"].get("unschedulable")
    cp = cluster.node("cp1")
    assert cp["spec"]["taints"] == [
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
    ]
    rc, out, _ = cluster.kubectl("get", "nodes")
    assert rc == 0
    assert re.search(r"^cp1\s+Ready\s+control-plane\s+\S+\s+v1\.36\.3$", out, re.M)
    assert re.search(r"^gpu1\s+Ready\s+<none>\s+\S+\s+v1\.36\.3$", out, re.M)
    rc, out, _ = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")
    assert out == "cp1 gpu1"


def test_flannel_wrote_the_cni_config_and_subnet(cluster: Cluster) -> None:
    conflist = json.loads(cluster.gpu.read("/etc/cni/net.d/10-flannel.conflist") or "{}")
    assert conflist["name"] == "cbr0" and conflist["plugins"][0]["type"] == "flannel"
    env = cluster.gpu.read("/run/flannel/subnet.env") or ""
    assert "FLANNEL_NETWORK=10.244.0.0/16\n" in env and "FLANNEL_SUBNET=10.244.1.1/24\n" in env
    assert cluster.gpu.exists("/opt/cni/bin/flannel")
    rc, out, _ = cluster.kubectl("apply", "-f", "/root/kube-flannel.yml")
    assert rc == 0 and out.count(" unchanged\n") == 6, out


def test_node_not_ready_when_the_cgroup_driver_does_not_match(cluster: Cluster) -> None:
    good = cluster.gpu.read("/etc/containerd/config.toml") or ""
    cluster.gpu.write(
        "/etc/containerd/config.toml", good.replace("SystemdCgroup = true", "SystemdCgroup = false")
    )
    try:
        kt.wait_for(lambda: cluster.ready("gpu1") == "False", 20)
        ready = next(c for c in cluster.node("gpu1")["status"]["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "KubeletNotReady" and "cgroup driver" in ready["message"]
    finally:
        cluster.gpu.write("/etc/containerd/config.toml", good)
    kt.wait_for(lambda: cluster.ready("gpu1") == "True", 20)


def test_node_not_ready_without_a_cni_config(cluster: Cluster) -> None:
    path = "/etc/cni/net.d/10-flannel.conflist"
    saved = cluster.gpu.read(path) or ""
    # flannel's init container would put it back; take the DaemonSet's node away first
    cluster.kubectl("label", "node", "gpu1", "kubernetes.io/os=none", "--overwrite")
    try:
        kt.wait_for(
            lambda: not [p for p in _pods(cluster, "kube-flannel") if p["spec"]["nodeName"] == "gpu1"], 20
        )
        cluster.gpu.remove(path)
        kt.wait_for(lambda: cluster.ready("gpu1") == "False", 20)
        ready = next(c for c in cluster.node("gpu1")["status"]["conditions"] if c["type"] == "Ready")
        assert "cni plugin not initialized" in ready["message"]
    finally:
        cluster.kubectl("label", "node", "gpu1", "kubernetes.io/os=linux", "--overwrite")
    kt.wait_for(lambda: cluster.gpu.read(path) == saved and cluster.ready("gpu1") == "True", 30)


def _get(url: str, tls: bool) -> tuple[int, str]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=5, context=ctx if tls else None) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_kubelet_hardening_is_observable(cluster: Cluster) -> None:
    g = cluster.gpu
    assert _get(f"http://127.0.0.1:{g.port(10248)}/healthz", tls=False) == (200, "ok")
    assert _get(f"https://127.0.0.1:{g.port(10250)}/pods", tls=True)[0] == 401
    assert not _port_open(g.port(10255))
    cfg_text = g.read("/var/lib/kubelet/config.yaml") or ""
    cfg = yaml.safe_load(cfg_text)
    cfg["authentication"]["anonymous"]["enabled"] = True
    cfg["readOnlyPort"] = 10255
    g.write("/var/lib/kubelet/config.yaml", yaml.safe_dump(cfg))
    try:
        g.services.systemctl(["restart", "kubelet"])  # type: ignore[union-attr]
        kt.wait_for(lambda: _port_open(g.port(10255)), 20)
        code, body = _get(f"https://127.0.0.1:{g.port(10250)}/pods", tls=True)
        assert code == 403 and "user=system:anonymous" in body
        code, body = _get(f"http://127.0.0.1:{g.port(10255)}/pods", tls=False)
        assert code == 200 and json.loads(body)["kind"] == "PodList"
    finally:
        g.write("/var/lib/kubelet/config.yaml", cfg_text)
        g.services.systemctl(["restart", "kubelet"])  # type: ignore[union-attr]
    kt.wait_for(lambda: not _port_open(g.port(10255)) and _port_open(g.port(10250)), 20)


def test_labels_and_annotations_like_kubectl(cluster: Cluster) -> None:
    assert cluster.kubectl("label", "node", "gpu1", "team=ml")[1] == "node/gpu1 labeled\n"
    assert cluster.kubectl("label", "node", "gpu1", "team=ml")[1] == "node/gpu1 not labeled\n"
    rc, _out, err = cluster.kubectl("label", "node", "gpu1", "team=hpc")
    assert rc == 1 and "'team' already has a value (ml), and --overwrite is false" in err
    assert cluster.kubectl("annotate", "node", "gpu1", "x/y=1")[1] == "node/gpu1 annotated\n"
    rc, _out, err = cluster.kubectl("annotate", "node", "gpu1", "x/y=2")
    assert rc == 1 and "--overwrite is false" in err
    assert cluster.kubectl("annotate", "node", "gpu1", "x/y=2", "--overwrite")[0] == 0
    assert cluster.node("gpu1")["metadata"]["annotations"]["x/y"] == "2"
    assert cluster.kubectl("label", "node", "gpu1", "team-")[1] == "node/gpu1 unlabeled\n"
    assert cluster.kubectl("annotate", "node", "gpu1", "x/y-")[0] == 0
    assert "team" not in cluster.node("gpu1")["metadata"]["labels"]


# ------------------------------------------------------------------------------------------- drain


def _pods(cluster: Cluster, ns: str, selector: str = "") -> list[dict]:
    args = ["get", "pods", "-n", ns, "-o", "json"] + (["-l", selector] if selector else [])
    rc, out, err = cluster.kubectl(*args)
    assert rc == 0, err
    return json.loads(out)["items"]


def test_cordon_drain_uncordon(cluster: Cluster) -> None:
    kt.wait_for(
        lambda: [
            p
            for p in _pods(cluster, "kube-system", "k8s-app=kube-dns")
            if p["status"].get("phase") == "Running"
        ],
        30,
    )
    assert cluster.kubectl("cordon", "gpu1")[1] == "node/gpu1 cordoned\n"
    assert cluster.kubectl("cordon", "gpu1")[1] == "node/gpu1 already cordoned\n"
    rc, out, err = cluster.kubectl(
        "drain", "gpu1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"
    )
    assert rc == 0, err
    assert out.startswith("node/gpu1 already cordoned\n") and out.endswith("node/gpu1 drained\n")
    assert "Warning: ignoring DaemonSet-managed Pods: " in err and "kube-flannel/kube-flannel-ds-" in err
    left = [
        p for p in _pods(cluster, "kube-system", "k8s-app=kube-dns") if p["spec"].get("nodeName") == "gpu1"
    ]
    assert left == []
    assert re.search(r"^gpu1\s+Ready,SchedulingDisabled\s", cluster.kubectl("get", "nodes")[1], re.M)
    assert cluster.node("gpu1")["spec"]["unschedulable"] is True
    assert cluster.kubectl("uncordon", "gpu1")[1] == "node/gpu1 uncordoned\n"
    assert not cluster.node("gpu1")["spec"].get("unschedulable")
    rc, _out, err = cluster.kubectl("drain", "gpu1", "--timeout=5s")
    assert rc == 1
    assert "cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore)" in err
    cluster.kubectl("uncordon", "gpu1")


def test_drain_block_fault_makes_drain_time_out(cluster: Cluster) -> None:
    g = cluster.gpu
    g.write("/etc/gpuprov-lab/faults.json", json.dumps({"faults": [{"kind": "drain-block"}]}))
    try:
        kt.wait_for(
            lambda: [p for p in _pods(cluster, "gpuprov-lab") if p["status"].get("phase") == "Running"], 30
        )
        rc, out, err = cluster.kubectl(
            "drain", "gpu1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=7s"
        )
        assert rc == 1
        assert re.search(
            r'error when evicting pods/"drain-block-gpu1-\S+" -n "gpuprov-lab" \(will retry after 5s\): '
            r"Cannot evict pod as it would violate the pod's disruption budget\.",
            err,
        )
        assert re.search(
            r'There are pending pods in node "gpu1" when an error occurred: error when evicting '
            r'pods/"drain-block-gpu1-\S+" -n "gpuprov-lab": global timeout reached: 7s',
            err,
        )
        assert 'error: unable to drain node "gpu1" due to error: ' in err
        assert "There are pending nodes to be drained:\n gpu1\n" in err
        assert "node/gpu1 drained" not in out
    finally:
        g.write("/etc/gpuprov-lab/faults.json", json.dumps({"faults": []}))
        cluster.kubectl("uncordon", "gpu1")
    kt.wait_for(lambda: not _pods(cluster, "gpuprov-lab"), 30)


# -------------------------------------------------------------------------------------------- helm


def test_helm_release_revisions(cluster: Cluster) -> None:
    repo = cluster.mirror_url + "/helm-charts/nvidia"
    h = cluster.helm
    rc, _out, err = cluster.kubectl("get", "clusterpolicies.nvidia.com")
    assert rc == 1 and 'the server doesn\'t have a resource type "clusterpolicies.nvidia.com"' in err
    assert h("repo", "add", "nvidia", repo)[1] == '"nvidia" has been added to your repositories\n'
    assert "already exists with the same configuration, skipping" in h("repo", "add", "nvidia", repo)[1]
    rc, out, _ = h("search", "repo", "nvidia/gpu-operator", "-o", "json")
    assert rc == 0 and json.loads(out)[0]["version"] == "v26.7.0"
    # `helm show crds` is the real helm's: the chart's CRDs and its subcharts' (the role applies them).
    rc, out, err = h("show", "crds", "nvidia/gpu-operator", "--version", "v26.7.0")
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(out) if d}
    assert rc == 0 and {"clusterpolicies.nvidia.com", "nodefeaturerules.nfd.k8s-sigs.io"} <= names, err
    values = {"nfd": {"enabled": False}, "driver": {"enabled": False}}
    cluster.cp.write("/root/v.yaml", yaml.safe_dump(values))
    args = ["nvidia/gpu-operator", "--version", "v26.7.0", "-n", "rev-test", "-f", "/root/v.yaml"]
    rc, _out, err = h("upgrade", "--install", "rel", *args)
    assert rc == 1 and 'namespaces "rev-test" not found' in err
    rc, out, err = h("upgrade", "--install", "rel", *args, "--create-namespace")
    assert rc == 0, err
    assert (
        out.startswith('Release "rel" does not exist. Installing it now.\nNAME: rel\n')
        and "REVISION: 1\n" in out
    )
    # An upgrade would run the chart's CRD-upgrade hook job, which the lab cannot run: it says so.
    rc, _out, err = h("upgrade", "--install", "rel", *args)
    assert rc == 1 and "gpu-operator-upgrade-crd-hook-sa is a pre-upgrade hook" in err
    values["operator"] = {"upgradeCRD": False}
    cluster.cp.write("/root/v.yaml", yaml.safe_dump(values))
    rc, out, _ = h("upgrade", "--install", "rel", *args)
    assert rc == 0 and 'Release "rel" has been upgraded. Happy Helming!' in out and "REVISION: 2\n" in out
    rc, out, _ = h("list", "-A", "-o", "json")
    rel = next(r for r in json.loads(out) if r["name"] == "rel")
    assert (rel["revision"], rel["status"], rel["chart"], rel["app_version"]) == (
        "2",
        "deployed",
        "gpu-operator-v26.7.0",
        "v26.7.0",
    )
    assert json.loads(h("get", "values", "rel", "-n", "rev-test", "-o", "json")[1]) == values
    secrets = {
        s["metadata"]["name"]: s
        for s in json.loads(
            cluster.kubectl("get", "secrets", "-n", "rev-test", "-l", "owner=helm", "-o", "json")[1]
        )["items"]
    }
    assert set(secrets) == {"sh.helm.release.v1.rel.v1", "sh.helm.release.v1.rel.v2"}
    assert secrets["sh.helm.release.v1.rel.v1"]["metadata"]["labels"]["status"] == "superseded"
    assert secrets["sh.helm.release.v1.rel.v2"]["type"] == "helm.sh/release.v1"
    assert json.loads(h("list", "-n", "rev-test", "--filter", "^rel$", "-o", "json")[1])[0]["name"] == "rel"
    assert json.loads(h("list", "-n", "rev-test", "--filter", "^other$", "-o", "json")[1]) == []
    rc, out, _ = h("status", "rel", "-n", "rev-test", "-o", "json")
    assert rc == 0 and json.loads(out)["info"]["status"] == "deployed" and json.loads(out)["version"] == 2
    rc, out, _ = h("uninstall", "rel", "-n", "rev-test")
    assert (rc, out) == (0, 'release "rel" uninstalled\n')
    assert h("status", "rel", "-n", "rev-test")[2] == "Error: release: not found\n"
    cluster.kubectl("delete", "namespace", "rev-test")


# ---------------------------------------------------------------------------------------- operator


def _policy(cluster: Cluster) -> dict:
    rc, out, err = cluster.kubectl("get", "clusterpolicies.nvidia.com", "-o", "json")
    assert rc == 0, err
    items = json.loads(out)["items"]
    return items[0] if items else {}


def _state(cluster: Cluster) -> str:
    return _policy(cluster).get("status", {}).get("state", "")


def _messages(pod: dict) -> str:
    """Every container state's reason and message of a pod, one per line."""
    out = []
    st = pod.get("status") or {}
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            for detail in state.values():
                out.append(f"{cs['name']}: {detail.get('reason', '')}: {detail.get('message', '')}")
    return "\n".join(out)


def _validator(cluster: Cluster) -> dict:
    pods = _pods(cluster, "gpu-operator", "app=nvidia-operator-validator")
    return pods[0] if pods else {}


def test_gpu_operator_validates_against_the_host(cluster: Cluster) -> None:
    """driver and toolkit from the host: the validator passes only when containerd has the nvidia runtime
    and the host driver answers; then the device plugin advertises the GPU; a containerized driver on a
    host that has one crash-loops."""
    g = cluster.gpu
    # The node's containerd (a version 2 config) has CDI off: the role would choose cdi.enabled=false.
    values = {
        "driver": {"enabled": False},
        "toolkit": {"enabled": False},
        "cdi": {"enabled": False},
        "operator": {"upgradeCRD": False},
    }
    cluster.cp.write("/root/gpu-operator-values.json", json.dumps(values))
    ns = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "gpu-operator", "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
    }
    cluster.cp.write("/root/ns.json", json.dumps(ns))
    assert cluster.kubectl("apply", "-f", "/root/ns.json")[1] == "namespace/gpu-operator created\n"
    install = [
        "upgrade",
        "--install",
        "gpu-operator",
        "gpu-operator",
        "--repo",
        cluster.mirror_url + "/helm-charts/nvidia",
        "--version",
        "v26.7.0",
        "--namespace",
        "gpu-operator",
        "--values",
        "/root/gpu-operator-values.json",
    ]
    rc, out, err = cluster.helm(*install)
    assert rc == 0, err
    # no nvidia runtime in containerd yet: pods of runtime class nvidia cannot start
    kt.wait_for(lambda: _validator(cluster), 60)
    kt.wait_for(lambda: 'no runtime for "nvidia" is configured' in _messages(_validator(cluster)), 30)
    assert _state(cluster) == "notReady"
    assert "state-operator-validation" in json.dumps(_policy(cluster)["status"]["conditions"])
    labels = cluster.node("gpu1")["metadata"]["labels"]
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert "nvidia.com/gpu.present" not in cluster.node("cp1")["metadata"]["labels"]
    # the host driver fails: the device plugin cannot start either
    g.write("/etc/containerd/config.toml", kt.CONTAINERD_OK + kt.NVIDIA_RUNTIME)
    g.driver_ok = False
    g.services.systemctl(["restart", "kubelet"])  # type: ignore[union-attr]
    kt.wait_for(lambda: "running nvidia-smi on the host failed" in _messages(_validator(cluster)), 40)
    assert _state(cluster) == "notReady"
    assert "nvidia.com/gpu" not in cluster.node("gpu1")["status"]["allocatable"]
    # a working driver: everything validates
    g.driver_ok = True
    g.services.systemctl(["restart", "kubelet"])  # type: ignore[union-attr]
    kt.wait_for(lambda: _state(cluster) == "ready", 90)
    validator = _validator(cluster)
    assert next(c for c in validator["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    assert cluster.node("gpu1")["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert g.exists("/run/nvidia/validations/plugin-ready")
    ds = {
        d["metadata"]["name"]
        for d in json.loads(cluster.kubectl("get", "ds", "-n", "gpu-operator", "-o", "json")[1])["items"]
    }
    assert "nvidia-driver-daemonset" not in ds and "nvidia-container-toolkit-daemonset" not in ds
    assert {"nvidia-device-plugin-daemonset", "nvidia-operator-validator", "nvidia-dcgm-exporter"} <= ds
    # role-style idempotence: same values, nothing to do; other values: a real upgrade
    assert (
        json.loads(cluster.helm("get", "values", "gpu-operator", "-n", "gpu-operator", "-o", "json")[1])
        == values
    )
    values["driver"]["enabled"] = True
    cluster.cp.write("/root/gpu-operator-values.json", json.dumps(values))
    rc, out, err = cluster.helm(*install)
    assert rc == 0 and "REVISION: 2" in out, err
    kt.wait_for(
        lambda: [
            p
            for p in _pods(cluster, "gpu-operator", "app=nvidia-driver-daemonset")
            if "CrashLoopBackOff" in json.dumps(p["status"])
        ],
        60,
    )
    driver = _pods(cluster, "gpu-operator", "app=nvidia-driver-daemonset")[0]
    assert "driver is in use" in _messages(driver)
    kt.wait_for(lambda: _state(cluster) == "notReady", 30)
    rc, out, _ = cluster.kubectl("get", "clusterpolicies.nvidia.com")
    assert re.search(r"^cluster-policy\s+notReady\s", out, re.M)


def _older_chart(tmp: Path) -> bytes:
    """The real chart packaged as an older release whose ClusterPolicy CRD lacks a field the new one
    has (cdi): what a cluster installed with an earlier chart carries."""
    import shutil
    import subprocess

    from gpuprov_lab import vendor

    src = tmp / "gpu-operator"
    shutil.copytree(vendor.artifact("gpu-operator", "chart"), src)
    crd_path = src / "crds" / "nvidia.com_clusterpolicies.yaml"
    crd = yaml.safe_load(crd_path.read_text())
    for version in crd["spec"]["versions"]:
        del version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["cdi"]
    crd_path.write_text(yaml.safe_dump(crd))
    home = {"HELM_CACHE_HOME": str(tmp / "h"), "HELM_CONFIG_HOME": str(tmp / "h"), "HOME": str(tmp)}
    argv = [str(vendor.helm()), "package", "--version", "v25.3.0", "--app-version", "v25.3.0", "-d", str(tmp)]
    subprocess.run([*argv, str(src)], check=True, capture_output=True, env={**home, "PATH": "/usr/bin:/bin"})
    return (tmp / "gpu-operator-v25.3.0.tgz").read_bytes()


def _crd_has_cdi(cluster: Cluster) -> bool:
    rc, out, err = cluster.kubectl("get", "crd", "clusterpolicies.nvidia.com", "-o", "json")
    assert rc == 0, err
    props = json.loads(out)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return "cdi" in props["properties"]


def test_an_upgrade_from_an_older_chart_gets_the_new_crds_only_when_applied(
    cluster: Cluster, tmp_path: Path
) -> None:
    """helm installs a chart's CRDs only when they are missing and never upgrades them; the chart's
    hook job is off (the lab cannot run it, the role turns it off), so the role applies `helm show crds`
    of the new chart before upgrading. Both halves are checked here with the real helm's output."""
    h = cluster.helm
    # A cluster holds one GPU Operator: its cluster-scoped objects (ClusterRole gpu-operator, ...) are
    # owned by the release that made them, so an earlier release is uninstalled first, as a site would.
    rc, out, err = h("list", "--all-namespaces", "-o", "json")
    assert rc == 0, err
    for rel in json.loads(out):
        if rel["chart"].startswith("gpu-operator-"):
            assert h("uninstall", rel["name"], "-n", rel["namespace"])[0] == 0
    assert cluster.kubectl("delete", "crd", "clusterpolicies.nvidia.com", "--ignore-not-found")[0] == 0
    (cluster.cp.root / "root").mkdir(exist_ok=True)
    (cluster.cp.root / "root/old.tgz").write_bytes(_older_chart(tmp_path))
    values = {"nfd": {"enabled": False}, "driver": {"enabled": False}, "toolkit": {"enabled": False},
              "operator": {"upgradeCRD": False}}  # fmt: skip
    cluster.cp.write("/root/up.yaml", yaml.safe_dump(values))
    ns = ["-n", "upgrade-test", "-f", "/root/up.yaml"]
    rc, _out, err = h("install", "up", "/root/old.tgz", *ns, "--create-namespace")
    assert rc == 0, err
    assert not _crd_has_cdi(cluster)
    repo = cluster.mirror_url + "/helm-charts/nvidia"
    new = ["gpu-operator", "--repo", repo, "--version", "v26.7.0"]
    rc, out, err = h("upgrade", "up", *new, *ns)
    assert rc == 0 and "REVISION: 2" in out, err
    assert not _crd_has_cdi(cluster), "helm upgraded a CRD: real helm never does"
    rc, crds, err = h("show", "crds", *new)
    assert rc == 0, err
    cluster.cp.write("/root/crds.yaml", crds)
    rc, out, err = cluster.kubectl("apply", "-f", "/root/crds.yaml")
    assert rc == 0 and "customresourcedefinition.apiextensions.k8s.io/clusterpolicies.nvidia.com" in out, err
    assert _crd_has_cdi(cluster)
    assert h("uninstall", "up", "-n", "upgrade-test")[0] == 0
    rc, _out, err = cluster.kubectl("delete", "namespace", "upgrade-test", "--timeout=120s")
    assert rc == 0, err


# ------------------------------------------------------------------------------------------- reset


def test_reset_undoes_the_join(cluster: Cluster) -> None:
    """Runs last in the module: gpu1 leaves the cluster."""
    rc, out, err = kt.Tool(cluster.gpu).kubeadm("reset")
    assert rc == 1 and "won't proceed; the user didn't answer (Y|y) in order to continue" in err
    rc, out, err = kt.Tool(cluster.gpu).kubeadm("reset", "-f")
    assert rc == 0, err
    assert "The reset process does not perform cleanup of CNI plugin configuration" in out
    for f in ("/etc/kubernetes/kubelet.conf", "/var/lib/kubelet/config.yaml", "/etc/kubernetes/pki/ca.crt"):
        assert not cluster.gpu.exists(f), f
    assert not cluster.gpu.services.active("kubelet")  # type: ignore[union-attr]
    assert cluster.gpu.exists("/etc/cni/net.d/10-flannel.conflist")


# -------------------------------------------------------------------------------------- preflight


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[kt.SimHost]:
    h = kt.make_node(tmp_path / "n", "n1")
    yield h
    h.services.shutdown()  # type: ignore[union-attr]


def _init(h: kt.SimHost) -> tuple[int, str, str]:
    return kt.Tool(h).kubeadm(
        "init", f"--apiserver-bind-port={kt.free_port()}", "--apiserver-advertise-address=127.0.0.1"
    )


def test_preflight_needs_ip_forwarding_configured(fresh: kt.SimHost) -> None:
    fresh.write("/etc/sysctl.d/99-kubernetes.conf", "net.bridge.bridge-nf-call-iptables = 1\n")
    rc, _out, err = _init(fresh)
    assert rc == 1
    assert (
        "[ERROR FileContent--proc-sys-net-ipv4-ip_forward]: /proc/sys/net/ipv4/ip_forward contents are not "
        "set to 1" in err
    )
    assert not fresh.exists("/etc/kubernetes/pki/ca.crt")


def test_preflight_needs_a_running_container_runtime_with_cri(fresh: kt.SimHost) -> None:
    fresh.services.set_containerd(False)  # type: ignore[union-attr]
    rc, _out, err = _init(fresh)
    assert (
        rc == 1 and "[ERROR CRI]: container runtime is not running" in err and "connect: no such file" in err
    )
    fresh.services.set_containerd(True)  # type: ignore[union-attr]
    fresh.write("/etc/containerd/config.toml", 'disabled_plugins = ["cri"]\n')
    rc, _out, err = _init(fresh)
    assert rc == 1 and "unknown service runtime.v1.RuntimeService" in err
    rc, _out, err = kt.Tool(fresh).kubeadm("init", "--ignore-preflight-errors=CRI", "--dry-run")
    assert rc == 0 and "[WARNING CRI]" in _out


def test_preflight_port_in_use_and_missing_tools(fresh: kt.SimHost) -> None:
    fresh.remove("/usr/sbin/iptables")
    fresh.remove("/usr/sbin/socat")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        rc, out, err = kt.Tool(fresh).kubeadm("init", f"--apiserver-bind-port={port}")
    assert rc == 1
    assert f"[ERROR Port-{port}]: Port {port} is in use" in err
    assert "[ERROR FileExisting-iptables]: iptables not found in system path" in err
    assert "[WARNING FileExisting-socat]: socat not found in system path" in out


def test_swap_on_keeps_the_kubelet_from_starting(fresh: kt.SimHost) -> None:
    fresh.write("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/swapfile  file  1048572  0  -2\n")
    fresh.env["GPUPROV_SIM_KUBEADM_TIMEOUT_KUBELETHEALTHCHECK"] = "3s"
    rc, out, err = _init(fresh)
    assert rc == 1
    assert "[WARNING Swap]: swap is supported for cgroup v2 only" in out
    assert "[kubelet-check] The kubelet is not healthy after 3s" in out
    assert "error execution phase wait-control-plane: failed while waiting for the kubelet to start" in err
    assert any("running with swap on is not supported, please disable swap" in line for line in fresh.log)


def test_config_file_v1beta4_and_mixed_flags(fresh: kt.SimHost) -> None:
    fresh.write(
        "/root/init.yaml",
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n---\n"
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nfoo: bar\n",
    )
    rc, _out, err = kt.Tool(fresh).kubeadm(
        "init", "--config", "/root/init.yaml", "--pod-network-cidr=10.0.0.0/16"
    )
    assert rc == 1 and "can not mix '--config' with arguments [pod-network-cidr]" in err
    rc, _out, err = kt.Tool(fresh).kubeadm("init", "--config", "/root/init.yaml", "--dry-run")
    assert rc == 0, err
    assert 'strict decoding error: unknown field "foo"' in err
    fresh.write("/root/bad.yaml", "apiVersion: kubeadm.k8s.io/v1beta9\nkind: InitConfiguration\n")
    rc, _out, err = kt.Tool(fresh).kubeadm("init", "--config", "/root/bad.yaml")
    assert rc == 1 and 'no kind "InitConfiguration" is registered for version "kubeadm.k8s.io/v1beta9"' in err
