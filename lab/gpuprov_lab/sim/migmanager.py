"""Part of the gpuprov lab: NVIDIA's nvidia-mig-manager .deb, built from NVIDIA's own packaging.

Not simulated: the package holds the real nvidia-mig-parted v0.15.0 binary (built from NVIDIA's source)
and the real files of NVIDIA's systemd deployment, laid out as NVIDIA's Debian packaging installs them
(NVIDIA/mig-parted v0.15.0 deployments/systemd/packages/debian: Makefile ``install``, control,
conffiles, postinst, postrm, copyright, lintian overrides; Dockerfile.deb for the version string and the
changelog entry). NVIDIA runs debuild in a container; here the same tree is assembled and packed with
dpkg-deb, which is what debuild ends with. Differences, because no debhelper runs here:

- ``${shlibs:Depends}`` is what dpkg-shlibdeps computes for this binary (NVIDIA's, built on Ubuntu 18.04,
  needs an older libc); ``${misc:Depends}`` is empty for this package.
- ``#DEBHELPER#`` in postinst/postrm becomes nothing: debhelper would add the unit-enable snippet of
  dh_systemd_enable there. gpuprov's role enables nvidia-mig-manager.service itself, on real hosts too.

The mirror serves the file at :data:`MIRROR_PATH`, the path of NVIDIA's release URL below the mirror base
(docs/contracts.md, like flannel's manifest).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from gpuprov_lab import proc, vendor
from gpuprov_lab.errors import LabError

VERSION = "0.15.0"
REVISION = "1"  # deployments/systemd/packages/Makefile: REVISION ?= 1
ARCH = "amd64"
PACKAGE = "nvidia-mig-manager"
DEB_NAME = f"{PACKAGE}_{VERSION}-{REVISION}_{ARCH}.deb"
# https://github.com/NVIDIA/mig-parted/releases/download/v0.15.0/<DEB_NAME>, below the mirror base.
MIRROR_PATH = f"mig-parted/v{VERSION}/{DEB_NAME}"
# The tag's commit (PROVENANCE.md), named in the changelog entry Dockerfile.deb writes with dch.
GIT_COMMIT = "e2d5ad1fc72b9d298ea6d04b885cf2d7dbe56941"
# Timestamps inside the package (the tag's date is not known here; a fixed one keeps the build
# reproducible, so the checksum the lab pins stays the same between builds).
SOURCE_DATE_EPOCH = 1767225600  # 2026-01-01T00:00:00Z

# deployments/systemd/packages/debian/Makefile, `install`: (source, destination directory, mode).
INSTALL = (
    ("bin/nvidia-mig-parted", "usr/bin", 0o755),
    ("systemd/nvidia-mig-manager.service", "lib/systemd/system", 0o644),
    ("systemd/nvidia-mig-parted.sh", "etc/profile.d", 0o644),
    ("systemd/override.conf", "etc/systemd/system/nvidia-mig-manager.service.d", 0o644),
    ("systemd/service.sh", "etc/nvidia-mig-manager", 0o755),
    ("systemd/utils.sh", "etc/nvidia-mig-manager", 0o644),
    ("systemd/hooks.sh", "etc/nvidia-mig-manager", 0o644),
    ("systemd/hooks-default.yaml", "etc/nvidia-mig-manager", 0o644),
    ("systemd/hooks-minimal.yaml", "etc/nvidia-mig-manager", 0o644),
    ("systemd/config-default.yaml", "etc/nvidia-mig-manager", 0o644),
    ("systemd/nvidia-gpu-reset.target", "lib/systemd/system", 0o644),
)
# Directories the Makefile creates that no file lands in.
EMPTY_DIRS = ("var/lib/nvidia-mig-manager",)
DEBIAN_DIR = "systemd/packages/debian"


def _control_fields(text: str) -> list[tuple[str, str]]:
    """The fields of one control stanza in order (continuation lines kept with their field)."""
    fields: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line[:1] in (" ", "\t") and fields:
            name, value = fields[-1]
            fields[-1] = (name, f"{value}\n{line}")
        elif ":" in line:
            name, value = line.split(":", 1)
            fields.append((name.strip(), value.strip()))
    return fields


def _shlibs_depends(binary: Path, control: str, work: Path) -> str:
    """``${shlibs:Depends}`` as dpkg-shlibdeps computes it for the binary."""
    (work / "debian").mkdir(parents=True, exist_ok=True)
    (work / "debian" / "control").write_text(control)
    out = proc.run(
        ["dpkg-shlibdeps", "-O", "-e", str(binary)], cwd=work, what="dpkg-shlibdeps nvidia-mig-parted"
    ).stdout
    m = re.search(r"^shlibs:Depends=(.*)$", out, re.M)
    if not m:
        raise LabError(f"dpkg-shlibdeps printed no shlibs:Depends for nvidia-mig-parted: {out.strip()!r}")
    return m.group(1).strip()


def control_text(source: Path, work: Path, installed_kib: int) -> str:
    """DEBIAN/control from NVIDIA's debian/control: the source stanza's fields the binary package carries,
    the binary stanza's own, with debian/prepare's @SECTION@ (SECTION empty) and the substitutions filled."""
    raw = (source / DEBIAN_DIR / "control").read_text().replace("@SECTION@", "")
    stanzas = [s for s in re.split(r"\n\s*\n", raw) if s.strip()]
    if len(stanzas) != 2:
        raise LabError(f"{source / DEBIAN_DIR / 'control'}: expected a source and one binary stanza")
    src, binary = (dict(_control_fields(s)) for s in stanzas)
    depends = binary.get("Depends", "")
    depends = depends.replace(
        "${shlibs:Depends}", _shlibs_depends(source / "bin/nvidia-mig-parted", raw, work)
    )
    depends = ", ".join(d.strip() for d in depends.replace("${misc:Depends}", "").split(",") if d.strip())
    fields = [
        ("Package", binary["Package"]),
        ("Version", f"{VERSION}-{REVISION}"),
        ("Architecture", ARCH),
        ("Maintainer", src["Maintainer"]),
        ("Installed-Size", str(installed_kib)),
        ("Depends", depends),
        ("Section", src["Section"]),
        ("Priority", src["Priority"]),
        ("Homepage", src["Homepage"]),
        ("Description", binary["Description"]),
    ]
    return "".join(f"{name}: {value}\n" for name, value in fields if value)


def _maintainer_script(text: str) -> str:
    """postinst/postrm as dh_installdeb leaves them when debhelper has nothing to add (see the module
    docstring): the #DEBHELPER# token replaced."""
    return text.replace("#DEBHELPER#\n", "")


