"""Part of the gpuprov lab simulation: the simulated packages of NVIDIA's CUDA repository (Debian 12).

Real names, versions and file paths (docs/contracts.md, "Package versions"): driver branches 580
(580.159.04, 580.95.05) and 570 (570.195.03) in open and proprietary kernel-module flavours, fabric
manager, DCGM, CUDA toolkits 13.0 and 12.8, and the kernel headers of the lab's running kernel. The
tools they install are thin wrappers around the lab's GPU stand-in (gpuprov_lab/gpu, at
/usr/lib/gpuprov-lab/gpu in a host), which answers from the host's simulated hardware.

The kernel-module packages are real DKMS packages: their postinst runs Debian's dkms, which builds
(with gcc) tiny ELF objects carrying the real module names and modinfo, and installs them under
/lib/modules/$(uname -r)/updates/dkms/. So missing kernel headers, a failing build (the lab's
``install-fail`` fault) and a half-configured package behave as they do on a real host.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml
from gpuprov_lab import image, vendor
from gpuprov_lab.gpu.kmod import BRANCH_CUDA  # the CUDA version each branch's driver reports
from gpuprov_lab.sim.debs import SIMULATED, SimFile, SimPackage
from gpuprov_lab.sim.elf import shared_object

# The lab's CUDA repositories (catalog.REPOS keys) and the catalog's name for each.
CUDA_REPOS = {"cuda-debian12": "debian12", "cuda-debian13": "debian13"}
LIBDIR = "/usr/lib/x86_64-linux-gnu"
# The files of the simulated packages, as templates (str.format) where they carry versions or labels.
FILES = Path(__file__).parent / "files"
HOMEPAGE = "https://developer.nvidia.com/cuda-downloads"


def _catalog() -> dict[str, Any]:
    """vendor-catalog.yaml: NVIDIA's package names, versions and revisions, with their sources."""
    return yaml.safe_load((Path(__file__).parent / "vendor-catalog.yaml").read_text())


def _catalog_drivers() -> dict[str, tuple[str, str, str]]:
    """Driver version → (branch, CUDA version, lab repository), every release the catalog has for the
    Debian repositories the lab serves."""
    out: dict[str, tuple[str, str, str]] = {}
    for repo_key, catalog_repo in CUDA_REPOS.items():
        for branch, b in _catalog()["repositories"][catalog_repo]["branches"].items():
            for version in b["releases"]:
                out[version] = (branch, BRANCH_CUDA[branch], repo_key)
    return out


# Driver version → (branch, CUDA version its libcuda reports, lab repository).
DRIVERS: dict[str, tuple[str, str, str]] = _catalog_drivers()


def _revision(version: str) -> str:
    """The Debian revision of a release's driver packages, as the catalog has it."""
    branch, _, repo_key = DRIVERS[version]
    return str(_catalog()["repositories"][CUDA_REPOS[repo_key]]["branches"][branch]["releases"][version])


def _repo(version: str) -> str:
    return DRIVERS[version][2]


DCGM_VERSION = "1:4.4.1-1"
# NVIDIA publishes DCGM for debian12, not debian13 (vendor-catalog.yaml).
DCGM_REPOS = "cuda-debian12"
# Module names as built (dkms BUILT_MODULE_NAME) and as the kernel names them.
KERNEL_MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")


def tool(module: str, prog: str, **constants: str) -> SimFile:
    """An executable that runs one entry point of the lab's GPU stand-in (gpuprov_lab/gpu)."""
    return SimFile(image.launcher(module, prog, **constants), 0o755)


def smi_launcher(**constants: str) -> SimFile:
    """/usr/bin/nvidia-smi: on a lab host the simulated front end (gpu/smi.py); where the lab's GPU
    stand-in is absent it is NVIDIA's binary that answers. That is the case inside a container, where the
    NVIDIA runtime mounts this file (the CDI spec names /usr/bin/nvidia-smi) and the lab's images carry
    NVIDIA's binary where Debian installs it."""
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(constants.items()))
    call = f"from gpu import smi; sys.exit(smi.main('nvidia-smi', sys.argv[1:], {args}))"
    text = f"""#!/bin/sh
# nvidia-smi: {SIMULATED} front end. Part of the gpuprov lab simulation: on a lab host it answers
# from the host's simulated hardware (/etc/gpuprov-lab/profile.json) and NVIDIA's own binary
# (/{vendor.NVIDIA_SMI_PATH}); where the lab's GPU stand-in is absent (inside a container) NVIDIA's
# binary answers alone.
if [ -d {image.HOST_LIB}/gpu ] && [ -x /usr/bin/python3 ]; then
  exec /usr/bin/python3 -c "import sys; sys.path.insert(0, '{image.HOST_LIB}'); {call}" "$@"
fi
exec /{vendor.NVIDIA_SMI_PATH} "$@"
"""
    return SimFile(text, 0o755)


