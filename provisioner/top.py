"""`gpuprov top`: the fleet's GPUs now: utilisation, memory, temperature, power, clock-event reasons and
the Xids of this boot, per GPU, refreshed every few seconds.

Each host runs one long-lived shell (STREAM_SCRIPT) on one SSH session that stays open: every refresh
the controller writes a newline to it, and it answers with one record, `nvidia-smi --query-gpu` (which
NVIDIA documents for scripts; its CSV with `noheader,nounits`) between two marker lines. The kernel
log's NVRM Xid lines come on the same stream as they are logged: this boot's so far once at the start,
then only new ones (journalctl --follow after the cursor it read up to, or dmesg --follow-new; where
neither exists, the shell re-reads dmesg each refresh and passes on only lines after those it already
sent). The controller keeps a line buffer per host and reads only what arrived; it never re-reads a
host's whole log. What a host prints is data: numbers are parsed strictly, names and messages are
shown escaped, lines and records are bounded. A reading that is not a number a GPU could report (other
scripts' digits, thousands of digits, infinity, -273 C) is that GPU's error; an answer that is not
nvidia-smi's is that host's error; neither stops the other hosts' rows.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from provisioner.executors import CommandStream, Executor, ExecutorError, OpenConnections
from provisioner.hostnumbers import HostNumberError, is_index, parse_decimal, parse_int
from provisioner.hosttext import first_line
from provisioner.probes.host import normalize_bus_id
from provisioner.probes.kernel_log import XID_LINE, pci_device, xid_number

# The fields, in order. Names as `nvidia-smi --help-query-gpu` lists them (driver 580).
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks_event_reasons.active",
)
QUERY = f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"
XID_MARK = "@@gpuprov-top-xids"
_ENV = "PATH=$PATH:/usr/local/nvidia/bin:/usr/sbin:/usr/bin:/sbin:/bin; LC_ALL=C; export PATH LC_ALL\n"
# Where verification's kernel-log probe reads: the journal when it has this boot's kernel messages.
_HAS_JOURNAL = (
    "{ [ -d /run/log/journal ] || [ -d /var/log/journal ]; } && command -v journalctl >/dev/null 2>&1 &&"
    " journalctl -k -b -n 1 -q --no-pager 2>/dev/null | grep -q ."
)
# One refresh as a one-shot script (nvidia-smi's query, then this boot's Xid lines): what OpenSSH or
# Ansible would run every refresh; the benchmark compares the stream against it.
SCRIPT = (
    _ENV
    + f"{QUERY} || exit $?\n"
    + f"echo {XID_MARK}\n"
    + f"if {_HAS_JOURNAL}; then journalctl -k -b -q --no-pager 2>/dev/null; else dmesg 2>/dev/null; fi"
    " | grep -F 'NVRM: Xid' | tail -n 1000\n"
    "exit 0\n"
)
MAX_XIDS = 1000  # Xid lines kept per host (the newest), as the one-shot script's `tail -n 1000`
MAX_LINE = 64 * 1024  # a longer line (no newline within 64 KiB) ends the stream: not nvidia-smi's
MAX_RECORD_LINES = 1024  # GPUs per host, with room


def stream_script(token: str) -> str:
    """The long-lived shell of one host (POSIX sh). Records: `@@T S`, nvidia-smi's CSV, up to 5 lines
    `@@T R text` (its stderr, when it said something), `@@T E rc`; T is a random token per stream, so no
    logged line can fake a marker. Xid lines come as the kernel log has them, between or inside records.

    The Xid follower runs in the background and is stopped when the shell ends (end of input: the
    controller closed the session): the whole process group when the shell leads it (sshd and
    LocalExecutor start it in a new session), else the follower's last process."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", token):
        raise ValueError("token must be hex")
    xid = "grep -F 'NVRM: Xid'"
    follow = "grep --line-buffered -F 'NVRM: Xid'"
    return (
        f"K={token}\n" + _ENV + "G=; read -r _ _ _ _ G _ </proc/$$/stat 2>/dev/null\n"
        "F=; N=-1\n"
        'stop() { if [ "$G" = "$$" ]; then trap "" TERM; kill -TERM 0 2>/dev/null;'
        ' elif [ -n "$F" ]; then kill "$F" 2>/dev/null; fi; }\n'
        "trap stop EXIT\n"
        # journald: this boot's Xid lines and the cursor they end at, then a follower after that cursor.
        f"if {_HAS_JOURNAL}; then\n"
        "  C=$(journalctl -k -b -q --no-pager --show-cursor 2>/dev/null"
        f" | grep -F -e 'NVRM: Xid' -e '-- cursor: ' | tail -n {MAX_XIDS + 1})\n"
        f"  printf '%s\\n' \"$C\" | {xid}\n"
        "  C=$(printf '%s\\n' \"$C\" | sed -n 's/^-- cursor: //p')\n"
        '  if [ -n "$C" ]; then set -- --after-cursor="$C"; else set -- -n 0; fi\n'
        f'  journalctl -k -b -f -q --no-pager "$@" 2>/dev/null | {follow} &\n'
        "  F=$!\n"
        # util-linux dmesg: this boot's Xid lines, then --follow-new (only messages logged from now on).
        "elif dmesg --help 2>&1 | grep -q -e '--follow-new'; then\n"
        f"  dmesg 2>/dev/null | {xid} | tail -n {MAX_XIDS}\n"
        f"  dmesg --follow-new 2>/dev/null | {follow} &\n"
        "  F=$!\n"
        "else\n"
        "  N=0\n"
        "fi\n"
        # A dmesg that cannot follow (busybox): re-read per refresh, pass on the lines after the N sent.
        "xids() {\n"
        f"  L=$(dmesg 2>/dev/null | {xid}); M=0\n"
        '  [ -n "$L" ] && M=$(printf \'%s\\n\' "$L" | wc -l)\n'
        '  [ "$M" -lt "$N" ] && N=0\n'
        f'  [ "$M" -gt "$N" ] && printf \'%s\\n\' "$L" | tail -n +$((N + 1)) | tail -n {MAX_XIDS}\n'
        "  N=$M\n"
        "}\n"
        "while read -r _; do\n"
        '  [ "$N" -ge 0 ] && xids\n'
        '  echo "@@$K S"\n'
        f"  {{ R=$({QUERY} 2>&1 1>&3 3>&-); }} 3>&1\n"
        "  r=$?\n"
        '  [ -n "$R" ] && printf \'%s\\n\' "$R" | head -n 5 | sed "s/^/@@$K R /"\n'
        '  echo "@@$K E $r"\n'
        "done\n"
    )


