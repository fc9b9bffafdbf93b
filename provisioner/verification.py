"""Verification: run the probes on hosts (in parallel), evaluate the checks, build the report.

Library entry points, for the CLI and for other parts of gpuprov (bootstrap ends by verifying its
hosts; the rolling upgrade verifies one host before putting it back):

- `verify_hosts(hosts, policy, checks=..., parallel=...)` over SSH, hosts being inventory HostSpecs;
- `verify_local(...)` on this machine; `verify_snapshot(dir, ...)` replaying a snapshot;
- `snapshot_hosts(hosts, out_dir)` / `snapshot_local(out_dir)` writing the host-snapshot contract.

One probe script per host, one SSH channel; an unreachable host gets `error` on every check with
the reason and the other hosts are unaffected.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from provisioner import records
from provisioner.checks import CHECK_IDS, ERROR, Finding, HostFacts, evaluate, probes_for, select_checks
from provisioner.checks.model import REGISTRY
from provisioner.errors import GpuprovError, InputError, Interrupted
from provisioner.executors import (
    Executor,
    ExecutorError,
    LocalExecutor,
    OpenConnections,
    SnapshotExecutor,
    SnapshotFileRefused,
    SshExecutor,
    SshTarget,
    recorded_seconds,
)
from provisioner.hosttext import first_line
from provisioner.inventory import needs_become
from provisioner.policy import Expectations, Policy, validate_expectations, with_overrides
from provisioner.probes import LEGACY_PROBES, PROBES_BY_NAME, SNAPSHOT_PROBES
from provisioner.probes.base import ProbeResult
from provisioner.probes.host import HOST_FACTS
from provisioner.probes.script import build_script, new_token, parse_script_output
from provisioner.report.model import HostReport, Report

DEFAULT_PARALLEL = 50
DEFAULT_TIMEOUT = 180.0  # whole probe script, per host (each probe also has its own timeout)
DEFAULT_CONNECT_TIMEOUT = 10.0


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Target:
    """One host to probe: its name, how to reach it, and what the inventory says about it."""

    name: str
    open: Callable[[], Executor]
    address: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)
    become: bool = False
    inventory: Path | None = None  # the inventory the vars came from (names the file of a declared value)


_LIVE = OpenConnections()


def ssh_targets(
    hosts: Sequence[Any], connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, inventory: Path | None = None
) -> list[Target]:
    """Targets for inventory HostSpecs (name, address, port, user, keys, known_hosts, groups, vars)."""
    targets: list[Target] = []
    for host in hosts:
        ssh = SshTarget.from_host(host)
        hostvars = dict(getattr(host, "vars", None) or {})
        become = needs_become(host)
        targets.append(
            Target(
                name=ssh.name,
                open=lambda ssh=ssh: SshExecutor(ssh, connect_timeout=connect_timeout),
                address=ssh.address,
                groups=tuple(getattr(host, "groups", None) or ()),
                vars=hostvars,
                become=become,
                inventory=inventory,
            )
        )
    return targets


# ---------------------------------------------------------------------------------------- probing


def collect(
    executor: Executor,
    names: Sequence[str],
    timeout: float = DEFAULT_TIMEOUT,
    smoke_image: str | None = None,
    become: bool = False,
) -> dict[str, ProbeResult]:
    """Run the named probes on one host in one script (or replay them from a snapshot)."""
    if isinstance(executor, SnapshotExecutor):
        if executor.host_error:
            raise ExecutorError(executor.name, f"not collected: {executor.host_error}")
        replayed = replay(executor, names)
        if names and not any(r.collected for r in replayed.values()):
            # Every check would skip and the host would read as fine, judged on nothing.
            first = next(iter(replayed.values()), None)
            why = f" ({first.name}: {first.note})" if first is not None else ""
            raise ExecutorError(
                executor.name, f"nothing these checks need could be read from {executor.host_dir}{why}"
            )
        return replayed
    token = new_token()
    script = build_script(names, token, smoke_image)
    argv = ["sh", "-c", script]
    if become:
        argv = ["sudo", "-n", "--", *argv]
    result = executor.run(argv, timeout)
    results = parse_script_output(result.stdout, token, names, result.stderr)
    if names and not any(r.collected for r in results.values()):
        why = first_line(result.stderr) or f"exit {result.rc}"
        raise ExecutorError(executor.name, f"the probe script did not run: {why}")
    return results


def replay(executor: SnapshotExecutor, names: Sequence[str]) -> dict[str, ProbeResult]:
    wanted = list(names)
    if HOST_FACTS in wanted and executor.meta.get("probes", {}).get(HOST_FACTS) is None:
        # A snapshot from before host-facts.json: the same facts are in its older files.
        wanted += [p.name for p in LEGACY_PROBES if p.name in executor.meta.get("probes", {})]
        if len(wanted) > len(names):
            wanted.remove(HOST_FACTS)
    out: dict[str, ProbeResult] = {}
    for name in wanted:
        try:
            entry, text = executor.recorded(name)
        except SnapshotFileRefused as exc:
            out[name] = ProbeResult(name, None, note=f"refused: {exc}")
            continue
        if entry is None:
            # meta.json is the record of what was collected and how it ended; a file it does not list
            # has no exit status, and guessing one would judge the host on a file of unknown origin.
            why = "not collected: meta.json does not list it" if text is not None else ""
            out[name] = ProbeResult(name, None, note=why or "not collected in this snapshot")
            continue
        rc = entry.get("rc", 0)
        if text is None and rc == 0:
            # A probe that succeeded always left a file (empty or not): without it the output is unknown.
            out[name] = ProbeResult(name, None, note="not collected: its file is missing from the snapshot")
            continue
        out[name] = ProbeResult(
            name,
            int(rc) if isinstance(rc, int) else None,
            text or "",
            str(entry.get("stderr", "")),
            recorded_seconds(entry.get("duration_s")),
            note="" if isinstance(rc, int) else "snapshot metadata has no exit status",
        )
    return out


def _expectations(
    policy: Policy | None, target: Target, fleet_uses_gpu_nodes: bool, overrides: Mapping[str, Any] | None
) -> Expectations:
    exp = policy.expectations_for(target.name, target.groups) if policy else Expectations()
    if exp.gpu_present is None and fleet_uses_gpu_nodes:
        exp.gpu_present = "gpu_nodes" in target.groups
        exp.sources["gpu.present"] = "inventory: " + ("in" if exp.gpu_present else "not in") + " gpu_nodes"
    if exp.gpu_present is False and exp.gpu_count is None:
        exp.gpu_count = 0
        exp.sources["gpu.count"] = exp.sources.get("gpu.present", "gpu.present false")
    # What the inventory declares (MIG layout and strategy, GPU sharing, tenants) where the policy is silent.
    from provisioner import inventory_expectations as declared

    found = declared.declared(target.vars, host=target.name, groups=target.groups, inventory=target.inventory)
    declared.apply(exp, found)
    if overrides:
        from provisioner.policy import KEYS

        defaults = Expectations()
        for key, value in validate_expectations(overrides, "").items():
            name = KEYS[key][0]
            setattr(exp, name, getattr(defaults, name) if value is None else value)
            exp.sources[key] = "caller"
    return exp


def _verify_target(target: Target, exp: Expectations, ids: list[str], timeout: float) -> HostReport:
    start = time.monotonic()
    names = probes_for(ids, smoke=bool(exp.container_smoke_image))
    if not exp.dcgm_diag or "dcgm.diag" in exp.skip_checks:
        names = [n for n in names if n != "dcgmi-diag.json"]
    collected_at = _now_iso()
    executor: Executor | None = None
    try:
        executor = target.open()
        _LIVE.add(executor)
        if isinstance(executor, SnapshotExecutor):
            collected_at = str(executor.meta.get("collected_at") or collected_at)
        results = collect(executor, names, timeout, exp.container_smoke_image, target.become)
    except ExecutorError as exc:
        findings = [Finding(c, ERROR, REGISTRY[c].severity, f"host not probed: {exc.reason}") for c in ids]
        return HostReport(
            target.name, findings, target.address, exc.reason, time.monotonic() - start, collected_at
        )
    finally:
        if executor is not None:
            _LIVE.discard(executor)
            executor.close()
    facts = HostFacts(target.name, results)
    findings = evaluate(facts, exp, ids)
    return HostReport(target.name, findings, target.address, None, time.monotonic() - start, collected_at)


R = TypeVar("R")


def _run_parallel(targets: Sequence[Target], work: Callable[[Target], R], parallel: int) -> list[R]:
    """Run `work` per target on a bounded pool; results in target order."""
    if parallel < 1:
        raise InputError(f"--parallel: must be at least 1, got {parallel}")
    if len(targets) == 1:
        return [work(targets[0])]
    pool = ThreadPoolExecutor(max_workers=min(parallel, len(targets)), thread_name_prefix="gpuprov-probe")
    futures: list[Future[R]] = [pool.submit(work, t) for t in targets]
    try:
        reports = [f.result() for f in futures]
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        _LIVE.close_all()  # blocked reads return at once; threads finish instead of holding exit
        done = sum(1 for f in futures if f.done())
        raise Interrupted(f"interrupted after {done} of {len(targets)} host(s)") from None
    pool.shutdown(wait=True)
    return reports


def verify_targets(
    targets: Sequence[Target],
    policy: Policy | None = None,
    *,
    checks: Iterable[str] | None = None,
    parallel: int = DEFAULT_PARALLEL,
    timeout: float = DEFAULT_TIMEOUT,
    overrides: Mapping[str, Any] | None = None,
    source: str = "",
) -> Report:
    ids = select_checks(checks)
    started = _now_iso()
    t0 = time.monotonic()
    uses_gpu_nodes = any("gpu_nodes" in t.groups for t in targets)
    plans = {t.name: _expectations(policy, t, uses_gpu_nodes, overrides) for t in targets}
    reports = _run_parallel(targets, lambda t: _verify_target(t, plans[t.name], ids, timeout), parallel)
    return Report(
        reports,
        ids,
        started,
        time.monotonic() - t0,
        str(policy.path) if policy and policy.path else None,
        source,
    )


def verify_hosts(
    hosts: Sequence[Any],
    policy: Policy | None = None,
    *,
    checks: Iterable[str] | None = None,
    parallel: int = DEFAULT_PARALLEL,
    timeout: float = DEFAULT_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    overrides: Mapping[str, Any] | None = None,
    inventory: Path | None = None,
) -> Report:
    """Verify inventory hosts over SSH. `checks` picks a subset of ids (or 'gpu.*'); `overrides` are
    policy keys the caller knows better than any file (e.g. {"driver.version": "580.159.04"} right
    after installing it)."""
    return verify_targets(
        ssh_targets(hosts, connect_timeout, inventory),
        policy,
        checks=checks,
        parallel=parallel,
        timeout=timeout,
        overrides=overrides,
        source="ssh",
    )


def local_target(name: str | None = None) -> Target:
    host = name or socket.gethostname()
    return Target(name=host, open=lambda: LocalExecutor(host), address="local")


def verify_local(
    policy: Policy | None = None,
    *,
    checks: Iterable[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    overrides: Mapping[str, Any] | None = None,
) -> Report:
    return verify_targets(
        [local_target()], policy, checks=checks, timeout=timeout, overrides=overrides, source="local"
    )


def snapshot_host_dirs(root: Path, limit: str | None = None) -> list[Path]:
    """A snapshot root (one sub-directory per host) or a single host directory."""
    if not root.is_dir():
        raise InputError(f"--snapshot {root}: not a directory")
    # A meta.json of any kind (a link, a FIFO, a directory) marks a host directory, so that reading it
    # names what is wrong with it instead of the host silently not being there.
    if os.path.lexists(root / "meta.json"):
        dirs = [root]
    else:
        # A host directory is never followed through a symlink: it could point anywhere. A name starting
        # with a dot is no host's (`snapshot` refuses those): it is a directory being written or replaced.
        dirs = sorted(
            d
            for d in root.iterdir()
            if not d.name.startswith(".")
            and d.is_dir()
            and not d.is_symlink()
            and os.path.lexists(d / "meta.json")
        )
    if not dirs:
        raise InputError(f"--snapshot {root}: no snapshot here (no meta.json in it or its sub-directories)")
    if limit:
        dirs = [d for d in dirs if _matches(d.name, limit)]
        if not dirs:
            raise InputError(f"--limit {limit}: matches no host in snapshot {root}")
    return dirs


def _matches(name: str, pattern: str) -> bool:
    """A small subset of Ansible's --limit: comma/colon-separated globs, '!' to exclude."""
    parts = [p.strip() for p in pattern.replace(":", ",").split(",") if p.strip()]
    include = [p for p in parts if not p.startswith("!")]
    exclude = [p[1:] for p in parts if p.startswith("!")]
    ok = any(fnmatch.fnmatchcase(name, p) for p in include) if include else True
    return ok and not any(fnmatch.fnmatchcase(name, p) for p in exclude)


