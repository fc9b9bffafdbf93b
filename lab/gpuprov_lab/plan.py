"""What a lab should contain: host names, addresses and hardware profiles (validated before anything
is touched).

Hosts are ``cp1`` (the Kubernetes control plane, no GPU) and ``gpu1..gpuN-1``; workers take the
profiles given, else the default order of docs/contracts.md, and the operating systems given
(``--os``), else one of each containerd generation in turn (:mod:`gpuprov_lab.distros`). The
profiles themselves (GPU counts, the ``profile.json`` document the in-host emulation reads) come from
:mod:`gpuprov_lab.sim.profiles`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from typing import Any

from gpuprov_lab import distros
from gpuprov_lab.errors import LabError
from gpuprov_lab.sim import profiles
from provisioner.errors import InputError

CONTROL_PLANE = "cp1"
NO_GPU = "cpu"  # the control plane's profile: a host without GPUs
DEFAULT_WORKER_PROFILES = ("h200", "h100-sxm-8", "a100-4", "l40s")
MAX_HOSTS = 64
# cp1 and one GPU host of each containerd generation.
DEFAULT_HOSTS = 4
FIRST_HOST_OCTET = 10


@dataclass(frozen=True)
class PlannedHost:
    name: str
    index: int
    ip: str
    profile: str
    gpu_count: int
    os: str = distros.CONTROL_PLANE_FLAVOUR

    @property
    def is_gpu(self) -> bool:
        return self.name != CONTROL_PLANE

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PlannedHost:
        return cls(
            **{k: doc[k] for k in ("name", "index", "ip", "profile", "gpu_count")},
            os=doc.get("os", distros.CONTROL_PLANE_FLAVOUR),
        )


def known_profiles() -> dict[str, int]:
    """GPU profile name → GPU count."""
    return {name: p.gpu_count for name, p in profiles.PROFILES.items() if p.gpu_count > 0}


def profile_document(spec: PlannedHost) -> dict[str, Any]:
    """profile.json for a host, as the in-host emulation reads it."""
    return profiles.profile_document(spec.profile, spec.name)


def parse_profiles(value: list[str] | None) -> list[str] | None:
    """Check --profiles names against the known GPU profiles."""
    if value is None:
        return None
    if not value:
        raise InputError("--profiles: empty list")
    known = known_profiles()
    bad = [p for p in value if p not in known]
    if bad:
        raise InputError(
            f"--profiles: unknown profile(s) {', '.join(bad)} (known: {', '.join(sorted(known))})"
        )
    return value


def check_host_count(n: int) -> int:
    if not 1 <= n <= MAX_HOSTS:
        raise InputError(f"--hosts {n}: a lab has 1 to {MAX_HOSTS} hosts (cp1 and gpu1..gpuN-1)")
    return n


def parse_subnet(value: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise InputError(f"--subnet {value!r}: not an IPv4 network ({exc})") from exc
    if not net.is_private:
        raise InputError(f"--subnet {value}: must be a private range (the lab never routes off this machine)")
    if net.num_addresses < FIRST_HOST_OCTET + MAX_HOSTS + 2:
        raise InputError(f"--subnet {value}: too small; use a /24 or larger")
    return net


def gateway(net: ipaddress.IPv4Network) -> str:
    return str(net.network_address + 1)


def host_ip(net: ipaddress.IPv4Network, index: int) -> str:
    return str(net.network_address + FIRST_HOST_OCTET + index)


def host_name(index: int) -> str:
    return CONTROL_PLANE if index == 0 else f"gpu{index}"


def plan(
    count: int,
    net: ipaddress.IPv4Network,
    profiles: list[str] | None,
    existing: dict[str, PlannedHost],
    oses: list[str] | None = None,
) -> list[PlannedHost]:
    """The hosts a lab should have: existing ones keep their profile and OS unless --profiles / --os say
    otherwise."""
    workers = count - 1
    if profiles is not None and len(profiles) > workers:
        raise InputError(
            f"--profiles: {len(profiles)} profiles for {workers} GPU host(s); use --hosts {len(profiles) + 1}"
        )
    gpu_counts = known_profiles()
    specs: list[PlannedHost] = []
    for index in range(count):
        name = host_name(index)
        if index == 0:
            profile = NO_GPU
        elif profiles is not None:
            profile = profiles[(index - 1) % len(profiles)]
        elif name in existing:
            profile = existing[name].profile
        else:
            profile = DEFAULT_WORKER_PROFILES[(index - 1) % len(DEFAULT_WORKER_PROFILES)]
        if profile != NO_GPU and profile not in gpu_counts:
            raise LabError(f"host {name}: profile {profile!r} is not in gpuprov_lab/sim/profiles.yaml")
        if index == 0:
            os_name = distros.CONTROL_PLANE_FLAVOUR
        elif oses is not None:
            os_name = oses[(index - 1) % len(oses)]
        elif name in existing:
            os_name = existing[name].os
        else:
            order = distros.DEFAULT_WORKER_FLAVOURS
            os_name = order[(index - 1) % len(order)]
        specs.append(
            PlannedHost(name, index, host_ip(net, index), profile, gpu_counts.get(profile, 0), os_name)
        )
    return specs