# NVML's clocks event reasons (nvml.h, nvmlClocksEventReason*): what holds the clocks down. GPU idle and
# the applications-clocks setting are no slowdown.
EVENT_REASONS: dict[int, str] = {
    0x1: "idle",
    0x2: "app-clocks",
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x10: "sync-boost",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
    0x100: "display-clocks",
}
NOT_SLOWDOWN = 0x1 | 0x2 | 0x100


class TopParseError(ValueError):
    pass


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    name: str
    bus_id: str
    util_gpu: float | None  # percent
    util_mem: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    temp_c: float | None
    power_w: float | None
    power_limit_w: float | None
    event_reasons: int | None
    xids: list[int] = field(default_factory=list)  # Xid numbers of this boot, in log order
    error: str | None = None  # what of this GPU's answer could not be read; table and Prometheus skip it

    @property
    def slowdowns(self) -> list[str]:
        if self.event_reasons is None:
            return []
        bits = self.event_reasons & ~NOT_SLOWDOWN
        return [name for bit, name in EVENT_REASONS.items() if bits & bit]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "pci_bus_id": self.bus_id,
            "utilization_gpu_pct": self.util_gpu,
            "utilization_memory_pct": self.util_mem,
            "memory_used_mib": self.mem_used_mib,
            "memory_total_mib": self.mem_total_mib,
            "temperature_c": self.temp_c,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "clocks_event_reasons": None if self.event_reasons is None else f"0x{self.event_reasons:x}",
            "slowdowns": self.slowdowns,
            "xids": self.xids,
        }
        if self.error:
            out["error"] = self.error
        return out


