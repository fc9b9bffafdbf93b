"""Part of the gpuprov lab simulation: simulated Debian packages and how they are built.

A :class:`SimPackage` carries the real package name, version and file paths of a vendor package that
cannot be had here (NVIDIA driver, CUDA, container toolkit, ...). :func:`build_deb` turns it into a
.deb with ``dpkg-deb --root-owner-group --build``; its Description says it is simulated, and the
output is byte-for-byte the same for the same input (fixed mtimes, sorted trees), so the lab mirror
is only rebuilt when a package really changes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov_lab.errors import LabError

SIMULATED = "SIMULATED (gpuprov lab)"
MAINTAINER = "gpuprov lab simulation <lab@gpuprov.invalid>"
# Every file and directory in a sim .deb carries this mtime (2025-01-01T00:00:00Z).
EPOCH = 1735689600
SCRIPTS = ("preinst", "postinst", "prerm", "postrm", "config", "triggers")
_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_VERSION = re.compile(r"^(\d+:)?[0-9][A-Za-z0-9.+~-]*$")


@dataclass(frozen=True)
class SimFile:
    """One file of a package: content and mode, or a symlink when ``link_to`` is set."""

    content: bytes | str = b""
    mode: int = 0o644
    link_to: str | None = None

    def data(self) -> bytes:
        return self.content.encode() if isinstance(self.content, str) else self.content


@dataclass
class SimPackage:
    """A simulated package with the real name, version and paths of the vendor's package."""

    name: str
    version: str
    repo: str | list[str]
    description: str
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    files: dict[str, SimFile] = field(default_factory=dict)
    maintainer_scripts: dict[str, str] = field(default_factory=dict)
    conffiles: list[str] = field(default_factory=list)
    arch: str = "amd64"
    pre_depends: list[str] = field(default_factory=list)
    recommends: list[str] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    section: str = "multiverse/devel"
    priority: str = "optional"
    homepage: str = ""
    long_description: str = ""
    # What in the package is the vendor's real software (empty: all of it is simulated). Said in the
    # Description instead of the SIMULATED label, next to what is still simulated.
    real: str = ""

    @property
    def filename(self) -> str:
        """The pool file name, as dpkg-name would give it (the epoch is not part of it)."""
        version = self.version.split(":", 1)[-1]
        return f"{self.name}_{version}_{self.arch}.deb"

    def validate(self) -> None:
        if not _NAME.match(self.name):
            raise LabError(f"sim package {self.name!r}: not a Debian package name")
        if not _VERSION.match(self.version):
            raise LabError(f"sim package {self.name}: version {self.version!r} is not a Debian version")
        for script in self.maintainer_scripts:
            if script not in SCRIPTS:
                raise LabError(f"sim package {self.name}: unknown maintainer script {script!r}")
        for path, f in self.files.items():
            if not path.startswith("/") or "/../" in f"{path}/" or path.endswith("/"):
                raise LabError(f"sim package {self.name}: file path {path!r} must be absolute")
            if not isinstance(f, SimFile):
                raise LabError(f"sim package {self.name}: {path} is not a SimFile")
        for conffile in self.conffiles:
            if conffile not in self.files or self.files[conffile].link_to is not None:
                raise LabError(f"sim package {self.name}: conffile {conffile} is not a regular file of it")


