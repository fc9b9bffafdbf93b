"""`gpuprov verify` and `gpuprov bootstrap` reach a host that the controller cannot reach, through a jump
host (bastion), as `ansible_ssh_common_args` or an ssh config tells them.

The module brings up a lab of its own (cp1 + gpu1) and puts a second segment behind cp1: a Docker network
made like the lab's (``--internal``, masquerading off, on a free private /24) that cp1 (the bastion) and
gpu1 join. A policy-routing rule on this machine (``ip rule add to <segment> prohibit``) makes the
segment unreachable from the controller; traffic between the containers is bridged and takes no routing
decision on this machine, so cp1 still reaches gpu1 there. The rule only blocks: nothing is routed or
forwarded anywhere. gpu1 keeps its lab address (its apt mirror is there), but the test's inventories name
it only by its address on the segment.

Two ways to the bastion, each for verify (paramiko) and bootstrap --only preflight (Ansible, OpenSSH):

- ``proxycommand``: ``-o ProxyCommand="ssh -W %h:%p -i KEY -o UserKnownHostsFile=... root@cp1"`` in
  gpu1's ansible_ssh_common_args (the jump hop's key and known_hosts are in the inventory itself);
- ``proxyjump``: ``-o ProxyJump=root@cp1`` there, the jump hop's key and known_hosts in an ssh config
  handed to OpenSSH with ``-F`` and to gpuprov with GPUPROV_SSH_CONFIG (ProxyJump passes no ``-i``).

That the path went through the bastion is read from the hosts' sshd journals: every login on gpu1 comes
from cp1's address on the segment (none from the controller), and cp1 was logged into from the controller.
Without the jump, verify and bootstrap report gpu1 unreachable within seconds.

The fixture removes the rule (exactly that one), the network and the lab, also when a test fails.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from labkit import Lab, gpuprov, lab_from_inventory, require_lab, unique_lab_name

pytestmark = pytest.mark.lab

BASTION = "cp1"
TARGET = "gpu1"
# Segments behind a bastion come from here (not the lab's own pool, 10.213.0.0/16: no race with `lab up`).
SEGMENT_POOL = ipaddress.IPv4Network("10.214.0.0/16")
SEGMENT_LABEL = "gpuprov.test"
RULE_PRIORITY_BASE = 29100
LOGIN = re.compile(r"Accepted publickey for root from (\S+) port")


def _docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    from gpuprov_lab.engine import docker_cli

    res = subprocess.run([docker_cli(), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and res.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed (rc {res.returncode}): {res.stderr.strip()}")
    return res


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and res.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed (rc {res.returncode}): {res.stderr.strip()}")
    return res


def _used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks already on this machine: Docker's, routes of every table, and ip rules' `to`."""
    found: list[str] = []
    for nid in _docker("network", "ls", "-q").stdout.split():
        fmt = "{{range .IPAM.Config}}{{.Subnet}} {{end}}"
        found += _docker("network", "inspect", "--format", fmt, nid, check=False).stdout.split()
    found += re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", _ip("-4", "route", "show", "table", "all").stdout)
    found += re.findall(r"\bto (\S+)", _ip("-4", "rule").stdout)
    used = []
    for text in found:
        try:
            net = ipaddress.IPv4Network(text, strict=False)
        except ValueError:
            continue
        if net.prefixlen > 0:
            used.append(net)
    return used


def _create_segment(name: str, lab: str) -> ipaddress.IPv4Network:
    """An internal bridge network without masquerading on a free /24 of SEGMENT_POOL, labelled with the
    lab (so `lab down` removes it too) and with this module."""
    used = _used_networks()
    last = ""
    for cand in SEGMENT_POOL.subnets(new_prefix=24):
        if any(cand.overlaps(u) for u in used):
            continue
        res = _docker(
            "network", "create", "--driver", "bridge", "--internal",
            "--subnet", str(cand), "--gateway", str(cand.network_address + 1),
            "--label", f"gpuprov.lab={lab}", "--label", f"{SEGMENT_LABEL}=jump-host",
            "-o", "com.docker.network.bridge.enable_ip_masquerade=false",
            name,
            check=False,
        )  # fmt: skip
        if res.returncode == 0:
            return cand
        last = res.stderr.strip()  # taken meanwhile (Docker refuses overlapping pools): try the next
    pytest.fail(f"no free /24 in {SEGMENT_POOL} for the segment: {last}", pytrace=False)


def _free_rule_priority() -> int:
    taken = {int(m) for m in re.findall(r"^(\d+):", _ip("-4", "rule").stdout, re.M)}
    return next(p for p in range(RULE_PRIORITY_BASE, 32000) if p not in taken)


