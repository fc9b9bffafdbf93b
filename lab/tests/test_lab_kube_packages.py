"""The lab's Kubernetes and helm packages: the real binaries, laid out as pkgs.k8s.io and helm's apt
repository publish them (names, versions, relations, files, maintainer scripts), at the versions the
roles pin."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from gpuprov_lab.kube import binaries, packages
from gpuprov_lab.sim import catalog, debs

REPO = Path(__file__).resolve().parents[2]


def test_the_versions_are_the_roles_pins() -> None:
    pins = yaml.safe_load((REPO / "roles/kubernetes/vars/main.yml").read_text())["__kubernetes_minors"]
    assert set(packages.MINORS) == set(pins)
    for minor, pin in pins.items():
        ours = packages.MINORS[minor]
        assert (ours["kube"], ours["cni"], ours["cri-tools"]) == (
            pin["package_version"], pin["cni_version"], pin["cri_tools_version"]
        )  # fmt: skip
    helm = yaml.safe_load((REPO / "roles/gpu_operator/defaults/main.yml").read_text())[
        "gpu_operator_helm_version"
    ]
    assert helm == packages.HELM_VERSION
    # The binaries are the version the packages say.
    assert binaries.version("kubeadm") == f"v{packages.MINORS['1.36']['kube'].split('-')[0]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("debs")
    result = {}
    for p in packages.packages():
        assert p.repo in catalog.REPOS, p.repo
        result[p.name] = Path(debs.build_deb(p, out / p.repo))
    return result


def _field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def _member(deb: Path, path: str) -> tarfile.TarInfo | None:
    raw = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        try:
            return tar.getmember("." + path)
        except KeyError:
            return None


def _text(deb: Path, path: str) -> str:
    raw = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        fh = tar.extractfile("." + path)
        assert fh is not None
        return fh.read().decode()


def test_kubelet_is_the_real_binary_with_the_projects_unit(built: dict[str, Path]) -> None:
    deb = built["kubelet"]
    assert _field(deb, "Version") == "1.36.3-1.1"
    assert (
        _field(deb, "Depends") == "iptables (>= 1.4.21), kubernetes-cni (>= 1.2.0), libc6, mount, util-linux"
    )
    assert "SIMULATED" not in _field(deb, "Description")
    member = _member(deb, "/usr/bin/kubelet")
    assert member is not None and member.size == binaries.kubernetes("kubelet").stat().st_size
    unit = _text(deb, "/usr/lib/systemd/system/kubelet.service")
    assert "ExecStart=/usr/bin/kubelet\n" in unit and "Restart=always" in unit
    # debhelper's enable-and-start, as the project's package does (the kubelet then waits for kubeadm).
    assert (
        "deb-systemd-helper enable 'kubelet.service'"
        in subprocess.run(
            ["dpkg-deb", "-I", str(deb), "postinst"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_kubeadm_ships_the_drop_in_that_reads_kubeadm_flags(built: dict[str, Path]) -> None:
    deb = built["kubeadm"]
    assert _field(deb, "Depends") == "cri-tools (>= 1.30.0)"
    dropin = _text(deb, "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf")
    assert "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env" in dropin
    assert dropin.splitlines()[-1] == (
        "ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS "
        "$KUBELET_EXTRA_ARGS"
    )


def test_the_cni_plugins_are_debians_and_crictl_says_it_is_missing(
    built: dict[str, Path], tmp_path: Path
) -> None:
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        assert _member(built["kubernetes-cni"], f"/opt/cni/bin/{plugin}") is not None, plugin
    assert "SIMULATED" in _field(built["cri-tools"], "Description")
    subprocess.run(["dpkg-deb", "-x", str(built["cri-tools"]), str(tmp_path)], check=True)
    res = subprocess.run([str(tmp_path / "usr/bin/crictl"), "ps"], capture_output=True, text=True)
    assert res.returncode == 1 and "not available in the gpuprov lab" in res.stderr


def test_helm_is_the_real_release(built: dict[str, Path], tmp_path: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", str(built["helm"]), str(tmp_path)], check=True)
    out = subprocess.run(
        [str(tmp_path / "usr/bin/helm"), "version", "--short"], capture_output=True, text=True
    )
    assert out.stdout.startswith("v4.2.3+g"), out
