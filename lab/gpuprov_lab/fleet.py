"""Bring a lab up, report on it, take it down.

``up`` is idempotent: a second run keeps the hosts that are there (starting stopped ones), adds or
removes hosts to match ``--hosts``, rewrites profiles when ``--profiles`` changes them, rebuilds cached
inputs (image, mirror) only when they changed, and restarts the lab's mirror server when it is gone.
``down`` removes everything the lab made, found by label and by the PIDs recorded in its state.
"""

from __future__ import annotations

import io
import ipaddress
import json
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpuprov_lab import (
    distros,
    engine,
    faults,
    image,
    inventory,
    keys,
    mirror,
    paths,
    plan,
    proc,
    state,
    vendor,
)
from gpuprov_lab.engine import Docker, Progress, _quiet
from gpuprov_lab.errors import LabError
from gpuprov_lab.kube import images, registry
from gpuprov_lab.plan import PlannedHost
from gpuprov_lab.sim import nvml
from gpuprov_lab.state import LabState
from provisioner.errors import InputError

SUBNET_POOL = ipaddress.IPv4Network("10.213.0.0/16")
DEFAULT_MIRROR_PORT = 8080
BOOT_TIMEOUT = 120.0
SSH_TIMEOUT = 60.0
PARALLEL = 8

T = TypeVar("T")
R = TypeVar("R")


def _parallel(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(items))) as pool:
        return list(pool.map(fn, items))


# ------------------------------------------------------------------------------------------------ up


@dataclass
class UpRequest:
    lab: str
    hosts: int | None = None
    profiles: list[str] | None = None
    os: list[str] | None = None
    subnet: str | None = None
    mirror_port: int | None = None


def validate(req: UpRequest) -> tuple[LabState | None, int, list[str] | None, ipaddress.IPv4Network | None]:
    """Every check on the request, before anything is touched (arguments first, then the lab)."""
    paths.check_lab_name(req.lab)
    if req.hosts is not None:
        plan.check_host_count(req.hosts)
    net = plan.parse_subnet(req.subnet) if req.subnet else None
    if req.mirror_port is not None and not 1024 <= req.mirror_port <= 65535:
        raise InputError(f"--mirror-port {req.mirror_port}: use a port from 1024 to 65535")
    existing = state.load(req.lab)
    if existing and net and str(net) != existing.subnet:
        raise InputError(
            f"--subnet {net}: lab {req.lab!r} already uses {existing.subnet} "
            f"(gpuprov lab down --lab {req.lab} first)"
        )
    if existing and req.mirror_port is not None and req.mirror_port != existing.mirror_port:
        # Hosts have the mirror URL in their apt sources since they were made.
        raise InputError(
            f"--mirror-port {req.mirror_port}: lab {req.lab!r} serves its mirror on {existing.mirror_port} "
            f"(gpuprov lab down --lab {req.lab} first)"
        )
    profiles = plan.parse_profiles(req.profiles)
    if req.hosts is not None:
        count = req.hosts
    elif profiles is not None:
        count = plan.check_host_count(len(profiles) + 1)
    elif existing is not None:
        count = len(existing.hosts)
    else:
        count = plan.DEFAULT_HOSTS
    if profiles is not None and len(profiles) > count - 1:
        raise InputError(
            f"--profiles: {len(profiles)} profiles for {count - 1} GPU host(s); "
            f"use --hosts {len(profiles) + 1}"
        )
    if req.os is not None:
        for name in req.os:
            distros.get(name)
        if len(req.os) > count - 1:
            raise InputError(
                f"--os: {len(req.os)} systems for {count - 1} GPU host(s); use --hosts {len(req.os) + 1}"
            )
    refuse_real_nvidia_driver()
    return existing, count, profiles, net


# Present while an NVIDIA kernel module is loaded (the real driver creates it).
REAL_DRIVER_MARKER = Path("/proc/driver/nvidia")


def refuse_real_nvidia_driver(marker: Path = REAL_DRIVER_MARKER) -> None:
    """The lab makes GPU device nodes (char 195:N, 511:N) in its hosts, which share this machine's
    kernel: where a real NVIDIA driver is loaded they would open this machine's real GPUs."""
    if marker.exists():
        raise LabError(
            f"this machine has a real NVIDIA driver loaded ({marker} exists): the lab's hosts share its "
            "kernel and would get device nodes of its real GPUs. Run the lab on a machine without an "
            "NVIDIA driver."
        )