def _doc(name: str, what: str) -> dict[str, SimFile]:
    return {
        f"/usr/share/doc/{name}/README.simulated": SimFile(
            f"{name}: {SIMULATED}.\n{what}\nIt exists only on gpuprov lab hosts; see lab/gpuprov_lab/sim.\n"
        )
    }


LDCONFIG_TRIGGER = "activate-noawait ldconfig\n"
MOCK_NVML_PROVENANCE = (
    "NVIDIA's mock {lib} (github.com/NVIDIA/k8s-test-infra, pkg/gpu/mocknvml and mockcuda: NVIDIA's "
    "library for testing its GPU stack without GPUs), installed under driver {version}'s file name. It "
    "answers from the host's simulated GPUs (MOCK_NVML_CONFIG, written while the simulated nvidia module "
    "is loaded)."
)


NVIDIA_SMI_PROVENANCE = (
    f"NVIDIA's nvidia-smi binary (Debian {vendor.NVIDIA_SMI_SUITE}'s non-free build, "
    f"/{vendor.NVIDIA_SMI_PATH}) answers from NVIDIA's mock NVML: the GPU list (-L), the summary "
    "table, queries. /usr/bin/nvidia-smi in front of it is SIMULATED where the binary cannot answer: "
    "while no driver module is loaded or the library and module disagree (the kernel module is "
    "simulated), -q -x (the real binary crashes on the mock), --version (the binary is its own branch, "
    "not the simulated driver's), queries of MIG mode, persistence, ECC and the PCIe link (the "
    "simulated states and faults are not in the mock) and MIG changes (the mock has no MIG devices)."
)


@functools.cache
def _real_nvidia_smi() -> bytes:
    return vendor.nvidia_smi().read_bytes()


def _mock_library(name: str) -> bytes:
    """NVIDIA's mock NVML / CUDA driver library, from the vendor artifacts."""
    return vendor.artifact("nvml-mock", f"lib/{name}").read_bytes()


# ------------------------------------------------------------------------------------------ driver

DKMS_CONF = (FILES / "dkms.conf").read_text()

DKMS_MAKEFILE = (FILES / "dkms-Makefile").read_text()

MODULE_C = (FILES / "sim-module.c").read_text()

PERSISTENCED_UNIT = (FILES / "nvidia-persistenced.service").read_text()


def _dkms_postinst(version: str) -> str:
    # What dh_dkms generates for a DKMS package (Debian 12's dkms 3.0.10).
    return f"""DKMS_NAME=nvidia
DKMS_VERSION={version}
case "$1" in
  configure)
    /usr/lib/dkms/common.postinst "$DKMS_NAME" "$DKMS_VERSION" "" "" "$2" || exit $?
  ;;
esac
"""


def _dkms_prerm(version: str) -> str:
    return f"""case "$1" in
  remove|upgrade|deconfigure)
    if [ "$(dkms status -m nvidia -v {version})" ]; then
      dkms remove -m nvidia -v {version} --all
    fi
  ;;
esac
"""


