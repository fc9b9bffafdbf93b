"""Part of the gpuprov lab: the NVIDIA Container Toolkit repository (libnvidia-container), 1.20.0-1.

nvidia-container-toolkit-base and nvidia-container-toolkit carry NVIDIA's real 1.20.0 binaries
(nvidia-ctk, nvidia-container-runtime, nvidia-cdi-hook, nvidia-container-runtime-hook, built from NVIDIA's
source), NVIDIA's own maintainer scripts and the nvidia-cdi-refresh systemd units, laid out as the tag's
debian/*.install files say (the units under /lib/systemd/system since 1.20.0); their control fields follow
the tag's debian/control, and what debhelper adds to the scripts (debian/rules runs `dh --with systemd`,
debian/*.maintscript) is added as debhelper writes it. What they do to
daemon.json, which CDI spec they write and which devices a container gets is therefore the real tools'
doing (the GPUs they see come from NVIDIA's mock NVML in the lab's driver packages).

Still SIMULATED, because no real build exists here (it needs NVIDIA's driver libraries): libnvidia-container1
and libnvidia-container-tools, whose nvidia-container-cli answers ``--version`` only. Only the legacy
(non-CDI) injection path would use it; nothing in the lab does.
"""

from __future__ import annotations

import functools
import re

from gpuprov_lab import vendor
from gpuprov_lab.sim.debs import SIMULATED, SimFile, SimPackage
from gpuprov_lab.sim.elf import shared_object
from gpuprov_lab.sim.nvidia import LIBDIR, systemd_scripts

NCT_REPO = "nct"
VERSION = "1.20.0"
FULL = f"{VERSION}-1"
HOMEPAGE = "https://github.com/NVIDIA/nvidia-container-toolkit"
ARTIFACT = "nvidia-container-toolkit"
REAL = (
    "NVIDIA Container Toolkit {version} (github.com/NVIDIA/nvidia-container-toolkit, tag v{version}): "
    "NVIDIA's binaries built from the tag's source, NVIDIA's maintainer scripts and systemd units."
)


# The one change the lab makes to NVIDIA's files, in the two settings files NVIDIA provides for it: the
# disable-device-node-modification hook of a generated CDI spec reads the kernel module's
# /proc/driver/nvidia/params inside the container, and a lab host's simulated module has none there (a
# container's /proc is the machine's kernel's). Everything else of the spec is generated as on a real host.
LAB_CDI_SETTINGS = (
    b"\n# gpuprov lab: the simulated kernel module has no /proc/driver/nvidia/params inside containers.\n"
    b"NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS=disable-device-node-modification\n"
)


# The same hook in the specs nvidia-container-runtime generates just in time (mode auto, a container
# asking for GPUs by NVIDIA_VISIBLE_DEVICES, as the GPU Operator's validator does): its config.toml's
# jit-cdi table names the hooks to leave out (api/config/v1/runtime.go, nvcdi-disable-hooks). The
# package's postinst (`nvidia-ctk config --in-place`) fills in every other key around it.
RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"
LAB_RUNTIME_SETTINGS = (
    b"# gpuprov lab: the simulated kernel module has no /proc/driver/nvidia/params inside containers.\n"
    b"[nvidia-container-runtime.modes.jit-cdi]\n"
    b'nvcdi-disable-hooks = ["disable-device-node-modification"]\n'
)


NVIDIA_CONTAINER_CLI = f"""#!/bin/sh
# nvidia-container-cli: {SIMULATED} (libnvidia-container needs NVIDIA's driver libraries).
case "$1" in
  --version|-V) printf 'cli-version: {VERSION}\\nlib-version: {VERSION}\\n' ;;
  *) echo "nvidia-container-cli: $1: not provided by the gpuprov lab ({SIMULATED})" >&2; exit 1 ;;
esac
"""


def _real(rel: str) -> bytes:
    return vendor.artifact(ARTIFACT, rel).read_bytes()


def _control_field(package: str, field: str) -> list[str]:
    """A relation field of one package in NVIDIA's debian/control, with @VERSION@ filled in."""
    text = vendor.artifact(ARTIFACT, "packaging/control").read_text()
    for stanza in re.split(r"\n\s*\n", text):
        if re.search(rf"^Package:\s*{re.escape(package)}\s*$", stanza, re.M):
            m = re.search(rf"^{field}:\s*(.*(?:\n[ \t].*)*)", stanza, re.M)
            if not m:
                return []
            items = [i.strip() for i in m.group(1).replace("\n", " ").split(",")]
            return [i.replace("@VERSION@", FULL) for i in items if i and not i.startswith("${")]
    raise ValueError(f"{package} is not in NVIDIA's debian/control")


