"""The images the lab's registry serves, under the names and tags the real ones have.

Kubernetes' own (what kubeadm v1.36 pulls): kube-apiserver, kube-controller-manager, kube-scheduler,
kube-proxy, pause and etcd, each the vendored binary (static) at the path the upstream image has it,
kube-proxy with Debian's iptables (nft backend) and conntrack beside it. The etcd image carries etcd
3.6.13 under its own tag (3.6.13-0); the lab's inventory names that tag (kubeadm's default is
3.6.8-0). No CoreDNS image exists here (no source, no registry has it).

The GPU Operator's (what its v26.7.0 chart and ClusterPolicy name): the operator image (gpu-operator,
manage-crds, nvidia-validator, the operator's assets and manifests where its Dockerfile puts them; it
is also the validator image), the device plugin image (nvidia-device-plugin, gpu-feature-discovery)
and the MIG manager image (nvidia-mig-manager, nvidia-mig-parted, nvidia-ctk), each the vendored
binaries built from NVIDIA's source on Debian's glibc, with busybox as the images carry it. What is
not built here is missing (the CUDA vectorAdd sample the validator's workload pods run, the MPS
control daemon) or, where an operand cannot start without it, a labelled stand-in: the device
plugin's config-manager (its sidecar and init container), which picks the node's sharing profile, and
the operator's cleanup-gpuclusters, which the chart's pre-delete hook runs on `helm uninstall`.
"""

from __future__ import annotations

from pathlib import Path

from gpuprov_lab import debian, vendor
from gpuprov_lab.kube import binaries
from gpuprov_lab.kube.oci import Entry, Image

K8S = "registry.k8s.io"
KUBE_VERSION = "v1.36.3"
PAUSE_TAG = "3.10.2"
ETCD_TAG = "3.6.13-0"
# The Debian release whose userland the images carry next to the vendor binaries.
SUITE = "trixie"
# iptables (xtables-nft-multi and its libraries) and conntrack, for kube-proxy's iptables mode.
KUBE_PROXY_DEBS = ("iptables", "libxtables12", "libip4tc2", "libip6tc2", "libnftnl11", "libmnl0",
                   "libnetfilter-conntrack3", "libnfnetlink0", "conntrack", "libc6")  # fmt: skip
IPTABLES_NAMES = ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save",
                  "ip6tables-restore")  # fmt: skip


def merged_usr() -> dict[str, Entry]:
    """Debian's merged-/usr links, so the binaries' interpreter (/lib64/ld-linux-x86-64.so.2) is found."""
    return {
        "/bin": Entry(link_to="usr/bin"),
        "/sbin": Entry(link_to="usr/sbin"),
        "/lib": Entry(link_to="usr/lib"),
        "/lib64": Entry(link_to="usr/lib64"),
    }


def debian_files(*names: str, suite: str = SUITE) -> dict[str, Entry]:
    """Every file of these Debian packages (docs left out), symlinks kept."""
    img = Image(ref="x:x")
    for name in names:
        img.add_tree(debian.unpacked(suite, name).root)
    return img.files


def _static(name: str, binary: Path, *, ref: str, entrypoint: list[str] | None = None) -> Image:
    return Image(
        ref=ref,
        files={f"/usr/local/bin/{name}": Entry(source=binary, mode=0o755)},
        entrypoint=entrypoint or [],
    )


def kubernetes_images() -> list[Image]:
    images = [
        _static(c, binaries.kubernetes(c), ref=f"{K8S}/{c}:{KUBE_VERSION}")
        for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ]
    proxy = Image(ref=f"{K8S}/kube-proxy:{KUBE_VERSION}")
    proxy.files.update(merged_usr())
    proxy.files.update(debian_files(*KUBE_PROXY_DEBS))
    # As the upstream image does: iptables and friends are the nft backend's multi-call binary.
    for name in IPTABLES_NAMES:
        proxy.files[f"/usr/sbin/{name}"] = Entry(link_to="xtables-nft-multi")
    proxy.files["/usr/local/bin/kube-proxy"] = Entry(source=binaries.kubernetes("kube-proxy"), mode=0o755)
    images.append(proxy)
    images.append(
        Image(
            ref=f"{K8S}/pause:{PAUSE_TAG}",
            files={"/pause": Entry(source=binaries.kubernetes("pause"), mode=0o755)},
            entrypoint=["/pause"],
        )
    )
    images.append(_static("etcd", binaries.unpacked("etcd", "etcd"), ref=f"{K8S}/etcd:{ETCD_TAG}"))
    return images


