"""Part of the gpuprov lab simulation: the NVIDIA Container Toolkit repository (libnvidia-container).

Packages nvidia-container-toolkit, nvidia-container-toolkit-base, libnvidia-container-tools and
libnvidia-container1 at 1.18.0-1, with the real binaries' paths. ``nvidia-ctk`` edits Docker's
daemon.json and containerd's config.toml the way the real 1.18.0 does (gpuprovsim/ctk.py);
``nvidia-container-runtime`` hands containers to runc unchanged (no GPU is injected: the lab has none).
"""

from __future__ import annotations

from provisioner.lab.sim.debs import SIMULATED, SimFile, SimPackage
from provisioner.lab.sim.elf import shared_object
from provisioner.lab.sim.nvidia import LIBDIR, tool

NCT_REPO = "nct"
VERSION = "1.18.0"
FULL = f"{VERSION}-1"
HOMEPAGE = "https://github.com/NVIDIA/nvidia-container-toolkit"

RUNTIME_CONFIG = """\
#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
#debug = "/var/log/nvidia-container-toolkit.log"
environment = []
#ldcache = "/etc/ld.so.cache"
ldconfig = "@/sbin/ldconfig"
load-kmods = true
#no-cgroups = false
#path = "/usr/bin/nvidia-container-cli"
#root = "/run/nvidia/driver"
#user = "root:video"

[nvidia-container-runtime]
#debug = "/var/log/nvidia-container-runtime.log"
log-level = "info"
mode = "auto"
runtimes = ["runc", "crun"]

[nvidia-container-runtime.modes]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime.modes.csv]
mount-spec-path = "/etc/nvidia-container-runtime/host-files-for-container.d"

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = false

[nvidia-ctk]
path = "nvidia-ctk"
"""


def packages() -> list[SimPackage]:
    label = f"{SIMULATED} NVIDIA Container Toolkit {VERSION}"
    lib = f"{LIBDIR}/libnvidia-container.so.{VERSION}"
    golib = f"{LIBDIR}/libnvidia-container-go.so.{VERSION}"
    config = "/etc/nvidia-container-runtime/config.toml"
    return [
        SimPackage(
            name="libnvidia-container1",
            version=FULL,
            repo=NCT_REPO,
            description="NVIDIA container runtime library",
            section="libs",
            homepage=HOMEPAGE,
            files={
                lib: SimFile(shared_object("libnvidia-container.so.1", f"{label} libnvidia-container")),
                f"{LIBDIR}/libnvidia-container.so.1": SimFile(link_to=f"libnvidia-container.so.{VERSION}"),
                golib: SimFile(
                    shared_object("libnvidia-container-go.so.1", f"{label} libnvidia-container-go")
                ),
                f"{LIBDIR}/libnvidia-container-go.so.1": SimFile(
                    link_to=f"libnvidia-container-go.so.{VERSION}"
                ),
            },
            maintainer_scripts={"triggers": "activate-noawait ldconfig\n"},
        ),
        SimPackage(
            name="libnvidia-container-tools",
            version=FULL,
            repo=NCT_REPO,
            description="NVIDIA container runtime library (command-line tools)",
            depends=[f"libnvidia-container1 (>= {FULL})"],
            section="utils",
            homepage=HOMEPAGE,
            files={"/usr/bin/nvidia-container-cli": tool("ctk", "nvidia-container-cli", nct=VERSION)},
        ),
        SimPackage(
            name="nvidia-container-toolkit-base",
            version=FULL,
            repo=NCT_REPO,
            description="NVIDIA Container Toolkit Base",
            breaks=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-toolkit (<= 1.10.0-1)"],
            replaces=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-toolkit (<= 1.10.0-1)"],
            section="utils",
            homepage=HOMEPAGE,
            files={
                "/usr/bin/nvidia-ctk": tool("ctk", "nvidia-ctk", nct=VERSION),
                "/usr/bin/nvidia-container-runtime": tool("ctk", "nvidia-container-runtime", nct=VERSION),
                "/usr/bin/nvidia-cdi-hook": tool("ctk", "nvidia-cdi-hook", nct=VERSION),
                config: SimFile(RUNTIME_CONFIG),
            },
            conffiles=[config],
        ),
        SimPackage(
            name="nvidia-container-toolkit",
            version=FULL,
            repo=NCT_REPO,
            description="NVIDIA Container toolkit",
            depends=[f"nvidia-container-toolkit-base (= {FULL})", f"libnvidia-container-tools (>= {FULL})"],
            breaks=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"],
            replaces=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"],
            section="utils",
            homepage=HOMEPAGE,
            files={
                "/usr/bin/nvidia-container-runtime-hook": tool(
                    "ctk", "nvidia-container-runtime-hook", nct=VERSION
                ),
            },
        ),
    ]