NO_GPU = "no GPU"


@dataclass(frozen=True)
class HostSample:
    host: str
    gpus: list[GpuSample]
    error: str | None = None
    duration_s: float = 0.0
    gpu_node: bool = True  # False: the inventory says the host has no GPU; it is not asked

    @property
    def failed(self) -> bool:
        """The host, or one of its GPUs, could not be read."""
        return bool(self.error) or any(g.error for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host,
            "gpu_node": self.gpu_node,
            "gpus": [g.to_dict() for g in self.gpus],
        }
        if self.error:
            out["error"] = self.error
        return out


# The range each reading can take on a real GPU, in nvidia-smi's units; a value outside it is no reading
# but an error of that GPU. NVML reads temperatures as unsigned integers, and GPUs shut down far below
# 150 C; 4 TiB of memory and 5 kW are several times the largest GPU made so far.
READING_RANGES: dict[str, tuple[float, float]] = {
    "utilization.gpu": (0, 100),
    "utilization.memory": (0, 100),
    "memory.used": (0, 4 * 1024 * 1024),
    "memory.total": (0, 4 * 1024 * 1024),
    "temperature.gpu": (0, 150),
    "power.draw": (0, 5000),
    "power.limit": (0, 5000),
}
MAX_GPU_INDEX = 4095
_UNITS = (" %", " MiB", " W", " C")


def _reading(value: str, field_name: str) -> float | None:
    """A field's number; None for what nvidia-smi prints when it has none ([N/A], [Not Supported], N/A).
    Units are stripped, so the CSV with or without `nounits` reads the same. HostNumberError for anything
    but ASCII digits in the field's range."""
    v = value.strip()
    if v.startswith("[") or v in ("N/A", ""):
        return None
    for unit in _UNITS:
        if v.endswith(unit):
            v = v[: -len(unit)]
    lo, hi = READING_RANGES[field_name]
    return parse_decimal(v, lo=lo, hi=hi, what=field_name)


def _gpu_line(line: str, n: int) -> GpuSample:
    """One GPU's line. TopParseError when the line is not one GPU's answer (the record cannot be trusted);
    a reading that is no number, or impossible, is that GPU's error."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(QUERY_FIELDS):
        raise TopParseError(f"line {n}: {len(cells)} fields, {len(QUERY_FIELDS)} expected: {line[:80]!r}")
    f = dict(zip(QUERY_FIELDS, cells, strict=True))
    if not is_index(f["index"], hi=MAX_GPU_INDEX):
        raise TopParseError(f"line {n}: index: not a number from 0 to {MAX_GPU_INDEX}: {f['index'][:20]!r}")
    reasons = f["clocks_event_reasons.active"]
    if re.fullmatch(r"0x[0-9a-fA-F]{1,16}", reasons):
        event = int(reasons, 16)
    elif reasons.startswith("[") or reasons == "N/A":
        event = None
    else:
        raise TopParseError(f"line {n}: clocks_event_reasons.active: not a bit mask: {reasons[:30]!r}")
    readings: dict[str, float | None] = {}
    errors: list[str] = []
    for name in READING_RANGES:
        try:
            readings[name] = _reading(f[name], name)
        except HostNumberError as exc:
            readings[name] = None
            errors.append(str(exc))
    used, total = readings["memory.used"], readings["memory.total"]
    if used is not None and total is not None and used > total:
        errors.append(f"memory.used: {used:g} MiB is more than memory.total, {total:g} MiB")
    return GpuSample(
        index=int(f["index"]),
        uuid=f["uuid"],
        name=f["name"],
        bus_id=normalize_bus_id(f["pci.bus_id"]),
        util_gpu=readings["utilization.gpu"],
        util_mem=readings["utilization.memory"],
        mem_used_mib=used,
        mem_total_mib=total,
        temp_c=readings["temperature.gpu"],
        power_w=readings["power.draw"],
        power_limit_w=readings["power.limit"],
        event_reasons=event,
        error="; ".join(errors) or None,
    )


def read_query(text: str) -> list[GpuSample]:
    """`nvidia-smi --query-gpu=QUERY_FIELDS --format=csv,noheader[,nounits]`, one GPU per line; a GPU
    whose readings are not numbers a GPU could report comes with its error. TopParseError when the text
    is not that answer (a line of other fields, an index that is no GPU index, no GPU at all)."""
    gpus = [_gpu_line(line, n) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not gpus:
        raise TopParseError("nvidia-smi listed no GPU")
    return gpus


def parse_query(text: str) -> list[GpuSample]:
    """As read_query, with any GPU's error raised (TopParseError naming its line)."""
    gpus = read_query(text)
    for n, g in enumerate(gpus, 1):
        if g.error:
            raise TopParseError(f"GPU {g.index} (line {n}): {g.error}")
    return gpus