def _kernel_dkms(version: str, flavour: str) -> SimPackage:
    open_ = flavour == "open"
    name = "nvidia-kernel-open-dkms" if open_ else "nvidia-kernel-dkms"
    other = "nvidia-kernel-dkms" if open_ else "nvidia-kernel-open-dkms"
    full = f"{version}-{_revision(version)}"
    label = f"{SIMULATED} {name} {version}"
    modules = "\n".join(
        f'BUILT_MODULE_NAME[{i}]="{m}"\nDEST_MODULE_LOCATION[{i}]="/kernel/drivers/video"'
        for i, m in enumerate(KERNEL_MODULES)
    )
    src = f"/usr/src/nvidia-{version}"
    kind = "Open GPU kernel modules (MIT/GPL)" if open_ else "proprietary kernel modules"
    return SimPackage(
        name=name,
        version=full,
        repo=_repo(version),
        description=f"NVIDIA binary kernel module DKMS source ({'open' if open_ else 'proprietary'} flavor)",
        long_description=f"DKMS source of the NVIDIA {kind}, version {version}.",
        depends=["dkms", f"nvidia-kernel-support (= {full})", f"firmware-nvidia-gsp (= {full})"],
        conflicts=[other],
        provides=[f"nvidia-kernel-dkms-any (= {version})"],
        section="non-free/kernel",
        homepage=HOMEPAGE,
        files={
            f"{src}/dkms.conf": SimFile(
                DKMS_CONF.format(label=label, flavour=flavour, version=version, modules=modules)
            ),
            f"{src}/Makefile": SimFile(
                DKMS_MAKEFILE.format(
                    label=label,
                    modules=" ".join(KERNEL_MODULES),
                    pylib=image.HOST_LIB,
                    version=version,
                    license="Dual MIT/GPL" if open_ else "NVIDIA",
                )
            ),
            f"{src}/sim-module.c": SimFile(MODULE_C.format(label=label)),
            **_doc(name, f"DKMS source of the simulated NVIDIA {kind} {version}."),
        },
        maintainer_scripts={"postinst": _dkms_postinst(version), "prerm": _dkms_prerm(version)},
    )


def _driver_packages(version: str) -> list[SimPackage]:
    _branch, cuda, _ = DRIVERS[version]
    full = f"{version}-{_revision(version)}"
    same = f"(= {full})"
    label = f"{SIMULATED} NVIDIA driver {version}"
    ml = f"{LIBDIR}/libnvidia-ml.so.{version}"
    cu = f"{LIBDIR}/libcuda.so.{version}"
    pkg = functools.partial(SimPackage, version=full, repo=_repo(version), homepage=HOMEPAGE)
    # NVML's users, built with it: they need the same build of libnvidia-ml1.
    nvml_user = functools.partial(pkg, depends=[f"libnvidia-ml1 {same}"])
    persistenced = systemd_scripts("nvidia-persistenced.service")
    persistenced["postinst"] = (
        'if [ "$1" = configure ] && ! getent passwd nvidia-persistenced >/dev/null; then\n'
        "  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "
        '--comment "NVIDIA Persistence Daemon" nvidia-persistenced\nfi\n' + persistenced["postinst"]
    )
    return [
        _kernel_dkms(version, "open"),
        _kernel_dkms(version, "proprietary"),
        pkg(
            name="nvidia-kernel-support",
            description="NVIDIA binary kernel module support files",
            depends=["nvidia-modprobe"],
            section="non-free/kernel",
            files={
                "/etc/modprobe.d/nvidia-blacklists-nouveau.conf": SimFile(
                    '# You need to run "update-initramfs -u" after editing this file.\n\n'
                    "# see #580894\nblacklist nouveau\n"
                ),
                "/etc/modprobe.d/nvidia-options.conf": SimFile(
                    "#options nvidia-current NVreg_DeviceFileUID=0 NVreg_DeviceFileGID=44 "
                    "NVreg_DeviceFileMode=0660\n\n#options nvidia-current NVreg_EnableGpuFirmware=0\n"
                ),
                **_doc("nvidia-kernel-support", label),
            },
            conffiles=[
                "/etc/modprobe.d/nvidia-blacklists-nouveau.conf",
                "/etc/modprobe.d/nvidia-options.conf",
            ],
        ),
        pkg(
            name="firmware-nvidia-gsp",
            description="NVIDIA GSP firmware",
            section="non-free-firmware/kernel",
            files={
                f"/lib/firmware/nvidia/{version}/{fw}": SimFile(f"{label}: GSP firmware image {fw}\n")
                for fw in ("gsp_ga10x.bin", "gsp_tu10x.bin")
            },
        ),
        pkg(
            name="nvidia-modprobe",
            description="utility to load NVIDIA kernel modules and create device nodes",
            section="contrib/utils",
            files={"/usr/bin/nvidia-modprobe": tool("kmod", "nvidia-modprobe", driver=version)},
        ),
        pkg(
            name="libnvidia-ml1",
            description="NVIDIA Management Library (NVML) runtime library",
            section="non-free/libs",
            files={
                ml: SimFile(_mock_library("libnvidia-ml.so.550.163.01"), 0o644),
                f"{LIBDIR}/libnvidia-ml.so.1": SimFile(link_to=os.path.basename(ml)),
            },
            maintainer_scripts={"triggers": LDCONFIG_TRIGGER},
            real=MOCK_NVML_PROVENANCE.format(lib="libnvidia-ml.so", version=version),
        ),
        nvml_user(
            name="libcuda1",
            description=f"NVIDIA CUDA Driver Library (CUDA {cuda})",
            section="non-free/libs",
            files={
                cu: SimFile(_mock_library("libcuda.so.550.163.01"), 0o644),
                f"{LIBDIR}/libcuda.so.1": SimFile(link_to=os.path.basename(cu)),
                f"{LIBDIR}/libcuda.so": SimFile(link_to="libcuda.so.1"),
            },
            maintainer_scripts={"triggers": LDCONFIG_TRIGGER},
            real=MOCK_NVML_PROVENANCE.format(lib="libcuda.so", version=version),
        ),
        nvml_user(
            name="nvidia-smi",
            description="NVIDIA System Management Interface",
            section="non-free/utils",
            files={
                "/usr/bin/nvidia-smi": smi_launcher(driver=version, cuda=cuda),
                f"/{vendor.NVIDIA_SMI_PATH}": SimFile(_real_nvidia_smi(), 0o755),
            },
            real=NVIDIA_SMI_PROVENANCE,
        ),
        nvml_user(
            name="nvidia-persistenced",
            description="daemon to maintain persistent software state in the NVIDIA driver",
            section="contrib/utils",
            files={
                "/usr/bin/nvidia-persistenced": tool("daemons", "nvidia-persistenced", driver=version),
                "/lib/systemd/system/nvidia-persistenced.service": SimFile(PERSISTENCED_UNIT),
            },
            maintainer_scripts=persistenced,
        ),
        pkg(
            name="nvidia-driver-cuda",
            description="NVIDIA driver CUDA integration components",
            long_description=f"Headless NVIDIA driver {version} for compute (CUDA {cuda}).",
            depends=[
                f"nvidia-kernel-open-dkms {same} | nvidia-kernel-dkms {same}",
                f"libcuda1 {same}",
                f"libnvidia-ml1 {same}",
                f"nvidia-smi {same}",
                f"nvidia-persistenced {same}",
                f"nvidia-modprobe {same}",
                f"firmware-nvidia-gsp {same}",
            ],
            section="non-free/libs",
            files=_doc("nvidia-driver-cuda", label),
        ),
        *_fabricmanager(version),
    ]


