"""`gpuprov top` fed hostile host output: digits of other scripts, thousands of digits, numbers that
float() turns into infinity, impossible temperatures and memory, control characters, torn and huge
lines. Each goes through the whole path (stream, parser, table, JSON, Prometheus) next to a healthy
host: no traceback, JSON without Infinity or NaN, every Prometheus value finite, the faulty host or
GPU shown as an error and the healthy one shown as it is. Each input runs under a hang guard."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console

from provisioner import top as T

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h200-ubuntu2404"
TOKEN = "0123abcd0123abcd"


def real_h200_cells() -> list[str]:
    """Top's fields, filled with what the real H200 printed (driver 580.159.04), without units."""
    q = [c.strip() for c in (HOSTS / "nvidia-smi-query-gpu.csv").read_text().splitlines()[1].split(",")]
    tel = [c.strip() for c in (HOSTS / "nvidia-smi-telemetry.csv").read_text().splitlines()[1].split(",")]
    cells = [q[0], q[1], q[2], q[3], tel[0], tel[1], tel[2], tel[3], tel[4], tel[5], q[18], tel[6]]
    return [re.sub(r" (%|MiB|W)$", "", c) for c in cells]


REAL = real_h200_cells()
# Keyword names for the fields: "pci.bus_id" is pci_bus_id.
FIELD = {name.replace(".", "_"): i for i, name in enumerate(T.QUERY_FIELDS)}
XID = "[ 812.5] NVRM: Xid (PCI:0000:00:06): {}, pid=1234, name=python, GPU has fallen off the bus."


def line(**changed: str) -> str:
    cells = list(REAL)
    for name, value in changed.items():
        cells[FIELD[name]] = value
    return ", ".join(cells)


def second_gpu() -> str:
    """The real GPU as index 1 on another bus: a host's healthy neighbour of a faulty GPU."""
    return line(index="1", uuid="GPU-second", pci_bus_id="00000000:00:07.0")


def record(body: str, rc: str = "0") -> bytes:
    return f"@@{TOKEN} S\n{body}\n@@{TOKEN} E {rc}\n".encode()


@contextlib.contextmanager
def hang_guard(seconds: float = 5.0) -> Iterator[None]:
    """A hang is a failure, not a stuck suite; no test here asserts how long anything takes."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class ScriptedStream:
    """A host's stream that answers each refresh with the bytes it was given."""

    def __init__(self, answer: bytes) -> None:
        self.answer, self.pending, self.ended = answer, b"", False

    def send(self, data: bytes, timeout: float) -> None:
        self.pending += self.answer

    def read(self, timeout: float) -> bytes:
        data, self.pending = self.pending, b""
        self.ended = not data
        return data

    def close(self) -> None:
        pass


class ScriptedHost:
    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def open_stream(self, script: str) -> ScriptedStream:
        token = re.search(r"^K=([0-9a-f]+)$", script, re.M)
        assert token
        return ScriptedStream(self.answer.replace(TOKEN.encode(), token.group(1).encode()))

    def close(self) -> None:
        pass


def sample_fleet(evil: bytes) -> list[T.HostSample]:
    """One refresh of a fleet of a healthy host and one that answers `evil`."""
    healthy = record(line())
    fleet = T.Fleet([("good", lambda: ScriptedHost(healthy)), ("evil", lambda: ScriptedHost(evil))], 2, 5)
    try:
        return fleet.refresh()
    finally:
        fleet.close()


def refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} in JSON output")


PROM_LINE = re.compile(r'^([a-z_]+)\{((?:[a-z_]+="(?:[^"\\\n]|\\.)*",?)+)\} (\S+)$')


def render_everything(samples: list[T.HostSample]) -> tuple[dict, str, str]:
    """What `top --once` prints in each format, checked for what no format may hold."""
    doc = json.loads(json.dumps(T.to_json(samples), indent=2), parse_constant=refuse_constant)
    prom = T.to_prometheus(samples)
    for text in prom.splitlines():
        if text.startswith("# "):
            continue
        m = PROM_LINE.match(text)
        assert m, text
        assert math.isfinite(float(m.group(3))), text
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(T.table(samples))
    table = out.getvalue()
    # An error row quotes what the host said; a row of readings never shows a non-finite one.
    readings = [row for row in table.splitlines() if "error:" not in row]
    assert not any(re.search(r"\b(inf|nan)\b", row, re.I) for row in readings), table
    return doc, prom, table