def _changelog(maintainer: str) -> bytes:
    """The entry Dockerfile.deb creates with `dch --create` and `dch -r ""` (distribution UNRELEASED,
    debian/prepare then sets DISTRIB; no DISTRIB here), gzipped as dh_installchangelogs installs it."""
    when = "Thu, 01 Jan 2026 00:00:00 +0000"
    text = (
        f"{PACKAGE} ({VERSION}-{REVISION}) UNRELEASED; urgency=medium\n\n"
        f"  * See https://github.com/NVIDIA/mig-parted/-/blob/{GIT_COMMIT}/CHANGELOG.md for the changelog\n\n"
        f" -- {maintainer}  {when}\n"
    )
    return gzip.compress(text.encode(), mtime=SOURCE_DATE_EPOCH)


def stage_tree(source: Path, root: Path, work: Path) -> None:
    """The package's file tree under root, DEBIAN/ included."""
    for rel, dest, mode in INSTALL:
        target = root / dest / Path(rel).name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target)
        target.chmod(mode)
    for d in EMPTY_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    debian = source / DEBIAN_DIR
    maintainer = dict(_control_fields((debian / "control").read_text()))["Maintainer"]
    doc = root / "usr/share/doc" / PACKAGE
    doc.mkdir(parents=True)
    shutil.copyfile(debian / "copyright", doc / "copyright")
    (doc / "changelog.Debian.gz").write_bytes(_changelog(maintainer))
    overrides = root / "usr/share/lintian/overrides"
    overrides.mkdir(parents=True)
    shutil.copyfile(debian / f"{PACKAGE}.lintian-overrides", overrides / PACKAGE)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    installed_kib = (
        sum((p.stat().st_size + 1023) // 1024 for p in files) + len(list(root.rglob("*"))) - len(files)
    )
    meta = root / "DEBIAN"
    meta.mkdir()
    (meta / "control").write_text(control_text(source, work, installed_kib))
    # debian/rules override_dh_installdeb: NVIDIA's own conffiles list replaces the generated one.
    shutil.copyfile(debian / "conffiles", meta / "conffiles")
    for script in ("postinst", "postrm"):
        (meta / script).write_text(_maintainer_script((debian / script).read_text()))
        (meta / script).chmod(0o755)
    md5 = "".join(
        f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(root)}\n"  # dpkg's md5sums format
        for p in files
    )
    (meta / "md5sums").write_text(md5)
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)


def build_deb(out_dir: Path) -> Path:
    """Build nvidia-mig-manager_0.15.0-1_amd64.deb into out_dir from the vendor artifact; return it."""
    source = vendor.artifact("mig-parted")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuprov-mig-manager-") as tmp:
        root = Path(tmp) / f"{PACKAGE}-{VERSION}-{REVISION}"
        root.mkdir()
        stage_tree(source, root, Path(tmp) / "shlibdeps")
        deb = out_dir / DEB_NAME
        proc.run(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
            env={**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)},
            what=f"dpkg-deb --build {DEB_NAME}",
        )
    return deb


def mirror_files() -> dict[str, bytes]:
    """The mirror's files for NVIDIA's release asset: {MIRROR_PATH: the .deb}."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-mig-manager-deb-") as tmp:
        return {MIRROR_PATH: build_deb(Path(tmp)).read_bytes()}
