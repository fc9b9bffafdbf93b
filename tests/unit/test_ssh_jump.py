"""SSH through jump hosts (ProxyJump, -J, the `ssh -W %h:%p` ProxyCommand) and ssh_config, as Ansible
reaches such hosts through OpenSSH; the connection tests run against real sshd servers on loopback."""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from provisioner.errors import InputError
from provisioner.executors import (
    SSH_CONFIG_ENV,
    HostUnreachable,
    JumpHop,
    SshExecutor,
    SshTarget,
    parse_proxy_command,
    parse_ssh_args,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from loopback_sshd import SSHD, LoopbackFleet, available


@pytest.fixture(autouse=True)
def no_user_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never the real ~/.ssh/config: every test starts with an ssh_config that does not exist."""
    path = tmp_path / "ssh_config"
    monkeypatch.setenv(SSH_CONFIG_ENV, str(path))
    return path


def host(name: str, **attrs: object) -> SimpleNamespace:
    """A HostSpec-shaped object as the inventory gives it (vars: what the inventory set)."""
    base: dict[str, object] = {
        "name": name,
        "address": name,
        "port": 22,
        "user": "root",
        "private_key_file": None,
        "known_hosts_file": None,
        "strict_host_key_checking": True,
        "password": None,
        "vars": {},
    }
    base.update(attrs)
    return SimpleNamespace(**base)


# ------------------------------------------------------------------------------ ssh argument parser

COMMON = "ansible_ssh_common_args"


@pytest.mark.parametrize(
    ("args", "hops"),
    [
        ("-o ProxyJump=admin@bastion1:2222", [JumpHop("bastion1", "admin", 2222)]),
        ("-o 'ProxyJump bastion1'", [JumpHop("bastion1")]),
        ("-oProxyJump=b1,ops@b2:2200", [JumpHop("b1"), JumpHop("b2", "ops", 2200)]),
        ("-J bastion1", [JumpHop("bastion1")]),
        ("-qJ ops@10.0.0.9:2200", [JumpHop("10.0.0.9", "ops", 2200)]),
        ("-J ssh://ops@[2001:db8::1]:2200", [JumpHop("2001:db8::1", "ops", 2200)]),
        ('-o ProxyCommand="ssh -W %h:%p -q ops@bastion1"', [JumpHop("bastion1", "ops")]),
        (
            "-o StrictHostKeyChecking=accept-new "
            "-o 'ProxyCommand=ssh -q -p 2200 -i /keys/jump -l ops -W [%h]:%p bastion1'",
            [JumpHop("bastion1", "ops", 2200, Path("/keys/jump"))],
        ),
        ('-o ProxyCommand="ssh -J b0 -W %h:%p b1"', [JumpHop("b0"), JumpHop("b1")]),
        # As with ssh, the first proxy option wins.
        ("-J first -o ProxyJump=second", [JumpHop("first")]),
        ("-o ProxyJump=none -J later", []),
        ('-o ProxyCommand=none -o ProxyCommand="nc %h %p"', []),
    ],
)
def test_ssh_args_jump_hosts(args: str, hops: list[JumpHop]) -> None:
    assert parse_ssh_args(args, "gpu1", COMMON) == tuple(hops)


def test_ssh_args_without_a_proxy_and_unknown_options_ignored() -> None:
    args = "-o ConnectTimeout=5 -o ControlMaster=auto -o ControlPersist=60s -i /k -p 22 -F /x -vvv"
    assert parse_ssh_args(args, "gpu1", COMMON) is None
    assert parse_ssh_args("", "gpu1", COMMON) is None


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("nc -X 5 -x proxy:1080 %h %p", "not an ssh -W command"),
        ("/usr/bin/ssh bastion nc %h %p", "'nc' after the jump host"),
        ("ssh -W %h:%p bastion; touch /tmp/pwned", "'touch' after the jump host"),
        ("sh -c 'ssh -W %h:%p bastion'", "not an ssh -W command"),
        ("ssh -F /tmp/other -W %h:%p bastion", "option -F"),
        ("ssh -o 'ProxyCommand=nc %h %p' -W %h:%p bastion", "a ProxyCommand inside"),
        ("ssh -W 10.0.0.1:22 bastion", "-W '10.0.0.1:22'"),
        ("ssh -q bastion", "must forward with -W %h:%p"),
        ("ssh -W %h:%p", "no jump host"),
        ("ssh -W %h:%p 'bastion", "cannot be split into words"),
    ],
)
def test_proxy_commands_other_than_ssh_W_are_refused(command: str, why: str) -> None:
    with pytest.raises(InputError) as err:
        parse_ssh_args(f"-o ProxyCommand={command!r}", "gpu1", COMMON)
    message = str(err.value)
    assert message.startswith(f"host gpu1: {COMMON}: ProxyCommand ")
    assert why in message and "never runs a command" in message


@pytest.mark.parametrize(
    ("args", "bad"),
    [
        ("-J bastion1:99999", "'99999' is not a TCP port"),
        ("-J bastion1:0", "'0' is not a TCP port"),
        ("-o ProxyJump=bastion1:ssh", "'ssh' is not a TCP port"),
        ('-o ProxyCommand="ssh -p 70000 -W %h:%p bastion1"', "'70000' is not a TCP port"),
        ("-J -oProxyCommand=x", "'-oProxyCommand=x' is not a host name"),
        ("-o 'ProxyJump=bad host'", "'bad host' is not a host name"),
        ("-J 'b1,$(reboot)'", "'$(reboot)' is not a host name"),
        ('-o ProxyCommand="ssh -W %h:%p -- -oProxyCommand=x"', "option --"),
        ("-J '-l root@b1'", "is not a user name"),
        ("-o ProxyJump", "'' is not a host name"),
        ("-J b1,", "'' is not a host name"),
    ],
)
def test_bad_jump_values_name_the_host_and_the_variable(args: str, bad: str) -> None:
    with pytest.raises(InputError, match=r"^host gpu1: ansible_ssh_common_args") as err:
        parse_ssh_args(args, "gpu1", COMMON)
    assert bad in str(err.value)


def test_extra_args_errors_name_that_variable_and_common_args_win() -> None:
    spec = host("gpu1", vars={"ansible_ssh_extra_args": "-J b1:http"})
    with pytest.raises(InputError, match=r"host gpu1: ansible_ssh_extra_args \(-J\): 'http'"):
        SshTarget.from_host(spec)
    spec = host("gpu1", vars={COMMON: "-J b1", "ansible_ssh_extra_args": "-J b2"})
    assert [j.address for j in SshTarget.from_host(spec).jump] == ["b1"]


def test_proxy_command_from_ssh_config_comes_with_percent_tokens_expanded() -> None:
    """paramiko replaces %h and %p in ssh_config's ProxyCommand; the -W must still be the host's."""
    got = parse_proxy_command("ssh -W 10.0.0.5:22 b1", "gpu1", "ProxyCommand", ("10.0.0.5", "22"))
    assert got == (JumpHop("b1"),)
    with pytest.raises(InputError, match=r"-W '10\.9\.9\.9:22'"):
        parse_proxy_command("ssh -W 10.9.9.9:22 b1", "gpu1", "ProxyCommand", ("10.0.0.5", "22"))


# ----------------------------------------------------------------------------------- ssh_config


def test_ssh_config_values_and_the_inventory_winning_over_them(
    tmp_path: Path, no_user_ssh_config: Path
) -> None:
    from provisioner.inventory import load_inventory

    no_user_ssh_config.write_text(
        """
Host jump1
    HostName 10.0.0.9
    User ops
    Port 2200
    IdentityFile /keys/jump
    UserKnownHostsFile /kh/jump
Host gpu*
    HostName %h.dc1.example
    Port 2222
    User admin
    IdentityFile /keys/one
    IdentityFile /keys/two
    UserKnownHostsFile /kh/gpus /kh/other
    ProxyJump jump1
Host *
    User fallback
"""
    )
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        """all:
  vars:
    bastion: ops2@jump2:2201
  hosts:
    gpu1: {}
    gpu2:
      ansible_port: 22
      ansible_user: deploy
      ansible_ssh_private_key_file: /keys/inventory
      ansible_ssh_common_args: "-o UserKnownHostsFile=/kh/inventory -o ProxyJump={{ bastion }}"
    gpu3: {ansible_host: 192.0.2.7}
    gpu4: {ansible_ssh_common_args: "-o ProxyJump=none"}
"""
    )
    specs = {h.name: h for h in load_inventory(inv).select(None)}

    gpu1 = SshTarget.from_host(specs["gpu1"])  # nothing in the inventory: ssh_config throughout
    assert (gpu1.address, gpu1.port, gpu1.user) == ("gpu1.dc1.example", 2222, "admin")
    assert gpu1.private_key_file is None
    assert gpu1.identity_files == (Path("/keys/one"), Path("/keys/two"))
    assert gpu1.known_hosts_file == Path("/kh/gpus")
    (jump,) = gpu1.jump
    assert (jump.name, jump.address, jump.port, jump.user) == ("jump1", "10.0.0.9", 2200, "ops")
    assert jump.identity_files == (Path("/keys/jump"),) and jump.known_hosts_file == Path("/kh/jump")
    assert jump.password is None and jump.jump == ()

    gpu2 = SshTarget.from_host(specs["gpu2"])  # the inventory's values win, a templated ProxyJump too
    assert (gpu2.address, gpu2.port, gpu2.user) == ("gpu2.dc1.example", 22, "deploy")
    assert gpu2.private_key_file == Path("/keys/inventory")
    assert gpu2.identity_files == (Path("/keys/one"), Path("/keys/two"))  # tried after the inventory's key
    assert gpu2.known_hosts_file == Path("/kh/inventory")
    (jump,) = gpu2.jump
    assert (jump.name, jump.address, jump.port, jump.user) == ("jump2", "jump2", 2201, "ops2")
    assert jump.known_hosts_file == Path("/kh/inventory")  # the host's known_hosts, as jump2 has none

    # ansible_host is what ssh is given, so `Host gpu*` does not apply (as with ansible-playbook).
    gpu3 = SshTarget.from_host(specs["gpu3"])
    assert (gpu3.address, gpu3.port, gpu3.user, gpu3.jump) == ("192.0.2.7", 22, "fallback", ())
    assert SshTarget.from_host(specs["gpu4"]).jump == ()


def test_without_ssh_config_the_defaults_stand() -> None:
    gpu = SshTarget.from_host(host("gpu1"))
    assert (gpu.address, gpu.port, gpu.user, gpu.identity_files, gpu.jump) == ("gpu1", 22, "root", (), ())


def test_ssh_config_none_and_include(
    tmp_path: Path, no_user_ssh_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    included = tmp_path / "conf.d"
    included.mkdir()
    (included / "10-gpus.conf").write_text("Host gpu1\n    Port 2201\nHost other\n    Port 1\n")
    no_user_ssh_config.write_text(f"Host gpu*\n    Include {included}/*.conf\n    User admin\n")
    gpu = SshTarget.from_host(host("gpu1"))
    assert (gpu.port, gpu.user) == (2201, "admin")  # the Include's block ended, the outer one goes on
    monkeypatch.setenv(SSH_CONFIG_ENV, "none")
    assert SshTarget.from_host(host("gpu1")).port == 22


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ("Host gpu1\n  Port 0\n", r"host gpu1: Port in .*ssh_config: '0' is not a TCP port"),
        ("Host gpu1\n  Port 22x\n", r"host gpu1: Port in .*ssh_config: '22x' is not a TCP port"),
        ("Host gpu1\n  HostName -oProxyCommand=x\n", r"host gpu1: HostName in .*: '-oProxyCommand=x' is not"),
        ("Host gpu1\n  User -x\n", r"host gpu1: User in .*: '-x' is not a user name"),
        (
            "Host gpu1\n  ProxyJump 'j 1'\n",
            r"host gpu1: ProxyJump for gpu1 in .*ssh_config: \"'j 1'\" is not",
        ),
        ("Host gpu1\n  ProxyCommand nc %h %p\n", r"host gpu1: ProxyCommand for gpu1 in .*: ProxyCommand 'nc"),
        (
            "Host j1\n  Port 99999\nHost gpu1\n  ProxyJump j1\n",
            r"host gpu1: Port for jump host j1 in .*99999",
        ),
        ("Host *\n  ProxyJump j1\n", r"host gpu1: jump hosts loop or nest too deep \(gpu1 -> j1 -> j1\)"),
        ('Match exec "true"\n  Port 2\n', r"ssh_config: line 1: 'Match exec' would run a command"),
        ("Host gpu1\n  Port\n", r"ssh_config: cannot parse ssh config"),
    ],
)
def test_bad_ssh_config_values_are_input_errors(no_user_ssh_config: Path, config: str, error: str) -> None:
    no_user_ssh_config.write_text(config)
    with pytest.raises(InputError, match=error):
        SshTarget.from_host(host("gpu1"))


def test_inventory_values_are_checked_too() -> None:
    with pytest.raises(InputError, match=r"host gpu1: ansible_host: 'gpu 1' is not a host name"):
        SshTarget.from_host(host("gpu1", address="gpu 1", vars={"ansible_host": "gpu 1"}))
    with pytest.raises(InputError, match=r"host gpu1: ansible_port: '0' is not a TCP port"):
        SshTarget.from_host(host("gpu1", port=0, vars={"ansible_port": 0}))


# ------------------------------------------------------------------------- through real jump hosts

needs_sshd = pytest.mark.skipif(available() is not None, reason=str(available()))


@dataclass
class Jumps:
    """sshd servers on loopback: jump1 and jump2 log every forward, nofwd has AllowTcpForwarding no."""

    fleet: LoopbackFleet
    logs: dict[str, Path]

    @property
    def port(self) -> int:
        return self.fleet.port

    def address(self, role: str) -> str:
        return self.fleet.servers[["jump1", "target", "jump2", "nofwd"].index(role)].address

    def config(self, path: Path, **extra: str) -> None:
        """An ssh_config naming the jump hosts (the target's key opens them all), plus `extra` blocks."""
        blocks = [
            f"Host {role}\n    HostName {self.address(role)}\n    Port {self.port}\n"
            f"    User root\n    IdentityFile {self.fleet.client_key}\n"
            for role in ("jump1", "jump2", "nofwd")
        ]
        path.write_text("".join(f"Host {h}\n{body}" for h, body in extra.items()) + "".join(blocks))

    def spec(self, **attrs: object) -> SimpleNamespace:
        """The target as the inventory gives it: its own address, port, key and known_hosts."""
        base: dict[str, object] = {
            "address": self.address("target"),
            "port": self.port,
            "private_key_file": self.fleet.client_key,
            "known_hosts_file": self.fleet.known_hosts,
        }
        base.update(attrs)
        return host("gpu-behind", **base)


def _restart(fleet: LoopbackFleet, i: int, *extra: str) -> Path:
    """Restart fleet server i (our child, by its own PID) with its config, debug logging and `extra`."""
    server = fleet.servers[i]
    assert server.proc is not None
    server.proc.terminate()
    server.proc.wait(timeout=10)
    text = (fleet.workdir / f"sshd{i}.conf").read_text().replace("LogLevel ERROR", "LogLevel DEBUG1")
    config = fleet.workdir / f"sshd{i}-jump.conf"
    config.write_text(text + "".join(f"{line}\n" for line in extra))
    log = fleet.workdir / f"sshd{i}-jump.log"
    server.proc = subprocess.Popen(
        [SSHD, "-D", "-f", str(config), "-E", str(log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection((server.address, server.port), timeout=1):
                return log
        except OSError:
            if server.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"sshd {server.address} did not restart: {log.read_text()[-400:]}"
                ) from None
            time.sleep(0.02)


@pytest.fixture(scope="module")
def jumps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jumps]:
    with LoopbackFleet(tmp_path_factory.mktemp("jump-sshd"), count=4, first=91) as fleet:
        logs = {
            "jump1": _restart(fleet, 0),
            "jump2": _restart(fleet, 2),
            "nofwd": _restart(fleet, 3, "AllowTcpForwarding no"),
        }
        yield Jumps(fleet, logs)


def _log_grows(log: Path, since: int, wanted: str, timeout: float = 5.0) -> str:
    """What `log` gained since offset `since`, once it holds `wanted` (or after the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        new = log.read_bytes()[since:].decode(errors="replace")
        if wanted in new or time.monotonic() > deadline:
            return new
        time.sleep(0.05)


@pytest.fixture
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@needs_sshd
def test_the_ssh_W_proxycommand_idiom_goes_through_the_jump_host(jumps: Jumps, no_agent: None) -> None:
    import paramiko

    jump, target = jumps.address("jump1"), jumps.address("target")
    proxy = f"ssh -W %h:%p -q -i {jumps.fleet.client_key} -p {jumps.port} root@{jump}"
    spec = jumps.spec(vars={COMMON: f'-o StrictHostKeyChecking=yes -o ProxyCommand="{proxy}"'})
    t = SshTarget.from_host(spec)
    assert [(j.address, j.port, j.user, j.private_key_file) for j in t.jump] == [
        (jump, jumps.port, "root", jumps.fleet.client_key)
    ]
    log, since = jumps.logs["jump1"], jumps.logs["jump1"].stat().st_size
    ex = SshExecutor(t)
    try:
        assert ex.run("echo ok", 10).stdout == "ok\n"
        assert ex.run(["printf", "%s|", "a b"], 10).stdout == "a b|"  # one connection, reused
        transport = ex.connect()
        # The host's SSH runs over a channel of the jump host's connection, not over a socket of ours...
        assert isinstance(transport.sock, paramiko.Channel)
        (jump_transport,) = ex._jumps
        assert jump_transport.getpeername()[0] == jump and jump_transport.is_authenticated()
    finally:
        ex.close()
    # ... and the jump host's sshd opened the forward to the target: the path really went through it.
    forwarded = f"target {target} port {jumps.port}"
    assert forwarded in _log_grows(log, since, forwarded)
    assert not transport.is_active() and not jump_transport.is_active() and ex._jumps == []


@needs_sshd
def test_proxyjump_from_ssh_config_through_two_jump_hosts(
    jumps: Jumps, no_user_ssh_config: Path, no_agent: None
) -> None:
    """The inventory names only the host; ssh_config maps it to its address and two jump hosts (the
    second with no User: the local user, as with ssh)."""
    target = jumps.address("target")
    jumps.config(
        no_user_ssh_config,
        **{"gpu-behind": f"    HostName {target}\n    Port {jumps.port}\n    ProxyJump jump1,jump2\n"},
    )
    no_user_ssh_config.write_text(no_user_ssh_config.read_text().replace("User root\n", "", 2))
    spec = jumps.spec(address="gpu-behind", port=22)
    t = SshTarget.from_host(spec)
    assert (t.address, t.port) == (target, jumps.port)
    assert [(j.name, j.user) for j in t.jump] == [("jump1", getpass.getuser()), ("jump2", getpass.getuser())]
    sizes = {role: jumps.logs[role].stat().st_size for role in ("jump1", "jump2")}
    ex = SshExecutor(t)
    try:
        assert ex.run("echo ok", 10).stdout == "ok\n"
        assert len(ex._jumps) == 2
    finally:
        ex.close()
    first = f"target {jumps.address('jump2')} port {jumps.port}"
    second = f"target {target} port {jumps.port}"
    assert first in _log_grows(jumps.logs["jump1"], sizes["jump1"], first)
    assert second in _log_grows(jumps.logs["jump2"], sizes["jump2"], second)


@needs_sshd
def test_a_jump_host_that_does_not_forward_is_named_in_the_failure(
    jumps: Jumps, no_user_ssh_config: Path, no_agent: None
) -> None:
    """Would the jump be bypassed, this host (reachable directly) would answer."""
    jumps.config(no_user_ssh_config)
    ex = SshExecutor(SshTarget.from_host(jumps.spec(vars={COMMON: "-J nofwd"})))
    target = f"{jumps.address('target')}:{jumps.port}"
    with pytest.raises(
        HostUnreachable, match=rf"^gpu-behind: via jump host nofwd: cannot reach {target} from"
    ):
        ex.run("true", 10)
    assert ex._jumps == [] and ex._transport is None
    refused = f"refused local port forward: originator 127.0.0.1 port 0, target {jumps.address('target')}"
    assert refused in _log_grows(jumps.logs["nofwd"], 0, refused)


@needs_sshd
def test_jump_host_key_and_authentication_are_checked_like_the_hosts(
    jumps: Jumps, no_user_ssh_config: Path, no_agent: None, tmp_path: Path
) -> None:
    jumps.config(no_user_ssh_config)
    # known_hosts knows the target but not the jump host: refused, as a direct connection would be.
    only_target = tmp_path / "known_hosts"
    mark = f"[{jumps.address('target')}]:"
    only_target.write_text("".join(ln for ln in jumps.fleet.known_hosts.open() if ln.startswith(mark)))
    spec = jumps.spec(known_hosts_file=only_target, vars={COMMON: "-J jump1"})
    with pytest.raises(
        HostUnreachable, match=r"via jump host jump1: host key for \[127\.0\.0\.91\]:\d+ .*is not"
    ):
        SshExecutor(SshTarget.from_host(spec)).run("true", 10)
    # A jump host's key that is not its own (the target's, recorded under its name): refused even when
    # host key checking is off, as for any host.
    swapped = tmp_path / "swapped"
    target_key = only_target.read_text().split(" ", 1)[1]
    swapped.write_text(only_target.read_text() + f"[{jumps.address('jump1')}]:{jumps.port} {target_key}")
    spec = jumps.spec(known_hosts_file=swapped, strict_host_key_checking=False, vars={COMMON: "-J jump1"})
    with pytest.raises(HostUnreachable, match=r"via jump host jump1: host key for .* does not match"):
        SshExecutor(SshTarget.from_host(spec)).run("true", 10)
    # The jump host gets its own keys, not the host's password, and a wrong key fails there.
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    no_user_ssh_config.write_text(
        no_user_ssh_config.read_text().replace(str(jumps.fleet.client_key), str(other))
    )
    spec = jumps.spec(password="secret", vars={COMMON: "-J jump1"})
    with pytest.raises(
        HostUnreachable, match=r"via jump host jump1: authentication failed for root@127\.0\.0\.91"
    ):
        SshExecutor(SshTarget.from_host(spec)).run("true", 10)


def test_an_unreachable_jump_host_is_named_in_the_failure(no_user_ssh_config: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    no_user_ssh_config.write_text(f"Host bastion1\n    HostName 127.0.0.1\n    Port {port}\n")
    ex = SshExecutor(SshTarget.from_host(host("gpu1", address="10.0.0.5", vars={COMMON: "-J bastion1"})))
    with pytest.raises(
        HostUnreachable, match=rf"^gpu1: via jump host bastion1: connection refused by 127\.0\.0\.1:{port}$"
    ):
        ex.run("true", 5)
    assert ex._jumps == []


def test_no_test_here_reads_the_real_ssh_config() -> None:
    assert os.environ[SSH_CONFIG_ENV] != str(Path("~/.ssh/config").expanduser())