def _relations(package: str) -> dict[str, list[str]]:
    """Depends, Breaks and Replaces of one package in NVIDIA's debian/control."""
    return {field.lower(): _control_field(package, field) for field in ("Depends", "Breaks", "Replaces")}


# The units debian/nvidia-container-toolkit-base.install ships; `dh --with systemd` (debhelper compat 9,
# debian/compat) enables and starts each of them from the package's scripts.
UNITS = ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service")


def _maintscript_helpers(package: str) -> str:
    """dh_installdeb's rendering of debian/<package>.maintscript: each line becomes a
    dpkg-maintscript-helper call in preinst, postinst and postrm (what rm_conffile needs)."""
    path = vendor.artifact(ARTIFACT, "packaging").joinpath(f"{package}.maintscript")
    if not path.exists():
        return ""
    lines = []
    for line in path.read_text().splitlines():
        if line.strip():
            args = line.strip().replace("@VERSION@", FULL)
            lines.append(f'dpkg-maintscript-helper {args} -- "$@"\n')
    return "".join(lines)


def _script(package: str, kind: str, units: tuple[str, ...] = ()) -> str:
    """NVIDIA's maintainer script with debhelper's #DEBHELPER# token replaced by what debhelper puts
    there: the maintscript helpers and, for the units the package ships, their enable/start snippets."""
    path = vendor.artifact(ARTIFACT, "packaging").joinpath(f"{package}.{kind}")
    added = _maintscript_helpers(package) if kind in ("preinst", "postinst", "postrm") else ""
    added += "".join(systemd_scripts(unit).get(kind, "") for unit in units)
    if path.exists():
        return path.read_text().replace("#DEBHELPER#\n", added)
    return added


def packages() -> list[SimPackage]:
    label = f"{SIMULATED} NVIDIA Container Toolkit {VERSION}"
    libraries: dict[str, SimFile] = {}
    for lib in ("libnvidia-container", "libnvidia-container-go"):
        libraries[f"{LIBDIR}/{lib}.so.{VERSION}"] = SimFile(shared_object(f"{lib}.so.1", f"{label} {lib}"))
        libraries[f"{LIBDIR}/{lib}.so.1"] = SimFile(link_to=f"{lib}.so.{VERSION}")
    real = REAL.format(version=VERSION)
    # Where debian/nvidia-container-toolkit-base.install puts NVIDIA's systemd units and their env file
    # (only the env file is a conffile: it is under /etc).
    units = {f"/lib/systemd/system/{name}": SimFile(_real(f"systemd/{name}")) for name in UNITS}
    env_file = "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"
    units[env_file] = SimFile(_real("systemd/nvidia-cdi-refresh.env") + LAB_CDI_SETTINGS)
    units[RUNTIME_CONFIG] = SimFile(LAB_RUNTIME_SETTINGS)
    pkg = functools.partial(SimPackage, version=FULL, repo=NCT_REPO, homepage=HOMEPAGE)
    return [
        pkg(
            name="libnvidia-container1",
            description="NVIDIA container runtime library",
            section="libs",
            files=libraries,
            maintainer_scripts={"triggers": "activate-noawait ldconfig\n"},
        ),
        pkg(
            name="libnvidia-container-tools",
            description="NVIDIA container runtime library (command-line tools)",
            depends=[f"libnvidia-container1 (>= {FULL})"],
            section="utils",
            files={"/usr/bin/nvidia-container-cli": SimFile(NVIDIA_CONTAINER_CLI, 0o755)},
        ),
        pkg(
            name="nvidia-container-toolkit-base",
            description="NVIDIA Container Toolkit Base",
            **_relations("nvidia-container-toolkit-base"),
            section="utils",
            files={
                "/usr/bin/nvidia-ctk": SimFile(_real("bin/nvidia-ctk"), 0o755),
                "/usr/bin/nvidia-container-runtime": SimFile(_real("bin/nvidia-container-runtime"), 0o755),
                "/usr/bin/nvidia-cdi-hook": SimFile(_real("bin/nvidia-cdi-hook"), 0o755),
                **units,
            },
            conffiles=[env_file, RUNTIME_CONFIG],
            maintainer_scripts={
                kind: script
                for kind in ("preinst", "postinst", "prerm", "postrm")
                if (script := _script("nvidia-container-toolkit-base", kind, UNITS))
            },
            real=real,
        ),
        pkg(
            name="nvidia-container-toolkit",
            description="NVIDIA Container toolkit",
            **_relations("nvidia-container-toolkit"),
            section="utils",
            files={
                "/usr/bin/nvidia-container-runtime-hook": SimFile(
                    _real("bin/nvidia-container-runtime-hook"), 0o755
                ),
            },
            maintainer_scripts={
                "postinst": _script("nvidia-container-toolkit", "postinst"),
                "postrm": _script("nvidia-container-toolkit", "postrm"),
            },
            real=real,
        ),
    ]
