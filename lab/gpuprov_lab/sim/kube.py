"""Part of the gpuprov lab simulation: the Kubernetes side. SIMULATED packages with the real names,
versions and file paths of pkgs.k8s.io (kubeadm, kubelet, kubectl, kubernetes-cni, cri-tools for
minor 1.36) and of the helm apt repository (helm), the NVIDIA helm chart repository
(gpu-operator chart) and the flannel manifest, for the lab mirror (docs/contracts.md).

The tools are the Python modules ``kube_*.py`` next to this file, copied into each package under
/usr/lib/gpuprov-lab/kube/<package>/kubesim/ and started by small entry scripts at the real paths
(/usr/bin/kubeadm, ...). Besides python3 they need python3-yaml and openssl from Debian, which their
Depends name after the real ones. The control plane (API server with controllers) is a systemd unit of
the kubelet package, started by the kubelet for kubeadm's static pod manifest.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpuprov_lab.sim.debs import SIMULATED, SimFile, SimPackage

HERE = Path(__file__).parent
KUBEFILES = HERE / "kubefiles"
LIB = "/usr/lib/gpuprov-lab/kube"
PACKAGE = "kubesim"
# Modules that run on lab hosts (kube.py builds packages; kube_testing runs them off-host).
RUNTIME = sorted(p.name for p in HERE.glob("kube_*.py") if p.name != "kube_testing.py")
SIM_DEPENDS = ["python3 (>= 3.11)", "python3-yaml", "openssl"]

MINORS: dict[str, dict[str, str]] = {
    "1.36": {"kube": "1.36.3-1.1", "cri-tools": "1.36.0-1.1", "cni": "1.9.1-1.1"},
}
HELM_VERSION = "4.2.3-1"
CHART_VERSION = "v26.7.0"
FLANNEL_VERSION = "v0.27.4"
HOMEPAGE = "https://kubernetes.io"

KUBELET_SERVICE = """\
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

API_UNIT = "gpuprov-lab-kube-apiserver.service"
API_SERVICE = f"""\
[Unit]
Description=gpuprov lab: {SIMULATED} Kubernetes control plane for /etc/kubernetes/manifests
Documentation=https://kubernetes.io/docs/reference/command-line-tools-reference/kube-apiserver/
ConditionPathExists=/etc/kubernetes/manifests/kube-apiserver.yaml
After=network-online.target

[Service]
ExecStart={LIB}/kubelet/kube-apiserver
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def entry(prog: str, pkg: str, module: str, call: str) -> SimFile:
    """An executable at the real path that runs one of the sim modules shipped in the package."""
    return SimFile(
        f"""#!/usr/bin/python3
# {prog}: {SIMULATED}. Part of the gpuprov lab simulation of Kubernetes; it is not the real program.
import sys

sys.path.insert(0, {f"{LIB}/{pkg}"!r})
from {PACKAGE} import {module}  # noqa: E402

sys.exit({call})
""",
        0o755,
    )


def runtime_files(pkg: str) -> dict[str, SimFile]:
    files = {
        f"{LIB}/{pkg}/{PACKAGE}/__init__.py": SimFile(
            f'"""Kubernetes tools of the gpuprov lab: {SIMULATED}."""\n'
        )
    }
    for name in RUNTIME:
        files[f"{LIB}/{pkg}/{PACKAGE}/{name}"] = SimFile((HERE / name).read_text())
    return files


def _doc(pkg: str, what: str) -> dict[str, SimFile]:
    return {
        f"/usr/share/doc/{pkg}/README.simulated": SimFile(
            f"{pkg}: {SIMULATED}.\n{what}\nIt exists only on gpuprov lab hosts; see "
            f"lab/gpuprov_lab/sim/kube.py.\n"
        )
    }


def _systemd(unit: str, start: bool) -> dict[str, str]:
    """Maintainer scripts as debhelper writes them for a unit that is enabled (and started) on install."""
    started = f"    deb-systemd-invoke restart '{unit}' >/dev/null || true\n" if start else ""
    return {
        "postinst": f"""case "$1" in configure|abort-upgrade|abort-deconfigure) true;; *) exit 0;; esac
if true; then
  deb-systemd-helper unmask '{unit}' >/dev/null || true
  if deb-systemd-helper --quiet was-enabled '{unit}'; then
    deb-systemd-helper enable '{unit}' >/dev/null || true
  else
    deb-systemd-helper update-state '{unit}' >/dev/null || true
    deb-systemd-helper enable '{unit}' >/dev/null || true
  fi
  if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
{started}  fi
fi
""",
        "prerm": f"""if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  deb-systemd-invoke stop '{unit}' >/dev/null || true
