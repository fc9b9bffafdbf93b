"""NVIDIA's dcgm-exporter, SIMULATED (gpuprov lab): what the GPU Operator's state-dcgm-exporter
DaemonSet container "nvidia-dcgm-exporter" serves while its pod runs.

The kubelet of the pod's node runs it: an HTTP server on the pod's IP, port 9400 (DCGM_EXPORTER_LISTEN),
answering GET /metrics in dcgm-exporter's own Prometheus text format, for the counters of the CSV file
the container names (-f / DCGM_EXPORTER_COLLECTORS; the ConfigMap the operator mounts for
ClusterPolicy dcgmExporter.config.name, else the file built into the image). It stops with the pod.

Upstream behaviour followed (NVIDIA/dcgm-exporter, tag 4.4.1-4.6.0, the chart's dcgmExporter.version):
- pkg/cmd/app.go: flags and environment (collectors file, listen address, interval, kubernetes mode,
  remote host engine, no-hostname).
- internal/pkg/counters/counter_config.go ExtractCounters: the CSV (comments '#', three fields, the
  Prometheus types gauge/counter/histogram/summary/label; "label" fields become labels).
- internal/pkg/collector/gpu_collector.go toMetric/toString: labels gpu, UUID, pci_bus_id, device
  (nvidia<N>), modelName, Hostname, then the label fields (DCGM_FI_DRIVER_VERSION), then err_code and
  err_msg on DCGM_FI_DEV_XID_ERRORS (xid_errors.go); integers printed as %d, doubles as %f.
- internal/pkg/rendermetrics/render_metrics.go: "# HELP"/"# TYPE" per counter, counters in field id
  order (the template ranges over a map keyed by the counter, field id first).
- internal/pkg/hostname/hostname.go: Hostname is NODE_NAME in kubernetes mode.
- docker/Dockerfile.distroless: the image carries etc/ as /etc/dcgm-exporter (default-counters.csv
  and dcp-metrics-included.csv, whose active lines are the same: BUILTIN_COUNTERS below).

Values come from the simulated GPUs as the host reports them (`nvidia-smi --query-gpu`, which on a lab
host answers from the host's hardware profile and injected faults); DCGM_FI_DEV_XID_ERRORS is the last
Xid of the host's injected ``xid`` faults (kind xid, gpu, xid; 79 when unset, as the kernel log
emulation prints). Fields the simulated GPUs have no value for (profiling, NVLink, energy, vGPU) are
left out, as dcgm-exporter leaves out blank values.

Reachability: the real exporter listens inside the pod's network namespace, which the flannel CNI's
bridge plugin (containernetworking/plugins plugins/main/bridge) joins to the host through the cni0
bridge carrying the pod subnet's gateway address. The lab runs no container, so the pod's IP is put
on a cni0 bridge of the host itself (gateway address plus the pod's /32), the host reaches it exactly
as it reaches a pod, and the address goes when the pod stops. IP forwarding is never touched (the
bridge plugin would enable it; the lab must not).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from . import kube_util as u
from .kube_store import Obj

if TYPE_CHECKING:
    from .kube_host import Host
    from .kube_let import Kubelet
    from .kube_pods import PodRunner

DEFAULT_COLLECTORS = "/etc/dcgm-exporter/default-counters.csv"
DEFAULT_LISTEN = ":9400"
DEFAULT_INTERVAL_MS = 30000
CNI_BRIDGE = "cni0"
PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")
# The active lines of etc/default-counters.csv (= etc/dcp-metrics-included.csv) at 4.4.1-4.6.0.
BUILTIN_COUNTERS = """\
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_ENC_UTIL,      gauge, Encoder utilization (in %).
DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).
DCGM_FI_DEV_XID_ERRORS,              gauge,   Value of the last XID error encountered.
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_RESERVED, gauge, Framebuffer memory reserved (in MiB).
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,            counter, Total number of NVLink bandwidth counters for all lanes.
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,   counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed
DCGM_FI_DRIVER_VERSION,        label, Driver Version
DCGM_FI_PROF_GR_ENGINE_ACTIVE,   gauge, Ratio of time the graphics engine is active.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE,        gauge, Ratio of cycles the device memory interface is active sending or receiving data.
DCGM_FI_PROF_PCIE_TX_BYTES,      gauge, The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_PCIE_RX_BYTES,      gauge, The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
"""  # noqa: E501
IMAGE_FILES = {
    "/etc/dcgm-exporter/default-counters.csv": BUILTIN_COUNTERS,
    "/etc/dcgm-exporter/dcp-metrics-included.csv": BUILTIN_COUNTERS,
}

# DCGM field → (field id from dcgm_fields.h, nvidia-smi --query-gpu field or None, value kind).
# "i": DCGM_FT_INT64 (printed %d), "d": DCGM_FT_DOUBLE (printed %f), "s": string (labels).
FIELDS: dict[str, tuple[int, str | None, str]] = {
    "DCGM_FI_DRIVER_VERSION": (1, "driver_version", "s"),
    "DCGM_FI_DEV_SM_CLOCK": (100, "clocks.sm", "i"),
    "DCGM_FI_DEV_MEM_CLOCK": (101, "clocks.mem", "i"),
    "DCGM_FI_DEV_MEMORY_TEMP": (140, "temperature.memory", "i"),
    "DCGM_FI_DEV_GPU_TEMP": (150, "temperature.gpu", "i"),
    "DCGM_FI_DEV_POWER_USAGE": (155, "power.draw", "d"),
    "DCGM_FI_DEV_GPU_UTIL": (203, "utilization.gpu", "i"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": (204, "utilization.memory", "i"),
    "DCGM_FI_DEV_XID_ERRORS": (230, None, "i"),
    "DCGM_FI_DEV_FB_FREE": (251, "memory.free", "i"),
    "DCGM_FI_DEV_FB_USED": (252, "memory.used", "i"),
    "DCGM_FI_DEV_FB_RESERVED": (253, "memory.reserved", "i"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (393, "remapped_rows.uncorrectable", "i"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (394, "remapped_rows.correctable", "i"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (395, "remapped_rows.failure", "i"),
}
IDENTITY = ("index", "uuid", "pci.bus_id", "name")
QUERY = [*IDENTITY, *dict.fromkeys(f for _, f, _ in FIELDS.values() if f)]
# xid_errors.go xidErrCodeToText, for the Xids the lab injects (docs.nvidia.com/deploy/xid-errors).
XID_TEXT = {
    0: "No Error",
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning (newer drivers)",
    62: "Internal micro-controller halt (newer drivers)",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}
UNKNOWN_XID = "Unknown Error"


@dataclass(frozen=True)
class Counter:
    name: str
    prom_type: str
    help: str

    @property
    def field_id(self) -> int:
        return FIELDS.get(self.name, (1 << 16, None, ""))[0]


class ExporterError(Exception):
    """The exporter cannot start; the message is what it logs before exiting."""


def parse_counters(text: str, path: str) -> list[Counter]:
    """ExtractCounters: three fields per line, a known field name and Prometheus type."""
    out: list[Counter] = []
    for i, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        record = [x.strip(" ") for x in line.split(",", 2)]
        if len(record) != 3:
            raise ExporterError(
                f"malformed CSV record; err: failed to parse line {i} (`{record}`), expected 3 fields"
            )
        name, prom_type, help_text = record
        if not name.startswith(("DCGM_FI_", "DCGM_EXP_")):
            raise ExporterError(f"could not find DCGM field; err: unknown field name '{name}' in {path}")
        if prom_type not in PROM_TYPES:
            raise ExporterError(f"could not find Prometheus metric type '{prom_type}'")
        out.append(Counter(name, prom_type, help_text))
    return out


def _env(runner: PodRunner, c: Obj) -> dict[str, str]:
    """The container's environment, with the downward-API fields the exporter's DaemonSet uses."""
    env: dict[str, str] = {}
    for e in c.get("env") or []:
        ref = u.dig(e, "valueFrom", "fieldRef", "fieldPath")
        if ref == "spec.nodeName":
            env[str(e.get("name"))] = str(runner.spec.get("nodeName") or runner.k.s.node_name)
        elif ref is None:
            env[str(e.get("name"))] = str(e.get("value", ""))
    return env


def _flag(argv: list[str], names: tuple[str, ...]) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


@dataclass
class Config:
    """The exporter's settings (app.go flags, their environment variables as fallback)."""

    collectors: str
    listen_port: int
    interval: float
    hostname: str | None
    remote_he: str | None


