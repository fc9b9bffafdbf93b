"""The Debian packages installed (dpkg-query) and held (dpkg's selections)."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.probes.base import HostFacts, ParseError, Probe

PACKAGES = "packages.tsv"
APT_HOLDS = "apt-holds.txt"

PROBES: tuple[Probe, ...] = (
    Probe(
        PACKAGES,
        "dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'",
        30,
        "installed packages",
    ),
    # The same dpkg selection state `apt-mark showhold` reports, without loading the apt cache
    # (apt-mark takes ~1 s of CPU per host; this takes ~10 ms).
    Probe(APT_HOLDS, "dpkg --get-selections '*' | awk '$2 == \"hold\" {print $1}'", 20, "held packages"),
)


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    status: str  # dpkg's db:Status-Abbrev, e.g. "ii ", "hi "

    @property
    def installed(self) -> bool:
        return len(self.status) >= 2 and self.status[1] in "iWt"

    @property
    def held(self) -> bool:
        return self.status[:1] == "h"


def parse_packages(text: str) -> dict[str, Package]:
    pkgs: dict[str, Package] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 3 or not parts[0]:
            raise ParseError(f"packages.tsv line {n}: expected package<TAB>version<TAB>status: {line[:80]!r}")
        name = parts[0].strip()
        pkgs[name] = Package(name, parts[1].strip(), parts[2])
    return pkgs


def parse_holds(text: str) -> set[str]:
    held: set[str] = set()
    for line in text.splitlines():
        name = line.strip()
        if not name:
            continue
        if " " in name or "\t" in name:
            raise ParseError(f"apt-holds.txt: not a package name: {name[:60]!r}")
        held.add(name.split(":", 1)[0])
    return held


def packages(facts: HostFacts) -> dict[str, Package]:
    return facts.parsed("pkgs", lambda: parse_packages(facts.ok_text(PACKAGES)))


def installed(facts: HostFacts) -> set[str]:
    return {name for name, pkg in packages(facts).items() if pkg.installed}


def holds(facts: HostFacts) -> set[str]:
    return facts.parsed("holds", lambda: parse_holds(facts.ok_text(APT_HOLDS)))