fi
""",
        "postrm": f"""if [ -d /run/systemd/system ]; then
  systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = remove ] && [ -x /usr/bin/deb-systemd-helper ]; then
  deb-systemd-helper mask '{unit}' >/dev/null || true
fi
if [ "$1" = purge ] && [ -x /usr/bin/deb-systemd-helper ]; then
  deb-systemd-helper purge '{unit}' >/dev/null || true
  deb-systemd-helper unmask '{unit}' >/dev/null || true
fi
""",
    }


def operator_assets() -> dict[str, SimFile]:
    """The GPU Operator's real per-state manifests (the vendor's assets/ directory), which the lab's
    simulated operator, in the control plane, applies (kube_operator)."""
    from gpuprov_lab import vendor
    from gpuprov_lab.sim import kube_operator

    base = vendor.artifact("gpu-operator", "assets")
    files: dict[str, SimFile] = {}
    for state, _key, _default in kube_operator.STATES:
        for path in sorted((base / state).iterdir()):
            if path.suffix in (".yaml", ".yml") and "openshift" not in path.name:
                files[f"{kube_operator.ASSETS}/{state}/{path.name}"] = SimFile(path.read_bytes())
    return files


def kube_packages(minor: str) -> list[SimPackage]:
    from gpuprov_lab.sim import kube_cri, kube_let

    v = MINORS[minor]
    kv = "v" + v["kube"].split("-")[0]
    repo = f"k8s-{minor}"
    kubelet_scripts = _systemd("kubelet.service", start=True)
    kubelet_scripts["prerm"] += f"""if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  deb-systemd-invoke stop '{API_UNIT}' >/dev/null || true