NVCR = "nvcr.io/nvidia"
OPERATOR_VERSION = vendor.GPU_OPERATOR_CHART_VERSION
DEVICE_PLUGIN_VERSION = "v0.20.0"
MIG_MANAGER_VERSION = "v0.15.0"
BUSYBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox"
# The lab's stand-in for the device plugin's config-manager (SIMULATED: no build of it exists here).
CONFIG_MANAGER = Path(__file__).resolve().parent / "files" / "config-manager"
# And for the operator's cleanup-gpuclusters, which the chart's pre-delete hook runs (SIMULATED: the
# vendored build of the operator does not include it).
CLEANUP_GPUCLUSTERS = Path(__file__).resolve().parent / "files" / "cleanup-gpuclusters"


def glibc_busybox() -> dict[str, Entry]:
    """What the operand images stand on: Debian's glibc (the vendored dynamic binaries load it) and a
    static busybox at /busybox with its applets, /bin/sh being busybox's, as NVIDIA's images carry it."""
    files = merged_usr()
    files["/tmp"] = Entry(directory=True, mode=0o1777)
    files.update(debian_files("libc6", "libgcc-s1"))
    busybox = debian.unpacked(SUITE, "busybox-static").path("usr/bin/busybox")
    from gpuprov_lab import proc

    applets = proc.run([str(busybox), "--list"], what="busybox --list").stdout.split()
    for applet in applets:
        if applet != "busybox":
            files[f"/busybox/{applet}"] = Entry(link_to="busybox")
    files["/busybox/busybox"] = Entry(source=busybox, mode=0o755)
    files["/usr/bin/sh"] = Entry(link_to="/busybox/sh")
    return files


def _tree(src: Path, dest: str) -> dict[str, Entry]:
    return {
        f"{dest}/{p.relative_to(src).as_posix()}": Entry(source=p, mode=0o644)
        for p in sorted(src.rglob("*"))
        if p.is_file()
    }


def nvidia_smi() -> dict[str, Entry]:
    """NVIDIA's nvidia-smi where Debian installs it: a container that asks for GPUs gets the host's
    /usr/bin/nvidia-smi mounted by the NVIDIA runtime, which on a lab host is the simulation's
    front end, and it hands over to this binary where the lab's library is absent."""
    return {f"/{vendor.NVIDIA_SMI_PATH}": Entry(source=vendor.nvidia_smi(), mode=0o755)}


# The lab's own image for test workloads and its stand-ins: a shell, NVIDIA's nvidia-smi and kubectl,
# served by the lab's
# registry under its own address (the inventory makes containerd reach that address over HTTP).
TOOLS_REPOSITORY = "gpuprov-lab/tools"
TOOLS_TAG = "1"


def tools_image() -> Image:
    img = Image(ref=f"{TOOLS_REPOSITORY}:{TOOLS_TAG}", cmd=["sh"], env=[f"PATH={BUSYBOX_PATH}"])
    img.files.update(glibc_busybox())
    img.files.update(nvidia_smi())
    img.files["/usr/bin/kubectl"] = Entry(source=vendor.kubectl(), mode=0o755)  # the lab's stand-ins' client
    return img