def xids_by_device(lines: Sequence[str]) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Xid numbers per PCI device key, matched as verification's gpu.xid matches them (probes' Xid line
    pattern and PCI device key), in log order; and, per device, why an Xid line of it was unreadable
    (a number no driver prints)."""
    by_device: dict[str, list[int]] = {}
    unreadable: dict[str, str] = {}
    for line in lines:
        m = XID_LINE.search(line)
        if not m:
            continue
        device = pci_device(m.group("pci"))
        try:
            by_device.setdefault(device, []).append(xid_number(m.group("xid")))
        except HostNumberError as exc:
            unreadable.setdefault(device, f"kernel log: an Xid line of this GPU is unreadable: {exc}")
    return by_device, unreadable


def attach_xids(gpus: list[GpuSample], log: str | Sequence[str]) -> list[GpuSample]:
    """Each GPU with the Xids its PCI device reported this boot (an unreadable Xid line: its error)."""
    by_device, unreadable = xids_by_device(log.splitlines() if isinstance(log, str) else log)
    out = []
    for g in gpus:
        device = pci_device(g.bus_id)
        error = "; ".join(e for e in (g.error, unreadable.get(device)) if e) or None
        out.append(dataclasses.replace(g, xids=by_device.get(device, []), error=error))
    return out


def parse_sample(stdout: str) -> list[GpuSample]:
    """The one-shot SCRIPT's output."""
    query, _, log = stdout.partition(XID_MARK)
    return attach_xids(read_query(query), log)


class StreamError(Exception):
    """The host's stream broke the format's bounds; the stream is dropped and opened again."""


class HostStream:
    """What one host's stream said so far: the last complete record and the Xid lines of this boot.

    Bytes are fed as they arrive; only whole lines are looked at, each once. Bounded: a line longer
    than MAX_LINE or a record longer than MAX_RECORD_LINES is refused (StreamError), and only the
    newest MAX_XIDS Xid lines are kept."""

    def __init__(self, token: str) -> None:
        self.start = f"@@{token} S"
        self.end = f"@@{token} E "
        self.said = f"@@{token} R "
        self.partial = b""
        self.open_record: list[str] | None = None
        self.open_said: list[str] = []
        self.records = 0  # complete records so far
        self.rc: int | None = None
        self.query: list[str] = []
        self.stderr: list[str] = []
        self.xid_lines: collections.deque[str] = collections.deque(maxlen=MAX_XIDS)

    def feed(self, data: bytes) -> None:
        if not data:
            return
        chunk = self.partial + data
        lines = chunk.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:
            raise StreamError(f"a line longer than {MAX_LINE // 1024} KiB")
        for raw in lines:
            if len(raw) > MAX_LINE:
                raise StreamError(f"a line longer than {MAX_LINE // 1024} KiB")
            self._line(raw.decode("utf-8", errors="replace"))

    def _line(self, line: str) -> None:
        if "NVRM: Xid" in line and XID_LINE.search(line):
            self.xid_lines.append(line)  # the follower's lines may land inside a record
        elif line == self.start:
            self.open_record, self.open_said = [], []
        elif self.open_record is None:
            return  # nothing else is expected outside a record: not ours to read
        elif line.startswith(self.end):
            try:
                self.rc = parse_int(line[len(self.end) :], lo=0, hi=255, what="exit status")
            except HostNumberError:
                self.rc = -1
            self.query, self.stderr = self.open_record, self.open_said
            self.open_record = None
            self.records += 1
        elif line.startswith(self.said):
            self.open_said.append(line[len(self.said) :])
        else:
            if len(self.open_record) >= MAX_RECORD_LINES:
                raise StreamError(f"a record of more than {MAX_RECORD_LINES} lines")
            self.open_record.append(line)

    def sample(self, name: str, duration_s: float = 0.0) -> HostSample:
        """The last complete record as a sample; never raises for what the host printed."""
        if self.rc == 127:
            return HostSample(name, [], "nvidia-smi not found", duration_s)
        if self.rc != 0:
            why = next((first_line(t) for t in self.stderr if t.strip()), "") or first_line(
                "\n".join(self.query)
            )
            return HostSample(
                name, [], f"nvidia-smi failed (exit {self.rc})" + (f": {why}" if why else ""), duration_s
            )
        try:
            gpus = attach_xids(read_query("\n".join(self.query)), self.xid_lines)
        except TopParseError as exc:
            return HostSample(name, [], f"unreadable nvidia-smi output: {exc}", duration_s)
        return HostSample(name, gpus, None, duration_s)