fi
"""
    kubelet = SimPackage(
        name="kubelet",
        version=v["kube"],
        repo=repo,
        description="Node agent for Kubernetes clusters",
        depends=["kubernetes-cni (>= 1.2.0)", "mount", "util-linux", *SIM_DEPENDS],
        recommends=["iptables (>= 1.8.4)"],
        section="net",
        homepage=HOMEPAGE,
        files={
            "/usr/bin/kubelet": entry(
                "kubelet", "kubelet", "kube_let", f"kube_let.main(sys.argv[1:], version={kv!r})"
            ),
            "/usr/lib/systemd/system/kubelet.service": SimFile(KUBELET_SERVICE),
            "/etc/default/kubelet": SimFile("KUBELET_EXTRA_ARGS=\n"),
            "/var/lib/kubelet/.kubelet-keep": SimFile(""),
            "/etc/kubernetes/manifests/.kubelet-keep": SimFile(""),
            f"/usr/lib/systemd/system/{API_UNIT}": SimFile(API_SERVICE),
            f"{LIB}/kubelet/kube-apiserver": entry(
                "kube-apiserver", "kubelet", "kube_api", "kube_api.main(sys.argv[1:])"
            ),
            **operator_assets(),
            **runtime_files("kubelet"),
            **_doc(
                "kubelet",
                "The kubelet registers this host as a Node of the lab's one simulated cluster and runs "
                "its static pods, among them the simulated control plane.",
            ),
        },
        conffiles=["/etc/default/kubelet"],
        maintainer_scripts=kubelet_scripts,
    )
    kubeadm = SimPackage(
        name="kubeadm",
        version=v["kube"],
        repo=repo,
        description="Command-line utility for administering a Kubernetes cluster",
        depends=SIM_DEPENDS,
        section="admin",
        homepage=HOMEPAGE,
        files={
            "/usr/bin/kubeadm": entry(
                "kubeadm", "kubeadm", "kube_adm", f"kube_adm.main(sys.argv[1:], version={kv!r})"
            ),
            "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": SimFile(kube_let.KUBEADM_DROPIN),
            **runtime_files("kubeadm"),
            **_doc(
                "kubeadm",
                "kubeadm init/join/reset make and join the lab's simulated cluster with real "
                "certificates, bootstrap tokens and CA pinning.",
            ),
        },
    )
    kubectl = SimPackage(
        name="kubectl",
        version=v["kube"],
        repo=repo,
        description="Command-line utility for interacting with a Kubernetes cluster",
        depends=SIM_DEPENDS[:2],
        section="admin",
        homepage=HOMEPAGE,
        files={
            "/usr/bin/kubectl": entry(
                "kubectl", "kubectl", "kube_ctl", f"kube_ctl.main(sys.argv[1:], version={kv!r})"
            ),
            **runtime_files("kubectl"),
            **_doc("kubectl", "kubectl talks to the lab's simulated API server."),
        },
    )
    cni_version = "v" + v["cni"].split("-")[0]
    cni_files = {
        f"/opt/cni/bin/{p}": SimFile(kube_cri.cni_plugin_script(p, cni_version), 0o755)
        for p in kube_cri.CNI_PLUGINS
    }
    cni = SimPackage(
        name="kubernetes-cni",
        version=v["cni"],
        repo=repo,
        description="Binaries required to provision kubernetes container networking",
        section="net",
        homepage=HOMEPAGE,
        files={
            **cni_files,
            "/etc/cni/net.d/.kubernetes-cni-keep": SimFile(""),
            **_doc("kubernetes-cni", "The CNI plugins answer version probes only."),
        },
    )
    crt_version = "v" + v["cri-tools"].split("-")[0]
    cri = SimPackage(
        name="cri-tools",
        version=v["cri-tools"],
        repo=repo,
        description="Command-line utility for interacting with a container runtime",
        depends=SIM_DEPENDS[:2],
        section="admin",
        homepage=HOMEPAGE,
        files={
            "/usr/bin/crictl": entry(
                "crictl", "cri-tools", "kube_cri", f"kube_cri.main(sys.argv[1:], version={crt_version!r})"
            ),
            **runtime_files("cri-tools"),
            **_doc("cri-tools", "crictl answers from containerd's state and the simulated kubelet's pods."),
        },
    )
    return [kubelet, kubeadm, kubectl, cni, cri]


def helm_package() -> SimPackage:
    """helm: the lab's helm (it keeps releases in the simulated cluster) with the real helm binary it
    renders charts with (kube_helm.REAL_HELM)."""
    from gpuprov_lab import vendor
    from gpuprov_lab.sim.kube_helm import REAL_HELM

    return SimPackage(
        name="helm",
        version=HELM_VERSION,
        repo="helm",
        description="The Kubernetes Package Manager",
        long_description=(
            "Charts are rendered by the real helm (v4, at " + REAL_HELM + "), which cannot talk to the\n"
            "lab's simulated API server; releases are kept there by the lab's helm."
        ),
        depends=SIM_DEPENDS[:2],
        section="devel",
        homepage="https://helm.sh",
        files={
            "/usr/bin/helm": entry("helm", "helm", "kube_helm", "kube_helm.main(sys.argv[1:])"),
            REAL_HELM: SimFile(vendor.helm().read_bytes(), 0o755),
            **runtime_files("helm"),
            **_doc("helm", "helm installs charts into the lab's simulated cluster."),
        },
    )


def packages() -> list[SimPackage]:
    out: list[SimPackage] = []
    for minor in MINORS:
        out += kube_packages(minor)
    out.append(helm_package())
    return out


# ------------------------------------------------------------------------------------ mirror files


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def chart_tgz() -> bytes:
    """NVIDIA's GPU Operator chart, packaged as the release was (gpuprov_lab.vendor)."""
    from gpuprov_lab import vendor

    return vendor.gpu_operator_chart().read_bytes()


def chart_index(tgz: bytes) -> bytes:
    """The chart repository's index.yaml for the chart archive, from its own Chart.yaml."""
    import io
    import tarfile

    from gpuprov_lab.sim import kube_util as ku

    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("gpu-operator/Chart.yaml")
        assert member is not None
        meta = ku.yaml_load(member.read().decode())
    entry_doc = {
        **meta,
        "created": "2025-10-21T00:00:00.000000000Z",
        "digest": hashlib.sha256(tgz).hexdigest(),
        "urls": [f"gpu-operator-{CHART_VERSION}.tgz"],
    }
    doc = {
        "apiVersion": "v1",
        "entries": {"gpu-operator": [entry_doc]},
        "generated": "2025-10-21T00:00:00.000000000Z",
    }
    return ku.yaml_dump(doc).encode()


def extra_mirror_files() -> dict[str, bytes]:
    """The NVIDIA helm chart repository and the flannel manifest, at their mirror paths."""
    tgz = chart_tgz()
    return {
        "helm-charts/nvidia/index.yaml": chart_index(tgz),
        f"helm-charts/nvidia/gpu-operator-{CHART_VERSION}.tgz": tgz,
        f"flannel/{FLANNEL_VERSION}/kube-flannel.yml": (
            KUBEFILES / "flannel" / "kube-flannel.yml"
        ).read_bytes(),
    }