def systemd_scripts(unit: str) -> dict[str, str]:
    """What dh_installsystemd generates: enable and start on configure, stop on remove."""
    return {
        "postinst": f"""case "$1" in configure|abort-upgrade|abort-deconfigure) true;; *) exit 0;; esac
if true; then
  if deb-systemd-helper debian-installed '{unit}'; then
    deb-systemd-helper unmask '{unit}' >/dev/null || true
    if deb-systemd-helper --quiet was-enabled '{unit}'; then
      deb-systemd-helper enable '{unit}' >/dev/null || true
    else
      deb-systemd-helper update-state '{unit}' >/dev/null || true
    fi
  else
    deb-systemd-helper unmask '{unit}' >/dev/null || true
    deb-systemd-helper enable '{unit}' >/dev/null || true
  fi
    if [ -d /run/systemd/system ]; then
      systemctl --system daemon-reload >/dev/null || true
      deb-systemd-invoke restart '{unit}' >/dev/null || true
    fi
fi
""",
        "prerm": f"""if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  deb-systemd-invoke stop '{unit}' >/dev/null || true
fi
""",
        "postrm": f"""if [ -d /run/systemd/system ]; then
  systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = "remove" ]; then
  if [ -x "/usr/bin/deb-systemd-helper" ]; then
    deb-systemd-helper mask '{unit}' >/dev/null || true
  fi
fi
if [ "$1" = "purge" ]; then
  if [ -x "/usr/bin/deb-systemd-helper" ]; then
    deb-systemd-helper purge '{unit}' >/dev/null || true
    deb-systemd-helper unmask '{unit}' >/dev/null || true
  fi
fi
""",
    }


FABRICMANAGER_UNIT = (FILES / "nvidia-fabricmanager.service").read_text()

FABRICMANAGER_CFG = (FILES / "fabricmanager.cfg").read_text()