def _address_on(container: str, network: str) -> str:
    fmt = '{{(index .NetworkSettings.Networks "' + network + '").IPAddress}}'
    address = _docker("inspect", "--format", fmt, container).stdout.strip()
    assert address, f"{container} has no address on {network}"
    return address


def _direct_connect_error(address: str, timeout: float = 3.0) -> str | None:
    """Why this machine cannot open TCP to address:22, or None when it can."""
    try:
        with socket.create_connection((address, 22), timeout=timeout):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Segment:
    lab: Lab
    network: str
    subnet: ipaddress.IPv4Network
    bastion_ip: str  # cp1 on the lab network: what the controller connects to
    bastion_segment_ip: str  # cp1 on the segment: where gpu1's logins must come from
    target_ip: str  # gpu1 on the segment: the only address of gpu1 in the test's inventories
    known_hosts: Path  # the lab's known_hosts plus gpu1's key under target_ip
    work: Path

    def container(self, host: str) -> str:
        return f"gpuprov-{self.lab.name}-{host}"


@pytest.fixture(scope="module")
def segment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Segment]:
    """The module's own lab with gpu1 behind cp1; rule, network and lab always removed afterwards."""
    require_lab()
    name = unique_lab_name("j")
    network = f"gpuprov-{name}-behind"
    rule: list[str] | None = None
    made_network = False
    try:
        up = gpuprov("lab", "up", "--lab", name, "--hosts", "2", timeout=900)
        if up.returncode != 0:
            pytest.fail(
                f"gpuprov lab up --lab {name} failed (rc {up.returncode}):\n{up.stderr}", pytrace=False
            )
        inv = gpuprov("lab", "inventory", "--lab", name)
        assert inv.returncode == 0, inv.stderr
        lab = lab_from_inventory(name, Path(inv.stdout.strip().splitlines()[-1]))
        assert set(lab.hosts) == {BASTION, TARGET}, lab.hosts

        subnet = _create_segment(network, name)
        made_network = True
        for host in (BASTION, TARGET):
            _docker("network", "connect", network, f"gpuprov-{name}-{host}")
        target_ip = _address_on(f"gpuprov-{name}-{TARGET}", network)
        # Until the rule is in, the controller reaches the segment (it holds the bridge's gateway address):
        # the rule, and only the rule, is what keeps it out.
        assert _direct_connect_error(target_ip) is None, f"the segment does not work: {target_ip}:22"

        priority = _free_rule_priority()
        spec = ["to", str(subnet), "prohibit", "priority", str(priority)]
        _ip("-4", "rule", "add", *spec)
        rule = spec  # from here on, teardown deletes exactly this rule
        # Guard for every test: gpu1's segment address is out of the controller's reach, at once.
        t0 = time.monotonic()
        why = _direct_connect_error(target_ip)
        assert why is not None, f"the controller still reaches {target_ip}:22 directly"
        assert time.monotonic() - t0 < 2, why

        work = tmp_path_factory.mktemp("jump")
        known = work / "known_hosts"
        lines = lab.known_hosts.read_text().splitlines()
        target_keys = [ln.split(None, 1)[1] for ln in lines if ln.split(None, 1)[0] == lab.hosts[TARGET].ip]
        assert target_keys, f"no host key of {TARGET} in {lab.known_hosts}"
        known.write_text(
            "".join(f"{ln}\n" for ln in lines) + "".join(f"{target_ip} {k}\n" for k in target_keys)
        )
        yield Segment(
            lab=lab,
            network=network,
            subnet=subnet,
            bastion_ip=lab.hosts[BASTION].ip,
            bastion_segment_ip=_address_on(f"gpuprov-{name}-{BASTION}", network),
            target_ip=target_ip,
            known_hosts=known,
            work=work,
        )
    finally:
        problems = []
        if rule is not None:
            res = _ip("-4", "rule", "del", *rule, check=False)
            if res.returncode != 0:
                problems.append(f"ip rule del {' '.join(rule)}: {res.stderr.strip()}")
        if made_network:
            for host in (BASTION, TARGET):
                _docker("network", "disconnect", "--force", network, f"gpuprov-{name}-{host}", check=False)
            res = _docker("network", "rm", network, check=False)
            if res.returncode != 0:
                problems.append(f"docker network rm {network}: {res.stderr.strip()}")
        down = gpuprov("lab", "down", "--lab", name, timeout=600)
        if down.returncode != 0:
            problems.append(f"gpuprov lab down --lab {name} failed:\n{down.stderr}")
        assert not problems, "; ".join(problems)


