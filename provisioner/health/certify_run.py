"""What `gpuprov certify` does around the decision (health.certify): validate every input before any host
is contacted, probe each host at the level asked for (over SSH, locally, or from a snapshot), tell how
long that takes and how far it is, and on a cluster mark each node: the label `gpuprov.io/certified`
(the level) and the annotation `gpuprov.io/certified-at` (when, by which gpuprov) on a certified node,
both removed from a node that is not.

`certify_target(target, level)` certifies one host (what remediate can call on a host it repaired);
`mark_certified(kube, node, result)` is the cluster step for one node.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.checks import probes_for
from provisioner.errors import InputError
from provisioner.executors import ExecutorError, OpenConnections
from provisioner.health.certify import (
    DCGM_LEVEL,
    LEVELS,
    STANDARD,
    VERIFY_CHECKS,
    CertResult,
    decide,
    now_iso,
)
from provisioner.health.decide import forget_answered
from provisioner.hosttext import short_safe_text
from provisioner.probes import PROBES, dcgm, nvbandwidth
from provisioner.probes.base import HostFacts, Unavailable
from provisioner.probes.smi import SMI_NVLINK
from provisioner.probes.system import HOST_IDENTITY, host_identity
from provisioner.rollout.model import HostProbe, Kube, StepFailed, not_this_host
from provisioner.verification import (
    DEFAULT_PARALLEL,
    DEFAULT_TIMEOUT,
    Target,
    _run_parallel,
    collect_from,
    load_hosts,
    read_targets,
)

LABEL = "gpuprov.io/certified"
ANNOTATION = "gpuprov.io/certified-at"
HEARTBEAT_S = 30.0


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise InputError(f"--level: unknown level {level!r} (levels: {', '.join(LEVELS)})")
    return level


def probe_names(level: str) -> list[str]:
    """What a host runs to be certified at `level`, in the probe set's order."""
    n = DCGM_LEVEL[check_level(level)]
    wanted = {*probes_for(VERIFY_CHECKS), SMI_NVLINK, HOST_IDENTITY}
    if n:
        wanted.add(dcgm.DIAG_PROBE[n])
    if LEVELS.index(level) >= LEVELS.index(STANDARD):
        wanted.add(nvbandwidth.NVBANDWIDTH)
    return [p.name for p in PROBES if p.name in wanted]


def timeout_for(level: str) -> float:
    """The probe script's limit per host: verify's, plus what the DCGM level and nvbandwidth may take."""
    extra = nvbandwidth.LIMIT_SECONDS if LEVELS.index(level) >= LEVELS.index(STANDARD) else 0
    n = DCGM_LEVEL[level]
    return DEFAULT_TIMEOUT + (dcgm.LIMIT_SECONDS[n] if n else 0) + extra


def plan_text(level: str, hosts: int, timeout: float) -> str:
    """What will run and how long it should take, said before anything starts."""
    n = DCGM_LEVEL[level]
    what = "every verify check and the GPU models' expectations"
    if n:
        expected = dcgm.EXPECTED_SECONDS[n]
        took = f"about {expected // 60} min" if expected >= 60 else "seconds"
        what += f", dcgmi diag -r {n} (DCGM gives {took})"
    else:
        what += ", no DCGM diagnostic"
    if LEVELS.index(level) >= LEVELS.index(STANDARD):
        what += " and nvbandwidth where it is installed"
    return (
        f"certify: {hosts} host(s) at level {level}: {what}; hosts run in parallel, each stopped after "
        f"{timeout / 60:.0f} min"
    )


def _address(target: Target) -> str | None:
    return target.address if target.address not in (None, "local") else None


def _node_name(name: str) -> str | None:
    from provisioner.rollout.kube import valid_node_name

    return name.lower() if valid_node_name(name.lower()) else None


def _identity(facts: HostFacts, target: Target) -> HostProbe:
    """Who the host says it is (its node is its hostname), and the address it was reached at."""
    from provisioner.rollout.kube import valid_node_name

    probe = HostProbe(target.name, address=_address(target))
    try:
        hostname, probe.machine_id = host_identity(facts)
    except Unavailable as exc:
        probe.node_error = f"the host's name was not read: {exc.reason}"
        return probe
    if valid_node_name(hostname):
        probe.node = hostname
    else:
        probe.node_error = (
            f"the host's hostname {short_safe_text(hostname)!r} is not a valid Kubernetes node name"
        )
    return probe