def up(req: UpRequest, progress: Progress = _quiet) -> LabState:
    """Create or reconcile a lab; return its state once every host answers SSH."""
    existing, count, profiles, net = validate(req)
    vendor.require_all()
    t0 = time.monotonic()
    with state.lock():
        docker = engine.ensure_engine(progress)
        key = keys.ensure_archive_key()
        # One host image per Debian release; the mirror serves every flavour's archive suite.
        rootfs = {suite: image.ensure_rootfs(progress, suite) for suite in image.SUITES}
        bases = {
            suite: image.ensure_base_image(docker, rootfs[suite], progress, suite) for suite in image.SUITES
        }
        engine.ensure_privileged(docker, bases[image.SUITE], progress)
        host_images = {
            s: image.ensure_host_image(docker, bases[s], key.public, progress) for s in image.SUITES
        }
        image.prune_host_images(docker, keep=set(host_images.values()))
        mirror_dir = mirror.ensure_mirror(rootfs, key, progress)

        lp = paths.LabPaths(req.lab)
        st = existing
        if st is None or not _network_exists(docker, lp.network):
            st = _create_network(
                docker,
                lp,
                net or (st.network if st else None),
                req.mirror_port or (st.mirror_port if st else DEFAULT_MIRROR_PORT),
                progress,
            )
        st.images = host_images  # what new hosts are made from, per Debian release
        st.mirror_dir = str(mirror_dir)
        old_hosts = {h.name: h for h in st.hosts}
        specs = plan.plan(count, st.network, profiles, old_hosts, req.os)
        st.hosts = sorted({**old_hosts, **{h.name: h for h in specs}}.values(), key=lambda h: h.index)
        st.save()  # from here on, `lab down` can find everything even if the rest fails

        mirror.ensure_server(st, progress)
        registry.ensure_server(registry.storage(images.all_images(), progress), st.gateway, lp.root, progress)
        ssh_key = keys.ensure_ssh_key(lp.ssh_key, f"gpuprov-lab-{req.lab}")
        host_keys = {h.name: keys.ensure_host_key(lp.host_key_dir(h.name), h.name) for h in specs}
        keys.write_known_hosts(lp.known_hosts, {h.ip: host_keys[h.name][1] for h in specs})

        wanted = {h.name for h in specs}
        present = _containers(docker, req.lab)
        for name in sorted(set(present) - wanted):
            progress(f"hosts: removing {name}")
            _remove_host(docker, lp, name)
        st.hosts = specs
        st.save()

        for h in specs:
            _write_host_files(lp, h)
        todo_create = [h for h in specs if h.name not in present]
        todo_start = [h for h in specs if h.name in present and present[h.name] != "running"]
        if todo_create:
            made = ", ".join(f"{h.name} ({h.os})" for h in todo_create)
            progress(f"hosts: creating {made}")
        if todo_start:
            progress(f"hosts: starting {', '.join(h.name for h in todo_start)}")
        auth = ssh_key.with_suffix(".pub").read_text()
        _parallel(
            lambda h: _create_host(
                docker, st, h, host_images[distros.get(h.os).suite], auth, host_keys[h.name]
            ),
            todo_create,
        )
        _parallel(
            lambda h: docker("start", lp.container(h.name), what=f"docker start ({h.name})"), todo_start
        )
        progress("hosts: waiting for systemd and sshd")
        problems = [p for p in _parallel(lambda h: _wait_ready(docker, st, h), specs) if p]
        inventory.write(st)
        st.save()
        if problems:
            raise LabError("; ".join(problems))
        progress(f"lab {req.lab}: {len(specs)} host(s) up in {time.monotonic() - t0:.1f} s")
        return st


def _network_exists(docker: Docker, name: str) -> bool:
    return docker.ok("network", "inspect", name)


