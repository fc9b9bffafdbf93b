"""kubelet, SIMULATED (gpuprov lab): the node agent of the lab's cluster.

It reads its flags (from kubelet.service + the kubeadm drop-in) and /var/lib/kubelet/config.yaml, refuses
to start like the real one (no config, swap on with failSwapOn, no container runtime), does the TLS
bootstrap with a bootstrap token, registers the Node (name = lowercased hostname), posts node status
(Ready only when containerd is active with CRI, its runc cgroup driver matches the kubelet's, a CNI
config exists and swap is off), and "runs" the pods bound to its node: static pods from
/etc/kubernetes/manifests (the sim API server unit), flannel (writes the CNI config and subnet.env as
its containers do), node-feature-discovery, the GPU Operator's components checked against this host
(nvidia-smi, containerd's nvidia runtime), everything else simply Running. It serves /healthz on 10248,
the authenticated API on 10250 (anonymous only when allowed) and the read-only port when configured.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import kube_pki as pki
from . import kube_util as u
from .kube_client import Client, ClientError, load_kubeconfig
from .kube_host import CONTAINERD_SOCK, ContainerdConfig, Host, containerd_config
from .kube_store import ApiError, Obj, Resource

VERSION = "v1.36.3"
CONFIG_DEFAULT = "/var/lib/kubelet/config.yaml"
PKI_DIR = "/var/lib/kubelet/pki"
API_UNIT = "gpuprov-lab-kube-apiserver.service"
STATUS_PERIOD = 10.0
SYNC_PERIOD = 2.0
# How long one look at the container runtime (systemctl is-active containerd, its config) holds: once per
# sync instead of once per pod, node status and static pod, which kept idle lab hosts busy.
RUNTIME_TTL = 1.0
DRAIN_BLOCK_NS = "gpuprov-lab"
VALIDATIONS = "/run/nvidia/validations"
NVIDIA_NODE_LABELS = ("app=nvidia-driver-daemonset", "app=nvidia-container-toolkit-daemonset")
# The kubeadm drop-in of kubelet.service (kubeadm package): where the kubelet's flags come from.
KUBEADM_DROPIN = (
    "\n".join(
        [
            "# Note: This dropin only works with kubeadm and kubelet v1.11+",
            "[Service]",
            'Environment="KUBELET_KUBECONFIG_ARGS='
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf "
            '--kubeconfig=/etc/kubernetes/kubelet.conf"',
            'Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"',
            '# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the '
            "KUBELET_KUBEADM_ARGS variable dynamically",
            "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env",
            "# This is a file that the user can use for overrides of the kubelet args as a last resort. "
            "Preferably, "
            "the user should use",
            "# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. "
            "KUBELET_EXTRA_ARGS "
            "should be sourced from this file.",
            "EnvironmentFile=-/etc/default/kubelet",
            "ExecStart=",
            "ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS "
            "$KUBELET_EXTRA_ARGS",
        ]
    )
    + "\n"
)
KNOWN_FLAGS = {
    "config",
    "kubeconfig",
    "bootstrap-kubeconfig",
    "node-ip",
    "hostname-override",
    "container-runtime-endpoint",
    "pod-infra-container-image",
    "node-labels",
    "register-with-taints",
    "cgroup-driver",
    "fail-swap-on",
    "v",
    "resolv-conf",
    "cert-dir",
    "rotate-certificates",
    "runtime-request-timeout",
    "max-pods",
    "cluster-dns",
    "cluster-domain",
    "authentication-token-webhook",
    "anonymous-auth",
    "read-only-port",
    "client-ca-file",
    "authorization-mode",
    "root-dir",
    "image-service-endpoint",
    "feature-gates",
    "address",
    "port",
    "healthz-port",
    "healthz-bind-address",
    "provider-id",
    "cloud-provider",
    "kube-reserved",
    "system-reserved",
    "eviction-hard",
    "node-status-update-frequency",
    "pod-manifest-path",
    "protect-kernel-defaults",
    "logging-format",
}


def unit_argv(host: Host) -> list[str]:
    """The kubelet's command line as systemd builds it from kubelet.service and the kubeadm drop-in."""
    env: dict[str, str] = {}
    for line in KUBEADM_DROPIN.splitlines():
        if line.startswith('Environment="'):
            k, _, v = line[len('Environment="') :].rstrip('"').partition("=")
            env[k] = v
    for path in ("/var/lib/kubelet/kubeadm-flags.env", "/etc/default/kubelet"):
        for line in (host.read(path, "") or "").splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, _, v = line.partition("=")
                env[k.strip()] = v.strip().strip('"').strip("'")
    argv: list[str] = []
    for var in (
        "KUBELET_KUBECONFIG_ARGS",
        "KUBELET_CONFIG_ARGS",
        "KUBELET_KUBEADM_ARGS",
        "KUBELET_EXTRA_ARGS",
    ):
        argv += env.get(var, "").split()
    return argv


