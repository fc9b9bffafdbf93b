"""`gpuprov top`: nvidia-smi's query CSV (values from a real H200), Xids by GPU, the outputs, and
connections kept open between refreshes."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from provisioner import top as T
from provisioner.executors import ExecutorError, HostUnreachable

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h200-ubuntu2404"


def real_h200_line(units: bool) -> str:
    """Our field order, filled with what the real H200 printed (nvidia-smi-query-gpu.csv and
    nvidia-smi-telemetry.csv, driver 580.159.04; captured with units)."""
    q = [c.strip() for c in (HOSTS / "nvidia-smi-query-gpu.csv").read_text().splitlines()[1].split(",")]
    tel = [c.strip() for c in (HOSTS / "nvidia-smi-telemetry.csv").read_text().splitlines()[1].split(",")]
    index, uuid, name, bus = q[0], q[1], q[2], q[3]
    util, utilm, used, total, temp, power = tel[0], tel[1], tel[2], tel[3], tel[4], tel[5]
    limit, reasons = q[18], tel[6]
    cells = [index, uuid, name, bus, util, utilm, used, total, temp, power, limit, reasons]
    if not units:
        cells = [re.sub(r" (%|MiB|W)$", "", c) for c in cells]
    return ", ".join(cells)


@pytest.mark.parametrize("units", [True, False])
def test_the_real_h200s_numbers(units: bool) -> None:
    (g,) = T.parse_query(real_h200_line(units))
    assert (g.index, g.name, g.bus_id) == (0, "NVIDIA H200", "0000:00:06.0")
    assert g.uuid == "GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c008796e"
    assert (g.util_gpu, g.util_mem, g.mem_used_mib, g.mem_total_mib) == (0, 0, 0, 143771)
    assert (g.temp_c, g.power_w, g.power_limit_w) == (35, 77.83, 700)
    assert g.event_reasons == 0x1 and g.slowdowns == []  # idle is no slowdown


def test_not_available_values_and_slowdown_bits() -> None:
    line = (
        "1, GPU-x, NVIDIA H100 80GB HBM3, 00000000:1B:00.0, [N/A], [N/A], 1024, 81559, 88, [N/A], 700, 0x48"
    )
    (g,) = T.parse_query(line)
    assert g.util_gpu is None and g.power_w is None and g.mem_used_mib == 1024
    assert g.slowdowns == ["hw-slowdown", "hw-thermal"]


@pytest.mark.parametrize(
    "text,why",
    [
        ("", "listed no GPU"),
        ("0, GPU-x, H200", "3 fields, 12 expected"),
        ("0, GPU-x, H200, 0000:00:06.0, 12;rm, 0, 0, 1, 30, 70, 700, 0x1", "utilization.gpu: not a number"),
        ("x, GPU-x, H200, 0000:00:06.0, 1, 0, 0, 1, 30, 70, 700, 0x1", "index: not a number"),
        ("0, GPU-x, H200, 0000:00:06.0, 1, 0, 0, 1, 30, 70, 700, busy", "not a bit mask"),
    ],
)
def test_other_output_is_refused(text: str, why: str) -> None:
    with pytest.raises(T.TopParseError, match=why):
        T.parse_query(text)


def test_xids_go_to_the_gpu_whose_pci_device_reported_them() -> None:
    query = (
        "0, GPU-a, H100, 00000000:1B:00.0, 1, 0, 0, 1, 30, 70, 700, 0x1\n"
        "1, GPU-b, H100, 00000000:2A:00.0, 1, 0, 0, 1, 30, 70, 700, 0x1\n"
    )
    log = (
        "[ 812.5] NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
        "[ 900.1] NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE\n"
    )
    a, b = T.parse_sample(query + T.XID_MARK + "\n" + log)
    assert (a.xids, b.xids) == ([], [79, 48])


def test_json_and_prometheus_for_scripts() -> None:
    s = T.HostSample("gpu1", T.parse_query(real_h200_line(False)))
    bad = T.HostSample('evil"\nhost', [], "nvidia-smi not found")
    doc = json.loads(json.dumps(T.to_json([s, bad])))
    assert doc["hosts"][0]["gpus"][0]["memory_total_mib"] == 143771
    assert doc["hosts"][1]["error"] == "nvidia-smi not found"
    prom = T.to_prometheus([s, bad])
    sample = re.compile(r'^[a-z_]+\{(?:[a-z_]+="(?:[^"\\\n]|\\.)*",?)+\} -?[0-9.e+]+$')
    for line in prom.splitlines():
        assert line.startswith("# ") or sample.match(line), line
    assert 'gpuprov_gpu_memory_total_bytes{host="gpu1",gpu="0"' in prom
    assert f'",name="NVIDIA H200"}} {143771 * 1024 * 1024}\n' in prom  # exact, not 1.5e+11
    assert 'gpuprov_top_host_up{host="evil\\"\\nhost"} 0' in prom


TOKEN = "0123abcd0123abcd"


def record(body: str, rc: int = 0, said: str = "") -> bytes:
    lines = [f"@@{TOKEN} S", *body.splitlines(), *(f"@@{TOKEN} R {x}" for x in said.splitlines())]
    return ("\n".join([*lines, f"@@{TOKEN} E {rc}"]) + "\n").encode()


XID_2A = "[ 812.5] NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
TWO_GPUS = (
    "0, GPU-a, H100, 00000000:1B:00.0, 1, 0, 0, 1, 30, 70, 700, 0x1\n"
    "1, GPU-b, H100, 00000000:2A:00.0, 1, 0, 0, 1, 30, 70, 700, 0x1\n"
)


def test_the_stream_is_read_line_by_line_with_xids_anywhere_and_foreign_markers_ignored() -> None:
    hs = T.HostStream(TOKEN)
    data = record(TWO_GPUS)
    # Split mid-line, an Xid line from the follower inside the record, a marker with another token.
    cut = data.index(b"GPU-b")
    hs.feed(b"@@ffff0000ffff0000 E 0\n" + data[:cut])
    hs.feed(XID_2A.encode() + data[cut:])
    # A line torn by another writer is refused with that refresh, never misread.
    assert hs.records == 1 and hs.sample("gpu1").error.startswith("unreadable nvidia-smi output")
    hs.feed(record(TWO_GPUS))
    assert hs.records == 2
    a, b = hs.sample("gpu1").gpus
    assert (a.xids, b.xids) == ([], [79])


def test_the_first_stream_record_reads_like_the_one_shot_script() -> None:
    hs = T.HostStream(TOKEN)
    hs.feed(XID_2A.encode() + record(TWO_GPUS))
    assert hs.sample("h").gpus == T.parse_sample(TWO_GPUS + T.XID_MARK + "\n" + XID_2A)


def test_nvidia_smi_errors_and_bounds() -> None:
    hs = T.HostStream(TOKEN)
    hs.feed(record("", 127, "sh: 1: nvidia-smi: not found"))
    assert hs.sample("h").error == "nvidia-smi not found"
    hs.feed(record("", 9, "NVIDIA-SMI has failed because it couldn't communicate with the driver"))
    assert hs.sample("h").error == (
        "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate with the driver"
    )
    with pytest.raises(T.StreamError, match="longer than 64 KiB"):
        hs.feed(b"x" * (T.MAX_LINE + 1))
    flood = T.HostStream(TOKEN)
    with pytest.raises(T.StreamError, match="more than 1024 lines"):
        flood.feed(f"@@{TOKEN} S\n".encode() + b"0, a\n" * (T.MAX_RECORD_LINES + 1))
    many = T.HostStream(TOKEN)
    many.feed(XID_2A.encode() * (T.MAX_XIDS + 50))
    assert len(many.xid_lines) == T.MAX_XIDS


class FakeStream:
    """A host's stream: answers each newline with the next scripted bytes (or raises)."""

    def __init__(self, answers: list[bytes | Exception]) -> None:
        self.answers = answers
        self.pending = b""
        self.ended = False
        self.closed = False
        self.ticks = 0

    def send(self, data: bytes, timeout: float) -> None:
        self.ticks += data.count(b"\n")
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        self.pending += a

    def read(self, timeout: float) -> bytes:
        data, self.pending = self.pending, b""
        if not data:
            self.ended = True
        return data

    def close(self) -> None:
        self.closed = True


