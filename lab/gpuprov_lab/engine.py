"""The container engine under the lab: Debian's Docker (dockerd), started by gpuprov when none runs.

There is no systemd on the machines this runs on, so gpuprov starts ``dockerd`` itself, records its PID
and stops it by that PID once no lab (and no other container) remains. The engine must never route or
NAT lab traffic off the machine: daemon.json keeps ``"ip-forward": false, "ip-masq": false`` and every
lab network is ``--internal`` with masquerading off.

Some VMs lack capabilities in their bounding set, so ``docker run --privileged`` fails with "unable to
apply caps"; only when that failure is seen does gpuprov install :mod:`gpuprov_lab.runc_capfilter`
as the engine's default runtime.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpuprov_lab import paths, proc
from gpuprov_lab.errors import LabError

DAEMON_JSON = Path("/etc/docker/daemon.json")
DOCKER_PIDFILE = Path("/var/run/docker.pid")
CAPFILTER_NAME = "gpuprov-capfilter"
CAPFILTER_PATH = Path("/usr/local/sbin/gpuprov-runc-capfilter")
CAPS_FAILURE = "unable to apply caps"
# What the engine must always be told: no IPv4 forwarding, no NAT of container networks.
SAFE_DAEMON_OPTIONS = {"ip-forward": False, "ip-masq": False}

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def docker_cli() -> str:
    """The docker client: GPUPROV_DOCKER, else the one shipped with Debian's engine, else PATH's."""
    explicit = os.environ.get("GPUPROV_DOCKER")
    if explicit:
        return explicit
    if Path("/usr/bin/docker").exists():
        return "/usr/bin/docker"
    found = shutil.which("docker")
    if not found:
        raise LabError("docker client not found (./scripts/setup.sh installs docker.io)")
    return found


class Docker:
    """Thin wrapper over the docker CLI: every call is argv, failures are LabError with stderr."""

    def __init__(self, cli: str | None = None) -> None:
        self.cli = cli or docker_cli()

    def __call__(
        self,
        *args: str,
        input: bytes | None = None,
        timeout: float = 300,
        check: bool = True,
        what: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return proc.run(
            [self.cli, *args],
            input=input,
            timeout=timeout,
            check=check,
            what=what or f"docker {args[0]}",
            env=env,
        )

    def ok(self, *args: str, timeout: float = 30) -> bool:
        return self(*args, check=False, timeout=timeout).returncode == 0

    def lines(self, *args: str, timeout: float = 60) -> list[str]:
        return [ln for ln in self(*args, timeout=timeout).stdout.splitlines() if ln.strip()]

    def info(self) -> dict | None:
        """`docker info` as a dict, or None when no engine answers."""
        try:
            res = self("info", "--format", "{{json .}}", check=False, timeout=15)
        except LabError:
            return None
        if res.returncode != 0:
            return None
        try:
            doc = json.loads(res.stdout)
        except ValueError:
            return None
        # A client that reaches no daemon still prints a document, with ServerErrors.
        return None if doc.get("ServerErrors") or not doc.get("ID") else doc


def unavailable_reason() -> str | None:
    """Why the lab cannot run on this machine (None when it can): used by tests to skip or fail."""
    if os.geteuid() != 0:
        return "the lab needs root (privileged containers, bridge networks)"
    try:
        cli = docker_cli()
    except LabError as exc:
        return str(exc)
    if Docker(cli).info() is not None:
        return None
    if not shutil.which("dockerd"):
        return "no Docker engine answers and dockerd is not installed (./scripts/setup.sh installs docker.io)"
    return None


def read_daemon_json() -> dict:
    if not DAEMON_JSON.exists():
        return {}
    try:
        doc = json.loads(DAEMON_JSON.read_text() or "{}")
    except ValueError as exc:
        raise LabError(f"{DAEMON_JSON}: not valid JSON ({exc}); fix or remove it") from exc
    if not isinstance(doc, dict):
        raise LabError(f"{DAEMON_JSON}: expected a JSON object")
    return doc


def write_daemon_json(updates: dict) -> bool:
    """Merge keys into daemon.json (other keys are kept); True when the file changed."""
    doc = read_daemon_json()
    merged = {**doc, **updates}
    if merged == doc and DAEMON_JSON.exists():
        return False
    DAEMON_JSON.parent.mkdir(parents=True, exist_ok=True)
    tmp = DAEMON_JSON.with_suffix(".json.gpuprov")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, DAEMON_JSON)
    return True


def _dockerd_pid_file() -> Path:
    return paths.engine_dir() / "dockerd.pid"


def started_by_gpuprov() -> int | None:
    """PID of the dockerd that gpuprov started, if it is still that process."""
    return proc.recorded_pid(_dockerd_pid_file(), "dockerd")


def ensure_engine(progress: Progress = _quiet) -> Docker:
    """Return a client for a running engine, starting Debian's dockerd when none answers."""
    docker = Docker()
    if docker.info() is not None:
        return docker
    if os.geteuid() != 0:
        raise LabError("no Docker engine answers and starting one needs root")
    dockerd = shutil.which("dockerd")
    if not dockerd:
        raise LabError(
            "no Docker engine answers and dockerd is not installed (./scripts/setup.sh installs docker.io)"
        )
    other = proc.recorded_pid(DOCKER_PIDFILE, "dockerd")
    if other:
        # An engine is starting or stuck: give it a moment rather than start a second one.
        if _wait_ready(docker, other, 30):
            return docker
        raise LabError(f"dockerd (pid {other}) runs but does not answer; see its log")
    write_daemon_json(SAFE_DAEMON_OPTIONS)
    edir = paths.engine_dir()
    edir.mkdir(parents=True, exist_ok=True)
    log = edir / "dockerd.log"
    progress("engine: starting dockerd")
    child = proc.spawn([dockerd], log)
    _dockerd_pid_file().write_text(f"{child.pid}\n")
    if not _wait_ready(docker, child.pid, 60):
        proc.stop_pid(child.pid)
        _dockerd_pid_file().unlink(missing_ok=True)
        raise LabError(f"dockerd did not become ready: {proc.tail(log.read_text(errors='replace'))}")
    return docker