# ------------------------------------------------------------------------------------------ inventories

JUMPS = ("proxycommand", "proxyjump")


def _known_args(seg: Segment) -> str:
    return f"-o UserKnownHostsFile={seg.known_hosts} -o StrictHostKeyChecking=yes"


def _jump_args(seg: Segment, jump: str | None) -> tuple[str, dict[str, str]]:
    """gpu1's ansible_ssh_common_args for a way to the bastion, and the environment gpuprov needs for it."""
    if jump is None:
        return _known_args(seg), {"GPUPROV_SSH_CONFIG": "none"}
    if jump == "proxycommand":
        hop = (
            f"ssh -W %h:%p -q -i {seg.lab.ssh_key} -o IdentitiesOnly=yes {_known_args(seg)} "
            f"-o BatchMode=yes -o ConnectTimeout=10 root@{seg.bastion_ip}"
        )
        return f"{_known_args(seg)} -o {shlex.quote('ProxyCommand=' + hop)}", {"GPUPROV_SSH_CONFIG": "none"}
    assert jump == "proxyjump", jump
    config = seg.work / "ssh_config"
    config.write_text(
        f"# The bastion: how ssh (and gpuprov) log into it as the jump hop.\n"
        f"Host {seg.bastion_ip}\n"
        f"  User root\n"
        f"  IdentityFile {seg.lab.ssh_key}\n"
        f"  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {seg.known_hosts}\n"
        f"  StrictHostKeyChecking yes\n"
        f"  BatchMode yes\n"
        f"  ConnectTimeout 10\n"
    )
    args = f"-F {config} {_known_args(seg)} -o ProxyJump=root@{seg.bastion_ip}"
    return args, {"GPUPROV_SSH_CONFIG": str(config)}


def _inventory(seg: Segment, jump: str | None) -> tuple[Path, dict[str, str]]:
    """The lab's inventory with gpu1 named by its segment address only, reached the `jump` way (None:
    directly), and the test's known_hosts for every host."""
    doc = yaml.safe_load(seg.lab.inventory.read_text())
    doc["all"]["vars"]["ansible_ssh_common_args"] = _known_args(seg)
    gpu1 = doc["all"]["children"]["gpu_nodes"]["hosts"][TARGET]
    assert gpu1["ansible_host"] == seg.lab.hosts[TARGET].ip
    gpu1["ansible_host"] = seg.target_ip
    gpu1["ansible_ssh_common_args"], env = _jump_args(seg, jump)
    path = seg.work / f"inventory-{jump or 'direct'}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    return path, env


def _run(seg: Segment, *args: str, env: dict[str, str], timeout: float) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    res = gpuprov(
        *args, "--format", "json", env={"GPUPROV_HOME": str(seg.work / "home"), **env}, timeout=timeout
    )
    elapsed = time.monotonic() - t0
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        pytest.fail(
            f"gpuprov {args[0]} printed no JSON (rc {res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}"
        )
    return res.returncode, doc, elapsed


def _verify(seg: Segment, jump: str | None) -> tuple[int, dict[str, Any], float]:
    inventory, env = _inventory(seg, jump)
    rc, doc, elapsed = _run(
        seg, "verify", "-i", str(inventory), "--limit", TARGET, "--timeout", "60", env=env, timeout=300
    )
    assert [h["host"] for h in doc["hosts"]] == [TARGET], doc["hosts"]
    return rc, doc["hosts"][0], elapsed


def _bootstrap(seg: Segment, jump: str | None) -> tuple[int, dict[str, Any], float]:
    inventory, env = _inventory(seg, jump)
    # Ansible's ControlPersist masters, in a directory of this run only: a master left by an earlier run
    # (through the bastion) must not carry a run that should find no way to gpu1.
    control = Path(tempfile.mkdtemp(prefix="ssh-control-", dir=seg.work))
    env = {**env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control)}
    try:
        rc, doc, elapsed = _run(
            seg, "bootstrap", "-i", str(inventory), "--only", "preflight", "--yes", "--limit", TARGET,
            env=env, timeout=600,
        )  # fmt: skip
    finally:
        for sock in control.iterdir():  # stop the masters now rather than after ControlPersist's 60 s
            subprocess.run(
                ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "gpuprov-lab"],
                capture_output=True, timeout=30, check=False,
            )  # fmt: skip
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert set(hosts) == {TARGET}, doc["hosts"]
    return rc, hosts[TARGET], elapsed


# ---------------------------------------------------------------------------------------- sshd journals


def _cursor(seg: Segment, host: str) -> str:
    out = _docker("exec", seg.container(host), "journalctl", "-n", "0", "--show-cursor").stdout
    m = re.search(r"^-- cursor: (\S+)", out, re.M)
    assert m, f"no journal cursor on {host}: {out!r}"
    return m.group(1)