def _fabricmanager(version: str) -> list[SimPackage]:
    """The fabric manager and NVSwitch library of a release, named as the catalog says: for the branch up
    to 575 (nvidia-fabricmanager-570, libnvidia-nscq-570), without it from 580 on."""
    branch, _, repo_key = DRIVERS[version]
    catalog_repo = CUDA_REPOS[repo_key]
    b = _catalog()["repositories"][catalog_repo]["branches"][branch]
    fm_name, nscq_name = b["fabricmanager"]
    full = f"{version}-{b['fabricmanager_revision']}"
    # Every other branch's fabric manager: they install the same unit, binary and configuration, so dpkg
    # may hold only one (the nvidia_driver role removes the other branch's before installing).
    others = sorted(
        {
            name
            for other, ob in _catalog()["repositories"][catalog_repo]["branches"].items()
            if other != branch
            for name in ob["fabricmanager"][:1]
        }
        - {fm_name}
    )
    cfg = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
    label = f"{SIMULATED} fabric manager {version}"
    lib = f"{LIBDIR}/libnvidia-nscq.so.{version}"
    pkg = functools.partial(SimPackage, version=full, repo=_repo(version), homepage=HOMEPAGE)
    return [
        pkg(
            name=fm_name,
            description="Fabric Manager for NVSwitch based systems.",
            conflicts=others,
            replaces=others,
            section="multiverse/devel",
            files={
                "/usr/bin/nv-fabricmanager": tool("daemons", "nv-fabricmanager", driver=version),
                cfg: SimFile(FABRICMANAGER_CFG.format(label=label)),
                "/lib/systemd/system/nvidia-fabricmanager.service": SimFile(FABRICMANAGER_UNIT),
                **_doc(fm_name, label),
            },
            conffiles=[cfg],
            maintainer_scripts=systemd_scripts("nvidia-fabricmanager.service"),
        ),
        pkg(
            name=nscq_name,
            description="NVSwitch Configuration and Query library",
            conflicts=[n.replace("nvidia-fabricmanager", "libnvidia-nscq") for n in others],
            section="multiverse/libs",
            files={
                lib: SimFile(shared_object("libnvidia-nscq.so.2", f"{SIMULATED} libnvidia-nscq {version}")),
                f"{LIBDIR}/libnvidia-nscq.so.2": SimFile(link_to=f"libnvidia-nscq.so.{version}"),
            },
            maintainer_scripts={"triggers": LDCONFIG_TRIGGER},
        ),
    ]


# -------------------------------------------------------------------------------------------- DCGM

DCGM_UNIT = (FILES / "nvidia-dcgm.service").read_text()


def _dcgm_packages() -> list[SimPackage]:
    upstream = DCGM_VERSION.split(":", 1)[1].rsplit("-", 1)[0]
    plugins = "/usr/libexec/datacenter-gpu-manager-4/plugins"
    pkg = functools.partial(
        SimPackage, version=DCGM_VERSION, repo=DCGM_REPOS, homepage="https://developer.nvidia.com/dcgm"
    )
    core = pkg(
        name="datacenter-gpu-manager-4-core",
        description="NVIDIA® Datacenter GPU Management Tools",
        long_description=f"DCGM {upstream}: nv-hostengine and dcgmi.",
        depends=["libc6"],
        files={
            "/usr/bin/nv-hostengine": tool("dcgm", "nv-hostengine", dcgm=upstream),
            "/usr/bin/dcgmi": tool("dcgm", "dcgmi", dcgm=upstream),
            "/lib/systemd/system/nvidia-dcgm.service": SimFile(DCGM_UNIT),
        },
        maintainer_scripts={
            "postinst": 'if [ "$1" = configure ] && ! getent passwd nvidia-dcgm >/dev/null; then\n'
            "  useradd --system --no-create-home --home-dir /var/lib/nvidia-dcgm --shell /usr/sbin/nologin "
            "nvidia-dcgm\nfi\n"
            "if [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null || true; fi\n",
            "prerm": 'if [ -d /run/systemd/system ] && [ "$1" = remove ]; then\n'
            "  deb-systemd-invoke stop nvidia-dcgm.service >/dev/null || true\nfi\n",
        },
    )
    flavours = [
        pkg(
            name=f"datacenter-gpu-manager-4-cuda{cuda}",
            description=f"NVIDIA® Datacenter GPU Management Tools - CUDA {cuda} support",
            depends=[f"datacenter-gpu-manager-4-core (= {DCGM_VERSION})"],
            files={
                f"{plugins}/cuda{cuda}/libpluginsoftware.so.4": SimFile(
                    shared_object("libpluginsoftware.so.4", f"{SIMULATED} DCGM diagnostic plugin CUDA {cuda}")
                ),
                f"{plugins}/cuda{cuda}/VERSION": SimFile(f"{upstream} cuda{cuda}\n"),
            },
        )
        for cuda in ("12", "13")
    ]
    return [core, *flavours]


