"""The lab's simulated vendor packages, built and inspected with dpkg-deb: real names and versions
(docs/contracts.md), relations, files at the real paths, labelled simulated, reproducible builds."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from gpuprov_lab.errors import LabError
from gpuprov_lab.sim import catalog, debs, nvidia
from sim_host import KERNEL, deb_dir

from provisioner.probes.cuda import CudaToolkit, parse_nvcc

DRIVER_NAMES = (
    "nvidia-kernel-open-dkms",
    "nvidia-kernel-dkms",
    "nvidia-driver-cuda",
    "nvidia-smi",
    "libnvidia-ml1",
    "libcuda1",
    "nvidia-persistenced",
)
# docs/contracts.md, "Package versions the defaults pin".
CONTRACT = {
    **{
        (name, v): "cuda-debian12"
        for name in DRIVER_NAMES
        for v in ("580.159.04-1", "580.95.05-1", "570.195.03-1")
    },
    # From 580 on without the branch in the name (vendor-catalog.yaml, debian12 580).
    ("nvidia-fabricmanager", "580.159.04-1"): "cuda-debian12",
    ("nvidia-fabricmanager", "580.95.05-1"): "cuda-debian12",
    ("libnvidia-nscq", "580.159.04-1"): "cuda-debian12",
    ("nvidia-fabricmanager-570", "570.195.03-1"): "cuda-debian12",
    ("libnvidia-nscq-570", "570.195.03-1"): "cuda-debian12",
    ("cuda-toolkit-13-0", "13.0.2-1"): "cuda-debian12",
    ("cuda-toolkit-12-8", "12.8.1-1"): "cuda-debian12",
    ("datacenter-gpu-manager-4-core", "1:4.4.1-1"): "cuda-debian12",
    ("datacenter-gpu-manager-4-cuda13", "1:4.4.1-1"): "cuda-debian12",
    ("datacenter-gpu-manager-4-cuda12", "1:4.4.1-1"): "cuda-debian12",
    ("nvidia-container-toolkit", "1.20.0-1"): "nct",
    ("nvidia-container-toolkit-base", "1.20.0-1"): "nct",
    ("libnvidia-container-tools", "1.20.0-1"): "nct",
    ("libnvidia-container1", "1.20.0-1"): "nct",
    (f"linux-headers-{KERNEL}", nvidia.headers_package().version): "debian",
}


def field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def contents(deb: Path) -> list[str]:
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    return [line.split()[5].removeprefix(".") for line in out.splitlines()]


def deb(name: str, version: str) -> Path:
    (found,) = [p for p in deb_dir().glob(f"{name}_*.deb") if field(p, "Version") == version]
    return found


def test_the_contract_packages_are_published_where_the_roles_look() -> None:
    published = {(p.name, p.version): p.repo for p in catalog.gpu_packages()}
    for key, repo in CONTRACT.items():
        assert published.get(key) == repo, key
    keys = set(catalog.REPOS) | {catalog.DEBIAN}
    assert all(p.repo in keys for p in catalog.all_packages())
    assert catalog.REPOS["cuda-debian12"] == ("cuda/repos/debian12/x86_64/", "flat")
    assert catalog.REPOS["helm"] == ("helm-debian/any/", ("dists", "any", "main"))


# Packages that carry the vendor's real software (NVIDIA's toolkit binaries and scripts, NVIDIA's mock
# NVML/CUDA libraries, NVIDIA's nvidia-smi): labelled as lab builds, saying what is real.
REAL = {
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-ml1",
    "libcuda1",
    "nvidia-smi",
}


@pytest.mark.parametrize(("name", "version"), sorted(CONTRACT))
def test_built_packages_carry_name_version_and_their_label(name: str, version: str) -> None:
    f = deb(name, version)
    assert field(f, "Package") == name
    assert field(f, "Version") == version
    label = "gpuprov lab build" if name in REAL else debs.SIMULATED
    assert field(f, "Description").splitlines()[0].endswith(f" - {label}")
    assert "gpuprov" in field(f, "Maintainer")


def test_driver_relations() -> None:
    v = "580.159.04-1"
    assert field(deb("nvidia-kernel-open-dkms", v), "Conflicts") == "nvidia-kernel-dkms"
    assert field(deb("nvidia-kernel-dkms", v), "Conflicts") == "nvidia-kernel-open-dkms"
    assert field(deb("nvidia-kernel-open-dkms", v), "Depends").startswith(
        "dkms, nvidia-kernel-support (= 580.159.04-1)"
    )
    depends = field(deb("nvidia-driver-cuda", v), "Depends")
    assert "nvidia-kernel-open-dkms (= 580.159.04-1) | nvidia-kernel-dkms (= 580.159.04-1)" in depends
    assert "nvidia-smi (= 580.159.04-1)" in depends and "libcuda1 (= 580.159.04-1)" in depends
    assert field(deb("nvidia-fabricmanager", v), "Conflicts") == "nvidia-fabricmanager-570"
    # NVIDIA's own debian/control of 1.20.0.
    assert field(deb("nvidia-container-toolkit", "1.20.0-1"), "Depends") == (
        "nvidia-container-toolkit-base (= 1.20.0-1), libnvidia-container-tools (= 1.20.0-1), "
        "libnvidia-container-tools (<< 2.0.0)"
    )
    assert field(deb("linux-headers-amd64", nvidia.headers_package().version), "Depends") == (
        f"linux-headers-{KERNEL} (= {nvidia.headers_package().version})"
    )


def test_files_sit_at_the_real_paths() -> None:
    v = "580.159.04-1"
    assert {"/usr/bin/nvidia-smi", "/usr/lib/nvidia/current/nvidia-smi"} <= set(
        contents(deb("nvidia-smi", v))
    )
    assert "/lib/systemd/system/nvidia-persistenced.service" in contents(deb("nvidia-persistenced", v))
    assert "/lib/systemd/system/nvidia-fabricmanager.service" in contents(deb("nvidia-fabricmanager", v))
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159.04" in contents(deb("libnvidia-ml1", v))
    assert "/usr/src/nvidia-580.159.04/dkms.conf" in contents(deb("nvidia-kernel-open-dkms", v))
    assert "/usr/local/cuda-13.0/bin/nvcc" in contents(deb("cuda-nvcc-13-0", "13.0.88-1"))
    assert "/usr/local/cuda-13.0/version.json" in contents(deb("cuda-toolkit-13-0", "13.0.2-1"))
    assert "/usr/bin/nvidia-ctk" in contents(deb("nvidia-container-toolkit-base", "1.20.0-1"))
    assert "/usr/bin/nvidia-container-runtime" in contents(deb("nvidia-container-toolkit-base", "1.20.0-1"))
    assert "/usr/bin/dcgmi" in contents(deb("datacenter-gpu-manager-4-core", "1:4.4.1-1"))
    assert f"/lib/modules/{KERNEL}/build" in contents(
        deb(f"linux-headers-{KERNEL}", nvidia.headers_package().version)
    )


def test_libraries_are_elf_shared_objects_with_their_soname(tmp_path: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", str(deb("libnvidia-ml1", "580.95.05-1")), str(tmp_path)], check=True)
    lib = tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"
    assert lib.read_bytes()[:4] == b"\x7fELF"
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libnvidia-ml.so.1]" in out


def test_nvcc_prints_the_real_version_format(tmp_path: Path) -> None:
    for name, version, release, full in (
        ("cuda-nvcc-13-0", "13.0.88-1", "13.0", "13.0.88"),
        ("cuda-nvcc-12-8", "12.8.93-1", "12.8", "12.8.93"),
    ):
        subprocess.run(["dpkg-deb", "-x", str(deb(name, version)), str(tmp_path)], check=True)
        out = subprocess.run(
            [str(tmp_path / f"usr/local/cuda-{release}/bin/nvcc"), "--version"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert parse_nvcc(out) == CudaToolkit(release, full)
    real = (
        Path(__file__).resolve().parents[2] / "tests/fixtures/hosts/h200-ubuntu2404/nvcc-version.txt"
    ).read_text()
    ours = subprocess.run(
        [str(tmp_path / "usr/local/cuda-13.0/bin/nvcc"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ours == real


def test_toolkits_register_the_cuda_alternatives_like_config_common() -> None:
    postinst = subprocess.run(
        ["dpkg-deb", "--ctrl-tarfile", str(deb("cuda-toolkit-13-0-config-common", "13.0.96-1"))],
        capture_output=True,
        check=True,
    ).stdout
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(postinst)) as tar:
        member = tar.extractfile("./postinst")
        assert member is not None
        text = member.read().decode()
    assert "update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-13.0 130" in text
    assert "update-alternatives --install /usr/local/cuda-13 cuda-13 /usr/local/cuda-13.0 130" in text


def test_dkms_source_builds_modules_modinfo_reads(tmp_path: Path) -> None:
    from sim_host import SimHost

    host = SimHost(tmp_path, "h200")
    assert host.build_modules(version="570.195.03", flavour="proprietary").returncode == 0
    ko = tmp_path / f"lib/modules/{KERNEL}/updates/dkms/nvidia-uvm.ko"
    modinfo = shutil.which("modinfo") or shutil.which("modinfo", path="/sbin:/usr/sbin")
    if modinfo:  # kmod's modinfo reads the module like a real one
        out = subprocess.run([modinfo, "-F", "version", str(ko)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "570.195.03"
    from gpuprov_lab.gpu import kmod

    info = kmod.read_modinfo(ko)
    assert (info["name"], info["version"], info["license"]) == ("nvidia_uvm", "570.195.03", "NVIDIA")
    assert info["vermagic"].startswith(f"{KERNEL} ")


def test_builds_are_reproducible(tmp_path: Path) -> None:
    for pkg in catalog.gpu_packages()[:12]:
        assert debs.build_deb(pkg, tmp_path).read_bytes() == (deb_dir() / pkg.filename).read_bytes(), pkg.name


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"name": "Bad_Name"}, "Bad_Name"),
        ({"version": "not a version"}, "not a version"),
        ({"maintainer_scripts": {"postinstall": "true"}}, "postinstall"),
        ({"files": {"relative/path": debs.SimFile("x")}}, "relative/path"),
        ({"conffiles": ["/etc/missing.conf"]}, "/etc/missing.conf"),
    ],
)
def test_bad_packages_are_refused_by_name(tmp_path: Path, change: dict, names: str) -> None:
    fields = {"name": "good-name", "version": "1.0-1", "repo": "nct", "description": "x"} | change
    with pytest.raises(LabError, match=re.escape(names)):
        debs.build_deb(debs.SimPackage(**fields), tmp_path)