class FakeExecutor:
    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.scripts: list[str] = []
        self.closed = False

    def open_stream(self, script: str) -> FakeStream:
        self.scripts.append(script)
        token = re.search(r"^K=([0-9a-f]+)$", script, re.M)
        assert token
        # The fake answers with the token of the script it was given.
        self.stream.answers = [
            a.replace(TOKEN.encode(), token.group(1).encode()) if isinstance(a, bytes) else a
            for a in self.stream.answers
        ]
        return self.stream

    def run(self, command, timeout):  # type: ignore[no-untyped-def]
        raise AssertionError("top streams: it runs no command per refresh")

    def close(self) -> None:
        self.closed = True


def test_one_stream_per_host_one_tick_per_refresh_and_a_broken_one_is_opened_again() -> None:
    ok = record(TWO_GPUS)
    first = FakeExecutor(FakeStream([ok, ok + XID_2A.encode(), ok, ExecutorError("gpu1", "connection lost")]))
    second = FakeExecutor(FakeStream([ok]))
    opened: list[FakeExecutor] = []

    def opener() -> FakeExecutor:
        ex = [first, second][len(opened)]
        opened.append(ex)
        return ex

    fleet = T.Fleet([("gpu1", opener)], parallel=4, timeout=5)
    try:
        assert fleet.refresh()[0].gpus and fleet.refresh()[0].gpus
        third = fleet.refresh()[0]
        assert third.gpus[1].xids == [79]  # the Xid line came after the second record
        assert len(opened) == 1 and len(first.scripts) == 1 and first.stream.ticks == 3
        lost = fleet.refresh()[0]
        assert lost.error == "connection lost" and first.stream.closed and first.closed
        assert fleet.refresh()[0].gpus and len(opened) == 2
    finally:
        fleet.close()
    assert second.stream.closed