def assert_healthy_host_shown(doc: dict, prom: str, table: str) -> None:
    good = next(h for h in doc["hosts"] if h["host"] == "good")
    assert "error" not in good and len(good["gpus"]) == 1 and "error" not in good["gpus"][0]
    assert good["gpus"][0]["temperature_c"] == 35 and good["gpus"][0]["memory_total_mib"] == 143771
    assert 'gpuprov_gpu_temperature_celsius{host="good",gpu="0"' in prom
    assert 'gpuprov_top_host_up{host="good"} 1' in prom
    assert re.search(r"good\W+0\W+NVIDIA H200\W+0%\W+0\.0/140 GiB\W+35 C", table), table


def evil_errors(doc: dict) -> list[str]:
    evil = next(h for h in doc["hosts"] if h["host"] == "evil")
    return [e for e in [evil.get("error"), *(g.get("error") for g in evil["gpus"])] if e]


def check(evil: bytes) -> tuple[dict, str, str]:
    with hang_guard():
        samples = sample_fleet(evil)
        doc, prom, table = render_everything(samples)
    assert_healthy_host_shown(doc, prom, table)
    return doc, prom, table


# Not numbers, or numbers no real GPU reports, as a host might print them in any numeric field.
NOT_NUMBERS = [
    "²", "٣", "１", "৭", "9" * 5000, "9" * 400, "1" + "0" * 20, "inf", "-inf", "+inf", "nan", "NaN",
    "Infinity", "1e999", "1e3", "-1e999", "0x10", "1_000", "+5", "5.", ".5", "5..5", "--1", "\x00",
    "\x1b[2J", "\u202e12", "12;rm -rf /", "９９", "1" * 17, "1.0000000001", "१२",
]  # fmt: skip
IMPOSSIBLE = {
    "utilization.gpu": ["101", "-1", "250.5"],
    "utilization.memory": ["100.1", "-0.5"],
    "memory.used": ["-1024", "99999999999"],
    "memory.total": ["-1", "8796093022208"],
    "temperature.gpu": ["-273", "-273.15", "151", "65535"],
    "power.draw": ["-5", "100000"],
    "power.limit": ["-700", "1000000"],
}
NUMERIC = list(IMPOSSIBLE)


@pytest.mark.parametrize("field", NUMERIC)
def test_a_field_that_is_no_number_is_that_gpus_error(field: str) -> None:
    for value in NOT_NUMBERS + IMPOSSIBLE[field]:
        evil = record(line(**{field.replace(".", "_"): value}) + "\n" + second_gpu())
        doc, prom, table = check(evil)
        errors = evil_errors(doc)
        assert errors and field in errors[0], (field, value, errors)
        # The neighbour GPU of the same host is still shown; the faulty one has no metrics.
        evil_gpus = {g["index"]: g for g in next(h for h in doc["hosts"] if h["host"] == "evil")["gpus"]}
        assert "error" not in evil_gpus[1] and evil_gpus[1]["temperature_c"] == 35, (field, value)
        assert 'gpuprov_gpu_temperature_celsius{host="evil",gpu="1"' in prom
        assert 'gpuprov_gpu_temperature_celsius{host="evil",gpu="0"' not in prom, (field, value)
        assert "error" in table


@pytest.mark.parametrize("value", [*NOT_NUMBERS, "-1", "4096", "1.5", "x", ""])
def test_an_index_that_is_no_gpu_index_is_that_hosts_error(value: str) -> None:
    doc, _prom, _table = check(record(line(index=value)))
    errors = evil_errors(doc)
    assert errors and "index" in errors[0], (value, errors)


def test_memory_used_beyond_the_total_is_an_error() -> None:
    doc, _prom, _table = check(record(line(memory_used="143772")))
    assert "memory.used" in evil_errors(doc)[0]


