"""Fault injection: the controller writes ``faults.json`` in a host's state dir (bind-mounted read-only
at /etc/gpuprov-lab in the host), and the emulation inside reads it live. ``unreachable`` is done here:
the host is detached from the lab network and reattached with the same address on ``clear``.

faults.json: ``{"faults": [{"kind": "xid", "gpu": 0, "xid": 79, "id": "9f2c..."}, {"kind": "mig-fail"}]}``.

A GPU fault is an event: each injection gets an ``id`` of its own, so that the host, which clears the
faults a GPU reset or a reboot clears (gpu/recovery.py) for as long as they stay in the file, shows the
same kind, GPU and Xid injected again as a new event. Entries without an id (older labs) still apply.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from gpuprov_lab import paths, state
from gpuprov_lab.errors import LabError
from gpuprov_lab.plan import CONTROL_PLANE
from provisioner.errors import InputError

GPU_KINDS = ("ecc", "xid", "pcie", "gpu-missing", "remap-pending", "remap-failure")
# mig-fail: `nvidia-smi -mig 1` fails on the host's GPUs (the emulation's gpu/mig.py reads it).
HOST_KINDS = ("install-fail", "drain-block", "unreachable", "mig-fail")
KINDS = GPU_KINDS + HOST_KINDS
CLEAR = "clear"
DEFAULT_XID = 79
MAX_XID = 999
# drain-block: a pod on the host's node that a PodDisruptionBudget protects (minAvailable 1 of 1), made
# through the cluster's API from the control plane, so that a real `kubectl drain` cannot evict it.
# ``lab fault`` waits until it runs; ``clear`` deletes it.
DRAIN_BLOCK_NS = "gpuprov-lab"
DRAIN_BLOCK_TIMEOUT = 90.0
ADMIN_CONF = "/etc/kubernetes/admin.conf"

Fault = dict[str, Any]


def faults_file(lp: paths.LabPaths, host: str) -> Path:
    return lp.host_dir(host) / "faults.json"


def read_faults(lp: paths.LabPaths, host: str) -> list[Fault]:
    f = faults_file(lp, host)
    if not f.exists():
        return []
    try:
        doc = json.loads(f.read_text())
    except ValueError as exc:
        raise LabError(f"{f}: not valid JSON ({exc})") from exc
    return list(doc.get("faults", []))


def write_faults(lp: paths.LabPaths, host: str, faults: list[Fault]) -> None:
    state.write_json(faults_file(lp, host), {"faults": faults})


def is_unreachable(lp: paths.LabPaths, host: str) -> bool:
    return any(f.get("kind") == "unreachable" for f in read_faults(lp, host))


def describe(f: Fault) -> str:
    extra = [f"{k}={f[k]}" for k in ("gpu", "xid") if k in f]
    return f["kind"] + (f"({','.join(extra)})" if extra else "")


def build_fault(st: state.LabState, host: str, kind: str, gpu: int | None, xid: int | None) -> Fault | None:
    """Validate a fault request against the lab; the fault entry (None for clear)."""
    spec = st.host(host)
    if kind not in (*KINDS, CLEAR):
        raise InputError(f"fault kind {kind!r} is unknown (kinds: {', '.join(KINDS)}, or {CLEAR})")
    if kind != "xid" and xid is not None:
        raise InputError(f"--xid applies to the xid fault only, not {kind!r}")
    if kind not in GPU_KINDS and gpu is not None:
        raise InputError(f"--gpu applies to GPU faults ({', '.join(GPU_KINDS)}), not {kind!r}")
    if kind == CLEAR:
        return None
    fault: Fault = {"kind": kind}
    if kind in GPU_KINDS:
        if spec.gpu_count == 0:
            raise InputError(f"host {host!r} has no GPU; {kind!r} is a GPU fault")
        index = 0 if gpu is None else gpu
        if not 0 <= index < spec.gpu_count:
            raise InputError(
                f"--gpu {index}: host {host!r} ({spec.profile}) has GPUs 0..{spec.gpu_count - 1}"
            )
        fault["gpu"] = index
    if kind == "xid":
        value = DEFAULT_XID if xid is None else xid
        if not 1 <= value <= MAX_XID:
            raise InputError(f"--xid {value}: an Xid is a number from 1 to {MAX_XID}")
        fault["xid"] = value
    return fault


def with_fault(current: list[Fault], fault: Fault) -> list[Fault]:
    """The host's faults with ``fault`` added. A host fault is a condition: injecting one in force again
    changes nothing. A GPU fault is an event with an id of its own: injecting it again replaces the entry
    of the same kind, GPU and Xid with a new event, which shows again even where a GPU reset or a reboot
    cleared the last one."""
    if fault["kind"] not in GPU_KINDS:
        return current if fault in current else [*current, fault]
    others = [f for f in current if {k: v for k, v in f.items() if k != "id"} != fault]
    return [*others, {**fault, "id": uuid.uuid4().hex[:12]}]


def inject(lab: str, host: str, kind: str, gpu: int | None = None, xid: int | None = None) -> list[Fault]:
    """Add a fault to a host (or clear them all); return the host's faults now in force."""
    st = state.require(lab)
    fault = build_fault(st, host, kind, gpu, xid)
    from gpuprov_lab import network  # the engine is needed only for unreachable

    with state.lock():
        lp = st.paths
        current = read_faults(lp, host)
        if fault is None:
            if any(f.get("kind") == "unreachable" for f in current):
                network.reattach(st, st.host(host))
            write_faults(lp, host, [])
            now: list[Fault] = []
        else:
            now = with_fault(current, fault)
            if now == current:
                return current
            if fault["kind"] == "unreachable":
                network.detach(st, st.host(host))
            write_faults(lp, host, now)
            current = now
    if any(f.get("kind") == "drain-block" for f in current):  # added now, or there before a clear
        blocked = any(f.get("kind") == "drain-block" for f in now)
        if _kubectl(st, "apply" if blocked else "delete --ignore-not-found --wait=false",
                    _drain_block_objects(st, host)) is not None:  # fmt: skip
            wait_drain_block(st, host, blocked=blocked)
    return now


