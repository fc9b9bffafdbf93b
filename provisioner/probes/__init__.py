"""Read-only probes: what runs on a host, the pure parsers for what it prints, and the accessors the
checks read them through, one module per domain (pyinfra's facts: a fact's command, parser and accessor
in one place). This module collects them.

The probe set IS the host-snapshot contract (shared design: host-snapshot.md): a probe's name is
the file `gpuprov snapshot` writes. Every probe for a host runs in ONE shell script over ONE
channel (probes.script).

The remote side is POSIX sh with coreutils only: no bash-isms, no lspci/systemctl/journalctl/
mokutil required (the real H200 host has none of them). Parsers take text and return plain data,
raising ParseError on garbled or truncated input; they never touch a host.
"""

from __future__ import annotations

from provisioner.probes import (
    container,
    cuda,
    dcgm,
    exporter,
    host,
    kernel_log,
    kubernetes,
    mig,
    nvbandwidth,
    packages,
    smi,
    system,
)
from provisioner.probes.base import Probe

_DOMAINS = (
    system, host, smi, kernel_log, cuda, packages, container, kubernetes, dcgm, mig, exporter, nvbandwidth,
)  # fmt: skip
_LIVE: dict[str, Probe] = {p.name: p for domain in _DOMAINS for p in domain.PROBES}
# The order hosts run the probes in and a snapshot's meta.json lists them: the contract's.
PROBES: tuple[Probe, ...] = tuple(
    _LIVE[name]
    for name in (
        system.OS_RELEASE,
        system.UNAME_R,
        host.HOST_FACTS,
        smi.SMI_XML,
        smi.SMI_VERSION,
        smi.SMI_NVLINK,
        kernel_log.KERNEL_LOG,
        cuda.NVCC_VERSION,
        packages.PACKAGES,
        packages.APT_HOLDS,
        system.SERVICES,
        system.SERVICE_PROCESSES,
        container.DOCKER_DAEMON,
        container.CONTAINERD_CONFIG,
        container.CONTAINERD_DUMP,
        kubernetes.KUBE_NODE,
        dcgm.DCGM_DIAG,
        container.SMOKE,
        mig.SMI_LIST,
        exporter.DCGM_EXPORTER,
        kubernetes.KUBE_TENANTS,
        # What `certify` reads besides verify's: who the host is, the longer DCGM levels, nvbandwidth.
        system.HOST_IDENTITY,
        dcgm.DCGM_DIAG_R2,
        dcgm.DCGM_DIAG_R3,
        nvbandwidth.NVBANDWIDTH,
    )
)
assert len(PROBES) == len(_LIVE), "every domain's probe has its place in the probe order"
LEGACY_PROBES: tuple[Probe, ...] = host.LEGACY_PROBES
PROBES_BY_NAME: dict[str, Probe] = {p.name: p for p in (*PROBES, *LEGACY_PROBES)}
# What `gpuprov snapshot` writes: every read-only probe. The DCGM diagnostics, nvbandwidth and the
# container smoke test exercise the GPU (and the smoke test needs an image named by a policy), so a
# support snapshot leaves them out; `verify` and `certify` run them. The host's identity (hostname,
# machine ID) only tells `certify` which node to label, so a snapshot does not carry it either.
_EXERCISE = (container.SMOKE, nvbandwidth.NVBANDWIDTH, *dcgm.DIAG_PROBE.values())
_NOT_IN_SNAPSHOTS = (*_EXERCISE, system.HOST_IDENTITY)
SNAPSHOT_PROBES: tuple[str, ...] = tuple(p.name for p in PROBES if p.name not in _NOT_IN_SNAPSHOTS)