@dataclass
class _Host:
    name: str
    open_: Callable[[], Executor]
    executor: Executor | None = None
    stream: CommandStream | None = None
    state: HostStream | None = None
    wanted: int = 0  # the record number this refresh waits for
    error: str | None = None


class Fleet:
    """One streaming session per host, opened on first use (in parallel) and kept open between
    refreshes. A refresh writes one newline to every stream, then reads the answers as they come, in
    this thread: no thread per host per refresh, no new SSH channel, no new process but nvidia-smi on
    the host. A host whose stream broke is opened again on the next refresh."""

    TICK = b"\n"

    def __init__(self, opener: Sequence[tuple[str, Callable[[], Executor]]], parallel: int, timeout: float):
        self.hosts = [_Host(n, o) for n, o in opener]
        self.parallel = max(1, min(parallel, len(self.hosts) or 1))
        self.timeout = timeout
        self.live = OpenConnections()
        self.pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="gpuprov-top")

    def _open(self, host: _Host) -> None:
        """Connect (once) and start the host's stream; a failure is kept in `host.error`."""
        try:
            if host.executor is None:
                host.executor = host.open_()
                self.live.add(host.executor)
            token = secrets.token_hex(8)
            open_stream = getattr(host.executor, "open_stream", None)
            if open_stream is None:
                raise ExecutorError(host.name, "this executor cannot keep a command running")
            host.stream = open_stream(stream_script(token))
            host.state = HostStream(token)
            host.error = None
        except ExecutorError as exc:
            self._drop(host, exc.reason)

    def _drop(self, host: _Host, reason: str) -> None:
        """Close the host's stream and connection; the next refresh opens them again."""
        host.error = reason
        if host.stream is not None:
            with contextlib.suppress(Exception):  # a broken stream may fail to close: gone anyway
                host.stream.close()
        if host.executor is not None:
            self.live.discard(host.executor)
            with contextlib.suppress(Exception):  # a broken stream may fail to close: gone anyway
                host.executor.close()
        host.stream = host.state = host.executor = None

    def refresh(self) -> list[HostSample]:
        t0 = time.monotonic()
        closed = [h for h in self.hosts if h.stream is None]
        if closed:
            list(self.pool.map(self._open, closed))
        deadline = time.monotonic() + self.timeout
        waiting: list[_Host] = []
        for h in self.hosts:
            if h.stream is None or h.state is None:
                continue
            h.wanted = h.state.records + 1
            try:
                h.stream.send(self.TICK, self.timeout)
                waiting.append(h)
            except ExecutorError as exc:
                self._drop(h, exc.reason)
        for h in waiting:
            self._await_record(h, deadline)
        took = time.monotonic() - t0
        samples = []
        for h in self.hosts:
            if h.state is None or h.error:
                samples.append(HostSample(h.name, [], h.error or "not connected", took))
            else:
                samples.append(h.state.sample(h.name, took))
        return samples

    def _await_record(self, h: _Host, deadline: float) -> None:
        assert h.stream is not None and h.state is not None
        try:
            while h.state.records < h.wanted:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._drop(h, f"no answer within {self.timeout:g} s")
                    return
                h.state.feed(h.stream.read(remaining))
                if h.stream.ended and h.state.records < h.wanted:
                    self._drop(h, "the session ended (connection lost?)")
                    return
        except ExecutorError as exc:
            self._drop(h, exc.reason)
        except StreamError as exc:
            self._drop(h, f"unreadable stream: {exc}")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for h in self.hosts:
            if h.stream is not None:
                with contextlib.suppress(Exception):  # a broken stream may fail to close: gone anyway
                    h.stream.close()
        self.live.close_all()


