"""`gpuprov top`: the fleet's GPUs now: utilisation, memory, temperature, power, clock-event reasons and
the Xids of this boot, per GPU, refreshed every few seconds.

Each refresh runs one short script per host over the host's open connection (SSH connections stay open
between refreshes): `nvidia-smi --query-gpu` (which NVIDIA documents for scripts; its CSV with
`noheader,nounits`) and the NVRM Xid lines of this boot's kernel log. What a host prints is data: numbers
are parsed strictly, names and messages are shown escaped.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from provisioner import probes as P
from provisioner.executors import Executor, ExecutorError, OpenConnections

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
XID_MARK = "@@gpuprov-top-xids"
# The kernel log's Xid lines only, from where verification's kernel-log probe reads (the journal when it
# has this boot's kernel messages, else dmesg): a refresh passes on a few lines, not the whole log.
SCRIPT = (
    "PATH=$PATH:/usr/local/nvidia/bin:/usr/sbin:/usr/bin:/sbin:/bin; LC_ALL=C; export PATH LC_ALL\n"
    f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits || exit $?\n"
    f"echo {XID_MARK}\n"
    "if { [ -d /run/log/journal ] || [ -d /var/log/journal ]; } && command -v journalctl >/dev/null 2>&1 &&"
    " journalctl -k -b -n 1 -q --no-pager 2>/dev/null | grep -q .;"
    " then journalctl -k -b -q --no-pager 2>/dev/null; else dmesg 2>/dev/null; fi"
    " | grep -F 'NVRM: Xid' | tail -n 1000\n"
    "exit 0\n"
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

    @property
    def slowdowns(self) -> list[str]:
        if self.event_reasons is None:
            return []
        bits = self.event_reasons & ~NOT_SLOWDOWN
        return [name for bit, name in EVENT_REASONS.items() if bits & bit]

    def to_dict(self) -> dict[str, Any]:
        return {
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


@dataclass(frozen=True)
class HostSample:
    host: str
    gpus: list[GpuSample]
    error: str | None = None
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "gpus": [g.to_dict() for g in self.gpus]}
        if self.error:
            out["error"] = self.error
        return out


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_UNITS = (" %", " MiB", " W", " C")


def _number(value: str, field_name: str) -> float | None:
    """A field's number; None for what nvidia-smi prints when it has none ([N/A], [Not Supported], N/A).
    Units are stripped, so the CSV with or without `nounits` reads the same."""
    v = value.strip()
    if v.startswith("[") or v in ("N/A", ""):
        return None
    for unit in _UNITS:
        if v.endswith(unit):
            v = v[: -len(unit)]
    if not _NUMBER.fullmatch(v):
        raise TopParseError(f"{field_name}: not a number: {value.strip()[:40]!r}")
    return float(v)


def parse_query(text: str) -> list[GpuSample]:
    """`nvidia-smi --query-gpu=QUERY_FIELDS --format=csv,noheader[,nounits]`, one GPU per line."""
    gpus: list[GpuSample] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_FIELDS):
            raise TopParseError(f"line {n}: {len(cells)} fields, {len(QUERY_FIELDS)} expected: {line[:80]!r}")
        f = dict(zip(QUERY_FIELDS, cells, strict=True))
        if not f["index"].isdigit():
            raise TopParseError(f"line {n}: index: not a number: {f['index'][:20]!r}")
        reasons = f["clocks_event_reasons.active"]
        if re.fullmatch(r"0x[0-9a-fA-F]{1,16}", reasons):
            event = int(reasons, 16)
        elif reasons.startswith("[") or reasons == "N/A":
            event = None
        else:
            raise TopParseError(f"line {n}: clocks_event_reasons.active: not a bit mask: {reasons[:30]!r}")
        gpus.append(
            GpuSample(
                index=int(f["index"]),
                uuid=f["uuid"],
                name=f["name"],
                bus_id=P.normalize_bus_id(f["pci.bus_id"]),
                util_gpu=_number(f["utilization.gpu"], "utilization.gpu"),
                util_mem=_number(f["utilization.memory"], "utilization.memory"),
                mem_used_mib=_number(f["memory.used"], "memory.used"),
                mem_total_mib=_number(f["memory.total"], "memory.total"),
                temp_c=_number(f["temperature.gpu"], "temperature.gpu"),
                power_w=_number(f["power.draw"], "power.draw"),
                power_limit_w=_number(f["power.limit"], "power.limit"),
                event_reasons=event,
            )
        )
    if not gpus:
        raise TopParseError("nvidia-smi listed no GPU")
    return gpus


def attach_xids(gpus: list[GpuSample], log: str) -> list[GpuSample]:
    """Each GPU with the Xids its PCI device reported this boot, matched as verification's gpu.xid
    matches them (probes' Xid line pattern and PCI device key)."""
    by_device: dict[str, list[int]] = {}
    for line in log.splitlines():
        m = P.XID_LINE.search(line)
        if m:
            by_device.setdefault(P.pci_device(m.group("pci")), []).append(int(m.group("xid")))
    return [
        GpuSample(**{**g.__dict__, "xids": by_device.get(P.pci_device(g.bus_id), [])})  # type: ignore[arg-type]
        for g in gpus
    ]


def parse_sample(stdout: str) -> list[GpuSample]:
    query, _, log = stdout.partition(XID_MARK)
    return attach_xids(parse_query(query), log)


def sample_host(name: str, executor: Executor, timeout: float) -> HostSample:
    """One refresh of one host: never raises for what the host did; the reason goes in `error`."""
    t0 = time.monotonic()
    try:
        res = executor.run(SCRIPT, timeout)
    except ExecutorError as exc:
        return HostSample(name, [], exc.reason, time.monotonic() - t0)
    if res.rc == 127:
        return HostSample(name, [], "nvidia-smi not found", time.monotonic() - t0)
    if res.rc != 0:
        why = P.first_line(res.stderr or res.stdout)
        return HostSample(name, [], f"nvidia-smi failed (exit {res.rc})" + (f": {why}" if why else ""), 0.0)
    try:
        return HostSample(name, parse_sample(res.stdout), None, time.monotonic() - t0)
    except TopParseError as exc:
        return HostSample(name, [], f"unreadable nvidia-smi output: {exc}", time.monotonic() - t0)


class Fleet:
    """The hosts' executors, opened on first use and kept open between refreshes."""

    def __init__(self, opener: Sequence[tuple[str, Callable[[], Executor]]], parallel: int, timeout: float):
        self.opener = list(opener)
        self.parallel = max(1, min(parallel, len(self.opener) or 1))
        self.timeout = timeout
        self.executors: dict[str, Executor] = {}
        self.live = OpenConnections()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="gpuprov-top")

    def _one(self, name: str, open_: Callable[[], Executor]) -> HostSample:
        with self.lock:
            ex = self.executors.get(name)
        if ex is None:
            try:
                ex = open_()
            except ExecutorError as exc:
                return HostSample(name, [], exc.reason)
            self.live.add(ex)
            with self.lock:
                self.executors[name] = ex
        sample = sample_host(name, ex, self.timeout)
        if sample.error and not sample.gpus:
            # A broken connection is opened again on the next refresh.
            with self.lock:
                self.executors.pop(name, None)
            self.live.discard(ex)
            ex.close()
        return sample

    def refresh(self) -> list[HostSample]:
        futures = [self.pool.submit(self._one, n, o) for n, o in self.opener]
        return [f.result() for f in futures]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
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

    lines: list[str] = []
    for metric, help_text, get, scale in PROMETHEUS_METRICS:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for s in samples:
            for g in s.gpus:
                value = get(g)
                if value is None:
                    continue
                labels = prom_labels(
                    host=safe_text(s.host), gpu=str(g.index), uuid=safe_text(g.uuid), name=safe_text(g.name)
                )
                lines.append(f"{metric}{labels} {value * scale:.15g}")
    lines += ["# HELP gpuprov_top_host_up 1 when the host answered", "# TYPE gpuprov_top_host_up gauge"]
    lines += [
        f"gpuprov_top_host_up{prom_labels(host=safe_text(s.host))} {0 if s.error else 1}" for s in samples
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
        if s.error:
            t.add_row(Text(short_safe_text(s.host, 40)), "", Text("error: " + short_safe_text(s.error, 80)))
            continue
        for g in s.gpus:
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


def targets_for(inventory: Any, local: bool, limit: str | None) -> list[tuple[str, Callable[[], Executor]]]:
    """(host, opener) for the inventory's hosts (or this machine); bad input raises before any connection."""
    from pathlib import Path

    from provisioner.errors import InputError
    from provisioner.verification import load_hosts, local_target, ssh_targets

    if local == (inventory is not None):
        raise InputError("give exactly one of -i/--inventory and --local")
    if local:
        t = local_target()
        return [(t.name, t.open)]
    return [(t.name, t.open) for t in ssh_targets(load_hosts(Path(inventory), limit))]


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
    fleet = Fleet(targets_for(inventory, local, limit), parallel, timeout)
    stop = stop or threading.Event()
    try:
        while True:
            started = time.monotonic()
            samples = fleet.refresh()
            show(samples)
            if once or stop.wait(max(0.0, interval - (time.monotonic() - started))):
                return samples
    finally:
        fleet.close()
