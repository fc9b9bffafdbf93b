"""What every rolling change's fleet shares: the hosts reached over SSH (sessions an interrupt closes
too), who each host says it is, and the cluster through kubectl on the first control-plane host."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from provisioner.executors import OpenConnections, SshExecutor, SshTarget
from provisioner.hosttext import short_safe_text
from provisioner.inventory import needs_become
from provisioner.rollout.kube import KubectlOverSsh, valid_node_name

# /etc/machine-id: 32 lower-case hex digits (systemd's machine-id(5)).
_MACHINE_ID = re.compile(r"[0-9a-f]{32}")
P = TypeVar("P")  # what probing one host gives


class SshFleet(Generic[P]):
    """The hosts (inventory HostSpecs by name) and, when the inventory has one, the control plane.
    `annotation` is the node annotation the change writes its reason to when it leaves a node out.
    A change's fleet says how one host is probed (`_probe_one`); `probe` probes them in parallel."""

    probe_threads = "gpuprov-probe"  # the name of the threads that probe hosts

    def __init__(
        self,
        hosts: Sequence[Any],
        control_plane: Any | None,
        *,
        annotation: str,
        connect_timeout: float = 10.0,
    ) -> None:
        self.specs = {h.name: h for h in hosts}
        self.connect_timeout = connect_timeout
        self._live = OpenConnections()
        self.kube: KubectlOverSsh | None = (
            KubectlOverSsh(control_plane, self._live, connect_timeout, annotation=annotation)
            if control_plane is not None
            else None
        )

    @contextlib.contextmanager
    def _session(self, name: str) -> Iterator[tuple[SshExecutor, list[str]]]:
        """One SSH connection to a host (closed by an interrupt too) and the prefix its root commands need."""
        spec = self.specs[name]
        ex = SshExecutor(SshTarget.from_host(spec), connect_timeout=self.connect_timeout)
        self._live.add(ex)
        try:
            yield ex, ["sudo", "-n", "--"] if needs_become(spec) else []
        finally:
            self._live.discard(ex)
            ex.close()

    def _probe_one(self, name: str) -> P:
        raise NotImplementedError

    def probe(self, hosts: Sequence[str]) -> dict[str, P]:
        """Each host's probe, up to 50 hosts at once."""
        if len(hosts) == 1:
            return {hosts[0]: self._probe_one(hosts[0])}
        with ThreadPoolExecutor(
            max_workers=min(len(hosts), 50), thread_name_prefix=self.probe_threads
        ) as pool:
            return dict(zip(hosts, pool.map(self._probe_one, hosts), strict=True))

    def interrupt(self) -> None:
        self._live.close_all()

    def close(self) -> None:
        self._live.close_all()
        if self.kube is not None:
            self.kube.close()


def read_identity(ex: SshExecutor) -> dict[str, Any]:
    """Who the host says it is, as HostProbe fields: its node name (its hostname, as kubeadm registers
    it), why that cannot name a node, its /etc/machine-id and the address it was reached at. Host data
    is untrusted: a value that is not what it should be is left out. ExecutorError when unreachable."""
    res = ex.run(["cat", "/proc/sys/kernel/hostname"], 15)
    hostname = res.stdout.strip().lower() if res.rc == 0 else ""
    res = ex.run(["cat", "/etc/machine-id"], 15)
    machine_id = res.stdout.strip() if res.rc == 0 else ""
    named = valid_node_name(hostname)
    return {
        "node": hostname if named else None,
        "node_error": None
        if named or not hostname
        else f"the host's hostname {short_safe_text(hostname)!r} is not a valid Kubernetes node name",
        "machine_id": machine_id if _MACHINE_ID.fullmatch(machine_id) else None,
        "address": ex.target.address,
    }