def klog(level: str, msg: str) -> str:
    t = time.time()
    lt = time.gmtime(t)
    return (
        f"{level}{lt.tm_mon:02d}{lt.tm_mday:02d} {time.strftime('%H:%M:%S', lt)}.{int(t % 1 * 1e6):06d} "
        f"{os.getpid():7d} {msg}"
    )


class KubeletExit(Exception):
    """The kubelet cannot run; message is its last log line."""


def parse_flags(argv: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--version", "-version"):
            flags["version"] = "true"
        elif arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name not in KNOWN_FLAGS:
                raise KubeletExit(
                    klog(
                        "E",
                        f'run.go:72] "command failed" err="failed to parse kubelet flag: unknown flag: '
                        f'--{name}"',
                    )
                )
            if not eq:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    value = argv[i + 1]
                    i += 1
                else:
                    value = "true"
            flags[name] = value
        elif arg.startswith("-v"):
            flags["v"] = arg[2:].lstrip("=")
        i += 1
    return flags


@dataclass
class Settings:
    config_path: str
    cfg: Obj
    kubeconfig: str
    bootstrap: str
    node_ip: str
    node_name: str
    labels: dict[str, str]
    cgroup_driver: str

    def cfg_get(self, *keys: str, default: Any = None) -> Any:
        return u.dig(self.cfg, *keys, default=default)


def load_settings(host: Host, argv: list[str]) -> Settings:
    flags = parse_flags(argv)
    path = flags.get("config", "")
    cfg: Obj = {}
    if path:
        text = host.read(path)
        if text is None:
            raise KubeletExit(
                klog(
                    "E",
                    f'run.go:72] "command failed" err="failed to load kubelet config file, path: {path}, '
                    f"error: failed "
                    f"to load Kubelet config file {path}, error failed to read kubelet config file "
                    f'\\"{path}\\", error: open '
                    f'{path}: no such file or directory"',
                )
            )
        try:
            cfg = u.yaml_load(text) or {}
        except Exception as exc:
            raise KubeletExit(
                klog(
                    "E",
                    f'run.go:72] "command failed" err="failed to load kubelet config file, path: '
                    f'{path}, error: {exc}"',
                )
            ) from exc
        if cfg.get("kind") != "KubeletConfiguration":
            raise KubeletExit(
                klog(
                    "E",
                    f'run.go:72] "command failed" err="failed to load kubelet config file, path: '
                    f'{path}, error: no kind \\"KubeletConfiguration\\" is registered"',
                )
            )
    labels = {}
    for item in (flags.get("node-labels") or "").split(","):
        if "=" in item:
            k, v = item.split("=", 1)
            labels[k] = v
    return Settings(
        config_path=path,
        cfg=cfg,
        kubeconfig=flags.get("kubeconfig", ""),
        bootstrap=flags.get("bootstrap-kubeconfig", ""),
        node_ip=flags.get("node-ip") or host.node_ip(),
        node_name=(flags.get("hostname-override") or host.hostname()).lower(),
        labels=labels,
        cgroup_driver=flags.get("cgroup-driver") or cfg.get("cgroupDriver") or "cgroupfs",
    )


def cni_configured(host: Host, conf_dir: str = "/etc/cni/net.d") -> bool:
    return any(n.endswith((".conf", ".conflist", ".json")) for n in host.listdir(conf_dir))


def runtime_state(host: Host, cgroup_driver: str) -> tuple[bool, str | None]:
    """(runtime usable, why the node is not ready because of it)."""
    if not host.service_active("containerd") or not host.exists(CONTAINERD_SOCK):
        return False, "container runtime is down"
    cc = containerd_config(host)
    if not cc.cri_enabled:
        return (
            False,
            "container runtime is down: rpc error: code = Unimplemented desc = unknown service "
            "runtime.v1.RuntimeService",
        )
    want_systemd = cgroup_driver == "systemd"
    if cc.systemd_cgroup() != want_systemd:
        have = "systemd" if cc.systemd_cgroup() else "cgroupfs"
        return True, (
            f'container runtime cgroup driver "{have}" (containerd runc SystemdCgroup) does not match the '
            f'kubelet cgroup driver "{cgroup_driver}"'
        )
    return True, None


# ------------------------------------------------------------------------------------------- the agent


class Kubelet:
    def __init__(self, host: Host, argv: list[str], stop: threading.Event | None = None) -> None:
        self.host = host
        self.argv = argv
        self.stop = stop or threading.Event()
        self.s = load_settings(host, argv)
        self.client: Client | None = None
        self.servers: list[ThreadingHTTPServer] = []
        self.last_status = 0.0
        self.last_status_doc: Obj | None = None
        self.failures: dict[tuple[str, str], float] = {}
        self.pod_ips: dict[str, str] = {}
        self.registered: dict[str, int] = {}  # extended resources the device plugin registered
        self.cache: dict[str, tuple[float, Any]] = {}
        self.healthy = False
        self.res: dict[str, Resource] = {}
        self.exporters: dict[str, Any] = {}  # pod uid → its running dcgm-exporter (kube_exporter)

    # -------------------------------------------------------------------------------- startup
    def check_start(self) -> None:
        fail_swap = self.s.cfg_get("failSwapOn", default=True)
        if fail_swap is not False and self.host.swap_devices():
            raise KubeletExit(
                klog(
                    "E",
                    'run.go:72] "command failed" err="failed to run Kubelet: running with swap on is '
                    'not supported, please disable swap or set --fail-swap-on flag to false"',
                )
            )
        endpoint = self.s.cfg_get(
            "containerRuntimeEndpoint", default="unix:///var/run/containerd/containerd.sock"
        )
        if not self.host.service_active("containerd") or not self.host.exists(CONTAINERD_SOCK):
            raise KubeletExit(
                klog(
                    "E",
                    f'run.go:72] "command failed" err="failed to run Kubelet: validate service connection: '
                    f"validate CRI "
                    f'v1 runtime API for endpoint \\"{endpoint}\\": rpc error: code = Unavailable desc = '
                    f"connection error: "
                    f'desc = \\"transport: Error while dialing: dial unix {endpoint[7:]}: connect: no such '
                    f"file or "
                    'directory\\""',
                )
            )
        if not containerd_config(self.host).cri_enabled:
            raise KubeletExit(
                klog(
                    "E",
                    f'run.go:72] "command failed" err="failed to run Kubelet: validate service connection: '
                    f"validate CRI "
                    f'v1 runtime API for endpoint \\"{endpoint}\\": rpc error: code = Unimplemented desc = '
                    f"unknown service "
                    'runtime.v1.RuntimeService"',
                )
            )

    def serve(self) -> None:
        host, s = self.host, self.s
        kubelet = self
        hz_addr = s.cfg_get("healthzBindAddress", default="127.0.0.1")
        hz_port = int(s.cfg_get("healthzPort", default=10248))
        if hz_port:
            self._http(host.bind_address(hz_addr), host.port(hz_port), None, "healthz")
        port = int(s.cfg_get("port", default=10250))
        tls = self._serving_tls()
        self._http(host.bind_address(s.cfg_get("address", default="0.0.0.0")), host.port(port), tls, "secure")
        ro = int(s.cfg_get("readOnlyPort", default=0) or 0)
        if ro:
            self._http(
                host.bind_address(s.cfg_get("address", default="0.0.0.0")), host.port(ro), None, "readonly"
            )
        _ = kubelet

    def _serving_tls(self) -> ssl.SSLContext:
        crt, key = f"{PKI_DIR}/kubelet.crt", f"{PKI_DIR}/kubelet.key"
        if not self.host.exists(crt) or not self.host.exists(key):
            ck = pki.self_signed(
                self.host, f"{self.s.node_name}@{int(time.time())}", [self.s.node_name], [self.s.node_ip]
            )
            self.host.write(crt, ck.cert)
            self.host.write(key, ck.key, 0o600)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.host.p(crt), self.host.p(key))
        ca_file = self.s.cfg_get("authentication", "x509", "clientCAFile")
        if ca_file and self.host.exists(ca_file):
            ctx.load_verify_locations(cafile=str(self.host.p(ca_file)))
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def _http(self, addr: str, port: int, tls: ssl.SSLContext | None, kind: str) -> None:
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                code, body = kubelet.http_answer(kind, self.path.split("?")[0], self.connection)
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json" if body.startswith("{") else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def finish_request(self, request: Any, client_address: Any) -> None:
                if tls is not None:
                    try:
                        request = tls.wrap_socket(request, server_side=True)
                    except (ssl.SSLError, OSError):
                        return
                Handler(request, client_address, self)

        srv = Server((addr, port), Handler)
        self.servers.append(srv)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()

    def http_answer(self, kind: str, path: str, conn: Any) -> tuple[int, str]:
        if kind == "healthz":
            return (
                (200, "ok")
                if path == "/healthz" and self.healthy
                else (404 if path != "/healthz" else 500, "")
            )
        if kind == "secure":
            peer = conn.getpeercert() if isinstance(conn, ssl.SSLSocket) else None
            if not peer:
                if not self.s.cfg_get("authentication", "anonymous", "enabled", default=False):
                    return 401, "Unauthorized"
                if self.s.cfg_get("authorization", "mode", default="AlwaysAllow") != "AlwaysAllow":
                    return (
                        403,
                        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource=proxy)",
                    )
        if path == "/healthz":
            return 200, "ok"
        if path == "/pods":
            pods = self._my_pods() if self.client else []
            return 200, json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods})
        return 404, "404 page not found"

    # ----------------------------------------------------------------------------------- run
    def run(self) -> None:
        self.check_start()
        self.serve()
        self.healthy = True
        while not self.stop.is_set():
            try:
                self.sync()
            except (ClientError, ApiError, OSError) as exc:
                sys.stderr.write(
                    klog("E", f'kubelet.go:2000] "sync failed (SIMULATED kubelet)" err="{exc}"') + "\n"
                )
            self.stop.wait(SYNC_PERIOD)
        from . import kube_exporter

        kube_exporter.reap(self, set())  # the pods' exporters end with the kubelet
        for srv in self.servers:
            srv.shutdown()
            srv.server_close()

    def sync(self) -> None:
        self.static_pods()
        if self.client is None:
            self.connect()
        if self.client is None:
            return
        node = self.register()
        if node is None:
            return
        self.post_status(node)
        self.run_pods(node)
        self.faults()

    # -------------------------------------------------------------------------------- static pods
    def static_pods(self) -> None:
        path = self.s.cfg_get("staticPodPath")
        if not path:
            return
        ok, why = self.runtime()
        has_api = self.host.exists(f"{path}/kube-apiserver.yaml")
        active = self.host.service_active(API_UNIT)
        if has_api and ok and why is None and not active:
            self.host.systemctl("start", API_UNIT)
        elif not has_api and active:
            self.host.systemctl("stop", API_UNIT)

    # ------------------------------------------------------------------------------ connection
    def connect(self) -> None:
        kc = self.s.kubeconfig
        if kc and self.host.exists(kc):
            try:
                self.client = Client(load_kubeconfig(self.host, kc), timeout=10)
            except ClientError:
                self.client = None
            return
        if self.s.bootstrap and self.host.exists(self.s.bootstrap):
            self.tls_bootstrap()

    def tls_bootstrap(self) -> None:
        boot = load_kubeconfig(self.host, self.s.bootstrap)
        c = Client(boot, timeout=10)
        key = pki.new_key(self.host)
        csr = pki.new_csr(self.host, key, f"system:node:{self.s.node_name}", ["system:nodes"])
        res = Resource(
            "CertificateSigningRequest", "certificatesigningrequests", "certificates.k8s.io", "v1", False
        )
        obj = c.create(
            res,
            "",
            {
                "apiVersion": "certificates.k8s.io/v1",
                "kind": "CertificateSigningRequest",
                "metadata": {"generateName": "csr-"},
                "spec": {
                    "request": pki.b64(csr),
                    "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                    "usages": ["digital signature", "client auth"],
                },
            },
        )
        name = obj["metadata"]["name"]
        deadline = time.monotonic() + 60
        cert = None
        while time.monotonic() < deadline and not self.stop.is_set():
            got = c.get(res, "", name)
            if u.dig(got, "status", "certificate"):
                cert = base64.b64decode(got["status"]["certificate"]).decode()
                break
            if any(x.get("type") == "Denied" for x in u.dig(got, "status", "conditions") or []):
                raise KubeletExit(klog("E", f"certificate request {name} was denied"))
            time.sleep(0.5)
        c.close()
        if cert is None:
            return
        stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime())
        pem = f"{PKI_DIR}/kubelet-client-{stamp}.pem"
        self.host.write(pem, cert + key, 0o600)
        current = self.host.p(f"{PKI_DIR}/kubelet-client-current.pem")
        current.unlink(missing_ok=True)
        current.symlink_to(str(self.host.p(pem)) if str(self.host.root) != "/" else pem)
        cfg = pki.kubeconfig(
            boot.server,
            boot.ca_pem or "",
            "default-auth",
            cluster="default-cluster",
            cert_file=f"{PKI_DIR}/kubelet-client-current.pem",
        )
        cfg["contexts"][0]["name"] = "default-context"
        cfg["current-context"] = "default-context"
        self.host.write(self.s.kubeconfig or "/etc/kubernetes/kubelet.conf", u.yaml_dump(cfg), 0o600)
        self.client = Client(
            load_kubeconfig(self.host, self.s.kubeconfig or "/etc/kubernetes/kubelet.conf"), timeout=10
        )

    def R(self, name: str) -> Resource:
        if name not in self.res:
            assert self.client is not None
            r = self.client.resource(name)
            if r is None:
                raise ApiError(404, "NotFound", f"resource {name} is not served")
            self.res[name] = r
        return self.res[name]

    # ------------------------------------------------------------------------------ node object
    def register(self) -> Obj | None:
        assert self.client is not None
        name = self.s.node_name
        node = self.client.find(self.R("nodes"), "", name)
        if node is not None:
            return node
        labels = {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            **self.s.labels,
        }
        taints = []
        for t in self.s.cfg_get("registerWithTaints", default=[]) or []:
            taints.append(t)
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                },
            },
            "spec": {"taints": taints} if taints else {},
        }
        try:
            return self.client.create(self.R("nodes"), "", body)
        except ApiError as exc:
            if exc.code == 409:
                return self.client.get(self.R("nodes"), "", name)
            raise

    def runtime(self) -> tuple[bool, str | None]:
        """runtime_state(), looked at once per RUNTIME_TTL."""
        return self.cached("runtime", RUNTIME_TTL, lambda: runtime_state(self.host, self.s.cgroup_driver))

    def cached(self, key: str, ttl: float, fn: Any) -> Any:
        hit = self.cache.get(key)
        if hit and time.monotonic() - hit[0] < ttl:
            return hit[1]
        value = fn()
        self.cache[key] = (time.monotonic(), value)
        return value

    def containerd(self) -> ContainerdConfig:
        """containerd's configuration as `containerd config dump` prints it, read at most every few
        seconds: every pod's sandbox asks for it on every pass, and each dump starts containerd's binary."""
        return self.cached("containerd-config", 5, lambda: containerd_config(self.host))

    def gpu_list(self) -> list[str]:
        """GPUs nvidia-smi -L lists on this host (empty when the driver does not answer)."""

        def probe() -> list[str]:
            res = self.host.run(["nvidia-smi", "-L"], timeout=30)
            if res.returncode != 0:
                return []
            return [ln for ln in res.stdout.splitlines() if ln.startswith("GPU ")]

        return self.cached("gpus", 15, probe)

    def nvidia_smi(self) -> tuple[bool, str]:
        def probe() -> tuple[bool, str]:
            res = self.host.run(["nvidia-smi"], timeout=30)
            return res.returncode == 0, (res.stdout + res.stderr).strip()

        return self.cached("smi", 15, probe)

    def node_status(self, node: Obj) -> Obj:
        host, s = self.host, self.s
        _ok, runtime_why = self.runtime()
        why = runtime_why
        if why is None and not cni_configured(host):
            why = (
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                "message:Network plugin returns error: cni plugin not initialized"
            )
        if why is None and host.swap_devices() and s.cfg_get("failSwapOn", default=True) is not False:
            why = "swap is on"
        now = u.iso()
        old = {c["type"]: c for c in u.dig(node, "status", "conditions") or []}

        def cond(ctype: str, status: str, reason: str, message: str) -> Obj:
            prev = old.get(ctype, {})
            return {
                "type": ctype,
                "status": status,
                "lastHeartbeatTime": now,
                "lastTransitionTime": prev.get("lastTransitionTime") if prev.get("status") == status else now,
                "reason": reason,
                "message": message,
            }

        conditions = [
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status")
            if why is None
            else cond("Ready", "False", "KubeletNotReady", why),
        ]
        mem_kib = host.mem_total_kib()
        capacity = {
            "cpu": str(host.cpu_count()),
            "ephemeral-storage": "102400000Ki",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
            "memory": f"{mem_kib}Ki",
            "pods": str(s.cfg_get("maxPods", default=110)),
        }
        allocatable = dict(
            capacity, memory=f"{max(0, mem_kib - 102400)}Ki", **{"ephemeral-storage": "94371840Ki"}
        )
        # The device manager: what the running plugin registered (kube_deviceplugin keeps it per plugin
        # pod; GPUs `nvidia-smi -L` lists when it has not said). While no plugin runs, capacity keeps
        # the last registration and allocatable is 0; a resource no longer registered reads 0 in both
        # (the kubelet's removed device plugin resources).
        plugin_uid = self._device_plugin_running()
        if plugin_uid:
            from .kube_deviceplugin import advertised_by

            adv = advertised_by(host, plugin_uid)
            self.registered = adv if adv is not None else {"nvidia.com/gpu": len(self.gpu_list())}
        elif not self.registered:
            old_cap = u.dig(node, "status", "capacity") or {}
            self.registered = {
                k: u.quantity_to_int(v) for k, v in old_cap.items() if k.startswith("nvidia.com/")
            }
        old = [k for k in u.dig(node, "status", "capacity") or {} if k.startswith("nvidia.com/")]
        for name in sorted({*self.registered, *old}):
            count = self.registered.get(name, 0)
            if not count and name not in old:
                continue
            capacity[name] = str(count)
            allocatable[name] = str(count if plugin_uid else 0)
        osr = host.os_release()
        containerd_version = self.cached("ctrd-version", 300, lambda: _containerd_version(host))
        return {
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": s.node_ip},
                {"type": "Hostname", "address": s.node_name},
            ],
            "capacity": capacity,
            "allocatable": allocatable,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": int(s.cfg_get("port", default=10250))}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": (host.read("/proc/sys/kernel/random/boot_id", "") or "").strip(),
                "containerRuntimeVersion": f"containerd://{containerd_version}",
                "kernelVersion": host.kernel_release(),
                "kubeProxyVersion": "",
                "kubeletVersion": VERSION,
                "machineID": (host.read("/etc/machine-id", "") or "").strip(),
                "operatingSystem": "linux",
                "osImage": osr.get("PRETTY_NAME", "Linux"),
                "systemUUID": hashlib.md5(s.node_name.encode()).hexdigest(),
            },
        }

    def post_status(self, node: Obj) -> None:
        assert self.client is not None
        status = self.node_status(node)
        comparable = json.dumps(
            {k: v for k, v in status.items() if k != "conditions"}, sort_keys=True
        ) + json.dumps(
            [{k: v for k, v in c.items() if k != "lastHeartbeatTime"} for c in status["conditions"]]
        )
        if comparable == self.last_status_doc and time.monotonic() - self.last_status < STATUS_PERIOD:
            return
        self.client.patch(self.R("nodes"), "", self.s.node_name, {"status": status}, sub="status")
        self.last_status_doc = comparable  # type: ignore[assignment]
        self.last_status = time.monotonic()
        with contextlib.suppress(ApiError):
            self._lease()

    def _lease(self) -> None:
        assert self.client is not None
        res = self.R("leases")
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.s.node_name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": self.s.node_name,
                "leaseDurationSeconds": 40,
                "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
            },
        }
        if self.client.find(res, "kube-node-lease", self.s.node_name) is None:
            self.client.create(res, "kube-node-lease", body)
        else:
            self.client.patch(res, "kube-node-lease", self.s.node_name, {"spec": body["spec"]})

    # ----------------------------------------------------------------------------------- pods
    def _my_pods(self) -> list[Obj]:
        assert self.client is not None
        return self.client.list(self.R("pods"), None, "", f"spec.nodeName={self.s.node_name}")

    def _device_plugin_running(self) -> str:
        """The uid of this node's running (ready) device plugin pod; "" when none runs."""
        if self.client is None:
            return ""
        for p in self.cached("pods-for-status", 2, self._my_pods):
            for cs in u.dig(p, "status", "containerStatuses") or []:
                if cs.get("name") == "nvidia-device-plugin" and cs.get("ready"):
                    return str(p["metadata"]["uid"])
        return ""

    def snapshot(self, pods: list[Obj]) -> None:
        """What the container runtime would know of this node's pods (crictl reads it)."""
        from .kube_cri import PODS_SNAPSHOT

        snap = []
        for p in pods:
            st = p.get("status") or {}
            snap.append(
                {
                    "uid": p["metadata"]["uid"].replace("-", ""),
                    "name": p["metadata"]["name"],
                    "namespace": p["metadata"]["namespace"],
                    "running": st.get("phase") == "Running",
                    "runtime": u.dig(p, "spec", "runtimeClassName") or "",
                    "age": u.human_age(
                        u.now() - (u.parse_iso(u.dig(p, "metadata", "creationTimestamp")) or u.now())
                    )
                    + " ago",
                    "containers": [
                        {
                            "id": (c.get("containerID") or "").removeprefix("containerd://") or "0" * 13,
                            "name": c["name"],
                            "image": c.get("image", ""),
                            "restarts": c.get("restartCount", 0),
                            "state": "Running"
                            if "running" in (c.get("state") or {})
                            else "Exited"
                            if "terminated" in (c.get("state") or {})
                            else "Created",
                        }
                        for c in st.get("containerStatuses") or []
                    ],
                }
            )
        text = json.dumps(snap)
        if text != self.cache.get("snapshot", (0, ""))[1]:
            self.host.write(PODS_SNAPSHOT, text)
            self.cache["snapshot"] = (time.monotonic(), text)

    def run_pods(self, node: Obj) -> None:
        assert self.client is not None
        pods = self._my_pods()
        self.cache["pods-for-status"] = (time.monotonic(), pods)
        self.snapshot(pods)
        self._mirror_pods(pods)
        from . import kube_exporter

        kube_exporter.reap(
            self, {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        )
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                self._stop_pod(pod)
                try:
                    self.client.delete(self.R("pods"), meta["namespace"], meta["name"], grace=0)
                except ApiError as exc:
                    if exc.code != 404:
                        raise
                continue
            if (meta.get("annotations") or {}).get("kubernetes.io/config.mirror"):
                continue
            from . import kube_pods

            status = kube_pods.PodRunner(self, node, pod).status()
            old = pod.get("status") or {}
            if _strip_times(status) != _strip_times(old):
                try:
                    self.client.patch(
                        self.R("pods"),
                        meta["namespace"],
                        meta["name"],
                        {"status": _replace(old, status)},
                        sub="status",
                    )
                except ApiError as exc:
                    if exc.code != 404:
                        raise

    def _stop_pod(self, pod: Obj) -> None:
        from . import kube_exporter

        kube_exporter.stop_pod(self, pod["metadata"]["uid"])
        for key in [k for k in self.failures if k[0] == pod["metadata"]["uid"]]:
            del self.failures[key]
        self.pod_ips.pop(pod["metadata"]["uid"], None)

    def _mirror_pods(self, pods: list[Obj]) -> None:
        """Mirror pods for the static pods of this node, their status from the control plane unit."""
        assert self.client is not None
        path = self.s.cfg_get("staticPodPath")
        if not path:
            return
        mirrors = {
            p["metadata"]["name"]: p
            for p in pods
            if (p["metadata"].get("annotations") or {}).get("kubernetes.io/config.mirror")
        }
        want: dict[str, Obj] = {}
        for fname in self.host.listdir(path):
            if not fname.endswith((".yaml", ".yml", ".json")):
                continue
            text = self.host.read(f"{path}/{fname}") or ""
            try:
                m = u.yaml_load(text)
            except Exception:
                continue
            if not isinstance(m, dict) or m.get("kind") != "Pod":
                continue
            name = f"{m['metadata']['name']}-{self.s.node_name}"
            want[name] = m
            h = hashlib.md5(text.encode()).hexdigest()
            running = self.host.service_active(API_UNIT)
            now = u.iso()
            status = {
                "phase": "Running" if running else "Pending",
                "hostIP": self.s.node_ip,
                "podIP": self.s.node_ip,
                "podIPs": [{"ip": self.s.node_ip}],
                "conditions": [
                    {"type": t, "status": "True" if running else "False"}
                    for t in (
                        "PodReadyToStartContainers",
                        "Initialized",
                        "Ready",
                        "ContainersReady",
                        "PodScheduled",
                    )
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "ready": running,
                        "restartCount": 0,
                        "started": running,
                        "state": {"running": {"startedAt": now}}
                        if running
                        else {"waiting": {"reason": "ContainerCreating"}},
                    }
                    for c in m["spec"]["containers"]
                ],
            }
            cur = mirrors.get(name)
            if (
                cur is not None
                and (cur["metadata"].get("annotations") or {}).get("kubernetes.io/config.hash") != h
            ):
                self.client.delete(self.R("pods"), cur["metadata"]["namespace"], name, grace=0)
                cur = None
            if cur is None:
                body = json.loads(json.dumps(m))
                body["metadata"]["name"] = name
                body["metadata"]["namespace"] = m["metadata"].get("namespace", "kube-system")
                body["metadata"]["annotations"] = {
                    **(m["metadata"].get("annotations") or {}),
                    "kubernetes.io/config.mirror": h,
                    "kubernetes.io/config.hash": h,
                    "kubernetes.io/config.source": "file",
                }
                body["metadata"]["ownerReferences"] = [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.s.node_name,
                        "uid": self._node_uid(),
                        "controller": True,
                    }
                ]
                body["spec"]["nodeName"] = self.s.node_name
                try:
                    cur = self.client.create(self.R("pods"), body["metadata"]["namespace"], body)
                except ApiError:
                    continue
            old = cur.get("status") or {}
            if _strip_times(status) != _strip_times(old):
                self.client.patch(
                    self.R("pods"),
                    cur["metadata"]["namespace"],
                    name,
                    {"status": _replace(old, status)},
                    sub="status",
                )
        for name, p in mirrors.items():
            if name not in want:
                self.client.delete(self.R("pods"), p["metadata"]["namespace"], name, grace=0)

    def _node_uid(self) -> str:
        assert self.client is not None
        return self.client.get(self.R("nodes"), "", self.s.node_name)["metadata"]["uid"]

    # --------------------------------------------------------------------------------- faults
    def faults(self) -> None:
        """The lab's drain-block fault: a pod on this node that a PodDisruptionBudget forbids evicting."""
        assert self.client is not None
        blocked = any(f.get("kind") == "drain-block" for f in self.host.faults())
        name = f"drain-block-{self.s.node_name}"
        dep_res, pdb_res, ns_res = self.R("deployments"), self.R("poddisruptionbudgets"), self.R("namespaces")
        have = self.client.find(dep_res, DRAIN_BLOCK_NS, name)
        if not blocked:
            if have is not None:
                self.client.delete(dep_res, DRAIN_BLOCK_NS, name)
                if self.client.find(pdb_res, DRAIN_BLOCK_NS, name) is not None:
                    self.client.delete(pdb_res, DRAIN_BLOCK_NS, name)
            return
        if have is not None:
            return
        if self.client.find(ns_res, "", DRAIN_BLOCK_NS) is None:
            try:
                self.client.create(
                    ns_res,
                    "",
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": DRAIN_BLOCK_NS, "labels": {"gpuprov.lab/simulated": "true"}},
                    },
                )
            except ApiError as exc:
                if exc.code != 409:
                    raise
        labels = {"app": name, "gpuprov.lab/fault": "drain-block"}
        self.client.create(
            pdb_res,
            DRAIN_BLOCK_NS,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": DRAIN_BLOCK_NS, "labels": labels},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}},
            },
        )
        self.client.create(
            dep_res,
            DRAIN_BLOCK_NS,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {
                    "name": name,
                    "namespace": DRAIN_BLOCK_NS,
                    "labels": labels,
                    "annotations": {
                        "gpuprov.lab/description": "SIMULATED (gpuprov lab): injected drain-block "
                        "fault; a PodDisruptionBudget refuses to evict this pod"
                    },
                },
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "nodeSelector": {"kubernetes.io/hostname": self.s.node_name},
                            "tolerations": [{"operator": "Exists"}],
                            "hostNetwork": True,
                            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10.2"}],
                        },
                    },
                },
            },
        )