def certify_target(
    target: Target, level: str, timeout: float | None = None, reset_at: Mapping[str, float] | None = None
) -> CertResult:
    """Certify one host at `level`: probe it (one script, one channel) and decide. A host that cannot be
    read is not certified, with the reason; nothing on the host is changed. `reset_at`: the GPUs reset in
    this boot (remediate's), whose Xids logged before the reset are what it answered."""
    check_level(level)
    started = now_iso()
    t0 = time.monotonic()
    try:
        results = collect_from(target, probe_names(level), timeout or timeout_for(level))
    except ExecutorError as exc:
        result = CertResult(target.name, level, None, error=exc.reason, started_at=started)
        result.duration_s = time.monotonic() - t0
        # Its node can still be found by its inventory name, and proven by the address it was tried at.
        result.identity = HostProbe(target.name, node=_node_name(target.name), address=_address(target))
        return result
    facts = HostFacts(target.name, results)
    forget_answered(facts, reset_at)
    result = decide(facts, level)
    result.started_at = started
    result.duration_s = time.monotonic() - t0
    result.identity = _identity(facts, target)
    return result


# ---------------------------------------------------------------------------------------------- cluster


def annotation_text(result: CertResult, version: str | None = None, at: str | None = None) -> str:
    """The annotation's value: JSON (ASCII) with when, which gpuprov, the level and the GPUs' models."""
    if version is None:
        from provisioner import __version__

        version = __version__
    doc = {
        "at": at or now_iso(),
        "by": f"gpuprov {version}",
        "level": result.level,
        "gpus": [g.get("model") or "unknown" for g in result.gpus],
    }
    return json.dumps(doc, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def mark_certified(kube: Kube, node: str, result: CertResult, *, version: str | None = None) -> str:
    """Label and annotate a certified node; take both off a node that is not. Returns what was done.
    The label is what schedulers read: set last on a pass, removed first on a failure."""
    if result.certified:
        kube.set_annotations(node, {ANNOTATION: annotation_text(result, version)})
        kube.set_labels(node, {LABEL: result.level})
        return f"{LABEL}={result.level} set on node {node}"
    kube.set_labels(node, {LABEL: None})
    kube.set_annotations(node, {ANNOTATION: None})
    return f"{LABEL} removed from node {node}"


def label_nodes(kube: Kube, done: Sequence[CertResult]) -> int:
    """Mark each host's node; a host whose node cannot be proven to be that host is left alone (a host
    that names itself after another node must not get that node labelled). Returns how many nodes
    could not be marked as their result says (each result's `label` says why)."""
    failures = 0
    for result in done:
        probe = result.identity or HostProbe(result.host, node_error="who the host is was not read")
        if probe.node is None:
            result.label = f"no node labelled: {probe.node_error or 'the node name is not known'}"
            continue
        try:
            info = kube.node(probe.node)
            if info is None:
                result.label = f"not a Kubernetes node (no node {probe.node})"
                continue
            why = not_this_host(info, probe)
            if why is not None:
                result.label = f"node {info.name} not labelled: it {why}"
                failures += 1
                continue
            result.label = mark_certified(kube, info.name, result)
        except StepFailed as exc:
            result.label = f"node {probe.node} not changed: {exc.reason}"
            failures += 1
    return failures


# ------------------------------------------------------------------------------------------------ runs


@dataclass
class CertRun:
    results: list[CertResult]
    label_failures: int = 0
    notes: list[str] = field(default_factory=list)

    def exit_code(self) -> int:
        """0 when every host is certified (and its node marked); 1 otherwise."""
        ok = all(r.certified for r in self.results) and self.label_failures == 0
        return 0 if ok else 1


class _Progress:
    """Lines to `say` as hosts finish, and every `every` seconds while they run."""

    def __init__(self, say: Callable[[str], None], total: int, every: float) -> None:
        self.say, self.total, self.every = say, total, every
        self.done = 0
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="gpuprov-certify-progress", daemon=True)

    def _elapsed(self) -> str:
        s = int(time.monotonic() - self.t0)
        return f"{s // 60}m{s % 60:02d}s"

    def _beat(self) -> None:
        while not self.stop.wait(self.every):
            with self.lock:
                self.say(f"certify: {self._elapsed()} elapsed, {self.done} of {self.total} host(s) done")

    def finished(self, result: CertResult) -> None:
        with self.lock:
            self.done += 1
            if result.certified:
                how = f"certified ({result.level})"
            else:
                how = (
                    f"not certified (reached {result.reached or 'no level'}; {len(result.reasons)} reason(s))"
                )
            self.say(f"{short_safe_text(result.host, 60)}: {how} after {self._elapsed()}")

    def __enter__(self) -> _Progress:
        if self.every > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