# ----------------------------------------------------------------------------------------- output


def to_json(samples: Sequence[HostSample]) -> dict[str, Any]:
    return {"collector": "gpuprov top", "hosts": [s.to_dict() for s in samples]}


PROMETHEUS_METRICS = (
    ("gpuprov_gpu_utilization_ratio", "GPU utilisation (0-1)", lambda g: g.util_gpu, 0.01),
    ("gpuprov_gpu_memory_used_bytes", "framebuffer memory used", lambda g: g.mem_used_mib, 1024 * 1024),
    ("gpuprov_gpu_memory_total_bytes", "framebuffer memory", lambda g: g.mem_total_mib, 1024 * 1024),
    ("gpuprov_gpu_temperature_celsius", "GPU temperature", lambda g: g.temp_c, 1),
    ("gpuprov_gpu_power_watts", "power draw", lambda g: g.power_w, 1),
    (
        "gpuprov_gpu_slowdown",
        "1 while a clock slowdown reason is active",
        lambda g: float(bool(g.slowdowns)),
        1,
    ),
    ("gpuprov_gpu_xids_this_boot", "Xid events this boot", lambda g: float(len(g.xids)), 1),
)


def to_prometheus(samples: Sequence[HostSample]) -> str:
    from provisioner.hosttext import safe_text
    from provisioner.report.prometheus import labels as prom_labels

    def gpu_labels(s: HostSample, g: GpuSample) -> str:
        return prom_labels(
            host=safe_text(s.host), gpu=str(g.index), uuid=safe_text(g.uuid), name=safe_text(g.name)
        )

    lines: list[str] = []
    for metric, help_text, get, scale in PROMETHEUS_METRICS:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for s in samples:
            for g in s.gpus:
                value = None if g.error else get(g)
                if value is None:
                    continue
                lines.append(f"{metric}{gpu_labels(s, g)} {value * scale:.15g}")
    lines += [
        "# HELP gpuprov_top_gpu_up 1 when the GPU's readings were read",
        "# TYPE gpuprov_top_gpu_up gauge",
    ]
    lines += [f"gpuprov_top_gpu_up{gpu_labels(s, g)} {0 if g.error else 1}" for s in samples for g in s.gpus]
    # A host that is no GPU node is not asked: it has no series.
    lines += ["# HELP gpuprov_top_host_up 1 when the host answered", "# TYPE gpuprov_top_host_up gauge"]
    lines += [
        f"gpuprov_top_host_up{prom_labels(host=safe_text(s.host))} {0 if s.error else 1}"
        for s in samples
        if s.gpu_node
    ]
    return "\n".join(lines) + "\n"