def _logins(seg: Segment, host: str, cursor: str) -> list[str]:
    """Source addresses of the root logins sshd accepted on the host since the cursor."""
    out = _docker(
        "exec", seg.container(host), "journalctl", "-u", "ssh.service", "-o", "cat", "--no-pager",
        "--after-cursor", cursor,
    ).stdout  # fmt: skip
    return LOGIN.findall(out)


@dataclass(frozen=True)
class Marks:
    bastion: str
    target: str


def _mark(seg: Segment) -> Marks:
    return Marks(_cursor(seg, BASTION), _cursor(seg, TARGET))


def _assert_through_bastion(seg: Segment, marks: Marks, what: str, elapsed: float) -> None:
    """gpu1 was logged into, only from cp1's segment address; cp1 was logged into from the controller."""
    deadline = time.monotonic() + 10  # journald may write a login line a moment after the run ends
    while True:
        on_target, on_bastion = _logins(seg, TARGET, marks.target), _logins(seg, BASTION, marks.bastion)
        if (on_target and on_bastion) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert on_target, f"no login on {TARGET} since the run began"
    # Not from the controller (which holds the segment's gateway address, .1): from the bastion only.
    assert set(on_target) == {seg.bastion_segment_ip}, (
        f"logins on {TARGET} came from {sorted(set(on_target))}, not only from the bastion "
        f"({seg.bastion_segment_ip})"
    )
    assert on_bastion, f"no login on the bastion {BASTION} since the run began"
    # Shown with -s (or -rP): the evidence, per run.
    print(f"{what}: {elapsed:.1f} s; logins on {TARGET} from {on_target}, on {BASTION} from {on_bastion}")


# ---------------------------------------------------------------------------------------------- tests


def test_segment_is_reachable_from_the_bastion_only(segment: Segment) -> None:
    why = _direct_connect_error(segment.target_ip)
    assert why is not None and "Permission denied" in why, why
    probe = _docker(
        "exec", segment.container(BASTION), "timeout", "5", "bash", "-c",
        f"exec 3<>/dev/tcp/{segment.target_ip}/22 && head -c 8 <&3",
    )  # fmt: skip
    assert probe.stdout.startswith("SSH-2.0"), probe


@pytest.mark.parametrize("jump", JUMPS)
def test_verify_reaches_the_host_through_the_bastion(segment: Segment, jump: str) -> None:
    marks = _mark(segment)
    rc, host, elapsed = _verify(segment, jump)
    # A bare host has findings (no driver yet): rc 1. What matters is that it was reached and probed.
    assert rc in (0, 1), host
    assert not host.get("error"), host["error"]
    statuses = {c["id"]: c["status"] for c in host["checks"]}
    assert "error" not in statuses.values(), host["checks"]
    assert statuses["os.supported"] == "pass", host["checks"]
    assert statuses["gpu.present"] == "pass", host["checks"]
    _assert_through_bastion(segment, marks, f"verify via {jump}", elapsed)


@pytest.mark.parametrize("jump", JUMPS)
def test_bootstrap_runs_on_the_host_through_the_bastion(segment: Segment, jump: str) -> None:
    marks = _mark(segment)
    rc, host, elapsed = _bootstrap(segment, jump)
    assert rc == 0, host
    assert host["status"] == "done", host
    assert host["unreachable"] == 0 and host["failed"] == 0, host
    assert host["stages"].get("preflight") == "ok", host
    _assert_through_bastion(segment, marks, f"bootstrap via {jump}", elapsed)


def test_without_the_jump_the_host_is_unreachable_at_once(segment: Segment) -> None:
    marks = _mark(segment)
    rc, host, elapsed = _verify(segment, None)
    assert rc == 1
    assert host.get("error"), host
    assert segment.target_ip in host["error"], host["error"]
    assert {c["status"] for c in host["checks"]} == {"error"}, host["checks"]
    assert elapsed < 30, f"verify took {elapsed:.1f} s to find {TARGET} unreachable"
    host_error = host["error"]

    rc, host, bootstrap_elapsed = _bootstrap(segment, None)
    assert rc != 0
    assert host["status"] == "unreachable", host
    assert bootstrap_elapsed < 60, f"bootstrap took {bootstrap_elapsed:.1f} s to find {TARGET} unreachable"
    print(f"without the jump: verify {elapsed:.1f} s ({host_error}), bootstrap {bootstrap_elapsed:.1f} s")
    assert _logins(segment, TARGET, marks.target) == []
