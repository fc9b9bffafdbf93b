"""The lab's package mirror: a signed Debian bookworm archive of the real packages the roles install,
plus the simulated vendor repositories, laid out as docs/contracts.md's mirror table says, and served
per lab by a small HTTP server bound to the lab network's gateway address.

Real Debian packages are resolved with ``apt-get install --download-only`` inside an overlay of the host
rootfs (in a private mount namespace, so no mount outlives the run); downloaded .debs are cached. The
mirror is rebuilt only when its inputs change (sim sources, package list, rootfs, signing key). Every
repository is signed with the lab archive key (Release, InRelease, Release.gpg) and that key is also
published at every vendor key path, so roles exercise their real key handling.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov_lab import debian, distros, image, keys, paths, proc, state, vendor
from gpuprov_lab.engine import Progress, _quiet
from gpuprov_lab.errors import LabError
from gpuprov_lab.keys import ArchiveKey
from gpuprov_lab.sim import catalog, debs, migmanager
from gpuprov_lab.sim.debs import SimPackage

FORMAT = "3"
SUITE = image.SUITE
ARCH = "amd64"
# Real Debian packages the roles install (their dependencies come along). The Depends of the simulated
# packages that are not themselves simulated are added from the built .debs.
DISTRO_PACKAGES = [
    "docker.io",
    "containerd",
    "runc",
    "iptables",
    "initramfs-tools",
    "conntrack",
    "socat",
    "ebtables",
    "ethtool",
    "pciutils",
    "kmod",
    "jq",
    "python3-debian",
    "apt-transport-https",
    "ipset",
    "ipvsadm",
    # Not for the roles: the root filesystem of the tests' real containers (ctr run --rootfs).
    "busybox-static",
]
KEY_NAME = "gpuprov-lab-archive"
# Inside a built sim part: sim packages that belong in the Debian archive (e.g. kernel headers).
DEBIAN_POOL = ".debian-pool"
# apt settings of this machine that the resolver chroot must share (proxies, archive validity).
APT_SETTINGS = (
    "Acquire::http::Proxy",
    "Acquire::https::Proxy",
    "Acquire::Check-Valid-Until",
    "Acquire::Check-Date",
    "Acquire::Retries",
)


def _digest(*parts: str) -> str:
    return paths.digest(*parts)[:16]


def mirrors_root() -> Path:
    return paths.cache_root() / "mirror"


def debs_cache(suite: str = SUITE) -> Path:
    return paths.cache_root() / "debs" / suite


# ---------------------------------------------------------------------------------------------- signing


def _run_in(cwd: Path, argv: list[str], what: str) -> str:
    return proc.run(argv, cwd=cwd, what=what, timeout=600).stdout


def sign_release(release_dir: Path, key: ArchiveKey, gpg: list[str], release_options: dict[str, str]) -> None:
    """Release (apt-ftparchive), InRelease (clear-signed) and Release.gpg (detached) for one repo."""
    opts: list[str] = []
    for k, v in release_options.items():
        opts += ["-o", f"APT::FTPArchive::Release::{k}={v}"]
    for name in ("Release", "InRelease", "Release.gpg"):
        (release_dir / name).unlink(missing_ok=True)
    text = _run_in(release_dir, ["apt-ftparchive", *opts, "release", "."], "apt-ftparchive release")
    (release_dir / "Release").write_text(text)
    signer = [*gpg, "--yes", "--local-user", key.fingerprint, "--digest-algo", "SHA512"]
    proc.run(
        [*signer, "--clearsign", "-o", str(release_dir / "InRelease"), str(release_dir / "Release")],
        what="gpg --clearsign",
    )
    proc.run(
        [
            *signer,
            "--armor",
            "--detach-sign",
            "-o",
            str(release_dir / "Release.gpg"),
            str(release_dir / "Release"),
        ],
        what="gpg --detach-sign",
    )


def _write_packages(index_dir: Path, text: str) -> None:
    index_dir.mkdir(parents=True, exist_ok=True)
    (index_dir / "Packages").write_text(text)
    with gzip.GzipFile(index_dir / "Packages.gz", "wb", mtime=0) as fh:
        fh.write(text.encode())


def index_flat(repo: Path, key: ArchiveKey, gpg: list[str], label: str) -> None:
    """Flat repository (``Suites: /``): Packages and Release next to the .debs."""
    text = _run_in(repo, ["apt-ftparchive", "packages", "."], "apt-ftparchive packages")
    _write_packages(repo, text)
    sign_release(repo, key, gpg, {"Origin": label, "Label": label})


def index_dists(
    repo: Path, suite: str, component: str, key: ArchiveKey, gpg: list[str], label: str, pool: str = ""
) -> None:
    """dists/ repository: pool/<component>/*.deb (or the pool directory given) indexed into
    dists/<suite>/<component>/binary-amd64."""
    text = _run_in(
        repo, ["apt-ftparchive", "packages", pool or f"pool/{component}"], "apt-ftparchive packages"
    )
    dist = repo / "dists" / suite
    _write_packages(dist / component / f"binary-{ARCH}", text)
    sign_release(
        dist,
        key,
        gpg,
        {
            "Origin": label,
            "Label": label,
            "Suite": suite,
            "Codename": suite,
            "Components": component,
            "Architectures": ARCH,
        },
    )


# ------------------------------------------------------------------------------------------ sim repos


@dataclass(frozen=True)
class SimRepo:
    key: str
    path: str
    layout: Any  # "flat" or ("dists", suite, component)


def sim_repos(catalog: Any = catalog) -> list[SimRepo]:
    return [SimRepo(key, str(path).strip("/"), layout) for key, (path, layout) in catalog.REPOS.items()]


def _package_repos(pkg: SimPackage) -> list[str]:
    """Repo keys a sim package is published in."""
    return [pkg.repo] if isinstance(pkg.repo, str) else list(pkg.repo)


def vendor_key_paths(repo: SimRepo) -> list[str]:
    """Where the vendor publishes the key of this repository, relative to the mirror base."""
    p = repo.path
    if p.startswith("cuda/repos/debian13/"):
        return [f"{p}/8793F200.pub"]  # NVIDIA signs its debian13 repository with a key of its own
    if p.startswith("cuda/repos/"):
        return [f"{p}/3bf863cc.pub"]
    if p.startswith("libnvidia-container/"):
        return ["libnvidia-container/gpgkey"]
    if p.startswith("kubernetes/"):
        return [f"{p}/Release.key"]
    if p.startswith("helm-debian/"):
        return ["helm-debian/gpgkey"]
    if p.startswith("docker/linux/"):
        return [f"{p}/gpg"]
    return []


# Vendor artifacts the lab's packages are made from (their content is part of the mirror's cache key).
VENDOR_INPUTS = ("nvidia-container-toolkit", "nvml-mock", "gpu-operator", "mig-parted", "kubernetes")


def sim_inputs_digest() -> str:
    here = Path(__file__).parent
    parts = paths.tree_manifest(here / "sim") + paths.tree_manifest(here / "kube")
    for kind in VENDOR_INPUTS:
        parts += [f"vendor:{kind}", *paths.tree_manifest(vendor.artifact(kind))]
    parts.append(f"pypi:{vendor.HELM_WHEEL}=={vendor.HELM_WHEEL_VERSION}")  # helm and kubectl
    return _digest(*parts)


def build_sim_part(target: Path, key: ArchiveKey, gpg: list[str], progress: Progress) -> set[str]:
    """Build every sim .deb into its repositories, index and sign them; return the names of the sim
    packages (so their Depends on each other are not resolved from Debian)."""
    repos = {r.key: r for r in sim_repos()}
    packages = list(catalog.all_packages())
    progress(f"mirror: building {len(packages)} simulated packages")
    build_dir = target / ".build"
    build_dir.mkdir(parents=True)
    for pkg in packages:
        deb = debs.build_deb(pkg, build_dir)
        for repo_key in _package_repos(pkg):
            repo = repos.get(repo_key)
            if repo_key == catalog.DEBIAN:
                dest = target / DEBIAN_POOL  # published in the lab's Debian archive
            elif repo is None:
                raise LabError(f"sim package {pkg.name!r}: repository {repo_key!r} is not in catalog.REPOS")
            elif repo.layout == "flat":
                dest = target / repo.path
            else:
                _, _suite, component = repo.layout
                dest = target / repo.path / "pool" / component
            dest.mkdir(parents=True, exist_ok=True)
            if not (dest / deb.name).exists():
                os.link(deb, dest / deb.name)
    for repo in repos.values():
        root = target / repo.path
        root.mkdir(parents=True, exist_ok=True)
        label = f"gpuprov lab (SIMULATED) {repo.key}"
        if repo.layout == "flat":
            index_flat(root, key, gpg, label)
        else:
            kind, suite, component = repo.layout
            if kind != "dists":
                raise LabError(f"catalog.REPOS[{repo.key!r}]: unknown layout {repo.layout!r}")
            (root / "pool" / component).mkdir(parents=True, exist_ok=True)
            index_dists(root, suite, component, key, gpg, label)
        for rel in vendor_key_paths(repo):
            _write(target / rel, key.armored)
    # NVIDIA's nvidia-mig-manager .deb, real and built from NVIDIA's packaging, at its release URL's path.
    progress(f"mirror: building {migmanager.DEB_NAME} from NVIDIA's packaging")
    for rel, data in {**catalog.extra_mirror_files(), **migmanager.mirror_files()}.items():
        rel = str(rel).strip("/")
        if rel.startswith("..") or "/../" in f"/{rel}/":
            raise LabError(f"catalog.extra_mirror_files(): path {rel!r} is not a mirror path")
        _write(target / rel, data)
    names = set()
    for deb in build_dir.glob("*.deb"):
        names.add(_deb_field(deb, "Package"))
        for provided in _split_relations(_deb_field(deb, "Provides")):
            names.update(provided)
    (target / ".sim-depends").write_text("\n".join(sorted(_external_depends(build_dir, names))) + "\n")
    shutil.rmtree(build_dir)
    return names


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _deb_field(deb: Path, field: str) -> str:
    return proc.run(["dpkg-deb", "-f", str(deb), field], what="dpkg-deb -f").stdout.strip()


def _split_relations(text: str) -> list[list[str]]:
    """'a (>= 1), b | c:any' → [['a'], ['b', 'c']]."""
    clauses = []
    for clause in text.replace("\n", " ").split(","):
        alts = []
        for alt in clause.split("|"):
            name = re.split(r"[\s(\[<]", alt.strip(), maxsplit=1)[0].split(":")[0]
            if name:
                alts.append(name)
        if alts:
            clauses.append(alts)
    return clauses


def _external_depends(build_dir: Path, sim_names: set[str]) -> set[str]:
    """Depends/Pre-Depends of the sim packages that Debian must provide (first alternative)."""
    wanted: set[str] = set()
    for deb in build_dir.glob("*.deb"):
        for field in ("Pre-Depends", "Depends"):
            for alts in _split_relations(_deb_field(deb, field)):
                if not any(a in sim_names for a in alts):
                    wanted.add(alts[0])
    return wanted


# ------------------------------------------------------------------------------------- Debian archive


def _host_apt_settings() -> str:
    """The lines of this machine's apt configuration that the resolver must share."""
    try:
        dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return ""
    keep = [ln for ln in dump.splitlines() if any(ln.startswith(s + " ") for s in APT_SETTINGS)]
    return "\n".join(keep) + "\n"


RESOLVE_SCRIPT = r"""
set -eu
mount -t overlay overlay -o "lowerdir=$ROOTFS,upperdir=$UPPER,workdir=$WORK" "$MERGED"
mount --bind "$DEBS" "$MERGED/var/cache/apt/archives"
mount -t proc proc "$MERGED/proc"
cp /etc/resolv.conf "$MERGED/etc/resolv.conf"
printf 'deb %s %s main\n' "$MIRROR" "$SUITE" > "$MERGED/etc/apt/sources.list"
for s in $OTHER_SUITES; do printf 'deb %s %s main\n' "$MIRROR" "$s" >> "$MERGED/etc/apt/sources.list"; done
rm -f "$MERGED"/etc/apt/sources.list.d/* "$MERGED"/etc/apt/preferences.d/*
cp "$APTCONF" "$MERGED/etc/apt/apt.conf.d/00gpuprov-resolver"
cp "$PREFERENCES" "$MERGED/etc/apt/preferences.d/00gpuprov-resolver"
chroot "$MERGED" apt-get -q update >&2
chroot "$MERGED" apt-get -s --no-install-recommends install $PACKAGES
chroot "$MERGED" apt-get -q -y --download-only --no-install-recommends install $PACKAGES >&2
"""


def resolve_debian(
    packages: Iterable[str], flavour: distros.Flavour, rootfs: Path, progress: Progress
) -> list[Path]:
    """Download (cached) the .debs a lab host of this flavour needs to install packages; return exactly
    that set. Packages the flavour takes from another suite come from there (apt pins them to it;
    nothing else of that suite is chosen)."""
    names = sorted(set(packages))
    work = paths.cache_root() / "resolver" / f"{flavour.name}-{image.rootfs_stamp(flavour.suite)}"
    for sub in ("upper", "work", "merged"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    cache = debs_cache(flavour.name)
    (cache / "partial").mkdir(parents=True, exist_ok=True)
    aptconf = work / "apt.conf"
    aptconf.write_text(_host_apt_settings())
    others = sorted({suite for _name, suite in flavour.from_suite})
    preferences = work / "preferences"
    preferences.write_text(
        "".join(
            f"Package: *\nPin: release n={suite}\nPin-Priority: 1\n\n"
            f"Package: {' '.join(n for n, s in flavour.from_suite if s == suite)}\n"
            f"Pin: release n={suite}\nPin-Priority: 990\n\n"
            for suite in others
        )
    )
    progress(
        f"mirror: resolving {len(names)} Debian packages for {flavour.name} hosts and their dependencies "
        "(downloads are cached)"
    )
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "ROOTFS": str(rootfs),
        "UPPER": str(work / "upper"),
        "WORK": str(work / "work"),
        "MERGED": str(work / "merged"),
        "DEBS": str(cache),
        "MIRROR": debian.debian_mirror_url(),
        "SUITE": flavour.suite,
        "OTHER_SUITES": " ".join(others),
        "APTCONF": str(aptconf),
        "PREFERENCES": str(preferences),
        "PACKAGES": " ".join(names),
        "DEBIAN_FRONTEND": "noninteractive",
        "LC_ALL": "C",
    }
    res = proc.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", RESOLVE_SCRIPT],
        env=env,
        timeout=1800,
        what=f"apt-get --download-only in the {flavour.suite} rootfs overlay",
    )
    (cache / "lock").unlink(missing_ok=True)
    debs: list[Path] = []
    for m in re.finditer(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) .*?\[(\S+)\]\)", res.stdout, re.M):
        name, version, arch = m.groups()
        f = cache / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
        if not f.exists():
            raise LabError(f"apt resolved {name} {version} but {f} was not downloaded")
        debs.append(f)
    if not debs:
        raise LabError(f"apt resolved nothing to install for {' '.join(names)}: {proc.tail(res.stdout)}")
    return debs


def resolved_debs(
    resolution: str, wanted: list[str], flavour: distros.Flavour, rootfs: Path, progress: Progress
) -> list[Path]:
    """The Debian .debs for a package list, resolved once per list, flavour and rootfs (a record names
    them)."""
    record = paths.cache_root() / "resolver" / f"resolved-{resolution}.txt"
    if record.exists():
        files = [debs_cache(flavour.name) / name for name in record.read_text().split()]
        if files and all(f.exists() for f in files):
            return files
    debs = resolve_debian(wanted, flavour, rootfs, progress)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("".join(f"{d.name}\n" for d in debs))
    return debs


def build_debian_part(target: Path, suite: str, debs: list[Path], key: ArchiveKey, gpg: list[str]) -> None:
    """One suite of the lab's Debian archive: pool/<suite>/*.deb, dists/<suite>/main."""
    pool = target / "pool" / suite
    pool.mkdir(parents=True)
    for deb in debs:
        if not (pool / deb.name).exists():
            os.link(deb, pool / deb.name)
    index_dists(target, suite, "main", key, gpg, f"gpuprov lab Debian ({suite})", pool=f"pool/{suite}")


# ----------------------------------------------------------------------------------------- the mirror


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link copy of a tree (cheap: parts are reused by every mirror built from them)."""
    proc.run(["cp", "-al", f"{src}/.", str(dst)], what="cp -al")


def ensure_mirror(rootfs: dict[str, Path], key: ArchiveKey, progress: Progress = _quiet) -> Path:
    """The mirror directory for the current inputs (built when they changed). ``rootfs``: the host root
    filesystem of each Debian release, in which its packages are resolved."""
    parts = paths.cache_root() / "mirror-parts"
    parts.mkdir(parents=True, exist_ok=True)
    sim_hash = _digest(FORMAT, key.fingerprint, sim_inputs_digest())
    sim_part = parts / f"sim-{sim_hash}"
    deb_parts: list[Path] = []
    with keys.gpg_session(key.gnupghome) as gpg:
        if not (sim_part / ".complete").exists():
            shutil.rmtree(sim_part, ignore_errors=True)
            tmp = parts / f".sim-{sim_hash}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            build_sim_part(tmp, key, gpg, progress)
            (tmp / ".complete").touch()
            os.replace(tmp, sim_part)
        sim_depends = (sim_part / ".sim-depends").read_text().split()
        wanted = sorted(set(DISTRO_PACKAGES) | set(sim_depends))
        sim_debian = sorted((sim_part / DEBIAN_POOL).glob("*.deb"))
        # One archive suite per host flavour (its Debian release, some packages from another suite).
        for flavour in distros.FLAVOURS.values():
            resolution = _digest(
                FORMAT,
                flavour.name,
                image.rootfs_stamp(flavour.suite),
                *wanted,
                *flavour.packages,
                *map(str, flavour.from_suite),
            )
            deb_hash = _digest(
                FORMAT, key.fingerprint, resolution, *paths.tree_manifest(sim_part / DEBIAN_POOL)
            )
            deb_part = parts / f"debian-{flavour.name}-{deb_hash}"
            if not (deb_part / ".complete").exists():
                shutil.rmtree(deb_part, ignore_errors=True)
                debs = resolved_debs(
                    resolution, wanted + list(flavour.packages), flavour, rootfs[flavour.suite], progress
                )
                tmp = parts / f".debian-{flavour.name}-{deb_hash}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                build_debian_part(tmp, flavour.archive_suite, debs + sim_debian, key, gpg)
                (tmp / ".complete").touch()
                os.replace(tmp, deb_part)
            deb_parts.append(deb_part)
    mirror_hash = _digest(FORMAT, sim_hash, *(p.name for p in deb_parts))
    target = mirrors_root() / mirror_hash
    if (target / ".complete").exists():
        return target
    progress(f"mirror: assembling {target}")
    tmp = mirrors_root() / f".{mirror_hash}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "debian").mkdir(parents=True)
    for deb_part in deb_parts:
        _link_tree(deb_part, tmp / "debian")
    _link_tree(sim_part, tmp)
    for marker in (".complete", ".sim-depends", "debian/.complete"):
        (tmp / marker).unlink(missing_ok=True)
    shutil.rmtree(tmp / DEBIAN_POOL, ignore_errors=True)
    _write(tmp / f"{KEY_NAME}.asc", key.armored)
    _write(tmp / f"{KEY_NAME}.gpg", key.public)
    (tmp / ".parts").write_text("".join(f"{p.name}\n" for p in (sim_part, *deb_parts)))
    (tmp / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    prune(keep={target})
    return target


def prune(keep: set[Path]) -> None:
    """Drop mirrors no lab serves any more (and the parts no kept mirror was built from)."""
    in_use = set(keep)
    for name in state.all_labs():
        st = state.load(name)
        if st and st.mirror_dir:
            in_use.add(Path(st.mirror_dir))
    root = mirrors_root()
    if not root.is_dir():
        return
    for d in root.iterdir():
        if d not in in_use and not d.name.startswith("."):
            shutil.rmtree(d, ignore_errors=True)
    used_parts: set[str] = set()
    for d in in_use:
        if (d / ".parts").exists():
            used_parts.update((d / ".parts").read_text().split())
    parts = paths.cache_root() / "mirror-parts"
    if parts.is_dir():
        for p in parts.iterdir():
            if not p.name.startswith(".") and p.name not in used_parts:
                shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------------------------------ the server


def _server_argv(bind: str, port: int, directory: Path) -> list[str]:
    server = [sys.executable, "-m", "gpuprov_lab.httpserve"]
    return [*server, "--bind", bind, "--port", str(port), "--directory", str(directory)]


def server_pid(lp: paths.LabPaths) -> int | None:
    """PID of the lab's mirror server, if the recorded PID is still that server."""
    return proc.recorded_pid(lp.mirror_pid, "gpuprov_lab.httpserve")


def ensure_server(st: state.LabState, progress: Progress = _quiet) -> int:
    """Serve st.mirror_dir on the lab gateway; (re)start the server when it is missing or stale."""
    lp = st.paths
    want = _server_argv(st.gateway, st.mirror_port, Path(st.mirror_dir))
    pid = server_pid(lp)
    if pid and proc.cmdline(pid)[1:] == want[1:] and _answers(st, 2):
        return pid
    if pid:
        stop_server(lp)
    _check_port_free(st.gateway, st.mirror_port)
    progress(f"mirror: serving {st.mirror_url}/ from {st.mirror_dir}")
    child = proc.spawn(want, lp.mirror_log, cwd="/")
    lp.mirror_pid.write_text(f"{child.pid}\n")
    proc.wait_started(child, lambda: _answers(st, 1), 20, lp.mirror_log, "the mirror server")
    return child.pid


def _check_port_free(bind: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
        except OSError as exc:
            raise LabError(
                f"cannot serve the mirror on {bind}:{port}: {exc.strerror} (choose --mirror-port)"
            ) from exc


def _answers(st: state.LabState, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"{st.mirror_url}/{KEY_NAME}.gpg", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def stop_server(lp: paths.LabPaths) -> bool:
    return proc.stop_recorded(lp.mirror_pid, "gpuprov_lab.httpserve")