def config_of(runner: PodRunner, c: Obj) -> Config:
    env = _env(runner, c)
    argv = [str(x) for x in [*(c.get("command") or []), *(c.get("args") or [])]]
    collectors = (
        _flag(argv, ("-f", "--collectors")) or env.get("DCGM_EXPORTER_COLLECTORS") or DEFAULT_COLLECTORS
    )
    listen = _flag(argv, ("-a", "--address")) or env.get("DCGM_EXPORTER_LISTEN") or DEFAULT_LISTEN
    interval = _flag(argv, ("-c", "--collect-interval")) or env.get("DCGM_EXPORTER_INTERVAL")
    remote = _flag(argv, ("-r", "--remote-hostengine-info")) or env.get("DCGM_REMOTE_HOSTENGINE_INFO")
    kubernetes = (_flag(argv, ("-k", "--kubernetes")) or env.get("DCGM_EXPORTER_KUBERNETES", "")) == "true"
    hostname: str | None = env.get("NODE_NAME") or runner.k.s.node_name
    if remote and not kubernetes:
        hostname = remote.rsplit(":", 1)[0]
    if env.get("DCGM_EXPORTER_NO_HOSTNAME") == "true":
        hostname = None
    try:
        port = int(listen.rsplit(":", 1)[1])
    except (IndexError, ValueError) as exc:
        raise ExporterError(f"listen tcp {listen}: address {listen}: missing port in address") from exc
    return Config(
        collectors=collectors,
        listen_port=port,
        interval=int(interval or DEFAULT_INTERVAL_MS) / 1000.0,
        hostname=hostname,
        remote_he=remote,
    )