def _wait_ready(docker: Docker, pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker.info() is not None:
            return True
        if not proc.alive(pid):
            return False
        time.sleep(0.2)
    return False


def ensure_privileged(docker: Docker, image: str, progress: Progress = _quiet) -> None:
    """Make sure a privileged container starts; install the capability filter only if it must."""
    info = docker.info() or {}
    if info.get("DefaultRuntime") == CAPFILTER_NAME:
        return
    probe = ["run", "--rm", "--privileged", "--network", "none", "--entrypoint", "/bin/true", image]
    res = docker(*probe, check=False, timeout=120)
    if res.returncode == 0:
        return
    if CAPS_FAILURE not in res.stderr:
        raise LabError(f"a privileged container does not start: {proc.tail(res.stderr)}")
    progress("engine: privileged containers fail here (capabilities missing); installing the runtime filter")
    install_capfilter()
    write_daemon_json(
        {
            **SAFE_DAEMON_OPTIONS,
            "runtimes": {
                **read_daemon_json().get("runtimes", {}),
                CAPFILTER_NAME: {"path": str(CAPFILTER_PATH)},
            },
            "default-runtime": CAPFILTER_NAME,
        }
    )
    pid = proc.recorded_pid(DOCKER_PIDFILE, "dockerd")
    if not pid:
        raise LabError(f"cannot find the running dockerd to reload {DAEMON_JSON} (no {DOCKER_PIDFILE})")
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 20
    while (docker.info() or {}).get("DefaultRuntime") != CAPFILTER_NAME:
        if time.monotonic() > deadline:
            raise LabError(
                f"dockerd did not take {CAPFILTER_NAME} as default runtime after reloading {DAEMON_JSON}"
            )
        time.sleep(0.2)
    res = docker(*probe, check=False, timeout=120)
    if res.returncode != 0:
        raise LabError(f"a privileged container still does not start: {proc.tail(res.stderr)}")


def install_capfilter() -> None:
    """Write the wrapper as a standalone script that execs this machine's runc."""
    runc = shutil.which("runc")
    if not runc:
        raise LabError("runc is not installed (./scripts/setup.sh installs docker.io, which brings it)")
    source = (Path(__file__).parent / "runc_capfilter.py").read_text()
    source = source.replace('REAL_RUNC = "/usr/sbin/runc"', f"REAL_RUNC = {runc!r}", 1)
    if CAPFILTER_PATH.exists() and CAPFILTER_PATH.read_text() == source:
        return
    CAPFILTER_PATH.parent.mkdir(parents=True, exist_ok=True)
    tmp = CAPFILTER_PATH.with_suffix(".tmp")
    tmp.write_text(source)
    tmp.chmod(0o755)
    os.replace(tmp, CAPFILTER_PATH)


DEFAULT_ENGINE_HOST = "unix:///var/run/docker.sock"


def started_engine_host() -> str:
    """Where the dockerd gpuprov starts listens: daemon.json's `hosts` (a unix socket first), else
    dockerd's default socket. gpuprov starts it without -H, so these are its only sources."""
    hosts = read_daemon_json().get("hosts")
    if isinstance(hosts, list):
        named = [h for h in hosts if isinstance(h, str) and h]
        local = [h for h in named if h.startswith("unix://")]
        if local or named:
            return (local or named)[0]
    return DEFAULT_ENGINE_HOST


def stop_engine_if_idle(docker: Docker, progress: Progress = _quiet) -> bool:
    """Stop the dockerd gpuprov started, by PID, only when that engine holds no container at all
    (the lab's are gone by now: any left are someone else's); True if stopped.

    The question goes to that engine's own socket: DOCKER_HOST or a docker context may point the
    client at another engine, whose empty list says nothing about this one. When the engine cannot
    be asked, it keeps running.
    """
    pid = started_by_gpuprov()
    if pid is None:
        return False
    try:
        host = started_engine_host()
        listed = docker("--host", host, "ps", "--all", "--quiet", timeout=60, what=f"docker --host {host} ps")
    except LabError as exc:
        progress(f"engine: leaving dockerd (pid {pid}) running: cannot tell whether anything uses it: {exc}")
        return False
    others = [ln for ln in listed.stdout.splitlines() if ln.strip()]
    if others:
        progress(f"engine: leaving dockerd (pid {pid}) running: {len(others)} other container(s) at {host}")
        return False
    progress(f"engine: stopping dockerd (pid {pid}), which gpuprov started")
    proc.stop_pid(pid, timeout=30)
    if proc.alive(pid):
        raise LabError(f"dockerd (pid {pid}) did not stop")
    shutil.rmtree(paths.engine_dir(), ignore_errors=True)
    return True