def table(samples: Sequence[HostSample], title: str = "") -> Any:
    from rich.table import Table
    from rich.text import Text

    from provisioner.hosttext import short_safe_text

    t = Table(title=title or None, title_justify="left")
    for col, right in (("host", False), ("gpu", True), ("name", False), ("util", True), ("memory", True),
                       ("temp", True), ("power", True), ("slowdown", False), ("xid", False)):  # fmt: skip
        t.add_column(col, justify="right" if right else "left", no_wrap=True)

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    for s in samples:
        if not s.gpu_node:
            t.add_row(Text(short_safe_text(s.host, 40)), "", Text(NO_GPU, style="dim"))
            continue
        if s.error:
            t.add_row(Text(short_safe_text(s.host, 40)), "", Text("error: " + short_safe_text(s.error, 80)))
            continue
        for g in s.gpus:
            if g.error:
                t.add_row(
                    Text(short_safe_text(s.host, 40)),
                    str(g.index),
                    Text("error: " + short_safe_text(g.error, 80)),
                )
                continue
            mem = (
                "-"
                if g.mem_used_mib is None or g.mem_total_mib is None
                else f"{g.mem_used_mib / 1024:.1f}/{g.mem_total_mib / 1024:.0f} GiB"
            )
            power = num(g.power_w, "{:.0f}") + "/" + num(g.power_limit_w, "{:.0f} W")
            xids = ",".join(str(x) for x in sorted(set(g.xids))) if g.xids else ""
            t.add_row(
                Text(short_safe_text(s.host, 40)),
                str(g.index),
                Text(short_safe_text(g.name, 30)),
                num(g.util_gpu, "{:.0f}%"),
                mem,
                num(g.temp_c, "{:.0f} C"),
                power,
                ",".join(g.slowdowns),
                f"{len(g.xids)} ({xids})" if g.xids else "0",
            )
    return t


# ------------------------------------------------------------------------------------------ the verb


@dataclass(frozen=True)
class TopHost:
    """A host `top` shows: how to reach it, and whether it is a GPU node (only those are asked)."""

    name: str
    open: Callable[[], Executor]
    gpu_node: bool = True


GPU_NODES = "gpu_nodes"


def targets_for(inventory: Any, local: bool, limit: str | None) -> list[TopHost]:
    """The inventory's hosts (or this machine); bad input raises before any connection. Where the
    inventory has a gpu_nodes group, as verification reads it, a host outside it (a control plane) is no
    GPU node: it is shown as one, not asked for an nvidia-smi it does not have."""
    from pathlib import Path

    from provisioner.errors import InputError
    from provisioner.inventory import load_inventory
    from provisioner.verification import local_target, ssh_targets

    if local == (inventory is not None):
        raise InputError("give exactly one of -i/--inventory and --local")
    if local:
        t = local_target()
        return [TopHost(t.name, t.open)]
    inv = load_inventory(Path(inventory))
    hosts = inv.select(limit)
    if not hosts:
        raise InputError(f"-i {inventory}: no host selected" + (f" by --limit {limit}" if limit else ""))
    # Read from the whole inventory, not the selection: --limit cp1 still knows cp1 has no GPU.
    gpu_nodes = set(inv.host_names(GPU_NODES)) if GPU_NODES in inv.group_names else set()
    return [TopHost(t.name, t.open, not gpu_nodes or t.name in gpu_nodes) for t in ssh_targets(hosts)]


def with_hosts_without_gpu(hosts: Sequence[TopHost], samples: Sequence[HostSample]) -> list[HostSample]:
    """The GPU nodes' samples and a "no GPU" row for every other host, in inventory order."""
    by_name = {s.host: s for s in samples}
    return [by_name.get(h.name) or HostSample(h.name, [], gpu_node=False) for h in hosts]


def run_top(
    *,
    inventory: Any,
    local: bool,
    limit: str | None,
    once: bool,
    interval: float,
    parallel: int,
    timeout: float,
    show: Callable[[list[HostSample]], None],
    stop: threading.Event | None = None,
) -> list[HostSample]:
    """Sample the fleet once, or every `interval` seconds until `stop` is set or Ctrl-C; `show` gets
    each refresh. Returns the last one."""
    from provisioner.errors import InputError

    if not (0.5 <= interval <= 3600):
        raise InputError(f"--interval {interval:g}: seconds between refreshes, 0.5 to 3600")
    hosts = targets_for(inventory, local, limit)
    fleet = Fleet([(h.name, h.open) for h in hosts if h.gpu_node], parallel, timeout)
    stop = stop or threading.Event()
    try:
        while True:
            started = time.monotonic()
            samples = with_hosts_without_gpu(hosts, fleet.refresh())
            show(samples)
            if once or stop.wait(max(0.0, interval - (time.monotonic() - started))):
                return samples
    finally:
        fleet.close()