def operator_image() -> Image:
    """nvcr.io/nvidia/gpu-operator:v26.7.0 (docker/Dockerfile of the tag): the operator and validator."""
    img = Image(ref=f"{NVCR}/gpu-operator:{OPERATOR_VERSION}", entrypoint=["/usr/bin/gpu-operator"],
                env=[f"PATH={BUSYBOX_PATH}", "NVIDIA_VISIBLE_DEVICES=void"], user="1000:1000")  # fmt: skip
    img.files.update(glibc_busybox())
    img.files.update(nvidia_smi())  # the validator's toolkit check runs nvidia-smi (see nvidia_smi())
    for name in ("gpu-operator", "manage-crds", "nvidia-validator"):
        img.files[f"/usr/bin/{name}"] = Entry(source=binaries.unpacked("gpu-operator", name), mode=0o755)
    img.files.update(_tree(vendor.artifact("gpu-operator", "assets"), "/opt/gpu-operator"))
    img.files.update(_tree(vendor.artifact("gpu-operator", "manifests"), "/opt/gpu-operator/manifests"))
    img.files.update(
        _tree(vendor.artifact("gpu-operator", "validator-manifests"), "/opt/validator/manifests")
    )
    img.files["/usr/bin/cleanup-gpuclusters"] = Entry(source=CLEANUP_GPUCLUSTERS, mode=0o755)
    img.files["/usr/bin/kubectl"] = Entry(source=vendor.kubectl(), mode=0o755)  # the stand-in's client
    chart = vendor.artifact("gpu-operator", "chart")
    for crd in (
        "nvidia.com_clusterpolicies.yaml",
        "nvidia.com_nvidiadrivers.yaml",
        "nvidia.com_gpuclusters.yaml",
    ):
        img.files[f"/opt/gpu-operator/{crd}"] = Entry(source=chart / "crds" / crd, mode=0o644)
    nfd = chart / "charts" / "node-feature-discovery" / "crds" / "nfd-api-crds.yaml"
    img.files["/opt/gpu-operator/nfd-api-crds.yaml"] = Entry(source=nfd, mode=0o644)
    return img


def device_plugin_image() -> Image:
    """nvcr.io/nvidia/k8s-device-plugin:v0.20.0 (deployments/container/Dockerfile of the tag)."""
    img = Image(
        ref=f"{NVCR}/k8s-device-plugin:{DEVICE_PLUGIN_VERSION}",
        entrypoint=["nvidia-device-plugin"],
        env=[f"PATH={BUSYBOX_PATH}", "NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_VISIBLE_DEVICES=all",
             "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
    )  # fmt: skip
    img.files.update(glibc_busybox())
    for name in ("nvidia-device-plugin", "gpu-feature-discovery"):
        img.files[f"/usr/bin/{name}"] = Entry(source=binaries.unpacked("k8s-device-plugin", name), mode=0o755)
    img.files["/usr/bin/config-manager"] = Entry(source=CONFIG_MANAGER, mode=0o755)
    img.files["/usr/bin/kubectl"] = Entry(source=vendor.kubectl(), mode=0o755)  # the stand-in's client
    return img


MIG_PARTED_LAUNCHER = """#!/bin/sh
# nvidia-mig-parted: SIMULATED (gpuprov lab) launcher. On a lab host (the MIG manager runs this copy
# through chroot /host) the lab's front end answers for the simulated GPUs; elsewhere NVIDIA's binary.
front=/usr/lib/gpuprov-lab/bin/nvidia-mig-parted
if [ -x "$front" ]; then exec "$front" "$@"; fi
exec /usr/bin/nvidia-mig-parted.real "$@"
"""


def mig_manager_image() -> Image:
    """nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0 (deployments/container/Dockerfile of the tag)."""
    img = Image(
        ref=f"{NVCR}/cloud-native/k8s-mig-manager:{MIG_MANAGER_VERSION}",
        entrypoint=["nvidia-mig-manager"],
        env=[f"PATH={BUSYBOX_PATH}", "NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_VISIBLE_DEVICES=all",
             "NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"],
        user="0:0",
    )  # fmt: skip
    img.files.update(glibc_busybox())
    img.files["/var/run"] = Entry(link_to="/run")
    img.files["/usr/bin/nvidia-mig-manager"] = Entry(
        source=binaries.unpacked("mig-parted", "nvidia-mig-manager"), mode=0o755
    )
    # MIG on the lab's GPUs is simulated: the manager runs nvidia-mig-parted on the host (chroot /host,
    # the host's driver being its own), where this launcher hands over to the lab's front end; anywhere
    # else NVIDIA's binary answers.
    img.files["/usr/bin/nvidia-mig-parted"] = Entry(content=MIG_PARTED_LAUNCHER.encode(), mode=0o755)
    img.files["/usr/bin/nvidia-mig-parted.real"] = Entry(source=vendor.mig_parted(), mode=0o755)
    img.files["/usr/bin/nvidia-ctk"] = Entry(source=vendor.nvidia_ctk(), mode=0o755)
    return img


def all_images() -> list[Image]:
    """Every image the lab's registry serves."""
    vendor.artifact("kubernetes")  # a clear error naming the artifact when it is missing
    return [*kubernetes_images(), operator_image(), device_plugin_image(), mig_manager_image(), tools_image()]