# ----------------------------------------------------------------------------------------- values


@dataclass
class Gpu:
    index: int
    uuid: str
    bus_id: str
    model: str
    values: dict[str, str]


def query_gpus(host: Host) -> list[Gpu]:
    """The host's GPUs and their values, as its nvidia-smi reports them."""
    res = host.run(
        ["nvidia-smi", f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"], timeout=30
    )
    if res.returncode != 0:
        out = (res.stdout + res.stderr).strip()
        raise ExporterError(f"Failed to initialize NVML: {out.splitlines()[-1] if out else 'no driver'}")
    gpus = []
    for line in res.stdout.splitlines():
        cells = [x.strip() for x in line.split(",")]
        if len(cells) != len(QUERY):
            continue
        row = dict(zip(QUERY, cells, strict=True))
        gpus.append(Gpu(int(row["index"]), row["uuid"], row["pci.bus_id"], row["name"], row))
    return gpus


def injected_xids(host: Host) -> dict[str, int]:
    """Bus id (or "index:N" without a profile) → the Xid of the last injected xid fault on that GPU."""
    try:
        profile = json.loads(host.read("/etc/gpuprov-lab/profile.json", "") or "{}")
    except ValueError:
        profile = {}
    bus_of = {int(g["index"]): g.get("bus_id", "") for g in profile.get("gpus") or [] if "index" in g}
    out: dict[str, int] = {}
    for f in host.faults():
        if f.get("kind") == "xid":
            idx = int(f.get("gpu", 0))
            out[bus_of.get(idx) or f"index:{idx}"] = int(f.get("xid", 79))
    return out


def _number(kind: str, raw: str) -> str | None:
    """toString: integers %d, doubles %f; values nvidia-smi has none for are left out."""
    text = raw.strip()
    if text in ("Yes", "No"):
        text = "1" if text == "Yes" else "0"
    try:
        value = float(text)
    except ValueError:
        return None
    return f"{int(value)}" if kind == "i" else f"{value:f}"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(counters: list[Counter], gpus: list[Gpu], xids: dict[str, int], hostname: str | None) -> str:
    """render_metrics.go gpuMetricsFormat for the GPU entities."""
    labels_of = [c for c in counters if c.prom_type == "label"]
    metrics = sorted(
        {c for c in counters if c.prom_type != "label"},
        key=lambda c: (c.field_id, c.name, c.prom_type, c.help),
    )
    out: list[str] = []
    for counter in metrics:
        spec = FIELDS.get(counter.name)
        if spec is None:
            continue  # a field the simulated GPUs have no value for
        _fid, smi_field, kind = spec
        lines = []
        for g in gpus:
            attrs: dict[str, str] = {}
            if counter.name == "DCGM_FI_DEV_XID_ERRORS":
                xid = xids.get(g.bus_id, xids.get(f"index:{g.index}", 0))
                value: str | None = str(xid)
                attrs = {"err_code": str(xid), "err_msg": XID_TEXT.get(xid, UNKNOWN_XID)}
            else:
                value = _number(kind, g.values.get(smi_field or "", ""))
            if value is None:
                continue
            parts = [
                f'gpu="{g.index}"',
                f'UUID="{_esc(g.uuid)}"',
                f'pci_bus_id="{_esc(g.bus_id)}"',
                f'device="nvidia{g.index}"',
                f'modelName="{_esc(g.model)}"',
            ]
            if hostname:
                parts.append(f'Hostname="{_esc(hostname)}"')
            for lc in sorted(labels_of, key=lambda c: c.name):
                lf = FIELDS.get(lc.name)
                if lf and lf[1] and g.values.get(lf[1]):
                    parts.append(f'{lc.name}="{_esc(g.values[lf[1]])}"')
            parts += [f'{k}="{_esc(v)}"' for k, v in sorted(attrs.items())]
            lines.append(f"{counter.name}{{{','.join(parts)}}} {value}")
        if lines:
            out += [
                f"# HELP {counter.name} {counter.help}",
                f"# TYPE {counter.name} {counter.prom_type}",
                *lines,
            ]
    return "\n".join(out) + ("\n" if out else "")


# ----------------------------------------------------------------------------------------- server


@dataclass
class Exporter:
    """One running exporter (one pod's container)."""

    host: Host
    counters: list[Counter]
    config: Config
    pod_ip: str
    address: str
    server: ThreadingHTTPServer | None = None
    added_ip: bool = False
    last_xid: dict[str, int] = field(default_factory=dict)
    cache: tuple[float, str] = (0.0, "")
    lock: threading.Lock = field(default_factory=threading.Lock)

    def metrics(self) -> str:
        """The latest collection (one every collect interval, as the exporter's watch loop does)."""
        with self.lock:
            stamp, text = self.cache
            if text and time.monotonic() - stamp < self.config.interval:
                return text
            gpus = query_gpus(self.host)
            # DCGM keeps the last Xid a GPU reported; a cleared fault does not take it back.
            self.last_xid.update(injected_xids(self.host))
            text = render(self.counters, gpus, self.last_xid, self.config.hostname)
            self.cache = (time.monotonic(), text)
            return text

    def start(self) -> None:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    try:
                        code, body, ctype = (
                            200,
                            exporter.metrics(),
                            "text/plain; version=0.0.4; charset=utf-8",
                        )
                    except ExporterError as exc:
                        code, body, ctype = 500, f"{exc}\n", "text/plain; charset=utf-8"
                elif path == "/health":
                    code, body, ctype = 200, "KO\n" if exporter.server is None else "OK\n", "text/plain"
                else:
                    code, body, ctype = 404, "404 page not found\n", "text/plain; charset=utf-8"
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        try:
            srv = Server((self.address, self.host.port(self.config.listen_port)), Handler)
        except OSError as exc:
            raise ExporterError(
                f"listen tcp :{self.config.listen_port}: bind: {exc.strerror or exc}".lower()
            ) from exc
        self.server = srv
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()

    def stop(self) -> None:
        srv, self.server = self.server, None
        if srv is not None:
            srv.shutdown()
            srv.server_close()
        if self.added_ip:
            self.host.run(["ip", "addr", "del", f"{self.pod_ip}/32", "dev", CNI_BRIDGE], timeout=10)
            self.added_ip = False


def _is_local(address: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def attach_pod_address(host: Host, pod_ip: str, pod_cidr: str) -> bool:
    """Put the pod's IP where the host reaches it (module docstring): on the cni0 bridge, created with the
    pod subnet's gateway address as the bridge plugin makes it. True when this added the address."""
    if _is_local(pod_ip):
        return False
    net = ipaddress.ip_network(pod_cidr, strict=False)
    gateway = f"{next(net.hosts())}/{net.prefixlen}"
    if host.run(["ip", "link", "show", CNI_BRIDGE], timeout=10).returncode != 0:
        for argv in (
            ["ip", "link", "add", CNI_BRIDGE, "type", "bridge"],
            ["ip", "addr", "add", gateway, "dev", CNI_BRIDGE],
            ["ip", "link", "set", CNI_BRIDGE, "up"],
        ):
            res = host.run(argv, timeout=10)
            if res.returncode != 0:
                raise ExporterError(f"failed to set up the {CNI_BRIDGE} bridge: {res.stderr.strip()}")
    res = host.run(["ip", "addr", "add", f"{pod_ip}/32", "dev", CNI_BRIDGE], timeout=10)
    if res.returncode != 0 and "File exists" not in res.stderr:
        raise ExporterError(f"failed to add {pod_ip} to {CNI_BRIDGE}: {res.stderr.strip()}")
    return res.returncode == 0


# ----------------------------------------------------------------------------------------- kubelet


def _registry(kubelet: Kubelet) -> dict[str, Exporter]:
    return kubelet.exporters


def stop_pod(kubelet: Kubelet, uid: str) -> None:
    """The pod stopped (deleted, or its container failed): the port stops answering."""
    ex = _registry(kubelet).pop(uid, None)
    if ex is not None:
        if ex.server in kubelet.servers:
            kubelet.servers.remove(ex.server)
        ex.stop()


def reap(kubelet: Kubelet, live: set[str]) -> None:
    """Stop the exporters of pods that are gone from this node (removed without a graceful stop)."""
    for uid in [x for x in _registry(kubelet) if x not in live]:
        stop_pod(kubelet, uid)


def run_container(runner: PodRunner, c: Obj) -> tuple[bool, str]:
    """The "nvidia-dcgm-exporter" container: (running, why not). Starts the server once per pod."""
    kubelet, uid = runner.k, runner.uid
    if uid in _registry(kubelet):
        ok, out = kubelet.nvidia_smi()
        if ok:
            return True, ""
        stop_pod(kubelet, uid)
        return False, f"Failed to initialize NVML: {out.splitlines()[-1] if out else 'no driver'}"
    try:
        cfg = config_of(runner, c)
        if cfg.remote_he and cfg.remote_he.split(":")[0] == "nvidia-dcgm":
            # The nvidia-dcgm Service has internalTrafficPolicy: Local (state-dcgm 0400_service.yaml).
            from .kube_ctrl import pod_ready

            dcgm = runner._node_pod("app=nvidia-dcgm")
            if dcgm is None or not pod_ready(dcgm):
                raise ExporterError(
                    f"Failed to initialize DCGM: error connecting to nv-hostengine at {cfg.remote_he}: "
                    "no ready nvidia-dcgm pod on this node"
                )
        text = runner.read_in(c, cfg.collectors)
        if text is None:
            text = IMAGE_FILES.get(cfg.collectors)
        if text is None:
            raise ExporterError(
                f"Could not read metrics file '{cfg.collectors}'; err: open {cfg.collectors}: "
                "no such file or directory"
            )
        counters = parse_counters(text, cfg.collectors)
        query_gpus(runner.host)  # DCGM must see the GPUs before the exporter serves
        pod_ip = runner.pod_ip()
        address = runner.host.bind_address(pod_ip)
        added = False
        if address == pod_ip and not runner.spec.get("hostNetwork"):
            added = attach_pod_address(runner.host, pod_ip, str(u.dig(runner.node, "spec", "podCIDR") or ""))
        ex = Exporter(runner.host, counters, cfg, pod_ip, address, added_ip=added)
        try:
            ex.start()
        except ExporterError:
            ex.stop()
            raise
    except ExporterError as exc:
        return False, str(exc)
    _registry(kubelet)[uid] = ex
    if ex.server is not None:
        kubelet.servers.append(ex.server)
    return True, ""
