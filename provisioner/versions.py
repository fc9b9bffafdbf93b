"""Which versions go together: the version matrix (versions.yaml beside this file), checked before any
host is touched, and rendered for docs/versions.md.

The matrix holds what gpuprov installs (the Kubernetes minors and their pins) and what the vendors say
about combinations (the GPU Operator's supported Kubernetes minors, validated driver branches and
operating systems), every cell with its sources. A combination a source calls unsupported is bad input:
the inventory asks for something that would install and then fail or go unsupported. Host-side facts
(the containerd a host runs) are checked by the roles once connected, from the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from provisioner.content import role_default

MATRIX_FILE = Path(__file__).with_name("versions.yaml")


@dataclass(frozen=True)
class OperatorRelease:
    chart_version: str
    kubernetes: tuple[str, str]  # first and last supported minor
    driver_branches: tuple[str, ...]  # validated by NVIDIA's component matrix (empty: not recorded)
    container_toolkit: str
    sources: tuple[str, ...]

    def supports(self, minor: str) -> bool:
        return _minor_key(self.kubernetes[0]) <= _minor_key(minor) <= _minor_key(self.kubernetes[1])


@dataclass(frozen=True)
class Matrix:
    sources: dict[str, str]
    kubernetes: dict[str, dict[str, Any]]
    gpu_operator: dict[str, OperatorRelease]
    operating_systems: dict[str, dict[str, Any]]


def _minor_key(minor: str) -> tuple[int, int]:
    major, _, rest = str(minor).partition(".")
    return int(major), int(rest.split(".")[0])


@cache
def load(path: Path = MATRIX_FILE) -> Matrix:
    """The matrix, with every cell's sources resolved (a dangling source name is a defect of the file)."""
    doc = yaml.safe_load(path.read_text())
    sources = {str(k): " ".join(str(v).split()) for k, v in doc["sources"].items()}

    def cited(entry: dict[str, Any], where: str) -> tuple[str, ...]:
        names = tuple(entry.get("sources") or ())
        missing = [n for n in names if n not in sources]
        if not names or missing:
            raise ValueError(f"{path}: {where}: every entry needs sources (unknown: {missing})")
        return names

    operators = {}
    for version, entry in doc["gpu_operator"].items():
        first, last = entry["kubernetes"]
        operators[str(version)] = OperatorRelease(
            chart_version=str(version),
            kubernetes=(str(first), str(last)),
            driver_branches=tuple(str(b) for b in entry.get("driver_branches") or ()),
            container_toolkit=str(entry.get("container_toolkit") or ""),
            sources=cited(entry, f"gpu_operator.{version}"),
        )
    kubernetes = {str(k): dict(v) for k, v in doc["kubernetes"].items()}
    for minor, entry in kubernetes.items():
        cited(entry, f"kubernetes.{minor}")
    systems = {str(k): dict(v) for k, v in doc["operating_systems"].items()}
    for name, entry in systems.items():
        cited(entry, f"operating_systems.{name}")
    return Matrix(sources=sources, kubernetes=kubernetes, gpu_operator=operators, operating_systems=systems)


def _effective(hostvars: dict[str, Any], role: str, knob: str) -> str | None:
    """What a host gets for a knob: the inventory's value, else the role's default; None for a template
    (only Ansible can render it) or a value of the wrong shape (reported by the settings check)."""
    value = hostvars.get(knob, role_default(role, knob))
    if value is None or isinstance(value, bool | dict | list):
        return None
    text = str(value)
    return None if "{{" in text or "{%" in text else text


def problems(hostvars: dict[str, Any]) -> list[tuple[str, str]]:
    """(knob, why) for each combination of one host's versions that the matrix's sources call
    unsupported."""
    minor = _effective(hostvars, "kubernetes", "kubernetes_minor")
    chart = _effective(hostvars, "gpu_operator", "gpu_operator_chart_version")
    return list(_verdict(minor, chart))


@cache
def _verdict(minor: str | None, chart: str | None) -> tuple[tuple[str, str], ...]:
    """problems() for one pair of values (a fleet's hosts share them: judged once)."""
    matrix = load()
    found: list[tuple[str, str]] = []
    if minor is None or chart is None or minor not in matrix.kubernetes:
        return ()  # an unknown minor is the settings check's (its choices)
    release = matrix.gpu_operator.get(chart)
    if release is None:
        known = ", ".join(matrix.gpu_operator)
        found.append(
            (
                "gpu_operator_chart_version",
                f"{chart} is not in gpuprov's version matrix (known: {known}); which Kubernetes minors "
                "it supports is unknown",
            )
        )
    elif not release.supports(minor):
        first, last = release.kubernetes
        fits = [v for v, r in matrix.gpu_operator.items() if r.supports(minor)]
        found.append(
            (
                "gpu_operator_chart_version",
                f"GPU Operator {chart} supports Kubernetes {first} to {last}, not kubernetes_minor {minor} "
                f"(sources: {', '.join(release.sources)}, docs/versions.md); for {minor}: "
                f"{', '.join(fits) or 'none known'}",
            )
        )
    return tuple(found)


# ---------------------------------------------------------------------------------- docs/versions.md


def markdown_tables(matrix: Matrix | None = None) -> str:
    """The matrix as docs/versions.md shows it (between its generated-section markers)."""
    m = matrix or load()
    minors = sorted(
        {
            f"1.{n}"
            for r in m.gpu_operator.values()
            for n in range(_minor_key(r.kubernetes[0])[1], _minor_key(r.kubernetes[1])[1] + 1)
        },
        key=_minor_key,
    )
    out = ["### GPU Operator × Kubernetes", ""]
    heads = ["GPU Operator", *minors, "driver branches validated", "toolkit", "sources"]
    out.append("| " + " | ".join(heads) + " |")
    out.append("|---" * (len(minors) + 4) + "|")
    for version, r in m.gpu_operator.items():
        cells = ["yes" if r.supports(minor) else "no" for minor in minors]
        branches = ", ".join(r.driver_branches) or "not recorded"
        out.append(
            f"| {version} | "
            + " | ".join(cells)
            + f" | {branches} | {r.container_toolkit or 'not recorded'} | {', '.join(r.sources)} |"
        )
    out += ["", "### What gpuprov installs per Kubernetes minor", ""]
    out.append("| minor | kubeadm, kubelet, kubectl | kubernetes-cni | cri-tools | pause | etcd | CoreDNS "
               "| containerd | sources |")  # fmt: skip
    out.append("|---" * 9 + "|")
    for minor, k in m.kubernetes.items():
        out.append(
            f"| {minor} | {k['packages']} | {k['kubernetes_cni']} | {k['cri_tools']} | {k['pause']} | "
            f"{k['etcd']} | {k['coredns']} | {k['containerd_min']} and later | {', '.join(k['sources'])} |"
        )
    out += ["", "### Operating systems", ""]
    out.append("| system | GPU Operator | distribution's containerd | NVIDIA driver branches | sources |")
    out.append("|---" * 5 + "|")
    for name, s in m.operating_systems.items():
        branches = f"{s['driver_branches_from']} and later" if "driver_branches_from" in s else "any"
        out.append(
            f"| {name} | {s['gpu_operator']} | {s.get('containerd', 'see the release')} | {branches} | "
            f"{', '.join(s['sources'])} |"
        )
    out += ["", "### Sources", ""]
    out += [f"- **{name}**: {text}" for name, text in m.sources.items()]
    return "\n".join(out) + "\n"
