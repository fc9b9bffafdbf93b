"""Executors: local shell, snapshot replay, and SSH against real sshd servers on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from provisioner.errors import InputError
from provisioner.executors import (
    KEYS,
    CommandTimeout,
    HostUnreachable,
    LocalExecutor,
    SnapshotExecutor,
    SshExecutor,
    SshTarget,
    to_shell,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from loopback_sshd import LoopbackFleet, available

# ----------------------------------------------------------------------------------------- local


def test_local_script_and_argv() -> None:
    ex = LocalExecutor("here")
    res = ex.run("echo out; echo err >&2; exit 3", 10)
    assert (res.rc, res.stdout, res.stderr) == (3, "out\n", "err\n")
    assert ex.run(["printf", "%s|", "a b", "c'd", "$HOME"], 10).stdout == "a b|c'd|$HOME|"
    assert ex.run(["/nonexistent/tool"], 10).rc == 127


def test_local_timeout_stops_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    with pytest.raises(CommandTimeout, match="timed out after 1 s"):
        LocalExecutor("here").run(f"sleep 60 & echo $! > {pidfile}; wait", 1)
    pid = int(pidfile.read_text())

    def alive() -> bool:  # gone, or a zombie waiting for its new parent to reap it
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state != "Z"

    for _ in range(100):
        if not alive():
            break
        time.sleep(0.02)
    assert not alive(), "background child of a timed-out command survived"


def test_to_shell_quotes_argv() -> None:
    assert to_shell(["sh", "-c", "echo 'x'"]) == "sh -c 'echo '\"'\"'x'\"'\"''"
    assert to_shell("already a script") == "already a script"


# -------------------------------------------------------------------------------------- snapshot


def test_snapshot_executor_replays_recorded_commands(tmp_path: Path) -> None:
    host = tmp_path / "h1"
    host.mkdir()
    (host / "uname-r").write_text("6.8.0-87-generic\n")
    meta = {"host": "h1", "probes": {"uname-r": {"rc": 0, "duration_s": 0.01, "command": "uname -r"}}}
    (host / "meta.json").write_text(json.dumps(meta))
    ex = SnapshotExecutor(host)
    assert ex.name == "h1"
    assert ex.run("uname -r", 5).stdout == "6.8.0-87-generic\n"
    other = ex.run(["rm", "-rf", "/"], 5)
    assert other.rc == 127 and "not recorded" in other.stderr
    assert ex.recorded("nvidia-smi-q.xml") == (None, None)


def test_snapshot_executor_bad_dirs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no meta\.json"):
        SnapshotExecutor(tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(InputError, match="unreadable snapshot metadata"):
        SnapshotExecutor(tmp_path)
    (tmp_path / "meta.json").write_text('{"probes": []}')
    with pytest.raises(InputError, match="'probes' object"):
        SnapshotExecutor(tmp_path)


# ------------------------------------------------------------------------------------------- ssh

needs_sshd = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackFleet]:
    f = LoopbackFleet(tmp_path_factory.mktemp("sshd"), count=2, first=61)
    with f:
        yield f


def target(fleet: LoopbackFleet, i: int = 0, **changes: object) -> SshTarget:
    base = {
        "name": f"h{i}",
        "address": fleet.servers[i].address,
        "port": fleet.port,
        "user": "root",
        "private_key_file": fleet.client_key,
        "known_hosts_file": fleet.known_hosts,
    }
    base.update(changes)
    return SshTarget(**base)  # type: ignore[arg-type]


@needs_sshd
def test_ssh_runs_scripts_and_argv_on_one_connection(fleet: LoopbackFleet) -> None:
    ex = SshExecutor(target(fleet))
    try:
        res = ex.run("echo out; echo err >&2; exit 3", 10)
        assert (res.rc, res.stdout, res.stderr) == (3, "out\n", "err\n")
        transport = ex.connect()
        assert ex.run(["printf", "%s|", "a b", "c'd", "$HOME"], 10).stdout == "a b|c'd|$HOME|"
        assert ex.connect() is transport
    finally:
        ex.close()


@needs_sshd
def test_ssh_large_interleaved_output_does_not_stall(fleet: LoopbackFleet) -> None:
    script = (
        "i=0; while [ $i -lt 3000 ]; do printf '%0300d\\n' $i; printf '%0300d\\n' $i >&2; i=$((i+1)); done"
    )
    ex = SshExecutor(target(fleet))
    try:
        res = ex.run(script, 60)
    finally:
        ex.close()
    assert res.rc == 0
    assert len(res.stdout) == len(res.stderr) == 3000 * 301


@needs_sshd
def test_ssh_command_timeout(fleet: LoopbackFleet) -> None:
    ex = SshExecutor(target(fleet))
    try:
        with pytest.raises(CommandTimeout, match="timed out after 1 s"):
            ex.run("sleep 30", 1)
    finally:
        ex.close()


@needs_sshd
def test_ssh_unknown_host_key_refused_when_strict(fleet: LoopbackFleet, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    ex = SshExecutor(target(fleet, known_hosts_file=empty))
    with pytest.raises(HostUnreachable, match=r"is not in known_hosts"):
        ex.run("true", 5)
    lenient = SshExecutor(target(fleet, known_hosts_file=empty, strict_host_key_checking=False))
    try:
        assert lenient.run("echo ok", 5).stdout == "ok\n"
    finally:
        lenient.close()


@needs_sshd
def test_accept_new_records_an_unknown_host_and_then_holds_it_to_that_key(
    fleet: LoopbackFleet, tmp_path: Path
) -> None:
    """StrictHostKeyChecking=accept-new, as OpenSSH does it: first contact records the key (a file of
    its own, 0600); from then on the host must present that key."""
    known = tmp_path / "ssh" / "known_hosts"
    ex = SshExecutor(target(fleet, known_hosts_file=known, strict_host_key_checking=False, accept_new=True))
    try:
        assert ex.run("echo ok", 5).stdout == "ok\n"
    finally:
        ex.close()
    (line,) = known.read_text().splitlines()
    assert line.startswith(f"[{fleet.servers[0].address}]:{fleet.port} ")
    assert known.stat().st_mode & 0o777 == 0o600
    # The other server's key recorded under this name: accept-new refuses it like a changed key.
    other = fleet.known_hosts.read_text().splitlines()[1].split(" ", 1)[1]
    known.write_text(f"[{fleet.servers[0].address}]:{fleet.port} {other}\n")
    ex = SshExecutor(target(fleet, known_hosts_file=known, strict_host_key_checking=False, accept_new=True))
    with pytest.raises(HostUnreachable, match="does not match known_hosts"):
        ex.run("true", 5)


def test_accept_new_and_the_environment_switch_come_from_the_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from provisioner import inventory as inv_mod

    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  hosts:\n    gpu1:\n      ansible_host: 192.0.2.1\n"
        '      ansible_ssh_common_args: "-o StrictHostKeyChecking=accept-new"\n'
        "    gpu2: {ansible_host: 192.0.2.2}\n"
    )
    specs = {h.name: h for h in inv_mod.load_inventory(inv).select(None)}
    assert SshTarget.from_host(specs["gpu1"]).accept_new is True
    assert SshTarget.from_host(specs["gpu2"]).strict_host_key_checking is True
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")
    inv_mod._WARNED.clear()
    specs = {h.name: h for h in inv_mod.load_inventory(inv).select(None)}
    assert specs["gpu2"].strict_host_key_checking is False
    assert "ANSIBLE_HOST_KEY_CHECKING is off" in capsys.readouterr().err


@needs_sshd
def test_ssh_changed_host_key_refused_even_when_not_strict(fleet: LoopbackFleet, tmp_path: Path) -> None:
    # Record server 1's key under server 0's name: exactly what a man-in-the-middle looks like.
    lines = fleet.known_hosts.read_text().splitlines()
    wrong = lines[1].split(" ", 1)[1]
    swapped = tmp_path / "known_hosts"
    swapped.write_text(f"[{fleet.servers[0].address}]:{fleet.port} {wrong}\n")
    for strict in (True, False):
        ex = SshExecutor(target(fleet, known_hosts_file=swapped, strict_host_key_checking=strict))
        with pytest.raises(HostUnreachable, match="does not match known_hosts"):
            ex.run("true", 5)


@needs_sshd
def test_ssh_auth_failure_and_refused_connection(fleet: LoopbackFleet, tmp_path: Path) -> None:
    import subprocess

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    env_sock = os.environ.pop("SSH_AUTH_SOCK", None)
    try:
        failed = r"authentication failed for root@127\.0\.0\.61 \(tried .*other_key"
        with pytest.raises(HostUnreachable, match=failed):
            SshExecutor(target(fleet, private_key_file=other)).run("true", 5)
    finally:
        if env_sock is not None:
            os.environ["SSH_AUTH_SOCK"] = env_sock
    with pytest.raises(HostUnreachable, match="connection refused"):
        SshExecutor(target(fleet, address="127.0.0.63")).run("true", 5)
    with pytest.raises(HostUnreachable, match="cannot resolve"):
        SshExecutor(target(fleet, address="no-such-host.invalid")).run("true", 5)


@needs_sshd
def test_ssh_known_hosts_with_only_the_rsa_key(tmp_path: Path) -> None:
    """A host with ed25519 and RSA keys, only RSA recorded: ask for RSA, as OpenSSH does."""
    with LoopbackFleet(
        tmp_path / "rsa", count=1, first=70, host_key_types=("ed25519", "rsa"), record_types=("rsa",)
    ) as f:
        assert "ssh-rsa" in f.known_hosts.read_text() and "ssh-ed25519" not in f.known_hosts.read_text()
        ex = SshExecutor(target(f))
        try:
            assert ex.run("echo ok", 10).stdout == "ok\n"
        finally:
            ex.close()


def test_key_cache_reports_unreadable_known_hosts(tmp_path: Path) -> None:
    bad = tmp_path / "known_hosts"
    bad.write_bytes(b"\xff\xfe not text")
    with pytest.raises(InputError, match="cannot read known_hosts"):
        KEYS.known_hosts((bad,))


class _RacingChannel:
    """A channel whose last data, EOF and close land right after the client found both buffers empty."""

    def __init__(self) -> None:
        self.buf = bytearray(b"head\n")
        self.eof_received = False
        self.closed = False
        self.status_event = threading.Event()
        self.exit_status = 0
        self._landed = False

    def exec_command(self, command: str) -> None:
        self.command = command

    def shutdown_write(self) -> None:
        return None

    def recv_ready(self) -> bool:
        return bool(self.buf)

    def recv(self, n: int) -> bytes:
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def recv_stderr_ready(self) -> bool:
        if not self.buf and not self._landed:
            self._landed = True
            self.buf += b"tail\n"
            self.eof_received = self.closed = True
            self.status_event.set()
        return False

    def recv_stderr(self, n: int) -> bytes:
        return b""

    def close(self) -> None:
        return None


def test_ssh_keeps_data_that_lands_with_eof_and_close() -> None:
    chan = _RacingChannel()
    ex = SshExecutor(SshTarget(name="h", address="192.0.2.1"))
    ex._transport = SimpleNamespace(is_active=lambda: True, open_session=lambda timeout: chan)  # type: ignore[assignment]
    res = ex.run("probe", 5)
    assert (res.rc, res.stdout) == (0, "head\ntail\n")


@needs_sshd
def test_ssh_closing_the_connection_ends_a_running_command(fleet: LoopbackFleet) -> None:
    """What Ctrl-C does to a fleet run: closing executors makes blocked runs return at once."""
    ex = SshExecutor(target(fleet))
    ex.connect()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            ex.run("sleep 30", 60)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    time.sleep(0.5)
    ex.close()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], HostUnreachable)
    assert "connection lost" in str(errors[0])


@needs_sshd
def test_a_flood_of_output_is_cut_at_the_cap_and_the_command_stopped(fleet: LoopbackFleet) -> None:
    """A host printing without end costs the controller at most the cap, and the run ends."""
    from provisioner.probes.script import build_script, new_token, parse_script_output

    ex = SshExecutor(target(fleet), max_output=1 << 20)
    token = new_token()
    flood = "flood() { yes 'NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.'; }\n"
    script = build_script(["os-release"], token).replace("main() {", flood + "main() {")
    script = script.replace("  run os-release p0", "  run os-release flood")
    try:
        res = ex.run(script, 60)
    finally:
        ex.close()
    assert len(res.stdout) <= 1 << 20 and "cut" in res.stderr
    results = parse_script_output(res.stdout, token, ["os-release"], res.stderr)
    assert results["os-release"].rc is None and "cut short" in results["os-release"].note


# ---------------------------------------------------------------------------------------- streams


def _read_until(stream, wanted: bytes, timeout: float = 10.0) -> bytes:  # type: ignore[no-untyped-def]
    got, deadline = b"", time.monotonic() + timeout
    while wanted not in got and time.monotonic() < deadline and not stream.ended:
        got += stream.read(deadline - time.monotonic())
    return got


def test_local_stream_answers_each_line_and_ends_with_its_input() -> None:
    stream = LocalExecutor("here").open_stream('while read -r x; do echo "got $x"; done; echo bye')
    try:
        stream.send(b"a\n", 5)
        assert _read_until(stream, b"got a\n") == b"got a\n"
        assert stream.read(0.2) == b""  # nothing more until asked
        stream.send(b"b\n", 5)
        assert _read_until(stream, b"got b\n") == b"got b\n"
    finally:
        stream.close()
    assert stream.ended and stream.proc.returncode == 0


@needs_sshd
def test_ssh_stream_keeps_one_command_running_on_one_channel(fleet: LoopbackFleet) -> None:
    ex = SshExecutor(target(fleet))
    try:
        stream = ex.open_stream('echo err >&2; while read -r x; do echo "got $x"; done')
        transport = ex.connect()
        for word in (b"a", b"b", b"c"):
            stream.send(word + b"\n", 5)
            assert _read_until(stream, b"got " + word + b"\n") == b"got " + word + b"\n"
        assert ex.connect() is transport and len(transport._channels.values()) == 1
        assert stream.stderr_tail == b"err\n"
        stream.close()
        assert ex.run("echo still", 10).stdout == "still\n"  # the connection outlives the stream
    finally:
        ex.close()
    assert _read_until(stream, b"never", 1) == b"" and stream.ended


@needs_sshd
def test_ssh_stream_read_ends_when_the_connection_drops(fleet: LoopbackFleet) -> None:
    ex = SshExecutor(target(fleet))
    stream = ex.open_stream("while read -r x; do echo $x; done")
    ex.close()
    with contextlib.suppress(HostUnreachable):
        _read_until(stream, b"never", 5)
    assert stream.ended