# -------------------------------------------------------------------------------------------- CUDA

# Toolkit meta version → (release, nvcc version, nvcc build line, build date, config-common version,
# priority, lab repository). 13.0.2 is the real H200 host's (dpkg status, nvcc --version); 13.1.1 (CUDA
# 13.1 Update 1, which NVIDIA's debian13 repository carries: cuda-nvcc-13-1 13.1.115-1 pinned from it in
# public Dockerfiles) prints what public captures of its nvcc show.
TOOLKITS = {
    "13.0.2": (
        "13.0",
        "13.0.88",
        "cuda_13.0.r13.0/compiler.36424714_0",
        "Wed_Aug_20_01:58:59_PM_PDT_2025",
        "13.0.96",
        130,
        "cuda-debian12",
    ),
    "12.8.1": (
        "12.8",
        "12.8.93",
        "cuda_12.8.r12.8/compiler.35583870_0",
        "Fri_Feb_21_20:23:50_PST_2025",
        "12.8.90",
        128,
        "cuda-debian12",
    ),
    "13.1.1": (
        "13.1",
        "13.1.115",
        "cuda_13.1.r13.1/compiler.37061995_0",
        "Tue_Dec_16_07:23:41_PM_PST_2025",
        "13.1.80",
        131,
        "cuda-debian13",
    ),
}

NVCC = (FILES / "nvcc").read_text()


def _cuda_packages() -> list[SimPackage]:
    pkgs: list[SimPackage] = []
    seen_common: set[str] = set()  # repositories that have cuda-toolkit-config-common already
    for meta, (release, nvcc, build, built, common, priority, repo) in TOOLKITS.items():
        major, minor = release.split(".")
        dash = f"{major}-{minor}"
        prefix = f"/usr/local/cuda-{release}"
        label = f"{SIMULATED} CUDA {meta}"
        version_json = {
            "cuda": {"name": "CUDA SDK", "version": meta},
            "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": common},
            "cuda_nvcc": {"name": "CUDA NVCC", "version": nvcc},
            "simulated": {"name": "gpuprov lab", "version": SIMULATED},
        }
        pkg = functools.partial(SimPackage, repo=repo, section="multiverse/devel", homepage=HOMEPAGE)
        pkgs += [
            pkg(
                name=f"cuda-toolkit-{dash}",
                version=f"{meta}-1",
                description=f"CUDA Toolkit {release} meta-package",
                depends=[
                    f"cuda-nvcc-{dash} (>= {nvcc})",
                    f"cuda-toolkit-{dash}-config-common",
                    f"cuda-toolkit-{major}-config-common",
                    "cuda-toolkit-config-common",
                ],
                files={f"{prefix}/version.json": SimFile(json.dumps(version_json, indent=3) + "\n")},
            ),
            pkg(
                name=f"cuda-nvcc-{dash}",
                version=f"{nvcc}-1",
                description="CUDA nvcc",
                files={
                    f"{prefix}/bin/nvcc": SimFile(
                        NVCC.format(label=label, built=built, release=release, nvcc=nvcc, build=build), 0o755
                    ),
                    f"{prefix}/bin/nvcc.profile": SimFile(
                        "\nTOP              = $(_HERE_)/..\n\nNVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice\n\n"
                        "LD_LIBRARY_PATH += $(TOP)/lib:\nPATH            += $(TOP)/nvvm/bin:$(_HERE_):\n"
                    ),
                },
            ),
            pkg(
                name=f"cuda-toolkit-{dash}-config-common",
                version=f"{common}-1",
                arch="all",
                description=f"Common config package for CUDA Toolkit {release}.",
                files=_doc(f"cuda-toolkit-{dash}-config-common", label),
                maintainer_scripts={
                    "postinst": f"""if [ "$1" = configure ]; then
  update-alternatives --install /usr/local/cuda cuda {prefix} {priority}
  update-alternatives --install /usr/local/cuda-{major} cuda-{major} {prefix} {priority}
fi
""",
                    "prerm": f"""if [ "$1" = remove ] || [ "$1" = deconfigure ]; then
  update-alternatives --remove cuda {prefix}
  update-alternatives --remove cuda-{major} {prefix}
fi
""",
                },
            ),
            pkg(
                name=f"cuda-toolkit-{major}-config-common",
                version=f"{common}-1",
                arch="all",
                description=f"Common config package for CUDA Toolkit {major}.",
                files={
                    f"/etc/ld.so.conf.d/988_cuda-{major}.conf": SimFile(
                        f"/usr/local/cuda-{major}/targets/x86_64-linux/lib\n"
                    )
                },
                conffiles=[f"/etc/ld.so.conf.d/988_cuda-{major}.conf"],
            ),
        ]
        if repo not in seen_common:
            seen_common.add(repo)
            pkgs.append(
                pkg(
                    name="cuda-toolkit-config-common",
                    version=f"{common}-1",
                    arch="all",
                    description="Common config package for CUDA Toolkit.",
                    files={
                        "/etc/ld.so.conf.d/000_cuda.conf": SimFile(
                            "/usr/local/cuda/targets/x86_64-linux/lib\n"
                        )
                    },
                    conffiles=["/etc/ld.so.conf.d/000_cuda.conf"],
                )
            )
    return pkgs