def _containerd_version(host: Host) -> str:
    res = host.run(["containerd", "--version"], timeout=10)
    parts = res.stdout.split()
    return parts[2].lstrip("v") if res.returncode == 0 and len(parts) >= 3 else "1.6.20"


def _strip_times(st: Obj) -> str:
    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {
                k: clean(x)
                for k, x in v.items()
                if k
                not in (
                    "lastProbeTime",
                    "lastTransitionTime",
                    "startedAt",
                    "startTime",
                    "finishedAt",
                    "lastHeartbeatTime",
                )
            }
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(st), sort_keys=True)


def _replace(old: Obj, new: Obj) -> Obj:
    patch: Obj = {k: None for k in old if k not in new}
    patch.update(new)
    return patch


# --------------------------------------------------------------------------------------------- entry


def main(
    argv: list[str], host: Host | None = None, stop: threading.Event | None = None, version: str | None = None
) -> int:
    global VERSION
    if version:
        VERSION = version
    host = host or Host()
    if "--version" in argv:
        sys.stdout.write(f"Kubernetes {VERSION}\n")
        return 0
    stop = stop or threading.Event()
    try:
        kubelet = Kubelet(host, argv, stop)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
        sys.stderr.write(
            klog("I", f'server.go:530] "Kubelet version" kubeletVersion="{VERSION}" (SIMULATED, gpuprov lab)')
            + "\n"
        )
        kubelet.run()
    except KubeletExit as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0