def test_a_stream_that_stops_answering_is_an_error_for_that_host_only() -> None:
    silent = FakeExecutor(FakeStream([b""]))
    fine = FakeExecutor(FakeStream([record(TWO_GPUS)]))
    fleet = T.Fleet([("gpu1", lambda: silent), ("gpu2", lambda: fine)], 2, 5)
    try:
        a, b = fleet.refresh()
    finally:
        fleet.close()
    assert a.error == "the session ended (connection lost?)" and silent.closed
    assert b.error is None and len(b.gpus) == 2


def test_a_host_that_cannot_be_reached_or_has_no_nvidia_smi_is_reported_not_raised() -> None:
    def unreachable() -> FakeExecutor:
        raise HostUnreachable("gpu9", "connection refused")

    no_smi = FakeExecutor(FakeStream([record("", 127, "sh: 1: nvidia-smi: not found")]))
    fleet = T.Fleet([("gpu9", unreachable), ("gpu2", lambda: no_smi)], 2, 5)
    try:
        a, b = fleet.refresh()
    finally:
        fleet.close()
    assert (a.error, b.error) == ("connection refused", "nvidia-smi not found")


FAKE_SMI = """#!/bin/sh
echo "0, GPU-a, NVIDIA H200, 00000000:1B:00.0, 5, 1, 100, 143771, 35, 77.8, 700, 0x1"
echo "1, GPU-b, NVIDIA H200, 00000000:2A:00.0, 5, 1, 100, 143771, 35, 77.8, 700, 0x1"
"""
# A dmesg without --follow (as busybox's): the script re-reads it and passes on only new lines.
FAKE_DMESG = """#!/bin/sh
[ "$1" = --help ] && { echo "Usage: dmesg [options]"; exit 0; }
cat "$KLOG"
"""
XID_1B = "[ 2.0] NVRM: Xid (PCI:0000:1b:00): 48, pid=1, name=x, An uncorrectable double bit error\n"


