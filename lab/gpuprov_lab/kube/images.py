"""The images the lab's registry serves, under the names and tags the real ones have.

Kubernetes' own (what kubeadm v1.36 pulls): kube-apiserver, kube-controller-manager, kube-scheduler,
kube-proxy, pause and etcd, each the vendored binary (static) at the path the upstream image has it,
kube-proxy with Debian's iptables (nft backend) and conntrack beside it. The etcd image carries etcd
3.6.13 under its own tag (3.6.13-0); the lab's inventory names that tag (kubeadm's default is
3.6.8-0). No CoreDNS image exists here (no source, no registry has it).
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


def all_images() -> list[Image]:
    """Every image the lab's registry serves."""
    vendor.artifact("kubernetes")  # a clear error naming the artifact when it is missing
    return kubernetes_images()
