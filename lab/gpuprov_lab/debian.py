"""Real Debian packages of any suite (bookworm, trixie, sid), fetched on this machine for the lab and
the tests: containerd of each generation, docker.io, runc, NVIDIA's nvidia-smi (non-free), and the tools
tests run for real.

Each suite gets its own apt state under the cache (lists, downloaded .debs), so this machine's own apt
configuration and package state are never touched. Packages are fetched with ``apt-get download``
(no dependency resolution, nothing installed) and unpacked with ``dpkg-deb -x`` into a directory per
package version, which is what tests run binaries from. The Debian archive is the one this machine's
apt already uses (``GPUPROV_LAB_DEBIAN_MIRROR`` overrides it).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from gpuprov_lab import paths, proc
from gpuprov_lab.errors import LabError

# The Debian release of this machine's own apt sources: the archive URL is found from them.
MACHINE_SUITE = "bookworm"
# Suites the lab knows, and what each stands for in the lab.
SUITES = ("bookworm", "trixie", "sid")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# non-free for NVIDIA's own nvidia-smi binary, which Debian redistributes there.
COMPONENTS = "main non-free"
# Package lists are refreshed when older than this (sid moves daily; the others rarely).
LISTS_MAX_AGE_S = 24 * 3600


@dataclass(frozen=True)
class Unpacked:
    """One real Debian package, downloaded and unpacked."""

    name: str
    version: str
    suite: str
    deb: Path
    root: Path

    def path(self, rel: str) -> Path:
        """A file of the package (``usr/bin/containerd``)."""
        return self.root / rel.lstrip("/")


def debian_mirror_url() -> str:
    """The Debian archive this machine's apt uses for bookworm main (GPUPROV_LAB_DEBIAN_MIRROR wins)."""
    explicit = os.environ.get("GPUPROV_LAB_DEBIAN_MIRROR")
    if explicit:
        return explicit.rstrip("/")
    found = _mirror_from_sources(Path("/etc/apt"))
    if not found:
        raise LabError(
            "no apt source for Debian bookworm main in /etc/apt; "
            "set GPUPROV_LAB_DEBIAN_MIRROR to a Debian archive URL"
        )
    return found


def _mirror_from_sources(etc_apt: Path) -> str | None:
    files = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*"))]
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
                if (
                    "deb" in fields.get("types", "").split()
                    and MACHINE_SUITE in fields.get("suites", "").split()
                    and "main" in fields.get("components", "").split()
                    and fields.get("enabled", "yes").lower() != "no"
                    and fields.get("uris")
                ):
                    return fields["uris"].split()[0].rstrip("/")
        elif f.name == "sources.list" or f.suffix == ".list":
            for line in text.splitlines():
                words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
                if (
                    len(words) >= 4
                    and words[0] == "deb"
                    and words[2] == MACHINE_SUITE
                    and "main" in words[3:]
                ):
                    return words[1].rstrip("/")
    return None


def _suite(suite: str) -> str:
    if suite not in SUITES:
        raise LabError(f"Debian suite {suite!r} is not one the lab knows ({', '.join(SUITES)})")
    return suite


def state_dir(suite: str) -> Path:
    return paths.cache_root() / "apt" / _suite(suite)


def _apt_options(suite: str) -> list[str]:
    root = state_dir(suite)
    return [
        "-o", f"Dir::Etc::SourceList={root / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={root / 'lists'}",
        "-o", f"Dir::Cache={root / 'cache'}",
        "-o", "Dir::State::Status=/dev/null",
        # The downloads land in the cache, which the unprivileged _apt user may not be able to write.
        "-o", "APT::Sandbox::User=root",
        "-o", "Debug::NoLocking=1",
    ]  # fmt: skip


def _prepare(suite: str) -> list[str]:
    root = state_dir(suite)
    for sub in ("lists/partial", "cache/archives/partial", "debs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    source = f"deb [signed-by={KEYRING}] {debian_mirror_url()} {suite} {COMPONENTS}\n"
    sources = root / "sources.list"
    if not sources.exists() or sources.read_text() != source:
        sources.write_text(source)
        for old in (root / "lists").glob("*_Packages*"):
            old.unlink()
    return _apt_options(suite)


def update(suite: str, *, force: bool = False) -> None:
    """Refresh the suite's package lists when they are missing or old."""
    opts = _prepare(suite)
    lists = list((state_dir(suite) / "lists").glob("*_Packages*"))
    fresh = lists and time.time() - min(f.stat().st_mtime for f in lists) < LISTS_MAX_AGE_S
    if fresh and not force:
        return
    proc.run(["apt-get", *opts, "-q", "update"], timeout=600, what=f"apt-get update ({suite})")


def candidate(suite: str, name: str) -> str:
    """The version of a package the suite offers now."""
    update(suite)
    res = proc.run(["apt-cache", *_apt_options(suite), "policy", name], what=f"apt-cache policy {name}")
    m = re.search(r"^\s*Candidate:\s*(\S+)", res.stdout, re.M)
    if not m or m.group(1) == "(none)":
        raise LabError(f"Debian {suite} has no package {name!r}")
    return m.group(1)


def download(suite: str, name: str, version: str | None = None) -> Path:
    """The .deb of ``name`` (at ``version``, else the suite's candidate), downloaded once."""
    version = version or candidate(suite, name)
    debs = state_dir(suite) / "debs"
    # apt-get download names a file after the version with its epoch's colon as %3a (1%3a1.4.8-2).
    quoted = version.replace(":", "%3a")

    def found_files() -> list[Path]:
        return sorted(debs.glob(f"{name}_{quoted}_*.deb")) + sorted(
            debs.glob(f"{name}_{version.split(':', 1)[-1]}_*.deb")
        )

    found = found_files()
    if found:
        return found[0]
    _prepare(suite)
    proc.run(
        ["apt-get", *_apt_options(suite), "-q", "download", f"{name}={version}"],
        cwd=debs,
        timeout=900,
        what=f"apt-get download {name}={version} ({suite})",
    )
    found = found_files()
    if not found:
        raise LabError(f"apt-get download {name}={version} ({suite}) left no .deb in {debs}")
    return found[0]


def unpacked(suite: str, name: str, version: str | None = None) -> Unpacked:
    """The package unpacked into the cache (once per version)."""
    deb = download(suite, name, version)
    version = proc.run(["dpkg-deb", "-f", str(deb), "Version"], what="dpkg-deb -f").stdout.strip()
    root = paths.cache_root() / "real" / f"{name}_{version.replace(':', '%3a')}"
    if not (root / ".complete").exists():
        tmp = root.with_name(root.name + f".tmp-{os.getpid()}")
        proc.run(["rm", "-rf", str(tmp)], what="rm")
        tmp.mkdir(parents=True)
        proc.run(["dpkg-deb", "-x", str(deb), str(tmp)], what=f"dpkg-deb -x {deb.name}")
        (tmp / ".complete").touch()
        proc.run(["rm", "-rf", str(root)], what="rm")
        os.replace(tmp, root)
    return Unpacked(name, version, suite, deb, root)