def _inventory_hosts(inventory: Path, limit: str | None) -> tuple[list[Any], Any | None, list[str]]:
    """The hosts to certify: the selected ones of group gpu_nodes where the inventory has that group
    (a control plane without GPUs is no GPU node to certify), else every selected host; the first
    control-plane host (None: no cluster); and the hosts left out, for a note."""
    from provisioner.inventory import load_inventory

    selected = load_hosts(inventory, limit)
    inv = load_inventory(inventory)
    control = inv.select("kube_control_plane") if "kube_control_plane" in inv.group_names else []
    if "gpu_nodes" not in inv.group_names:
        return selected, control[0] if control else None, []
    gpu = [h for h in selected if "gpu_nodes" in (h.groups or ())]
    if not gpu:
        raise InputError(
            f"-i {inventory}: no host of group gpu_nodes selected" + (f" by --limit {limit}" if limit else "")
        )
    left_out = [h.name for h in selected if h not in gpu]
    return gpu, control[0] if control else None, left_out


def run_certify(
    *,
    inventory: Path | None = None,
    local: bool = False,
    snapshot: Path | None = None,
    level: str = "quick",
    limit: str | None = None,
    parallel: int = DEFAULT_PARALLEL,
    timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    kube_factory: Callable[[Any], Any] | None = None,
) -> CertRun:
    """Validate every input first (InputError, before any host is contacted), then certify and, with an
    inventory that has a control plane, mark the nodes."""
    check_level(level)
    if timeout is not None and timeout <= 0:
        raise InputError(f"--timeout: must be positive, got {timeout:g}")
    control: Any | None = None
    left_out: list[str] = []

    def gpu_hosts(path: Path, pattern: str | None) -> list[Any]:
        nonlocal control, left_out
        hosts, control, left_out = _inventory_hosts(path, pattern)
        return hosts

    targets = read_targets(inventory, local, snapshot, limit, parallel, gpu_hosts)
    limit_s = timeout or timeout_for(level)
    say = progress or (lambda _text: None)
    say(plan_text(level, len(targets), limit_s))
    with _Progress(say, len(targets), heartbeat_s if progress else 0) as tracker:

        def work(target: Target) -> CertResult:
            result = certify_target(target, level, limit_s)
            tracker.finished(result)
            return result

        done = _run_parallel(targets, work, parallel)
    run = CertRun(done)
    if left_out:
        shown = ", ".join(short_safe_text(h, 60) for h in left_out)
        run.notes.append(f"not in group gpu_nodes, so not certified: {shown}")
    if snapshot is not None:
        run.notes.append("a snapshot is replayed: no node is labelled")
    elif local:
        run.notes.append("--local: no node is labelled (use -i with the inventory's control plane)")
    elif control is None:
        run.notes.append("the inventory has no kube_control_plane host: no node is labelled")
    else:
        from provisioner.rollout.kube import KubectlOverSsh

        kube = (
            kube_factory or (lambda spec: KubectlOverSsh(spec, OpenConnections(), annotation=ANNOTATION))
        )(control)
        try:
            run.label_failures = label_nodes(kube, done)
        finally:
            close = getattr(kube, "close", None)
            if close is not None:
                close()
    return run
