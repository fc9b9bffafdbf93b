"""The container runtimes: Docker's daemon.json, containerd's config as written and as containerd merges
it (`containerd config dump`), and a container that asks for every GPU (the smoke test)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any

from provisioner.hostnumbers import HostNumberError, parse_int
from provisioner.hosttext import first_line
from provisioner.probes.base import ERROR, HostFacts, ParseError, Probe, Unavailable, parse_json_object

DOCKER_DAEMON = "docker-daemon.json"
CONTAINERD_CONFIG = "containerd-config.toml"
CONTAINERD_DUMP = "containerd-config-dump.toml"
SMOKE = "container-smoke.txt"


def _cat(path: str) -> str:
    """The file's text; a file that is not there is "not applicable" (that engine is not configured)."""
    return f'[ -e {path} ] || {{ echo "{path}: absent" >&2; return 200; }}\ncat {path}'


# What containerd really uses: config.toml with every file it imports merged in, as containerd merges
# them (containerd 1.x lets an imported plugin table replace config.toml's). Reads files only; no
# running daemon needed.
_CONTAINERD_DUMP = r"""
    command -v containerd >/dev/null 2>&1 || { echo "containerd not installed" >&2; return 200; }
    t 20 containerd config dump
"""

_SMOKE = r"""
    [ -n "$SMOKE_IMAGE" ] || { echo "no container.smoke_image configured" >&2; return 200; }
    command -v docker >/dev/null 2>&1 || { echo "docker not installed" >&2; return 200; }
    docker image inspect "$SMOKE_IMAGE" >/dev/null 2>&1 || {
      echo "image $SMOKE_IMAGE is not present locally (pull it first; verify never pulls)" >&2; return 200; }
    t 120 docker run --rm --gpus all "$SMOKE_IMAGE" nvidia-smi -L
"""

PROBES: tuple[Probe, ...] = (
    Probe(DOCKER_DAEMON, _cat("/etc/docker/daemon.json"), 5, "Docker daemon config"),
    Probe(CONTAINERD_CONFIG, _cat("/etc/containerd/config.toml"), 5, "containerd config"),
    Probe(CONTAINERD_DUMP, _CONTAINERD_DUMP, 25, "containerd config dump (config.toml + imports)"),
    Probe(SMOKE, _SMOKE, 130, "nvidia-smi -L in a container with --gpus all"),
)


def parse_toml(text: str, probe: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ParseError(f"{probe}: not valid TOML: {exc}") from exc


@dataclass(frozen=True)
class ContainerdRuntime:
    runtime_type: str
    binary: str


@dataclass(frozen=True)
class ContainerdConfig:
    """The part of `containerd config dump` the checks read (the CRI plugin's runtimes and CDI)."""

    version: int
    runtimes: dict[str, ContainerdRuntime]
    default_runtime: str
    enable_cdi: bool
    imports: list[str]


def parse_containerd_dump(text: str) -> ContainerdConfig:
    """`containerd config dump`: config version 2 (containerd 1.x) keeps the runtimes in the plugin
    "io.containerd.grpc.v1.cri", version 3 (2.x) in "io.containerd.cri.v1.runtime"."""
    data = parse_toml(text, "containerd-config-dump.toml")
    raw = data.get("version") or 1
    try:
        # TOML may hold the version as a float (inf, nan) or a string; only a whole number is a version.
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise HostNumberError("not a whole number")
        version = parse_int(str(raw), lo=1, hi=99, what="version")
    except HostNumberError as exc:
        shown = ascii(raw)[:40]
        raise ParseError(f"containerd-config-dump.toml: version {shown} is not a config version") from exc
    plugins = data.get("plugins") if isinstance(data.get("plugins"), dict) else {}
    cri = plugins.get("io.containerd.cri.v1.runtime" if version >= 3 else "io.containerd.grpc.v1.cri")
    cri = cri if isinstance(cri, dict) else {}
    containerd = cri.get("containerd") if isinstance(cri.get("containerd"), dict) else {}
    runtimes: dict[str, ContainerdRuntime] = {}
    raw = containerd.get("runtimes") if isinstance(containerd.get("runtimes"), dict) else {}
    for name, table in raw.items():
        if isinstance(table, dict):
            options = table.get("options") if isinstance(table.get("options"), dict) else {}
            runtimes[str(name)] = ContainerdRuntime(
                str(table.get("runtime_type", "")), str(options.get("BinaryName", ""))
            )
    imports = data.get("imports") if isinstance(data.get("imports"), list) else []
    return ContainerdConfig(
        version=version,
        runtimes=runtimes,
        default_runtime=str(containerd.get("default_runtime_name", "")),
        enable_cdi=cri.get("enable_cdi") is True,
        imports=[str(i) for i in imports],
    )


def parse_smoke(text: str) -> list[str]:
    gpus = [line.strip() for line in text.splitlines() if re.match(r"^\s*GPU \d+:", line)]
    if not gpus:
        raise ParseError(f"container nvidia-smi -L listed no GPU: {first_line(text)!r}")
    return gpus


def docker_daemon(facts: HostFacts) -> dict[str, Any] | None:
    """/etc/docker/daemon.json: None when absent (not applicable), error when unreadable."""

    def load() -> dict[str, Any] | None:
        res = facts.result(DOCKER_DAEMON)
        if res.not_applicable:
            return None
        if not res.ok:
            raise Unavailable(ERROR, f"{DOCKER_DAEMON}: {res.reason()}")
        return parse_json_object(res.stdout, DOCKER_DAEMON)

    return facts.parsed(DOCKER_DAEMON, load)


def containerd_config(facts: HostFacts) -> ContainerdConfig | None:
    """What `containerd config dump` says containerd uses; None where containerd is not installed."""

    def load() -> ContainerdConfig | None:
        res = facts.result(CONTAINERD_DUMP)
        if res.not_applicable:
            return None
        if not res.ok:
            raise Unavailable(ERROR, f"{CONTAINERD_DUMP}: {res.reason()}")
        return parse_containerd_dump(res.stdout)

    return facts.parsed(CONTAINERD_DUMP, load)


def smoke_gpus(facts: HostFacts) -> list[str]:
    """The GPUs the smoke test's container listed, from a run that succeeded (what a failed run means is
    the check's call)."""
    return facts.parsed("smoke", lambda: parse_smoke(facts.ok_text(SMOKE)))