def _used_subnets(docker: Docker) -> list[ipaddress.IPv4Network]:
    used: list[ipaddress.IPv4Network] = []
    for nid in docker.lines("network", "ls", "-q"):
        out = docker(
            "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", nid, check=False
        ).stdout
        for s in out.split():
            try:
                used.append(ipaddress.IPv4Network(s, strict=False))
            except ValueError:
                continue
    routes = proc.run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout
    for line in routes.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("local", "broadcast", "unreachable", "blackhole", "prohibit", "multicast"):
            word = line.split()[1]
        if "/" in word:
            try:
                used.append(ipaddress.IPv4Network(word, strict=False))
            except ValueError:
                continue
    return used


def _create_network(
    docker: Docker,
    lp: paths.LabPaths,
    net: ipaddress.IPv4Network | None,
    port: int,
    progress: Progress,
) -> LabState:
    """An internal bridge network (no route off the machine, no NAT) on a free /24."""
    if docker.ok("network", "inspect", lp.network):
        docker("network", "rm", lp.network)
    candidates = [net] if net else list(SUBNET_POOL.subnets(new_prefix=24))[1:]
    used = _used_subnets(docker)
    last_error = ""
    for cand in candidates:
        if any(cand.overlaps(u) for u in used if u.prefixlen > 0):
            if net:
                raise InputError(f"--subnet {net}: overlaps a network already on this machine")
            continue
        res = docker(
            "network", "create", "--driver", "bridge", "--internal",
            "--subnet", str(cand), "--gateway", plan.gateway(cand),
            "--label", f"{paths.LABEL}={lp.name}",
            "-o", "com.docker.network.bridge.enable_ip_masquerade=false",
            lp.network,
            check=False,
        )  # fmt: skip
        if res.returncode == 0:
            progress(f"network: {lp.network} on {cand} (internal, gateway {plan.gateway(cand)})")
            return LabState(name=lp.name, subnet=str(cand), gateway=plan.gateway(cand), mirror_port=port)
        last_error = res.stderr
        if net:
            break
    raise LabError(f"no free subnet for lab {lp.name!r}: {proc.tail(last_error)}")


def _containers(docker: Docker, lab: str) -> dict[str, str]:
    """host name → container state for the lab's containers."""
    row = '{{.Label "' + paths.HOST_LABEL + '"}}\t{{.State}}'
    out = docker.lines("ps", "-a", "--filter", f"label={paths.LABEL}={lab}", "--format", row)
    return {host: st for host, _, st in (line.partition("\t") for line in out) if host}


def _write_host_files(lp: paths.LabPaths, h: PlannedHost) -> None:
    """profile.json (rewritten when the profile changes), NVIDIA's mock NVML configuration of the host's
    GPUs and faults.json (kept) for the emulation."""
    d = lp.host_dir(h.name)
    d.mkdir(parents=True, exist_ok=True)
    doc = plan.profile_document(h)
    f = d / "profile.json"
    if not f.exists() or json.loads(f.read_text()) != doc:
        state.write_json(f, doc)
    nvml_config = nvml.mock_config(doc)
    nvml_file = d / "nvml-mock.yaml"
    if nvml_config is None:
        nvml_file.unlink(missing_ok=True)
    elif not nvml_file.exists() or nvml_file.read_text() != nvml_config:
        nvml_file.write_text(nvml_config)
    if not (d / "faults.json").exists():
        faults.write_faults(lp, h.name, [])


def _tar(entries: list[tuple[str, bytes | None, int, str | None]]) -> bytes:
    """A tar stream of (path, content|None for a directory, mode, symlink target) owned by root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, mode, link in entries:
            info = tarfile.TarInfo(name)
            info.uid = info.gid = 0
            info.mode = mode
            info.mtime = int(time.time())
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                tar.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


ROUTE_UNIT = """\
[Unit]
Description=gpuprov lab: default route via the lab gateway (the controller, which does not forward)
DefaultDependencies=no
Before=network.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/sbin/ip route replace default via {gateway}

