"""The session lab bootstrapped once, end to end, for every test that needs a fully provisioned fleet.

Bootstrap runs twice: the first run provisions every stage, the second must change nothing (idempotence).
Both results are kept for the tests to inspect. Before the first run, two hosts get the engine settings
another tool left behind (FOREIGN_*): gpuprov must keep them; then each host's state is read (packages,
holds, apt and engine files, the stack's directories), for `gpuprov reset` to be held to.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from labkit import HostState, Lab, gpuprov, host_state


@dataclass(frozen=True)
class BootstrapRun:
    rc: int
    summary: dict[str, Any]
    stderr: str

    def host(self, name: str) -> dict[str, Any]:
        return next(h for h in self.summary["hosts"] if h["host"] == name)


@dataclass(frozen=True)
class Bootstrapped:
    lab: Lab
    first: BootstrapRun
    second: BootstrapRun
    foreign_hosts: tuple[str, ...]  # the hosts that had another tool's engine settings before the first run
    before: dict[str, HostState]  # each host as it was before gpuprov first ran on it


# What another tool left in the engines' files before gpuprov first ran, on a control-plane host and a
# GPU host: a registry mirror in daemon.json; containerd's own OOM score and a registry config_path.
FOREIGN_HOSTS = ("cp1", "gpu1")
FOREIGN_DAEMON_JSON = '{"registry-mirrors": ["https://registry-mirror.invalid"]}\n'
FOREIGN_CONTAINERD_TOML = """version = 2
oom_score = -999

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
"""


def _leave_foreign_settings(lab: Lab) -> None:
    for host in FOREIGN_HOSTS:
        res = lab.ssh(
            host,
            "mkdir -p /etc/docker /etc/containerd && "
            f"cat > /etc/docker/daemon.json <<'EOF'\n{FOREIGN_DAEMON_JSON}EOF\n"
            f"cat > /etc/containerd/config.toml <<'EOF'\n{FOREIGN_CONTAINERD_TOML}EOF\n",
        )
        if res.returncode != 0:
            pytest.fail(f"{host}: could not write the foreign engine settings: {res.stderr}", pytrace=False)


def _bootstrap(lab: Lab) -> BootstrapRun:
    res = gpuprov("bootstrap", "-i", str(lab.inventory), "--yes", "--format", "json", timeout=3600)
    try:
        summary = json.loads(res.stdout)
    except ValueError:
        pytest.fail(f"bootstrap printed no JSON summary (rc {res.returncode}):\n{res.stderr[-4000:]}")
    return BootstrapRun(res.returncode, summary, res.stderr)


@pytest.fixture(scope="session")
def bootstrapped(lab: Lab) -> Iterator[Bootstrapped]:
    _leave_foreign_settings(lab)
    before = {host: host_state(lab, host) for host in lab.hosts}
    first = _bootstrap(lab)
    if first.rc != 0:
        bad = [h for h in first.summary["hosts"] if h["status"] != "done"]
        pytest.fail(f"first bootstrap failed (rc {first.rc}): {bad}\n{first.stderr[-4000:]}", pytrace=False)
    second = _bootstrap(lab)
    yield Bootstrapped(lab, first, second, FOREIGN_HOSTS, before)
    for host in lab.hosts:
        lab.cli("lab", "fault", host, "clear")