def verify_snapshot(
    root: Path,
    policy: Policy | None = None,
    *,
    checks: Iterable[str] | None = None,
    limit: str | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> Report:
    """Evaluate a snapshot offline exactly as the live hosts would be."""
    targets = snapshot_targets_in(root, limit, groups)
    return verify_targets(targets, policy, checks=checks, parallel=8, source=f"snapshot {root}")


def snapshot_targets_in(
    root: Path, limit: str | None = None, groups: Mapping[str, Sequence[str]] | None = None
) -> list[Target]:
    """One target per host directory of a snapshot (validated: InputError before any is read)."""
    targets = []
    seen: dict[str, Path] = {}
    for d in snapshot_host_dirs(root, limit):
        ex = SnapshotExecutor(d)
        if ex.name in seen:
            # Two reports under one name would read as one host seen twice, or hide one of them.
            raise InputError(
                f"--snapshot {root}: {seen[ex.name]} and {d} both record host {ex.name!r}; keep one of them"
            )
        seen[ex.name] = d
        targets.append(
            Target(
                name=ex.name,
                open=lambda ex=ex: ex,
                address=None,
                groups=tuple((groups or {}).get(ex.name, ())),
            )
        )
    return targets


# --------------------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class SnapshotResult:
    host: str
    path: Path
    error: str | None
    probes: int


def _make_private_dirs(path: Path) -> None:
    """Create `path` and any missing parent owner-only (0700 whatever the umask); existing ones are
    left as they are."""
    missing = []
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir(mode=records.DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(p, records.DIR_MODE)


def _is_snapshot_host_dir(path: Path) -> bool:
    """A real directory (not a link to one) holding a regular meta.json (not a link to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and stat.S_ISREG(os.lstat(path / "meta.json").st_mode)
    except OSError:
        return False


def _check_snapshot_dest(out_dir: Path, names: Iterable[str]) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"-o {out_dir}: exists and is not a directory")
    # Where the snapshot cannot be written is found before any host is probed.
    parent = next((p for p in (out_dir, *out_dir.parents) if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise InputError(f"-o {out_dir}: {parent} is not writable")
    try:
        _make_private_dirs(out_dir)
        probe = tempfile.mkdtemp(prefix=".gpuprov-write-test-", dir=out_dir)
        os.rmdir(probe)
    except OSError as exc:
        raise InputError(f"-o {out_dir}: cannot create the snapshot there: {exc.strerror}") from exc
    for name in names:
        if not name or "/" in name or name in (".", "..") or name.startswith("."):
            raise InputError(f"host name {name!r} cannot be a snapshot directory name")
        dest = out_dir / name
        if dest.is_symlink():
            # Replacing it would write wherever it points, or leave the link behind: the operator decides.
            raise InputError(f"-o {out_dir}: {dest} is a symbolic link; not writing through it (remove it)")
        if dest.exists() and not _is_snapshot_host_dir(dest):
            raise InputError(
                f"-o {out_dir}: {dest} exists and is not a snapshot (no meta.json); not overwriting"
            )


def write_host_snapshot(
    out_dir: Path,
    host: str,
    results: Mapping[str, ProbeResult] | None,
    error: str | None,
    collected_at: str,
) -> Path:
    """Write one host's directory (files + meta.json) next to the target, then swap it in.

    A snapshot holds container engine configs (registry credentials), kernel logs and package lists:
    like a run record, its directories are 0700 and its files 0600 whatever the umask.
    """
    from provisioner import __version__

    _make_private_dirs(out_dir)
    meta: dict[str, Any] = {
        "host": host,
        "collected_at": collected_at,
        "collector": f"gpuprov {__version__}",
        "probes": {},
    }
    if error:
        meta["error"] = error
    # A fresh directory of its own (mkdtemp: 0700, a name nobody else holds), never one found there.
    tmp = Path(tempfile.mkdtemp(prefix=f".{host}.tmp-", dir=out_dir))
    try:
        not_collected: dict[str, str] = {}
        for name, res in (results or {}).items():
            if not res.collected:
                not_collected[name] = res.note
                continue
            entry: dict[str, Any] = {
                "rc": res.rc,
                "duration_s": res.duration_s,
                "command": PROBES_BY_NAME[name].command,
            }
            if res.stderr:
                entry["stderr"] = res.stderr
            meta["probes"][name] = entry
            if res.not_applicable or (not res.ok and not res.stdout):
                continue
            _write_private(tmp / name, res.stdout)
        if not_collected:
            meta["not_collected"] = not_collected
        _write_private(tmp / "meta.json", json.dumps(meta, indent=2, sort_keys=False) + "\n")
        os.chmod(tmp, records.DIR_MODE)
        _swap_in(tmp, out_dir / host)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir / host


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, records.FILE_MODE)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), records.FILE_MODE)
        fh.write(text)


def _swap_in(new: Path, dest: Path) -> None:
    """Put the directory `new` at `dest`, replacing a previous snapshot there. `dest` is never followed
    when it is a link, and a failure leaves the previous snapshot where it was."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        os.rename(new, dest)
        return
    if not stat.S_ISDIR(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise GpuprovError(f"{dest} is {what} now; the snapshot of this host is not written")
    # The old directory goes into a fresh holding directory first, so that removing it never meets a
    # name chosen by someone else.
    hold = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    try:
        os.rename(dest, hold / dest.name)
    except OSError:
        os.rmdir(hold)
        raise
    try:
        os.rename(new, dest)
    except OSError:
        os.rename(hold / dest.name, dest)
        os.rmdir(hold)
        raise
    shutil.rmtree(hold)


def snapshot_targets(
    targets: Sequence[Target],
    out_dir: Path,
    *,
    parallel: int = DEFAULT_PARALLEL,
    timeout: float = DEFAULT_TIMEOUT,
    probes: Sequence[str] = SNAPSHOT_PROBES,
) -> list[SnapshotResult]:
    _check_snapshot_dest(out_dir, [t.name for t in targets])

    def work(target: Target) -> SnapshotResult:
        collected_at = _now_iso()
        executor: Executor | None = None
        results: dict[str, ProbeResult] | None = None
        error: str | None = None
        try:
            executor = target.open()
            _LIVE.add(executor)
            results = collect(executor, probes, timeout, None, target.become)
        except ExecutorError as exc:
            error = exc.reason
        finally:
            if executor is not None:
                _LIVE.discard(executor)
                executor.close()
        path = write_host_snapshot(out_dir, target.name, results, error, collected_at)
        count = sum(1 for r in (results or {}).values() if r.collected)
        return SnapshotResult(target.name, path, error, count)

    return _run_parallel(targets, work, parallel)


def snapshot_hosts(
    hosts: Sequence[Any],
    out_dir: Path,
    *,
    parallel: int = DEFAULT_PARALLEL,
    timeout: float = DEFAULT_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> list[SnapshotResult]:
    return snapshot_targets(ssh_targets(hosts, connect_timeout), out_dir, parallel=parallel, timeout=timeout)


def snapshot_local(out_dir: Path, *, timeout: float = DEFAULT_TIMEOUT) -> list[SnapshotResult]:
    return snapshot_targets([local_target()], out_dir, timeout=timeout)


# ------------------------------------------------------------------------------------------ inputs


def load_hosts(inventory: Path, limit: str | None) -> list[Any]:
    """Hosts from an Ansible inventory (provisioner.inventory), filtered by --limit."""
    if not inventory.exists():
        raise InputError(f"-i {inventory}: inventory not found")
    from provisioner.inventory import load_inventory

    hosts = load_inventory(inventory).select(limit)
    if not hosts:
        raise InputError(f"-i {inventory}: no host selected" + (f" by --limit {limit}" if limit else ""))
    return list(hosts)


__all__ = [
    "CHECK_IDS",
    "DEFAULT_PARALLEL",
    "DEFAULT_TIMEOUT",
    "SnapshotResult",
    "Target",
    "collect",
    "load_hosts",
    "run_snapshot",
    "run_verification",
    "snapshot_hosts",
    "snapshot_local",
    "snapshot_targets",
    "snapshot_targets_in",
    "ssh_targets",
    "verify_hosts",
    "verify_local",
    "verify_snapshot",
    "verify_targets",
    "with_overrides",
]


def _one_source(
    inventory: Path | None, local: bool, snapshot: Path | None, allow_snapshot: bool = True
) -> str:
    given = [
        name
        for name, on in (
            ("-i/--inventory", inventory is not None),
            ("--local", local),
            ("--snapshot", snapshot is not None),
        )
        if on
    ]
    choices = "-i/--inventory, --local" + (" or --snapshot" if allow_snapshot else "")
    if not given:
        raise InputError(f"say which hosts: {choices}")
    if len(given) > 1:
        raise InputError(f"choose one of {choices} (got {' and '.join(given)})")
    return given[0]


def read_targets(
    inventory: Path | None,
    local: bool,
    snapshot: Path | None,
    limit: str | None,
    parallel: int,
    hosts_of: Callable[[Path, str | None], Sequence[Any]] | None = None,
) -> list[Target]:
    """The hosts a reading verb (remediate's plan, certify) reads: an inventory's over SSH (`hosts_of`
    picks them; default: every host --limit selects), this machine, or a snapshot's. Every input checked
    first (InputError: exit 2, nothing contacted)."""
    source = _one_source(inventory, local, snapshot)
    if parallel < 1:
        raise InputError(f"--parallel: must be at least 1, got {parallel}")
    if source == "--local":
        if limit:
            raise InputError("--limit applies to -i/--inventory or --snapshot, not --local")
        return [local_target()]
    if source == "--snapshot":
        assert snapshot is not None
        return snapshot_targets_in(snapshot, limit)
    assert inventory is not None
    return ssh_targets((hosts_of or load_hosts)(inventory, limit), inventory=inventory)


def collect_from(target: Target, names: Sequence[str], timeout: float) -> dict[str, ProbeResult]:
    """Open the target, run the probes on it in one script and close it again (an interrupt closes it
    too). ExecutorError when the host cannot be read."""
    executor: Executor | None = None
    try:
        executor = target.open()
        _LIVE.add(executor)
        return collect(executor, names, timeout, None, target.become)
    finally:
        if executor is not None:
            _LIVE.discard(executor)
            executor.close()


def run_verification(
    *,
    inventory: Path | None = None,
    local: bool = False,
    snapshot: Path | None = None,
    policy_path: Path | None = None,
    limit: str | None = None,
    parallel: int = DEFAULT_PARALLEL,
    checks: Iterable[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Report:
    """What `gpuprov verify` and `gpuprov check` do: validate every input first, then probe."""
    source = _one_source(inventory, local, snapshot)
    if parallel < 1:
        raise InputError(f"--parallel: must be at least 1, got {parallel}")
    ids = select_checks(checks)
    policy = load_policy_file(policy_path)
    if source == "--local":
        if limit:
            raise InputError("--limit applies to -i/--inventory or --snapshot, not --local")
        return verify_local(policy, checks=ids, timeout=timeout)
    if source == "--snapshot":
        assert snapshot is not None
        return verify_snapshot(snapshot, policy, checks=ids, limit=limit)
    assert inventory is not None
    hosts = load_hosts(inventory, limit)
    if policy is not None:
        from provisioner.inventory import load_inventory
        from provisioner.policy import check_policy_names

        inv = load_inventory(inventory)
        check_policy_names(policy, inv.host_names(), inv.group_names, inventory)
    return verify_hosts(hosts, policy, checks=ids, parallel=parallel, timeout=timeout, inventory=inventory)


def load_policy_file(path: Path | None) -> Policy | None:
    if path is None:
        return None
    from provisioner.policy import load_policy

    return load_policy(path)


def run_snapshot(
    *,
    inventory: Path | None = None,
    local: bool = False,
    out_dir: Path,
    limit: str | None = None,
    parallel: int = DEFAULT_PARALLEL,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[SnapshotResult]:
    """What `gpuprov snapshot` does."""
    source = _one_source(inventory, local, None, allow_snapshot=False)
    if parallel < 1:
        raise InputError(f"--parallel: must be at least 1, got {parallel}")
    if source == "--local":
        if limit:
            raise InputError("--limit applies to -i/--inventory, not --local")
        return snapshot_local(out_dir, timeout=timeout)
    assert inventory is not None
    return snapshot_hosts(load_hosts(inventory, limit), out_dir, parallel=parallel, timeout=timeout)