def control_text(pkg: SimPackage, installed_size_kib: int) -> str:
    """The DEBIAN/control paragraph; the synopsis ends with the SIMULATED label."""
    synopsis = pkg.description.strip().splitlines()[0] if pkg.description.strip() else pkg.name
    fields: list[tuple[str, str]] = [
        ("Package", pkg.name),
        ("Version", pkg.version),
        ("Architecture", pkg.arch),
        ("Maintainer", MAINTAINER),
        ("Installed-Size", str(installed_size_kib)),
        ("Pre-Depends", ", ".join(pkg.pre_depends)),
        ("Depends", ", ".join(pkg.depends)),
        ("Recommends", ", ".join(pkg.recommends)),
        ("Conflicts", ", ".join(pkg.conflicts)),
        ("Breaks", ", ".join(pkg.breaks)),
        ("Replaces", ", ".join(pkg.replaces)),
        ("Provides", ", ".join(pkg.provides)),
        ("Section", pkg.section),
        ("Priority", pkg.priority),
        ("Homepage", pkg.homepage),
    ]
    lines = [f"{k}: {v}" for k, v in fields if v]
    if pkg.real:
        body = [
            "Packaged by the gpuprov lab (not the vendor's .deb) from the vendor's real software:",
            *textwrap.wrap(pkg.real, 90),
        ]
        label = "gpuprov lab build"
    else:
        body = [
            f"This package is {SIMULATED}: it has the real package's name, version and file",
            "paths, and its tools answer from the lab host's simulated hardware. It does not contain",
            "the vendor's software and works only on gpuprov lab hosts.",
        ]
        label = SIMULATED
    if pkg.long_description.strip():
        body = [*pkg.long_description.strip().splitlines(), ".", *body]
    lines.append(f"Description: {synopsis} - {label}")
    lines += [" " + (ln if ln.strip() and ln != "." else ".") for ln in body]
    return "\n".join(lines) + "\n"


def _script_text(name: str, text: str) -> str:
    # A script that starts with "#!" is the vendor's own, used as it is.
    if name in ("triggers",) or text.startswith("#!"):
        return text if text.endswith("\n") else text + "\n"
    return f"#!/bin/sh\n# {SIMULATED}: maintainer script\nset -e\n{text.rstrip()}\n"


def _write_tree(pkg: SimPackage, root: Path) -> int:
    """Lay the package out under root; return its installed size in KiB."""
    size = 0
    for path, f in sorted(pkg.files.items()):
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.link_to is not None:
            target.symlink_to(f.link_to)
            continue
        data = f.data()
        target.write_bytes(data)
        target.chmod(f.mode)
        size += (len(data) + 1023) // 1024 or 1
    control = root / "DEBIAN"
    control.mkdir(mode=0o755, exist_ok=True)
    for name, text in sorted(pkg.maintainer_scripts.items()):
        script = control / name
        script.write_text(_script_text(name, text))
        script.chmod(0o644 if name == "triggers" else 0o755)
    if pkg.conffiles:
        (control / "conffiles").write_text("".join(f"{c}\n" for c in pkg.conffiles))
    md5 = []
    for path, f in sorted(pkg.files.items()):
        if f.link_to is None:
            md5.append(f"{hashlib.md5(f.data()).hexdigest()}  {path.lstrip('/')}\n")
    if md5:
        (control / "md5sums").write_text("".join(md5))
    (control / "control").write_text(control_text(pkg, max(size, 1)))
    return size


def _fix_tree(root: Path) -> None:
    """Directories 0755 and every entry at the fixed mtime, so the archive is reproducible."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            if not p.is_symlink() and p.is_dir():
                p.chmod(0o755)
            os.utime(p, (EPOCH, EPOCH), follow_symlinks=False)
    root.chmod(0o755)
    os.utime(root, (EPOCH, EPOCH))


def build_deb(pkg: SimPackage, out_dir: Path | str) -> Path:
    """Build pkg into out_dir/<name>_<version>_<arch>.deb (deterministic); return its path."""
    pkg.validate()
    if not shutil.which("dpkg-deb"):
        raise LabError("dpkg-deb is not installed (it builds the lab's simulated packages)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    deb = out / pkg.filename
    with tempfile.TemporaryDirectory(prefix=f"simdeb-{pkg.name}-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        _write_tree(pkg, root)
        _fix_tree(root)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "SOURCE_DATE_EPOCH": str(EPOCH),
            "LC_ALL": "C",
        }
        res = subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z6", "--build", str(root), str(deb)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if res.returncode != 0:
            raise LabError(f"dpkg-deb --build {pkg.name}: {res.stderr.strip()[-400:]}")
    return deb