@pytest.mark.parametrize(
    "body",
    [
        "",
        "\n\n",
        "0, GPU-x, NVIDIA H200",
        line()[: len(line()) // 2],
        line() + ", extra",
        "\x00" * 100,
        "\x1b]0;owned\x07" + line(),
        "é" * 5000,
        ("," * 11 + "\n") * 50,
        line(clocks_event_reasons_active="0x" + "f" * 17),
        line(clocks_event_reasons_active="busy"),
    ],
)
def test_output_that_is_no_query_answer_is_that_hosts_error(body: str) -> None:
    doc, _prom, _table = check(record(body))
    assert evil_errors(doc), body[:40]


@pytest.mark.parametrize("rc", ["²", "9" * 5000, "-1", "1e3", "", "٣"])
def test_an_unreadable_exit_status_is_that_hosts_error(rc: str) -> None:
    doc, _prom, _table = check(record(line(), rc))
    (error,) = evil_errors(doc)
    assert error.startswith("nvidia-smi failed (exit -1)"), error


def test_a_line_too_long_for_a_stream_is_that_hosts_error() -> None:
    doc, _prom, _table = check(record("9" * (T.MAX_LINE + 10)))
    assert "longer than 64 KiB" in evil_errors(doc)[0]


@pytest.mark.parametrize("xid", ["9" * 5000, "1" + "0" * 20, "4294967296"])
def test_an_xid_number_no_driver_prints_is_that_gpus_error(xid: str) -> None:
    doc, _prom, _table = check(XID.format(xid).encode() + b"\n" + record(line() + "\n" + second_gpu()))
    evil = next(h for h in doc["hosts"] if h["host"] == "evil")
    assert "Xid" in evil["gpus"][0]["error"] and "error" not in evil["gpus"][1]


@pytest.mark.parametrize("xid", ["²", "٣", "７９", "7²9", "-79", "inf"])
def test_an_xid_line_with_other_digits_is_not_read_as_an_xid(xid: str) -> None:
    doc, _prom, _table = check(XID.format(xid).encode() + b"\n" + record(line()))
    evil = next(h for h in doc["hosts"] if h["host"] == "evil")
    assert evil["gpus"][0]["xids"] == [], xid


def test_names_and_ids_with_control_characters_are_shown_escaped() -> None:
    doc, prom, table = check(record(line(name="\x1b[2JH200\u202e", uuid="GPU-\x07x")))
    assert not evil_errors(doc)
    assert "\x1b" not in table and "\x07" not in prom and "\u202e" not in table


def test_a_real_multi_gpu_answer_with_one_bad_gpu_keeps_the_others() -> None:
    body = "\n".join([line(), second_gpu(), line(index="2", temperature_gpu="-273", pci_bus_id="0:0:8.0")])
    doc, prom, table = check(record(body))
    evil = next(h for h in doc["hosts"] if h["host"] == "evil")
    assert [g["index"] for g in evil["gpus"]] == [0, 1, 2]
    assert [bool(g.get("error")) for g in evil["gpus"]] == [False, False, True]
    assert 'gpuprov_top_gpu_up{host="evil",gpu="2"' in prom and "temperature.gpu" in table


@pytest.mark.parametrize("render", [T.to_json, T.to_prometheus, T.table])
def test_each_format_renders_an_unreadable_host_without_raising(render: Callable) -> None:
    samples = sample_fleet(record(line(index="²")))
    with hang_guard():
        render(samples)


@pytest.mark.parametrize("output_format", ["table", "json", "prometheus"])
def test_the_command_shows_every_host_and_exits_1_for_an_unreadable_gpu(
    output_format: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from provisioner import cli

    samples = sample_fleet(record(line(temperature_gpu="-273") + "\n" + second_gpu()))

    def one_refresh(*, show: Callable[[list[T.HostSample]], None], **_: object) -> list[T.HostSample]:
        show(samples)
        return samples

    monkeypatch.setattr(T, "run_top", one_refresh)
    with hang_guard():
        rc = cli.app(["top", "--local", "--once", "--format", output_format], standalone_mode=False)
    out = capsys.readouterr().out
    assert rc == 1 and "good" in out and "evil" in out
    if output_format == "json":
        json.loads(out, parse_constant=refuse_constant)
