"""The operating systems a lab host can run, chosen per host: three containerd generations.

- ``bookworm``: Debian 12 with its own docker.io 20.10 and containerd 1.6 (no CDI).
- ``trixie``: Debian 13 with its own docker.io 26.1 and containerd 1.7 (CDI off by default).
- ``trixie-containerd2``: Debian 13 whose docker.io (28.5), containerd (2.1) and runc come from Debian sid:
  a lab-only flavour, the way to have the containerd 2.x generation (config version 3, CDI on by
  default) on a release NVIDIA's repositories serve.

Every package is Debian's real one. The host's apt source names the lab archive suite of its flavour
(the flavour's name); the NVIDIA side comes from the CUDA repository of its Debian release. NVIDIA's
debian13 repository starts with driver branch 590 and CUDA 13.1, so the lab's inventory gives hosts of
the Debian 13 flavours those settings, as a real Debian 13 site must.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.errors import InputError


@dataclass(frozen=True)
class Flavour:
    name: str
    suite: str  # the Debian release of the host's root filesystem
    description: str
    # Packages taken from another Debian suite (with what they depend on from there): (name, suite).
    from_suite: tuple[tuple[str, str], ...] = ()
    # Packages the roles install on this release only (its archive must have them).
    packages: tuple[str, ...] = ()
    # Settings the lab's inventory gives hosts of this flavour (what NVIDIA's repositories for its
    # release need); none = the roles' defaults.
    host_vars: tuple[tuple[str, object], ...] = ()

    @property
    def version_id(self) -> str:
        """VERSION_ID of the release's /etc/os-release."""
        return {"bookworm": "12", "trixie": "13"}[self.suite]

    @property
    def archive_suite(self) -> str:
        """The suite name of this flavour in the lab's Debian archive."""
        return self.name


DEBIAN13_VARS = (
    ("nvidia_driver_branch", "590"),
    ("nvidia_driver_version", "590.48.01"),
    ("cuda_toolkit_versions", ["13.1"]),
)
FLAVOURS: dict[str, Flavour] = {
    "bookworm": Flavour("bookworm", "bookworm", "Debian 12: docker.io 20.10, containerd 1.6"),
    # Debian 13's docker.io only recommends its CLI, docker-cli (the docker role installs it there).
    "trixie": Flavour(
        "trixie",
        "trixie",
        "Debian 13: docker.io 26.1, containerd 1.7",
        packages=("docker-cli",),
        host_vars=DEBIAN13_VARS,
    ),
    "trixie-containerd2": Flavour(
        "trixie-containerd2",
        "trixie",
        "Debian 13 with sid's docker.io 28.5, containerd 2.1 and runc (lab-only)",
        from_suite=(("containerd", "sid"), ("runc", "sid"), ("docker.io", "sid"), ("docker-cli", "sid")),
        packages=("docker-cli",),
        host_vars=DEBIAN13_VARS,
    ),
}
# The control plane's flavour, and the GPU hosts' in order (the default lab mixes the generations).
CONTROL_PLANE_FLAVOUR = "bookworm"
DEFAULT_WORKER_FLAVOURS = ("trixie", "bookworm", "trixie-containerd2")


def get(name: str) -> Flavour:
    if name not in FLAVOURS:
        raise InputError(f"lab host OS {name!r} is not one of {', '.join(FLAVOURS)}")
    return FLAVOURS[name]


def parse(text: str | None) -> list[str] | None:
    """`--os bookworm,trixie,...` (one per GPU host, in order)."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("--os: name at least one of " + ", ".join(FLAVOURS))
    for n in names:
        get(n)
    return names