def _drain_block_objects(st: state.LabState, host: str) -> str:
    """The pod (the lab's tools image, pinned to the host's node) and the PodDisruptionBudget that keeps
    it: every eviction is refused while it is the one pod its budget allows."""
    from gpuprov_lab.kube import images, registry

    name = f"drain-block-{host}"
    labels = {"gpuprov.lab/fault": "drain-block", "gpuprov.lab/host": host}
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRAIN_BLOCK_NS}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": DRAIN_BLOCK_NS, "labels": labels},
            "spec": {
                "nodeName": host,
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "block",
                        "image": f"{st.gateway}:{registry.PORT}/{images.TOOLS_REPOSITORY}:{images.TOOLS_TAG}",
                        "command": ["sleep", "2147483647"],
                    }
                ],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": DRAIN_BLOCK_NS},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
        },
    ]
    if not any(f.get("kind") == "drain-block" for f in read_faults(st.paths, host)):
        docs = docs[1:]  # the namespace stays for other hosts' faults
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def _on_control_plane(
    st: state.LabState, cmd: str, timeout: float, stdin: str | None = None
) -> subprocess.CompletedProcess[str] | None:
    """cmd run on the control plane over SSH; None when it cannot be reached (or does not answer)."""
    if is_unreachable(st.paths, CONTROL_PLANE):
        return None
    argv = st.ssh_argv(st.host(CONTROL_PLANE).ip, cmd)
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _kubectl(st: state.LabState, verb: str, manifest: str) -> str | None:
    """`kubectl VERB -f -` with a manifest on the control plane; its output, or None when there is no
    cluster to ask (the lab is not bootstrapped, or the control plane cannot be reached)."""
    cmd = f"test -f {ADMIN_CONF} || exit 3; kubectl --kubeconfig {ADMIN_CONF} {verb} -f -"
    res = _on_control_plane(st, cmd, 60, manifest)
    if res is None or res.returncode == 3:
        return None
    if res.returncode != 0:
        raise LabError(f"drain-block: kubectl {verb} on {CONTROL_PLANE}: {res.stderr.strip()[-300:]}")
    return res.stdout


def _blocking_pods(st: state.LabState, host: str) -> list[dict[str, Any]] | None:
    """The drain-block pods bound to ``host``'s node, read through the control plane; None when there is
    no cluster to ask (the lab is not bootstrapped, or the control plane cannot be reached)."""
    cmd = f"test -f {ADMIN_CONF} && kubectl --kubeconfig {ADMIN_CONF} -n {DRAIN_BLOCK_NS} get pods -o json"
    res = _on_control_plane(st, cmd, 30)
    if res is None or res.returncode != 0:
        return None
    try:
        items = json.loads(res.stdout).get("items", [])
    except ValueError:
        return None
    return [
        p
        for p in items
        if (p.get("spec") or {}).get("nodeName") == host
        and ((p.get("metadata") or {}).get("labels") or {}).get("gpuprov.lab/fault") == "drain-block"
    ]


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def wait_drain_block(
    st: state.LabState, host: str, blocked: bool, timeout: float = DRAIN_BLOCK_TIMEOUT
) -> None:
    """Return once the drain-block fault is in force on ``host`` (its protected pod Ready), or gone after
    a clear, so that what runs next sees it. Without a cluster the fault waits for one: nothing to do."""
    deadline = time.monotonic() + timeout
    while True:
        pods = _blocking_pods(st, host)
        if pods is None:
            return
        if (any(_ready(p) for p in pods)) if blocked else not pods:
            return
        if time.monotonic() > deadline:
            want = "a Ready pod protected by a PodDisruptionBudget" if blocked else "no drain-block pod"
            raise LabError(
                f"{host}: drain-block not {'in force' if blocked else 'cleared'} after {timeout:.0f}s "
                f"(waiting for {want} on the node, namespace {DRAIN_BLOCK_NS})"
            )
        time.sleep(1.0)