[Install]
WantedBy=multi-user.target
"""

DEBIAN_SOURCES = """\
# Debian archive of the gpuprov lab (a signed local mirror of the packages the roles install)
Types: deb
URIs: {url}/debian
Suites: {suite}
Components: main
Signed-By: {keyring}
"""


def host_files(st: LabState, h: PlannedHost, authorized_key: str, host_key: tuple[Path, str]) -> bytes:
    """Files put into a host before it boots: SSH host key and authorized key, apt source, route unit."""
    priv, _pub = host_key
    suite = distros.get(h.os).archive_suite
    sources = DEBIAN_SOURCES.format(url=st.mirror_url, suite=suite, keyring=image.ARCHIVE_KEYRING)
    route = "etc/systemd/system/gpuprov-lab-route.service"
    wants = "etc/systemd/system/multi-user.target.wants/gpuprov-lab-route.service"
    return _tar(
        [
            ("etc/ssh/ssh_host_ed25519_key", priv.read_bytes(), 0o600, None),
            ("etc/ssh/ssh_host_ed25519_key.pub", priv.with_suffix(".pub").read_bytes(), 0o644, None),
            ("root/.ssh", None, 0o700, None),
            ("root/.ssh/authorized_keys", authorized_key.encode(), 0o600, None),
            ("etc/apt/sources.list.d/debian.sources", sources.encode(), 0o644, None),
            (route, ROUTE_UNIT.format(gateway=st.gateway).encode(), 0o644, None),
            (wants, None, 0o777, f"/{route}"),
        ]
    )


def _create_host(
    docker: Docker, st: LabState, h: PlannedHost, host_image: str, auth: str, host_key: tuple[Path, str]
) -> None:
    lp = st.paths
    name = lp.container(h.name)
    labels = ["--label", f"{paths.LABEL}={st.name}", "--label", f"{paths.HOST_LABEL}={h.name}"]
    docker("rm", "-f", "-v", name, check=False)
    mounts: list[str] = []
    for what, target in (("docker", "/var/lib/docker"), ("containerd", "/var/lib/containerd")):
        vol = lp.volume(h.name, what)
        docker("volume", "create", *labels, vol, what=f"docker volume create ({h.name})")
        mounts += ["--volume", f"{vol}:{target}"]
    docker(
        "create", "--name", name, "--hostname", h.name, *labels, "--privileged",
        # `systemctl reboot` ends systemd (PID 1) with a non-zero status: restarting the container is
        # the lab's reboot (new boot id, modules loaded at boot), so Ansible's reboot module works.
        "--restart", "on-failure",
        "--network", lp.network, "--ip", h.ip, "--network-alias", h.name, "--dns", st.gateway,
        "--tmpfs", "/run", "--tmpfs", "/run/lock",
        *mounts, "--volume", f"{lp.host_dir(h.name)}:/etc/gpuprov-lab:ro",
        host_image,
        what=f"docker create ({h.name})",
    )  # fmt: skip
    docker("cp", "-", f"{name}:/", input=host_files(st, h, auth, host_key), what=f"docker cp ({h.name})")
    docker("start", name, what=f"docker start ({h.name})")


def _remove_host(docker: Docker, lp: paths.LabPaths, host: str) -> None:
    docker("rm", "-f", "-v", lp.container(host), check=False)
    for what in ("docker", "containerd"):
        docker("volume", "rm", "-f", lp.volume(host, what), check=False)
    shutil.rmtree(lp.host_dir(host), ignore_errors=True)
    shutil.rmtree(lp.host_key_dir(host), ignore_errors=True)


def _wait_ready(docker: Docker, st: LabState, h: PlannedHost) -> str | None:
    """Wait for systemd to finish booting and for SSH to accept the lab key; a problem, or None."""
    name = st.paths.container(h.name)
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:
        # Until systemd has its bus up, systemctl cannot ask; then --wait blocks until boot is done.
        res = docker(
            "exec", name, "systemctl", "is-system-running", "--wait", check=False, timeout=BOOT_TIMEOUT
        )
        boot = res.stdout.strip()
        if boot in ("running", "degraded"):
            break
        if time.monotonic() > deadline or boot not in ("", "offline", "initializing", "starting"):
            return f"{h.name}: systemd did not finish booting ({boot or proc.tail(res.stderr)})"
        time.sleep(0.2)
    if faults.is_unreachable(st.paths, h.name):
        return None
    deadline = time.monotonic() + SSH_TIMEOUT
    last = ""
    while time.monotonic() < deadline:
        r = subprocess.run(st.ssh_argv(h.ip, "true"), capture_output=True, text=True, check=False, timeout=30)
        if r.returncode == 0:
            return None
        last = r.stderr
        time.sleep(0.3)
    return f"{h.name}: SSH to {h.ip} does not work: {proc.tail(last)}"


# ---------------------------------------------------------------------------------------------- down


@dataclass
class DownReport:
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    mirror_stopped: bool = False
    registry_stopped: bool = False
    state_removed: bool = False
    engine_stopped: bool = False


def down(lab: str, progress: Progress = _quiet) -> DownReport:
    """Remove every container, network and volume labelled with the lab, its mirror and registry servers
    (by PID) and its state dir; stop the engine gpuprov started once nothing else uses it."""
    paths.check_lab_name(lab)
    lp = paths.LabPaths(lab)
    report = DownReport()
    with state.lock():
        report.mirror_stopped = mirror.stop_server(lp)
        report.registry_stopped = registry.stop_server(lp.root / "registry.pid")
        docker = Docker() if engine.Docker().info() is not None else None
        if docker is None and lp.root.exists():
            # The engine is down (a reboot, a crash) but the lab's containers, networks and volumes
            # are still in it: they come back when it starts (the containers restart by policy) and
            # would then run without a lab behind them. Start it to remove them; if it cannot start,
            # the error keeps the lab's state for a later `lab down`.
            docker = engine.ensure_engine(progress)
        if docker is not None:
            flt = ["--filter", f"label={paths.LABEL}={lab}"]
            report.containers = docker.lines("ps", "-aq", *flt)
            if report.containers:
                progress(f"down: removing {len(report.containers)} container(s)")
                docker("rm", "-f", "-v", *report.containers, timeout=300)
            report.networks = docker.lines("network", "ls", "-q", *flt)
            for n in report.networks:
                docker("network", "rm", n)
            report.volumes = docker.lines("volume", "ls", "-q", *flt)
            if report.volumes:
                docker("volume", "rm", "-f", *report.volumes)
        if lp.root.exists():
            shutil.rmtree(lp.root)
            report.state_removed = True
        if docker is not None and not state.all_labs() and not _any_lab_objects(docker):
            report.engine_stopped = engine.stop_engine_if_idle(docker, progress)
    return report


def _any_lab_objects(docker: Docker) -> bool:
    flt = ["--filter", f"label={paths.LABEL}"]
    return bool(docker.lines("ps", "-aq", *flt) or docker.lines("network", "ls", "-q", *flt))


# -------------------------------------------------------------------------------------------- status


@dataclass
class HostStatus:
    host: str
    address: str
    profile: str
    gpus: int
    state: str
    ssh: str
    faults: list[str]


def status(lab: str) -> tuple[LabState, list[HostStatus], bool]:
    """Per-host state (container + systemd), SSH reachability and whether the mirror answers."""
    st = state.require(lab)
    docker = Docker()
    if docker.info() is None:
        raise LabError("no Docker engine answers (gpuprov lab up starts one)")
    present = _containers(docker, lab)

    def one(h: PlannedHost) -> HostStatus:
        cstate = present.get(h.name, "missing")
        shown = cstate
        if cstate == "running":
            r = docker(
                "exec", st.paths.container(h.name), "systemctl", "is-system-running", check=False, timeout=20
            )
            shown = f"running ({r.stdout.strip() or 'unknown'})"
        flist = [faults.describe(f) for f in faults.read_faults(st.paths, h.name)]
        return HostStatus(h.name, h.ip, h.profile, h.gpu_count, shown, _ssh_banner(h.ip), flist)

    rows = _parallel(one, st.hosts)
    return st, rows, mirror.server_pid(st.paths) is not None and mirror._answers(st, 2)


def _ssh_banner(ip: str, timeout: float = 2.0) -> str:
    try:
        with socket.create_connection((ip, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            banner = s.recv(64).decode(errors="replace")
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return exc.strerror.lower() if exc.strerror else "error"
    return "ok" if banner.startswith("SSH-") else "no banner"