@pytest.mark.parametrize("follows", [False, True])
def test_the_stream_script_sends_each_xid_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, follows: bool
) -> None:
    """The real script in /bin/sh with a fake nvidia-smi and dmesg: this boot's Xid lines come once at
    the start, then only new ones, through the follower (dmesg --follow-new) or the re-read."""
    from provisioner.executors import LocalExecutor

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    klog = tmp_path / "klog"
    klog.write_text("[ 1.0] boot\n" + XID_1B)
    dmesg = FAKE_DMESG
    if follows:
        dmesg = dmesg.replace('echo "Usage: dmesg [options]"', 'echo " -W, --follow-new   wait"')
        dmesg = dmesg.replace(
            'cat "$KLOG"', '[ "$1" = --follow-new ] && exec tail -n 0 -F "$KLOG"\ncat "$KLOG"'
        )
    for name, text in (("nvidia-smi", FAKE_SMI), ("dmesg", dmesg)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("KLOG", str(klog))
    token = "feedbeef00112233"
    stream = LocalExecutor("here").open_stream(T.stream_script(token))
    hs = T.HostStream(token)
    seen: list[bytes] = []

    def refresh() -> T.HostSample:
        stream.send(b"\n", 5)
        wanted, deadline = hs.records + 1, time.monotonic() + 10
        while hs.records < wanted and time.monotonic() < deadline:
            data = stream.read(deadline - time.monotonic())
            seen.append(data)
            hs.feed(data)
        return hs.sample("here")

    try:
        assert [g.xids for g in refresh().gpus] == [[48], []]
        time.sleep(0.5)  # the follower starts after the first record (dmesg's backlog, then follow-new)
        with klog.open("a") as f:
            f.write("[ 3.0] NVRM: Xid (PCI:0000:2a:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
        deadline = time.monotonic() + 10
        while refresh().gpus[1].xids != [79] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [g.xids for g in refresh().gpus] == [[48], [79]]
    finally:
        stream.close()
    sent = b"".join(seen)
    assert sent.count(b"Xid (PCI:0000:1b:00)") == 1 and sent.count(b"Xid (PCI:0000:2a:00)") == 1


def test_interval_and_targets_are_checked_first() -> None:
    from provisioner.errors import InputError

    with pytest.raises(InputError, match=r"--interval 0\.1"):
        T.run_top(inventory=None, local=True, limit=None, once=True, interval=0.1, parallel=1, timeout=5,
                  show=lambda s: None)  # fmt: skip
    with pytest.raises(InputError, match="exactly one of"):
        T.targets_for(None, False, None)


def write_inventory(tmp_path: Path, with_gpu_nodes: bool = True) -> Path:
    gpu_group = "gpu_nodes" if with_gpu_nodes else "workers"
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  children:\n"
        "    kube_control_plane:\n      hosts:\n        cp1: {ansible_host: 192.0.2.10}\n"
        f"    {gpu_group}:\n      hosts:\n        gpu1: {{ansible_host: 192.0.2.21}}\n"
    )
    return inv


def test_hosts_outside_gpu_nodes_are_no_gpu_nodes_even_when_limited_to_them(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path)
    assert [(h.name, h.gpu_node) for h in T.targets_for(inv, False, None)] == [("cp1", False), ("gpu1", True)]
    assert [(h.name, h.gpu_node) for h in T.targets_for(inv, False, "cp1")] == [("cp1", False)]
    # Without a gpu_nodes group the inventory says nothing: every host is asked.
    (tmp_path / "plain").mkdir()
    plain = write_inventory(tmp_path / "plain", with_gpu_nodes=False)
    assert all(h.gpu_node for h in T.targets_for(plain, False, None))


def test_a_control_plane_without_gpus_is_shown_as_such_and_never_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A healthy fleet with a control plane: every GPU shown, the control plane as "no GPU" in each
    format, no connection to it, and exit 0."""
    from provisioner import cli

    def never() -> FakeExecutor:
        raise AssertionError("a host without GPUs is not connected to")

    def fleet(*_: object) -> list[T.TopHost]:
        gpu1 = FakeExecutor(FakeStream([record(TWO_GPUS)]))
        return [T.TopHost("cp1", never, gpu_node=False), T.TopHost("gpu1", lambda: gpu1)]

    monkeypatch.setattr(T, "targets_for", fleet)
    outputs = {}
    for output_format in ("table", "json", "prometheus"):
        rc = cli.app(["top", "--local", "--once", "--format", output_format], standalone_mode=False)
        outputs[output_format] = capsys.readouterr().out
        assert rc == 0, (output_format, outputs[output_format])
    assert re.search(r"cp1\W+no GPU", outputs["table"]) and "error" not in outputs["table"]
    hosts = {h["host"]: h for h in json.loads(outputs["json"])["hosts"]}
    assert hosts["cp1"] == {"host": "cp1", "gpu_node": False, "gpus": []}
    assert hosts["gpu1"]["gpu_node"] and len(hosts["gpu1"]["gpus"]) == 2
    assert 'host="cp1"' not in outputs["prometheus"]
    assert 'gpuprov_top_host_up{host="gpu1"} 1' in outputs["prometheus"]


def test_a_gpu_node_without_nvidia_smi_is_still_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    no_smi = FakeExecutor(FakeStream([record("", 127, "sh: 1: nvidia-smi: not found")]))
    monkeypatch.setattr(T, "targets_for", lambda *_: [T.TopHost("gpu1", lambda: no_smi)])
    (sample,) = T.run_top(
        inventory=None,
        local=True,
        limit=None,
        once=True,
        interval=1,
        parallel=1,
        timeout=5,
        show=lambda s: None,
    )
    assert sample.gpu_node and sample.error == "nvidia-smi not found" and sample.failed