# ---------------------------------------------------------------------------------- kernel headers

HEADERS_MAKEFILE = (FILES / "headers-Makefile").read_text()


def kernel_release() -> str:
    """The lab's running kernel (the containers share the controller's)."""
    return os.uname().release


def headers_package(release: str | None = None) -> SimPackage:
    """linux-headers-<release> for the running kernel, as the distro archive would carry it."""
    release = release or kernel_release()
    name = f"linux-headers-{release}".lower()
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", release)
    major, minor, sub = (m.group(1), m.group(2), m.group(3) or "0") if m else ("0", "0", "0")
    label = f"{SIMULATED} kernel headers"
    tree = f"/usr/src/linux-headers-{release}"
    return SimPackage(
        name=name,
        version=f"{major}.{minor}.{sub}-1",
        repo="debian",
        description=f"Header files for Linux {release}",
        long_description="This package provides kernel header files for the lab's running kernel.",
        # Debian's kernel headers depend on the compiler the kernel was built with (linux-headers-*-amd64:
        # gcc-12 on Debian 12, gcc-14 on Debian 13) and on make (via linux-kbuild); DKMS builds with them.
        depends=["gcc", "make"],
        section="kernel",
        files={
            f"{tree}/Makefile": SimFile(
                HEADERS_MAKEFILE.format(label=label, release=release, major=major, minor=minor, sub=sub)
            ),
            f"{tree}/.config": SimFile(
                f"#\n# {label}\n# Linux/x86 {release} Kernel Configuration\n#\n"
                'CONFIG_CC_VERSION_TEXT="gcc (Debian 12.2.0-14) 12.2.0"\nCONFIG_MODULES=y\n'
                "CONFIG_MODULE_UNLOAD=y\nCONFIG_MODVERSIONS=y\nCONFIG_X86_64=y\n"
            ),
            f"{tree}/include/config/kernel.release": SimFile(release + "\n"),
            f"{tree}/include/generated/utsrelease.h": SimFile(f'#define UTS_RELEASE "{release}"\n'),
            f"{tree}/Module.symvers": SimFile(""),
            f"/lib/modules/{release}/build": SimFile(link_to=tree),
        },
    )


def headers_metapackage(release: str | None = None) -> SimPackage:
    """linux-headers-amd64: Debian's metapackage for the headers of its current kernel (dkms recommends
    it), here the lab's running kernel."""
    hp = headers_package(release)
    return SimPackage(
        name="linux-headers-amd64",
        version=hp.version,
        repo="debian",
        description="Header files for Linux (meta-package)",
        long_description="This package depends on the architecture-specific header files for the latest "
        "Linux kernel, here the lab's running kernel.",
        depends=[f"{hp.name} (= {hp.version})"],
        section="kernel",
        files=_doc("linux-headers-amd64", f"{SIMULATED} kernel headers metapackage"),
    )


def packages() -> list[SimPackage]:
    pkgs: list[SimPackage] = []
    for version in DRIVERS:
        pkgs += _driver_packages(version)
    # One fabric manager package name per branch: every version of it is published.
    pkgs += _dcgm_packages()
    pkgs += _cuda_packages()
    pkgs += [headers_package(), headers_metapackage()]
    return pkgs
