"""The lab's simulated Kubernetes packages and mirror files: real names, versions, paths and Depends;
the tools they ship run on their own (no import from the project) and answer like the real ones;
the gpu-operator chart repository and the flannel manifest have the real layout."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from gpuprov_lab.sim import catalog, debs, kube, kube_helm

EXPECTED = {
    ("kubelet", "1.36.3-1.1", "k8s-1.36"),
    ("kubeadm", "1.36.3-1.1", "k8s-1.36"),
    ("kubectl", "1.36.3-1.1", "k8s-1.36"),
    ("kubernetes-cni", "1.9.1-1.1", "k8s-1.36"),
    ("cri-tools", "1.36.0-1.1", "k8s-1.36"),
    ("helm", "4.2.3-1", "helm"),
}


def test_packages_have_the_real_names_versions_and_repositories() -> None:
    got = {(p.name, p.version, p.repo) for p in kube.packages()}
    assert got == EXPECTED
    for p in kube.packages():
        assert p.repo in catalog.REPOS, p.repo


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    out = tmp_path_factory.mktemp("debs")
    result = {}
    for p in kube.packages():
        d = out / p.repo
        result[(p.name, p.repo)] = Path(debs.build_deb(p, d))
    return result


def _field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def _files(deb: Path) -> set[str]:
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].lstrip(".") for line in out.splitlines() if not line.startswith("d")}


def test_kubelet_deb_fields_and_files(built: dict[tuple[str, str], Path]) -> None:
    deb = built[("kubelet", "k8s-1.36")]
    assert _field(deb, "Package") == "kubelet"
    assert _field(deb, "Version") == "1.36.3-1.1"
    depends = _field(deb, "Depends")
    for dep in ("kubernetes-cni (>= 1.2.0)", "mount", "util-linux"):
        assert dep in depends
    assert "iptables (>= 1.8.4)" in _field(deb, "Recommends")
    assert "SIMULATED (gpuprov lab)" in _field(deb, "Description")
    files = _files(deb)
    for f in (
        "/usr/bin/kubelet",
        "/usr/lib/systemd/system/kubelet.service",
        "/etc/default/kubelet",
        "/usr/lib/systemd/system/gpuprov-lab-kube-apiserver.service",
    ):
        assert f in files, f
    unit = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(unit)) as tar:
        fh = tar.extractfile("./usr/lib/systemd/system/kubelet.service")
        assert fh is not None
        text = fh.read().decode()
    assert "ExecStart=/usr/bin/kubelet\n" in text and "Restart=always" in text and "RestartSec=10" in text


def test_kubeadm_ships_the_drop_in_that_reads_kubeadm_flags(built: dict[tuple[str, str], Path]) -> None:
    deb = built[("kubeadm", "k8s-1.36")]
    assert _field(deb, "Version") == "1.36.3-1.1"
    raw = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        fh = tar.extractfile("./usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf")
        assert fh is not None
        dropin = fh.read().decode()
    assert "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env" in dropin
    assert "EnvironmentFile=-/etc/default/kubelet" in dropin
    assert "--config=/var/lib/kubelet/config.yaml" in dropin
    assert dropin.splitlines()[-1] == (
        "ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS "
        "$KUBELET_EXTRA_ARGS"
    )


def test_cni_package_has_the_plugins_and_no_flannel(built: dict[tuple[str, str], Path]) -> None:
    files = _files(built[("kubernetes-cni", "k8s-1.36")])
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        assert f"/opt/cni/bin/{plugin}" in files
    assert "/opt/cni/bin/flannel" not in files  # flannel's own DaemonSet installs it


def test_shipped_modules_import_nothing_from_the_project() -> None:
    for name in kube.RUNTIME:
        tree = ast.parse((kube.HERE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("provisioner"), f"{name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("provisioner") for a in node.names), name
    assert "kube_testing.py" not in kube.RUNTIME


def _extract(deb: Path, dest: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


def _run_entry(root: Path, prog: str, pkg: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run an entry script from an extracted package, its library dir pointed into the extraction."""
    script = (
        (root / prog.lstrip("/"))
        .read_text()
        .replace(f"{kube.LIB}/{pkg}", str(root / kube.LIB.lstrip("/") / pkg))
    )
    res = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=root, env=env, check=False
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_tools_run_from_their_package(built: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    root = tmp_path / "root"
    for key in (
        ("kubectl", "k8s-1.36"),
        ("kubeadm", "k8s-1.36"),
        ("kubelet", "k8s-1.36"),
        ("helm", "helm"),
        ("cri-tools", "k8s-1.36"),
    ):
        _extract(built[key], root)
    assert "Client Version: v1.36.3" in _run_entry(root, "/usr/bin/kubectl", "kubectl", "version", "--client")
    assert _run_entry(root, "/usr/bin/kubeadm", "kubeadm", "version", "-o", "short") == "v1.36.3\n"
    assert _run_entry(root, "/usr/bin/kubelet", "kubelet", "--version") == "Kubernetes v1.36.3\n"
    assert _run_entry(root, "/usr/bin/helm", "helm", "version", "--short").startswith("v4.2.3+g")
    assert _run_entry(root, "/usr/bin/crictl", "cri-tools", "--version") == "crictl version v1.36.0\n"


def test_cni_plugin_answers_a_version_probe(built: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    root = _extract(built[("kubernetes-cni", "k8s-1.36")], tmp_path / "root")
    res = subprocess.run(
        [str(root / "opt/cni/bin/bridge")],
        env={"CNI_COMMAND": "VERSION"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "1.0.0" in json.loads(res.stdout)["supportedVersions"]
    add = subprocess.run(
        [str(root / "opt/cni/bin/bridge")],
        env={"CNI_COMMAND": "ADD"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert add.returncode != 0


# ------------------------------------------------------------------------------------- mirror files


@pytest.fixture(scope="module")
def mirror_files() -> dict[str, bytes]:
    return kube.extra_mirror_files()


def test_chart_repository_index_points_at_the_chart(mirror_files: dict[str, bytes]) -> None:
    index = yaml.safe_load(mirror_files["helm-charts/nvidia/index.yaml"])
    entry = index["entries"]["gpu-operator"][0]
    assert entry["version"] == "v26.7.0" and entry["appVersion"] == "v26.7.0"
    tgz = mirror_files[f"helm-charts/nvidia/{entry['urls'][0]}"]
    assert entry["digest"] == hashlib.sha256(tgz).hexdigest()
    chart = kube_helm.load_chart_archive(tgz)
    assert (chart.name, chart.version, chart.meta["appVersion"]) == ("gpu-operator", "v26.7.0", "v26.7.0")
    for key in (
        "driver",
        "toolkit",
        "devicePlugin",
        "dcgmExporter",
        "migManager",
        "nfd",
        "operator",
        "cdi",
        "validator",
        "gfd",
        "node-feature-discovery",
    ):
        assert key in chart.values, key
    assert chart.values["driver"]["enabled"] is True and chart.values["nfd"]["enabled"] is True
    # v26.7.0 has no operator.defaultRuntime (older charts had); CDI is on by default.
    assert "defaultRuntime" not in chart.values["operator"] and chart.values["cdi"]["enabled"] is True
    assert [s.name for s in chart.subcharts] == ["node-feature-discovery"]
    crds = {d["metadata"]["name"] for t in chart.crds.values() for d in yaml.safe_load_all(t) if d}
    assert "clusterpolicies.nvidia.com" in crds


def test_chart_archive_is_reproducible() -> None:
    assert kube.chart_tgz() == kube.chart_tgz()


def test_flannel_manifest_has_the_real_objects(mirror_files: dict[str, bytes]) -> None:
    docs = [d for d in yaml.safe_load_all(mirror_files["flannel/v0.27.4/kube-flannel.yml"]) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("Namespace", "kube-flannel"),
        ("ClusterRole", "flannel"),
        ("ClusterRoleBinding", "flannel"),
        ("ServiceAccount", "flannel"),
        ("ConfigMap", "kube-flannel-cfg"),
        ("DaemonSet", "kube-flannel-ds"),
    }
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert json.loads(cm["data"]["net-conf.json"])["Network"] == "10.244.0.0/16"
    assert json.loads(cm["data"]["cni-conf.json"])["plugins"][0]["type"] == "flannel"
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    inits = {c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]}
    assert inits == {"install-cni-plugin", "install-cni"}


def test_chart_renders_the_values_into_the_cluster_policy(tmp_path: Path, monkeypatch) -> None:
    from gpuprov_lab import vendor
    from gpuprov_lab.sim import kube_testing as kt

    monkeypatch.setenv("GPUPROV_LAB_REAL_HELM", str(vendor.helm()))

    chart = kube_helm.load_chart_archive(kube.chart_tgz())
    host = kt.SimHost(root=tmp_path, name="x")
    h = kube_helm.Helm(host, {}, io.StringIO(), io.StringIO())
    h._client = None
    values = {
        "driver": {"enabled": False},
        "toolkit": {"enabled": False},
        "nfd": {"enabled": False},
        "cdi": {"enabled": False},
        "operator": {"upgradeCRD": False},
    }

    class NoServer:
        def request(self, *a: object, **k: object) -> dict[str, str]:
            return {"gitVersion": "v1.36.3"}

    h._client = NoServer()  # type: ignore[assignment]
    _manifest, docs, _crds, _notes = kube_helm.render(
        h, chart, values, "gpu-operator", "gpu-operator", 1, True
    )
    cp = next(d for d in docs if d["kind"] == "ClusterPolicy")
    assert cp["spec"]["driver"]["enabled"] is False and cp["spec"]["toolkit"]["enabled"] is False
    assert cp["spec"]["devicePlugin"]["enabled"] is True
    assert cp["spec"]["cdi"]["enabled"] is False and "defaultRuntime" not in cp["spec"]["operator"]
    assert cp["spec"]["validator"]["version"] == "v26.7.0"
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-operator")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/gpu-operator:v26.7.0"
    assert not any("node-feature-discovery" in d["metadata"]["name"] for d in docs)
    _m, docs_nfd, crds, _n = kube_helm.render(h, chart, {}, "gpu-operator", "gpu-operator", 1, True)
    assert "nodefeaturerules.nfd.k8s-sigs.io" in {d["metadata"]["name"] for d in crds}
    # An install renders the CRD-upgrade hook but does not run it (a pre-upgrade hook).
    assert not any(d["metadata"]["name"].startswith("gpu-operator-upgrade-crd") for d in docs_nfd)
    names = {d["metadata"]["name"] for d in docs_nfd}
    assert "gpu-operator-node-feature-discovery-worker" in names
    worker_cm = next(d for d in docs_nfd if d["metadata"]["name"].endswith("worker-conf"))
    conf = yaml.safe_load(worker_cm["data"]["nfd-worker.conf"])
    assert conf["sources"]["pci"]["deviceLabelFields"] == ["vendor"]
