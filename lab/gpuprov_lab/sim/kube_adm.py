"""kubeadm, SIMULATED (gpuprov lab): init, join, reset, token, config images, version.

``init`` runs the real preflight checks against this host (container runtime, swap, IPv4 forwarding as
configured, ports, files, tools, kubelet version skew), makes a real PKI with openssl, the kubeconfig
files and the static pod manifests, configures and (re)starts the kubelet, waits for it and for the API
server it starts, uploads the cluster configuration, marks the control plane, creates the bootstrap token
and the cluster-info ConfigMap, installs CoreDNS and kube-proxy, and prints the real closing text with
the join command. ``join`` does token discovery for real (JWS-signed cluster-info, CA public-key pin)
and the kubelet's TLS bootstrap. Output and errors follow kubeadm's own wording.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import kube_pki as pki
from . import kube_util as u
from .kube_client import Client, ClientError, KubeConfig, load_kubeconfig
from .kube_host import CONTAINERD_SOCK, Host, containerd_config
from .kube_store import ApiError, Obj, Resource

VERSION = "v1.36.3"
# kubeadm v1.36's cmd/kubeadm/app/constants: DefaultEtcdVersion, CoreDNSVersion, PauseVersion.
IMAGES = {
    "1.36": {"etcd": "3.6.8-0", "coredns": "v1.14.2", "pause": "3.10.2"},
}
KUBEADM_API = ("kubeadm.k8s.io/v1beta4", "kubeadm.k8s.io/v1beta3")
MANIFESTS = "/etc/kubernetes/manifests"
PKI = "/etc/kubernetes/pki"
API_UNIT = "gpuprov-lab-kube-apiserver.service"
SA_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
MIXED_OK = {
    "ignore-preflight-errors",
    "dry-run",
    "kubeconfig",
    "skip-phases",
    "v",
    "rootfs",
    "upload-certs",
    "certificate-key",
    "skip-certificate-key-print",
    "skip-token-print",
    "patches",
}
CONF_FILES = (
    "admin.conf",
    "super-admin.conf",
    "kubelet.conf",
    "bootstrap-kubelet.conf",
    "controller-manager.conf",
    "scheduler.conf",
)
DEFAULT_TIMEOUTS = {
    "controlPlaneComponentHealthCheck": 240.0,
    "kubeletHealthCheck": 240.0,
    "kubernetesAPICall": 60.0,
    "discovery": 300.0,
    "tlsBootstrap": 300.0,
}


class Failure(Exception):
    """kubeadm failed: the text goes to stderr, exit 1."""


@dataclass
class Out:
    out: TextIO
    err: TextIO

    def p(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def w(self, text: str) -> None:
        self.err.write(text + "\n")


def minor(version: str) -> str:
    return ".".join(version.lstrip("v").split(".")[:2])


def _klogw(msg: str) -> str:
    t = time.gmtime()
    return f"W{t.tm_mon:02d}{t.tm_mday:02d} {time.strftime('%H:%M:%S', t)}.000000    {msg}"


# ------------------------------------------------------------------------------------------- flags

FLAGS = {
    "config": True,
    "pod-network-cidr": True,
    "apiserver-advertise-address": True,
    "apiserver-bind-port": True,
    "kubernetes-version": True,
    "ignore-preflight-errors": True,
    "node-name": True,
    "service-cidr": True,
    "control-plane-endpoint": True,
    "cri-socket": True,
    "token": True,
    "token-ttl": True,
    "skip-phases": True,
    "upload-certs": False,
    "cert-dir": True,
    "dry-run": False,
    "v": True,
    "discovery-token-ca-cert-hash": True,
    "discovery-token-unsafe-skip-ca-verification": False,
    "discovery-token": True,
    "tls-bootstrap-token": True,
    "force": False,
    "print-join-command": False,
    "ttl": True,
    "description": True,
    "usages": True,
    "groups": True,
    "kubeconfig": True,
    "output": True,
    "cleanup-tmp-dir": False,
    "apiserver-cert-extra-sans": True,
    "service-dns-domain": True,
    "image-repository": True,
    "skip-token-print": False,
    "control-plane": False,
    "certificate-key": True,
    "patches": True,
    "rootfs": True,
    "experimental-output": True,
}


def parse(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    pos: list[str] = []
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if name not in FLAGS:
                raise Failure(
                    f"unknown flag: --{name}\nTo see the stack trace of this error execute with --v=5 or "
                    f"higher"
                )
            if FLAGS[name] and not eq:
                if i + 1 >= len(argv):
                    raise Failure(f"flag needs an argument: --{name}")
                value = argv[i + 1]
                i += 1
            elif not FLAGS[name] and not eq:
                value = "true"
            flags[name] = value
        elif a in ("-f",):
            flags["force"] = "true"
        elif a.startswith("-o"):
            value = a[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            if not a[2:]:
                i += 1
            flags["output"] = value
        elif a.startswith("-v"):
            flags["v"] = a[2:].lstrip("=")
        else:
            pos.append(a)
        i += 1
    return pos, flags


# ------------------------------------------------------------------------------------------ config


@dataclass
class Config:
    version: str = VERSION
    advertise: str = ""
    bind_port: int = 6443
    node_name: str = ""
    pod_subnet: str = ""
    service_subnet: str = "10.96.0.0/12"
    dns_domain: str = "cluster.local"
    cluster_name: str = "kubernetes"
    control_plane_endpoint: str = ""
    cert_sans: list[str] = field(default_factory=list)
    image_repository: str = "registry.k8s.io"
    cri_socket: str = "unix:///var/run/containerd/containerd.sock"
    taints: list[Obj] | None = None
    kubelet_extra_args: dict[str, str] = field(default_factory=dict)
    ignore: set[str] = field(default_factory=set)
    tokens: list[Obj] = field(default_factory=list)
    kubelet: Obj = field(default_factory=dict)
    kube_proxy: Obj = field(default_factory=dict)
    timeouts: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    apiserver_extra: dict[str, str] = field(default_factory=dict)
    cm_extra: dict[str, str] = field(default_factory=dict)
    skip_phases: list[str] = field(default_factory=list)
    cluster_doc: Obj = field(default_factory=dict)
    etcd_dir: str = "/var/lib/etcd"
    # join
    discovery_endpoint: str = ""
    discovery_token: str = ""
    ca_hashes: list[str] = field(default_factory=list)
    unsafe_skip_ca: bool = False
    tls_token: str = ""


def _args(value: Any) -> dict[str, str]:
    """extraArgs: a map (v1beta3) or a list of {name, value} (v1beta4)."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    out = {}
    for item in value or []:
        if isinstance(item, dict) and "name" in item:
            out[str(item["name"])] = str(item.get("value", ""))
    return out


KNOWN_FIELDS = {
    "InitConfiguration": {
        "apiVersion",
        "kind",
        "bootstrapTokens",
        "nodeRegistration",
        "localAPIEndpoint",
        "certificateKey",
        "skipPhases",
        "patches",
        "timeouts",
        "dryRun",
    },
    "ClusterConfiguration": {
        "apiVersion",
        "kind",
        "etcd",
        "networking",
        "kubernetesVersion",
        "controlPlaneEndpoint",
        "apiServer",
        "controllerManager",
        "scheduler",
        "dns",
        "proxy",
        "certificatesDir",
        "imageRepository",
        "featureGates",
        "clusterName",
        "encryptionAlgorithm",
        "certificateValidityPeriod",
        "caCertificateValidityPeriod",
    },
    "JoinConfiguration": {
        "apiVersion",
        "kind",
        "nodeRegistration",
        "caCertPath",
        "discovery",
        "controlPlane",
        "skipPhases",
        "patches",
        "timeouts",
        "dryRun",
    },
}


def load_config(host: Host, path: str, o: Out, want: str) -> Config:
    text = host.read(path)
    if text is None:
        raise Failure(f'unable to read config from "{path}" : open {path}: no such file or directory')
    try:
        docs = u.yaml_load_all(text)
    except Exception as exc:
        raise Failure(f"error converting YAML to JSON: {exc}") from exc
    cfg = Config()
    seen = set()
    for d in docs:
        if not isinstance(d, dict):
            continue
        kind, api = d.get("kind", ""), d.get("apiVersion", "")
        if kind in KNOWN_FIELDS:
            if api not in KUBEADM_API:
                raise Failure(
                    f'no kind "{kind}" is registered for version "{api}" in scheme '
                    '"k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/scheme/scheme.go:31"'
                )
            if api.endswith("v1beta3"):
                o.w(
                    _klogw(
                        f'common.go:101] your configuration file uses a deprecated API spec: "{api}" '
                        f'(kind: "{kind}"). '
                        "Please use 'kubeadm config migrate --old-config old.yaml --new-config new.yaml', "
                        "which will "
                        "write the new, similar spec using a newer API version."
                    )
                )
            for key in d:
                if key not in KNOWN_FIELDS[kind]:
                    o.w(
                        _klogw(
                            f"strict.go:54] error unmarshaling configuration schema.GroupVersionKind{{Group:"
                            f'"kubeadm.k8s.io", Version:"{api.split("/")[1]}", Kind:"{kind}"}}: strict '
                            f"decoding error: "
                            f'unknown field "{key}"'
                        )
                    )
            seen.add(kind)
        if kind == "InitConfiguration" or kind == "JoinConfiguration":
            nr = d.get("nodeRegistration") or {}
            cfg.node_name = nr.get("name") or cfg.node_name
            cfg.cri_socket = nr.get("criSocket") or cfg.cri_socket
            if "taints" in nr:
                cfg.taints = nr.get("taints") or []
            cfg.kubelet_extra_args.update(_args(nr.get("kubeletExtraArgs")))
            cfg.ignore |= {x.lower() for x in nr.get("ignorePreflightErrors") or []}
            for k, v in (d.get("timeouts") or {}).items():
                try:
                    cfg.timeouts[k] = u.parse_duration(v)
                except ValueError as exc:
                    raise Failure(f"{kind}.timeouts.{k}: {exc}") from exc
            cfg.skip_phases = list(d.get("skipPhases") or [])
        if kind == "InitConfiguration":
            ep = d.get("localAPIEndpoint") or {}
            cfg.advertise = ep.get("advertiseAddress") or cfg.advertise
            cfg.bind_port = int(ep.get("bindPort") or cfg.bind_port)
            cfg.tokens = list(d.get("bootstrapTokens") or [])
        elif kind == "ClusterConfiguration":
            cfg.cluster_doc = d
            if d.get("kubernetesVersion"):
                cfg.version = str(d["kubernetesVersion"])
            net = d.get("networking") or {}
            cfg.pod_subnet = net.get("podSubnet") or cfg.pod_subnet
            cfg.service_subnet = net.get("serviceSubnet") or cfg.service_subnet
            cfg.dns_domain = net.get("dnsDomain") or cfg.dns_domain
            cfg.control_plane_endpoint = d.get("controlPlaneEndpoint") or ""
            cfg.cert_sans = list(u.dig(d, "apiServer", "certSANs") or [])
            cfg.apiserver_extra = _args(u.dig(d, "apiServer", "extraArgs"))
            cfg.cm_extra = _args(u.dig(d, "controllerManager", "extraArgs"))
            cfg.image_repository = d.get("imageRepository") or cfg.image_repository
            cfg.cluster_name = d.get("clusterName") or cfg.cluster_name
            cfg.etcd_dir = u.dig(d, "etcd", "local", "dataDir") or cfg.etcd_dir
        elif kind == "JoinConfiguration":
            bt = u.dig(d, "discovery", "bootstrapToken") or {}
            cfg.discovery_endpoint = bt.get("apiServerEndpoint", "")
            cfg.discovery_token = bt.get("token", "")
            cfg.ca_hashes = list(bt.get("caCertHashes") or [])
            cfg.unsafe_skip_ca = bool(bt.get("unsafeSkipCAVerification"))
            cfg.tls_token = u.dig(d, "discovery", "tlsBootstrapToken") or cfg.discovery_token
        elif kind == "KubeletConfiguration":
            cfg.kubelet = d
        elif kind == "KubeProxyConfiguration":
            cfg.kube_proxy = d
        elif kind not in KNOWN_FIELDS:
            o.w(f"[config] WARNING: Ignored configuration document with GroupVersionKind {api}, Kind={kind}")
    if want not in seen and not (want == "InitConfiguration" and "ClusterConfiguration" in seen):
        raise Failure(
            f'no {want} found in the config file "{path}"'
            if want == "JoinConfiguration"
            else "no InitConfiguration or ClusterConfiguration kind was found in the YAML file"
        )
    return cfg


def _check_mixed(flags: dict[str, str], allowed: set[str]) -> None:
    if "config" in flags:
        bad = sorted(k for k in flags if k != "config" and k not in allowed)
        if bad:
            raise Failure(f"can not mix '--config' with arguments [{' '.join(bad)}]")


def _version(value: str) -> str:
    v = value.strip()
    if v.startswith("stable") or v == "latest":
        return ""
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", v)
    if not m:
        raise Failure(f'couldn\'t parse Kubernetes version "{value}": could not parse "{value}" as version')
    return f"v{m.group(1)}.{m.group(2)}.{m.group(3)}"


def kubelet_defaults(cfg: Config) -> Obj:
    """kubeadm's KubeletConfiguration: its defaults under the user's document."""
    dns = str(list(ipaddress.ip_network(cfg.service_subnet, strict=False).hosts())[9])
    base: Obj = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"cacheTTL": "0s", "enabled": True},
            "x509": {"clientCAFile": f"{PKI}/ca.crt"},
        },
        "authorization": {
            "mode": "Webhook",
            "webhook": {"cacheAuthorizedTTL": "0s", "cacheUnauthorizedTTL": "0s"},
        },
        "cgroupDriver": "systemd",
        "clusterDNS": [dns],
        "clusterDomain": cfg.dns_domain,
        "containerRuntimeEndpoint": "",
        "cpuManagerReconcilePeriod": "0s",
        "crashLoopBackOff": {},
        "evictionPressureTransitionPeriod": "0s",
        "fileCheckFrequency": "0s",
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "httpCheckFrequency": "0s",
        "imageMaximumGCAge": "0s",
        "imageMinimumGCAge": "0s",
        "kind": "KubeletConfiguration",
        "logging": {
            "flushFrequency": 0,
            "options": {"json": {"infoBufferSize": "0"}, "text": {"infoBufferSize": "0"}},
            "verbosity": 0,
        },
        "memorySwap": {},
        "nodeStatusReportFrequency": "0s",
        "nodeStatusUpdateFrequency": "0s",
        "rotateCertificates": True,
        "runtimeRequestTimeout": "0s",
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
        "staticPodPath": MANIFESTS,
        "streamingConnectionIdleTimeout": "0s",
        "syncFrequency": "0s",
        "volumeStatsAggPeriod": "0s",
    }
    return u.deep_merge(base, cfg.kubelet or {})


# -------------------------------------------------------------------------------------------- preflight


class Preflight:
    def __init__(self, host: Host, o: Out, ignore: set[str]) -> None:
        self.host, self.o, self.ignore = host, o, {x.lower() for x in ignore}
        self.errors: list[str] = []

    def add(self, name: str, msg: str, warning: bool = False) -> None:
        if warning or "all" in self.ignore or name.lower() in self.ignore:
            self.o.p(f"\t[WARNING {name}]: {msg}")
        else:
            self.errors.append(f"\t[ERROR {name}]: {msg}")

    def runtime(self, socket_path: str) -> None:
        host = self.host
        sock = socket_path.removeprefix("unix://")
        if not host.service_active("containerd") or not host.exists(CONTAINERD_SOCK):
            self.add(
                "CRI",
                f'container runtime is not running: output: time="{u.iso()}" level=fatal msg="validate '
                f'service connection: validate CRI v1 runtime API for endpoint \\"{socket_path}\\": rpc '
                f"error: "
                'code = Unavailable desc = connection error: desc = \\"transport: Error while dialing: '
                "dial unix "
                f'{sock}: connect: no such file or directory\\""\n, error: exit status 1',
            )
            return
        cc = containerd_config(host)
        if not cc.cri_enabled:
            self.add(
                "CRI",
                f'container runtime is not running: output: time="{u.iso()}" level=fatal msg="validate '
                f'service connection: validate CRI v1 runtime API for endpoint \\"{socket_path}\\": rpc '
                f"error: "
                'code = Unimplemented desc = unknown service runtime.v1.RuntimeService"\n, error: exit '
                "status 1",
            )
            return
        ver = host.run(["containerd", "--version"], timeout=10).stdout.split()
        if len(ver) >= 3 and ver[2].lstrip("v").split(".")[0] < "2":
            self.add(
                "ContainerRuntimeVersion",
                "You must update your container runtime to a version that supports "
                "the CRI method RuntimeConfig. Falling back to using cgroupDriver from kubelet config will "
                "be "
                "removed in 1.36. For more information, see "
                "https://git.k8s.io/enhancements/keps/sig-node/4033-group-driver-detection-over-cri",
                warning=True,
            )

    def common(self, cfg: Config, control_plane: bool) -> None:
        host = self.host
        if host.swap_devices():
            self.add(
                "Swap",
                "swap is supported for cgroup v2 only. The kubelet must be properly configured to use "
                "swap. Please refer to "
                "https://kubernetes.io/docs/concepts/architecture/nodes/#swap-memory, or "
                "disable swap on the node",
                warning=True,
            )
        # IPv4 forwarding is judged from the sysctl configuration, not the live value: lab hosts share
        # this machine's kernel, whose forwarding must stay off (see Host.sysctl_configured).
        if host.sysctl_configured("net.ipv4.ip_forward") != "1":
            self.add(
                "FileContent--proc-sys-net-ipv4-ip_forward",
                "/proc/sys/net/ipv4/ip_forward contents are not set to 1",
            )
        for exe, mandatory in (
            ("ip", True),
            ("iptables", True),
            ("mount", True),
            ("nsenter", True),
            ("ebtables", False),
            ("ethtool", False),
            ("socat", False),
            ("tc", False),
            ("touch", False),
        ):
            if host.which(exe) is None:
                self.add(f"FileExisting-{exe}", f"{exe} not found in system path", warning=not mandatory)
        if not host.service_enabled("kubelet"):
            self.add(
                "Service-Kubelet",
                "kubelet service is not enabled, please run 'systemctl enable kubelet.service'",
                warning=True,
            )

    def port(self, port: int) -> None:
        real = self.host.port(port)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0" if self.host.bind_address("0.0.0.0") == "0.0.0.0" else "127.0.0.1", real))
            except OSError:
                self.add(f"Port-{port}", f"Port {port} is in use")

    def file_available(self, path: str) -> None:
        if self.host.exists(path):
            self.add(f"FileAvailable-{path.replace('/', '-')}", f"{path} already exists")

    def dir_available(self, path: str) -> None:
        if self.host.listdir(path):
            self.add(f"DirAvailable-{path.replace('/', '-')}", f"{path} is not empty")

    def kubelet_version(self, control_plane: str) -> None:
        res = self.host.run(["kubelet", "--version"], timeout=20)
        m = re.search(r"v(\d+)\.(\d+)\.(\d+)", res.stdout)
        if res.returncode != 0 or not m:
            self.add(
                "KubeletVersion",
                f"couldn't get kubelet version: cannot execute 'kubelet --version': "
                f"{(res.stderr or 'executable file not found in $PATH').strip()}",
            )
            return
        kv = (int(m.group(1)), int(m.group(2)))
        cv = tuple(int(x) for x in control_plane.lstrip("v").split(".")[:2])
        if kv > cv:
            self.add(
                "KubeletVersion",
                f"the kubelet version is higher than the control plane version. This is not a "
                f"supported version skew and may lead to a malfunctional cluster. Kubelet version: "
                f'"{m.group(0)[1:]}" '
                f'Control plane version: "{control_plane.lstrip("v")}"',
            )
        elif kv[1] < cv[1] - 3:
            self.add(
                "KubeletVersion",
                f'Kubelet version "{m.group(0)[1:]}" is lower than kubeadm can support. Please '
                f"upgrade kubelet",
            )

    def resources(self) -> None:
        if self.host.cpu_count() < 2:
            self.add(
                "NumCPU", f"the number of available CPUs {self.host.cpu_count()} is less than the required 2"
            )
        mb = self.host.mem_total_kib() // 1024
        if mb and mb < 1700:
            self.add("Mem", f"the system RAM ({mb} MB) is less than the minimum 1700 MB")

    def finish(self) -> None:
        if self.errors:
            raise Failure(
                "error execution phase preflight: [preflight] Some fatal errors occurred:\n"
                + "\n".join(self.errors)
                + "\n[preflight] If you know what you are doing, you can make a check non-fatal with "
                "`--ignore-preflight-errors=...`\nTo see the stack trace of this error execute with --v=5 "
                "or higher"
            )


# ---------------------------------------------------------------------------------------------- init


def _node_ip(host: Host, cfg: Config) -> str:
    return cfg.advertise or host.node_ip()


def _server(cfg: Config, ip: str) -> str:
    if cfg.control_plane_endpoint:
        ep = cfg.control_plane_endpoint
        return f"https://{ep}" if ":" in ep else f"https://{ep}:{cfg.bind_port}"
    return f"https://{ip}:{cfg.bind_port}"


def wait_http(url: str, timeout: float, tls: bool) -> float | None:
    """Seconds until url answered 200 (None when it did not within timeout)."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx if tls else None) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.2)
    return None


def write_pki(host: Host, cfg: Config, node: str, ip: str, o: Out) -> pki.CertKey:
    o.p(f'[certs] Using certificateDir folder "{PKI}"')
    svc_ip = str(next(ipaddress.ip_network(cfg.service_subnet, strict=False).hosts()))

    def save(rel: str, ck: pki.CertKey) -> None:
        host.write(f"{PKI}/{rel}.crt", ck.cert)
        host.write(f"{PKI}/{rel}.key", ck.key, 0o600)

    ca = pki.make_ca(host, "kubernetes")
    o.p('[certs] Generating "ca" certificate and key')
    save("ca", ca)
    dns = [
        node,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{cfg.dns_domain}",
    ]
    ips = [svc_ip, ip]
    for san in cfg.cert_sans + (
        [cfg.control_plane_endpoint.rsplit(":", 1)[0]] if cfg.control_plane_endpoint else []
    ):
        try:
            ipaddress.ip_address(san)
            ips.append(san)
        except ValueError:
            dns.append(san)
    if "127.0.0.1" not in ips and ip.startswith("127."):
        ips.append("127.0.0.1")
    dns, ips = list(dict.fromkeys(dns)), list(dict.fromkeys(ips))
    o.p('[certs] Generating "apiserver" certificate and key')
    o.p(f"[certs] apiserver serving cert is signed for DNS names [{' '.join(dns)}] and IPs [{' '.join(ips)}]")
    save("apiserver", pki.make_cert(host, ca, "kube-apiserver", server=True, client=False, dns=dns, ips=ips))
    o.p('[certs] Generating "apiserver-kubelet-client" certificate and key')
    save(
        "apiserver-kubelet-client",
        pki.make_cert(host, ca, "kube-apiserver-kubelet-client", ["kubeadm:cluster-admins"]),
    )
    o.p('[certs] Generating "front-proxy-ca" certificate and key')
    fp = pki.make_ca(host, "front-proxy-ca")
    save("front-proxy-ca", fp)
    o.p('[certs] Generating "front-proxy-client" certificate and key')
    save("front-proxy-client", pki.make_cert(host, fp, "front-proxy-client"))
    o.p('[certs] Generating "etcd/ca" certificate and key')
    eca = pki.make_ca(host, "etcd-ca")
    save("etcd/ca", eca)
    etcd_dns, etcd_ips = [node, "localhost"], [ip, "127.0.0.1", "0:0:0:0:0:0:0:1"]
    for name, cn, server in (
        ("etcd/server", node, True),
        ("etcd/peer", node, True),
        ("etcd/healthcheck-client", "kube-etcd-healthcheck-client", False),
    ):
        o.p(f'[certs] Generating "{name}" certificate and key')
        if server:
            o.p(
                f"[certs] {name} serving cert is signed for DNS names [{' '.join(etcd_dns)}] and IPs "
                f"[{' '.join(etcd_ips)}]"
            )
        save(
            name,
            pki.make_cert(
                host,
                eca,
                cn,
                server=server,
                client=True,
                dns=etcd_dns if server else None,
                ips=etcd_ips if server else None,
            ),
        )
    o.p('[certs] Generating "apiserver-etcd-client" certificate and key')
    save("apiserver-etcd-client", pki.make_cert(host, eca, "kube-apiserver-etcd-client"))
    o.p('[certs] Generating "sa" key and public key')
    sa = pki.new_key(host)
    host.write(f"{PKI}/sa.key", sa, 0o600)
    host.write(f"{PKI}/sa.pub", pki.public_key(host, sa))
    return ca


def write_kubeconfigs(host: Host, cfg: Config, ca: pki.CertKey, node: str, server: str, o: Out) -> None:
    o.p('[kubeconfig] Using kubeconfig folder "/etc/kubernetes"')
    for fname, cn, orgs in (
        ("admin.conf", "kubernetes-admin", ["kubeadm:cluster-admins"]),
        ("super-admin.conf", "kubernetes-super-admin", ["system:masters"]),
        ("kubelet.conf", f"system:node:{node}", ["system:nodes"]),
        ("controller-manager.conf", "system:kube-controller-manager", []),
        ("scheduler.conf", "system:kube-scheduler", []),
    ):
        o.p(f'[kubeconfig] Writing "{fname}" kubeconfig file')
        ck = pki.make_cert(host, ca, cn, orgs)
        user = cn if fname != "kubelet.conf" else f"system:node:{node}"
        kc = pki.kubeconfig(server, ca.cert, user, cluster=cfg.cluster_name, cert=ck)
        host.write(f"/etc/kubernetes/{fname}", pki.dump_kubeconfig(kc), 0o600)


def _pod(
    name: str,
    image: str,
    command: list[str],
    port: int,
    probe_path: str,
    scheme: str = "HTTPS",
    host_ip: str = "127.0.0.1",
    volumes: list[tuple[str, str, str]] | None = None,
) -> Obj:
    vols = volumes or []
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "labels": {"component": name, "tier": "control-plane"},
            "name": name,
            "namespace": "kube-system",
        },
        "spec": {
            "containers": [
                {
                    "command": command,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "livenessProbe": {
                        "failureThreshold": 8,
                        "httpGet": {"host": host_ip, "path": probe_path, "port": port, "scheme": scheme},
                        "initialDelaySeconds": 10,
                        "periodSeconds": 10,
                        "timeoutSeconds": 15,
                    },
                    "name": name,
                    "resources": {"requests": {"cpu": "250m" if name == "kube-apiserver" else "100m"}},
                    "volumeMounts": [{"mountPath": m, "name": n, "readOnly": True} for n, _h, m in vols],
                }
            ],
            "hostNetwork": True,
            "priority": 2000001000,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [
                {"hostPath": {"path": h, "type": "DirectoryOrCreate"}, "name": n} for n, h, _m in vols
            ],
        },
        "status": {},
    }


def write_manifests(host: Host, cfg: Config, ip: str, node: str, o: Out) -> None:
    repo, v = cfg.image_repository, cfg.version
    imgs = IMAGES.get(minor(v), IMAGES["1.36"])
    certs = [("ca-certs", "/etc/ssl/certs", "/etc/ssl/certs"), ("k8s-certs", PKI, PKI)]
    etcd = _pod(
        "etcd",
        f"{repo}/etcd:{imgs['etcd']}",
        [
            "etcd",
            f"--advertise-client-urls=https://{ip}:2379",
            f"--cert-file={PKI}/etcd/server.crt",
            "--client-cert-auth=true",
            f"--data-dir={cfg.etcd_dir}",
            "--experimental-initial-corrupt-check=true",
            f"--initial-advertise-peer-urls=https://{ip}:2380",
            f"--initial-cluster={node}=https://{ip}:2380",
            f"--key-file={PKI}/etcd/server.key",
            f"--listen-client-urls=https://127.0.0.1:2379,https://{ip}:2379",
            "--listen-metrics-urls=http://127.0.0.1:2381",
            f"--listen-peer-urls=https://{ip}:2380",
            f"--name={node}",
            f"--peer-cert-file={PKI}/etcd/peer.crt",
            "--peer-client-cert-auth=true",
            f"--peer-key-file={PKI}/etcd/peer.key",
            f"--peer-trusted-ca-file={PKI}/etcd/ca.crt",
            "--snapshot-count=10000",
            f"--trusted-ca-file={PKI}/etcd/ca.crt",
        ],
        2381,
        "/livez",
        "HTTP",
        volumes=[("etcd-certs", f"{PKI}/etcd", f"{PKI}/etcd"), ("etcd-data", cfg.etcd_dir, cfg.etcd_dir)],
    )
    api_flags = {
        "advertise-address": ip,
        "allow-privileged": "true",
        "authorization-mode": "Node,RBAC",
        "client-ca-file": f"{PKI}/ca.crt",
        "enable-admission-plugins": "NodeRestriction",
        "enable-bootstrap-token-auth": "true",
        "etcd-cafile": f"{PKI}/etcd/ca.crt",
        "etcd-certfile": f"{PKI}/apiserver-etcd-client.crt",
        "etcd-keyfile": f"{PKI}/apiserver-etcd-client.key",
        "etcd-servers": "https://127.0.0.1:2379",
        "kubelet-client-certificate": f"{PKI}/apiserver-kubelet-client.crt",
        "kubelet-client-key": f"{PKI}/apiserver-kubelet-client.key",
        "kubelet-preferred-address-types": "InternalIP,ExternalIP,Hostname",
        "proxy-client-cert-file": f"{PKI}/front-proxy-client.crt",
        "proxy-client-key-file": f"{PKI}/front-proxy-client.key",
        "requestheader-allowed-names": "front-proxy-client",
        "requestheader-client-ca-file": f"{PKI}/front-proxy-ca.crt",
        "requestheader-extra-headers-prefix": "X-Remote-Extra-",
        "requestheader-group-headers": "X-Remote-Group",
        "requestheader-username-headers": "X-Remote-User",
        "secure-port": str(cfg.bind_port),
        "service-account-issuer": f"https://kubernetes.default.svc.{cfg.dns_domain}",
        "service-account-key-file": f"{PKI}/sa.pub",
        "service-account-signing-key-file": f"{PKI}/sa.key",
        "service-cluster-ip-range": cfg.service_subnet,
        "tls-cert-file": f"{PKI}/apiserver.crt",
        "tls-private-key-file": f"{PKI}/apiserver.key",
        **cfg.apiserver_extra,
    }
    api = _pod(
        "kube-apiserver",
        f"{repo}/kube-apiserver:{v}",
        ["kube-apiserver", *(f"--{k}={x}" for k, x in sorted(api_flags.items()))],
        cfg.bind_port,
        "/livez",
        host_ip=ip,
        volumes=certs,
    )
    api["metadata"]["annotations"] = {
        "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint": f"{ip}:{cfg.bind_port}"
    }
    cm_flags = {
        "authentication-kubeconfig": "/etc/kubernetes/controller-manager.conf",
        "authorization-kubeconfig": "/etc/kubernetes/controller-manager.conf",
        "bind-address": "127.0.0.1",
        "client-ca-file": f"{PKI}/ca.crt",
        "cluster-name": cfg.cluster_name,
        "cluster-signing-cert-file": f"{PKI}/ca.crt",
        "cluster-signing-key-file": f"{PKI}/ca.key",
        "controllers": "*,bootstrapsigner,tokencleaner",
        "kubeconfig": "/etc/kubernetes/controller-manager.conf",
        "leader-elect": "true",
        "requestheader-client-ca-file": f"{PKI}/front-proxy-ca.crt",
        "root-ca-file": f"{PKI}/ca.crt",
        "service-account-private-key-file": f"{PKI}/sa.key",
        "use-service-account-credentials": "true",
    }
    if cfg.pod_subnet:
        cm_flags.update(
            {
                "allocate-node-cidrs": "true",
                "cluster-cidr": cfg.pod_subnet,
                "service-cluster-ip-range": cfg.service_subnet,
            }
        )
    cm_flags.update(cfg.cm_extra)
    cm = _pod(
        "kube-controller-manager",
        f"{repo}/kube-controller-manager:{v}",
        ["kube-controller-manager", *(f"--{k}={x}" for k, x in sorted(cm_flags.items()))],
        10257,
        "/healthz",
        volumes=certs,
    )
    sched = _pod(
        "kube-scheduler",
        f"{repo}/kube-scheduler:{v}",
        [
            "kube-scheduler",
            "--authentication-kubeconfig=/etc/kubernetes/scheduler.conf",
            "--authorization-kubeconfig=/etc/kubernetes/scheduler.conf",
            "--bind-address=127.0.0.1",
            "--kubeconfig=/etc/kubernetes/scheduler.conf",
            "--leader-elect=true",
        ],
        10259,
        "/livez",
    )
    o.p(f'[etcd] Creating static Pod manifest for local etcd in "{MANIFESTS}"')
    host.write(f"{MANIFESTS}/etcd.yaml", u.yaml_dump(etcd), 0o600)
    o.p(f'[control-plane] Using manifest folder "{MANIFESTS}"')
    for name, doc in (("kube-apiserver", api), ("kube-controller-manager", cm), ("kube-scheduler", sched)):
        o.p(f'[control-plane] Creating static Pod manifest for "{name}"')
        host.write(f"{MANIFESTS}/{name}.yaml", u.yaml_dump(doc), 0o600)


def kubelet_flags(cfg: Config, hostname: str) -> str:
    imgs = IMAGES.get(minor(cfg.version), IMAGES["1.36"])
    args = {
        "container-runtime-endpoint": cfg.cri_socket,
        "pod-infra-container-image": f"{cfg.image_repository}/pause:{imgs['pause']}",
    }
    if cfg.node_name and cfg.node_name.lower() != hostname.lower():
        args["hostname-override"] = cfg.node_name.lower()
    args.update(cfg.kubelet_extra_args)
    return 'KUBELET_KUBEADM_ARGS="' + " ".join(f"--{k}={v}" for k, v in args.items()) + '"\n'


def start_kubelet(host: Host, cfg: Config, kubelet_cfg: Obj, o: Out) -> None:
    host.systemctl("stop", "kubelet")
    o.p(
        "[kubelet-start] Writing kubelet environment file with flags to file "
        '"/var/lib/kubelet/kubeadm-flags.env"'
    )
    host.write("/var/lib/kubelet/kubeadm-flags.env", kubelet_flags(cfg, host.hostname()))
    o.p('[kubelet-start] Writing kubelet configuration to file "/var/lib/kubelet/config.yaml"')
    host.write("/var/lib/kubelet/config.yaml", u.yaml_dump(kubelet_cfg))
    o.p("[kubelet-start] Starting the kubelet")
    host.systemctl("restart", "kubelet")


def wait_kubelet(host: Host, cfg: Config, kubelet_cfg: Obj, o: Out, phase: str) -> None:
    port = int(kubelet_cfg.get("healthzPort", 10248))
    limit = cfg.timeouts["kubeletHealthCheck"]
    o.p(
        f"[kubelet-check] Waiting for a healthy kubelet at http://127.0.0.1:{port}/healthz. This can take "
        f"up to "
        f"{u.go_duration(limit)}"
    )
    took = wait_http(f"http://127.0.0.1:{host.port(port)}/healthz", limit, tls=False)
    if took is None:
        o.p(
            f"[kubelet-check] The kubelet is not healthy after {u.go_duration(limit)}\n\nUnfortunately, an "
            f"error has "
            "occurred, likely caused by:\n\t- The kubelet is not running\n\t- The kubelet is unhealthy due "
            "to a "
            "misconfiguration of the node in some way (required cgroups disabled)\n\nIf you are on a "
            "systemd-powered "
            "system, you can try to troubleshoot the error with the following commands:\n\t- 'systemctl "
            "status "
            "kubelet'\n\t- 'journalctl -xeu kubelet'\n"
        )
        raise Failure(
            f"error execution phase {phase}: failed while waiting for the kubelet to start: The HTTP call "
            f"equal to 'curl -sSL http://127.0.0.1:{port}/healthz' returned error: Get "
            f'"http://127.0.0.1:{port}/healthz": context deadline exceeded\nTo see the stack trace of this '
            "error execute with --v=5 or higher"
        )
    o.p(f"[kubelet-check] The kubelet is healthy after {u.go_duration(took)}")


class Api:
    """The few typed calls kubeadm makes."""

    def __init__(self, client: Client) -> None:
        self.c = client

    def r(self, name: str) -> Resource:
        from .kube_store import BUILTIN

        for res in BUILTIN:
            if name in (res.plural, res.rid):
                return res
        raise KeyError(name)

    def ensure(self, obj: Obj) -> Obj:
        """Create, or replace an existing object (kubeadm's CreateOrUpdate)."""
        res = next(r for r in self._all() if r.kind == obj["kind"] and r.api_version == obj["apiVersion"])
        ns = obj["metadata"].get("namespace", "") if res.namespaced else ""
        try:
            return self.c.create(res, ns, obj)
        except ApiError as exc:
            if exc.code != 409:
                raise
        live = self.c.get(res, ns, obj["metadata"]["name"])
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        return self.c.replace(res, ns, obj)

    def _all(self) -> list[Resource]:
        from .kube_store import BUILTIN

        return BUILTIN


def token_secret(token: str, ttl: float, description: str, usages: list[str], groups: list[str]) -> Obj:
    tid, sec = token.split(".")
    data = {"token-id": tid, "token-secret": sec}
    if ttl > 0:
        data["expiration"] = u.iso(time.time() + ttl)
    if description:
        data["description"] = description
    for us in usages:
        data[f"usage-bootstrap-{us}"] = "true"
    if groups:
        data["auth-extra-groups"] = ",".join(groups)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": f"bootstrap-token-{tid}", "namespace": "kube-system"},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def cmd_init(host: Host, pos: list[str], flags: dict[str, str], o: Out) -> int:
    _check_mixed(flags, MIXED_OK)
    cfg = load_config(host, flags["config"], o, "InitConfiguration") if "config" in flags else Config()
    if "config" not in flags:
        cfg.pod_subnet = flags.get("pod-network-cidr", "")
        cfg.advertise = flags.get("apiserver-advertise-address", "")
        cfg.bind_port = int(flags.get("apiserver-bind-port", 6443))
        cfg.node_name = flags.get("node-name", "")
        cfg.service_subnet = flags.get("service-cidr", cfg.service_subnet)
        cfg.dns_domain = flags.get("service-dns-domain", cfg.dns_domain)
        cfg.control_plane_endpoint = flags.get("control-plane-endpoint", "")
        cfg.cri_socket = flags.get("cri-socket", cfg.cri_socket)
        cfg.image_repository = flags.get("image-repository", cfg.image_repository)
        cfg.cert_sans = [x for x in flags.get("apiserver-cert-extra-sans", "").split(",") if x]
        if "kubernetes-version" in flags:
            cfg.version = flags["kubernetes-version"]
        if "token" in flags:
            cfg.tokens = [{"token": flags["token"], "ttl": flags.get("token-ttl", "24h0m0s")}]
        elif "token-ttl" in flags:
            cfg.tokens = [{"ttl": flags["token-ttl"]}]
    cfg.ignore |= {
        x.strip().lower() for x in flags.get("ignore-preflight-errors", "").split(",") if x.strip()
    }
    for key, value in cfg.timeouts.items():
        env = host.env.get(f"GPUPROV_SIM_KUBEADM_TIMEOUT_{key.upper()}")
        if env:
            cfg.timeouts[key] = u.parse_duration(env) if value == DEFAULT_TIMEOUTS.get(key) else value
    requested = _version(cfg.version) or VERSION
    if cfg.pod_subnet:
        try:
            ipaddress.ip_network(cfg.pod_subnet, strict=False)
        except ValueError as exc:
            raise Failure(
                f'networking.podSubnet: Invalid value: "{cfg.pod_subnet}": couldn\'t parse subnet'
            ) from exc
    if cfg.advertise:
        try:
            ipaddress.ip_address(cfg.advertise)
        except ValueError as exc:
            raise Failure(
                f'localAPIEndpoint.advertiseAddress: Invalid value: "{cfg.advertise}": '
                "must be a valid IP address"
            ) from exc
    cfg.version = requested
    node = (cfg.node_name or host.node_name()).lower()
    ip = _node_ip(host, cfg)
    o.p(f"[init] Using Kubernetes version: {cfg.version}")
    o.p("[preflight] Running pre-flight checks")
    kv = tuple(int(x) for x in cfg.version.lstrip("v").split(".")[:2])
    own = tuple(int(x) for x in VERSION.lstrip("v").split(".")[:2])
    pf = Preflight(host, o, cfg.ignore)
    if kv > own:
        pf.add(
            "KubernetesVersion",
            f"Kubernetes version is greater than kubeadm version. Please consider to upgrade "
            f"kubeadm. Kubernetes version: {cfg.version.lstrip('v')}. Kubeadm version: {minor(VERSION)}.x",
            warning=True,
        )
    elif kv < (own[0], own[1] - 1):
        raise Failure(
            f"this version of kubeadm only supports deploying clusters with the control plane version >= "
            f"{own[0]}.{own[1] - 1}.0. Current version: {cfg.version}"
        )
    pf.resources()
    pf.runtime(cfg.cri_socket)
    pf.common(cfg, control_plane=True)
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
        pf.file_available(f"{MANIFESTS}/{name}.yaml")
    for port in (cfg.bind_port, 10259, 10257, 10250, 2379, 2380):
        pf.port(port)
    pf.dir_available(cfg.etcd_dir)
    pf.kubelet_version(cfg.version)
    pf.finish()
    o.p("[preflight] Pulling images required for setting up a Kubernetes cluster")
    o.p("[preflight] This might take a minute or two, depending on the speed of your internet connection")
    o.p("[preflight] You can also perform this action beforehand using 'kubeadm config images pull'")
    if "dry-run" in flags:
        o.p("[dryrun] Finished dry-running successfully. Above are the resources that would be created")
        return 0
    server = _server(cfg, ip)
    ca = write_pki(host, cfg, node, ip, o)
    write_kubeconfigs(host, cfg, ca, node, server, o)
    write_manifests(host, cfg, ip, node, o)
    kubelet_cfg = kubelet_defaults(cfg)
    start_kubelet(host, cfg, kubelet_cfg, o)
    o.p(
        f"[wait-control-plane] Waiting for the kubelet to boot up the control plane as static Pods from "
        f"directory "
        f'"{MANIFESTS}"'
    )
    wait_kubelet(host, cfg, kubelet_cfg, o, "wait-control-plane")
    limit = cfg.timeouts["controlPlaneComponentHealthCheck"]
    o.p(
        f"[control-plane-check] Waiting for healthy control plane components. This can take up to "
        f"{u.go_duration(limit)}"
    )
    checks = [
        ("kube-apiserver", f"https://{ip}:{cfg.bind_port}/livez", cfg.bind_port),
        ("kube-controller-manager", "https://127.0.0.1:10257/healthz", 10257),
        ("kube-scheduler", "https://127.0.0.1:10259/livez", 10259),
    ]
    for name, url, _p in checks:
        o.p(f"[control-plane-check] Checking {name} at {url}")
    failed = []
    for name, url, port in reversed(checks):
        probe = url.replace(f":{port}/", f":{host.port(port)}/")
        took = wait_http(probe, limit, tls=True)
        if took is None:
            o.p(f"[control-plane-check] {name} is not healthy after {u.go_duration(limit)}")
            failed.append(
                f'{name} check failed at {url}: Get "{url}?timeout=10s": dial tcp '
                f"{url.split('/')[2]}: connect: connection refused"
            )
        else:
            o.p(f"[control-plane-check] {name} is healthy after {u.go_duration(took)}")
    if failed:
        o.p(
            "\nA control plane component may have crashed or exited when started by the container "
            "runtime.\nTo "
            "troubleshoot, list all containers using your preferred container runtimes CLI.\nHere is one "
            "example how "
            "you may list all running Kubernetes containers by using crictl:\n\t- 'crictl --runtime-endpoint "
            f"{cfg.cri_socket} ps -a | grep kube | grep -v pause'\n\tOnce you have found the failing "
            f"container, you "
            f"can inspect its logs with:\n\t- 'crictl --runtime-endpoint {cfg.cri_socket} logs CONTAINERID'\n"
        )
        raise Failure(
            "error execution phase wait-control-plane: failed while waiting for the control plane to start: ["
            + ", ".join(failed)
            + "]\nTo see the stack trace of this error execute with --v=5 or higher"
        )
    admin_kc = load_kubeconfig(host, "/etc/kubernetes/super-admin.conf")
    admin_kc.server = server.replace(f":{cfg.bind_port}", f":{host.port(cfg.bind_port)}")
    admin = Client(admin_kc, timeout=30)
    api = Api(admin)
    try:
        finish_init(host, cfg, api, ca, node, ip, server, kubelet_cfg, o, flags)
    finally:
        admin.close()
    return 0


def finish_init(
    host: Host,
    cfg: Config,
    api: Api,
    ca: pki.CertKey,
    node: str,
    ip: str,
    server: str,
    kubelet_cfg: Obj,
    o: Out,
    flags: dict[str, str] | None = None,
) -> None:
    cluster_cfg = u.deep_merge(
        {
            "apiServer": {},
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "caCertificateValidityPeriod": "87600h0m0s",
            "certificateValidityPeriod": "8760h0m0s",
            "certificatesDir": PKI,
            "clusterName": cfg.cluster_name,
            "controllerManager": {},
            "dns": {},
            "encryptionAlgorithm": "RSA-2048",
            "etcd": {"local": {"dataDir": cfg.etcd_dir}},
            "imageRepository": cfg.image_repository,
            "kind": "ClusterConfiguration",
            "kubernetesVersion": cfg.version,
            "networking": {
                "dnsDomain": cfg.dns_domain,
                "serviceSubnet": cfg.service_subnet,
                **({"podSubnet": cfg.pod_subnet} if cfg.pod_subnet else {}),
            },
            "proxy": {},
            "scheduler": {},
            **({"controlPlaneEndpoint": cfg.control_plane_endpoint} if cfg.control_plane_endpoint else {}),
        },
        {k: v for k, v in cfg.cluster_doc.items() if k not in ("apiVersion",)},
    )
    o.p(
        '[upload-config] Storing the configuration used in ConfigMap "kubeadm-config" in the "kube-system" '
        "Namespace"
    )
    api.ensure(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
            "data": {"ClusterConfiguration": u.yaml_dump(cluster_cfg)},
        }
    )
    o.p(
        '[kubelet] Creating a ConfigMap "kubelet-config" in namespace kube-system with the configuration '
        "for the "
        "kubelets in the cluster"
    )
    api.ensure(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kubelet-config", "namespace": "kube-system"},
            "data": {"kubelet": u.yaml_dump(kubelet_cfg)},
        }
    )
    flags = flags or {}
    withheld = "<value withheld>"
    if "upload-certs" in flags:
        import secrets

        key = secrets.token_hex(32)
        o.p(
            '[upload-certs] Storing the certificates in Secret "kubeadm-certs" in the "kube-system" Namespace'
        )
        o.p("[upload-certs] Using certificate key:")
        o.p(withheld if "skip-certificate-key-print" in flags else key)
        api.ensure(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "kubeadm-certs", "namespace": "kube-system"},
                "data": {"ca.crt": pki.b64(ca.cert)},
            }
        )
    else:
        o.p("[upload-certs] Skipping phase. Please see --upload-certs")
    for crb_name, role, subject in (
        ("kubeadm:cluster-admins", "cluster-admin", ("Group", "kubeadm:cluster-admins")),
        (
            "kubeadm:kubelet-bootstrap",
            "system:node-bootstrapper",
            ("Group", "system:bootstrappers:kubeadm:default-node-token"),
        ),
        (
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            ("Group", "system:bootstrappers:kubeadm:default-node-token"),
        ),
        (
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            ("Group", "system:nodes"),
        ),
        (
            "kubeadm:get-nodes",
            "kubeadm:get-nodes",
            ("Group", "system:bootstrappers:kubeadm:default-node-token"),
        ),
    ):
        api.ensure(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": crb_name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": subject[0], "name": subject[1]}
                ],
            }
        )
    node_res = api.r("nodes")
    deadline = time.monotonic() + cfg.timeouts["kubernetesAPICall"]
    node_obj = api.c.find(node_res, "", node)
    while node_obj is None:
        if time.monotonic() > deadline:
            raise Failure(
                f"error execution phase mark-control-plane: error applying control-plane label and taints: "
                f'timed out waiting for the condition: nodes "{node}" not found'
            )
        time.sleep(0.3)
        node_obj = api.c.find(node_res, "", node)
    labels = [
        "node-role.kubernetes.io/control-plane",
        "node.kubernetes.io/exclude-from-external-load-balancers",
    ]
    taints = (
        cfg.taints
        if cfg.taints is not None
        else [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
    )
    o.p(
        f"[mark-control-plane] Marking the node {node} as control-plane by adding the labels: "
        f"[{' '.join(labels)}]"
    )
    if taints:
        o.p(
            f"[mark-control-plane] Marking the node {node} as control-plane by adding the taints "
            f"[{' '.join(t['key'] + ':' + t.get('effect', '') for t in taints)}]"
        )
    have = u.dig(node_obj, "spec", "taints") or []
    merged = have + [
        t
        for t in taints
        if not any(h.get("key") == t["key"] and h.get("effect") == t.get("effect") for h in have)
    ]
    api.c.patch(
        node_res,
        "",
        node,
        {
            "metadata": {
                "labels": dict.fromkeys(labels, ""),
                "annotations": {"kubeadm.alpha.kubernetes.io/cri-socket": cfg.cri_socket},
            },
            "spec": {"taints": merged or None},
        },
    )
    tokens = cfg.tokens or [{}]
    printed = ""
    for t in tokens:
        token = t.get("token") or pki.new_token()
        if not pki.TOKEN_RE.match(token):
            raise Failure(
                f'the bootstrap token "{token}" was not of the form "^([a-z0-9]{{6}})\\.([a-z0-9]{{16}})$"'
            )
        ttl = u.parse_duration(t.get("ttl", "24h0m0s"))
        printed = printed or token
        o.p(f"[bootstrap-token] Using token: {withheld if 'skip-token-print' in flags else token}")
        api.ensure(
            token_secret(
                token,
                ttl,
                t.get("description") or "The default bootstrap token generated by 'kubeadm init'.",
                t.get("usages") or ["signing", "authentication"],
                t.get("groups") or ["system:bootstrappers:kubeadm:default-node-token"],
            )
        )
    o.p("[bootstrap-token] Configuring bootstrap tokens, cluster-info ConfigMap, RBAC Roles")
    o.p("[bootstrap-token] Configured RBAC rules to allow Node Bootstrap tokens to get nodes")
    o.p(
        "[bootstrap-token] Configured RBAC rules to allow Node Bootstrap tokens to post CSRs in order for "
        "nodes to get "
        "long term certificate credentials"
    )
    o.p(
        "[bootstrap-token] Configured RBAC rules to allow the csrapprover controller automatically approve "
        "CSRs from a "
        "Node Bootstrap Token"
    )
    o.p(
        "[bootstrap-token] Configured RBAC rules to allow certificate rotation for all node client "
        "certificates in the "
        "cluster"
    )
    o.p('[bootstrap-token] Creating the "cluster-info" ConfigMap in the "kube-public" namespace')
    info = pki.kubeconfig(server, ca.cert, "", cluster="")
    info = {
        "apiVersion": "v1",
        "clusters": [{"cluster": info["clusters"][0]["cluster"], "name": ""}],
        "contexts": None,
        "current-context": "",
        "kind": "Config",
        "preferences": {},
        "users": None,
    }
    api.ensure(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": u.yaml_dump(info)},
        }
    )
    o.p(
        '[kubelet-finalize] Updating "/etc/kubernetes/kubelet.conf" to point to a rotatable kubelet client '
        "certificate "
        "and key"
    )
    kc = load_kubeconfig(host, "/etc/kubernetes/kubelet.conf")
    stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime())
    pem = f"/var/lib/kubelet/pki/kubelet-client-{stamp}.pem"
    host.write(pem, (kc.cert_pem or "") + (kc.key_pem or ""), 0o600)
    cur = host.p("/var/lib/kubelet/pki/kubelet-client-current.pem")
    cur.unlink(missing_ok=True)
    cur.symlink_to(str(host.p(pem)) if str(host.root) != "/" else pem)
    kubelet_conf = pki.kubeconfig(
        server,
        ca.cert,
        "default-auth",
        cluster="default-cluster",
        cert_file="/var/lib/kubelet/pki/kubelet-client-current.pem",
    )
    kubelet_conf["contexts"][0]["name"] = "default-context"
    kubelet_conf["current-context"] = "default-context"
    host.write("/etc/kubernetes/kubelet.conf", u.yaml_dump(kubelet_conf), 0o600)
    addons(api, cfg, server)
    o.p("[addons] Applied essential addon: CoreDNS")
    o.p("[addons] Applied essential addon: kube-proxy")
    ca_hash = pki.spki_pin(host, ca.cert)
    endpoint = server.removeprefix("https://")
    shown_token = withheld if "skip-token-print" in flags else printed
    control_plane_join = ""
    if cfg.control_plane_endpoint:
        control_plane_join = (
            "You can now join any number of control-plane nodes by copying certificate authorities\n"
            "and service account keys on each node and then running the following as root:\n\n"
            f"  kubeadm join {endpoint} --token {shown_token} \\\n"
            f"\t--discovery-token-ca-cert-hash {ca_hash} \\\n\t--control-plane \n\n"
        )
    o.p(f"""
Your Kubernetes control-plane has initialized successfully!

To start using your cluster, you need to run the following as a regular user:

  mkdir -p $HOME/.kube
  sudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config
  sudo chown $(id -u):$(id -g) $HOME/.kube/config

Alternatively, if you are the root user, you can run:

  export KUBECONFIG=/etc/kubernetes/admin.conf

You should now deploy a pod network to the cluster.
Run "kubectl apply -f [podnetwork].yaml" with one of the options listed at:
  https://kubernetes.io/docs/concepts/cluster-administration/addons/

{control_plane_join}Then you can join any number of worker nodes by running the following on each as root:

kubeadm join {endpoint} --token {withheld if "skip-token-print" in flags else printed} \\
\t--discovery-token-ca-cert-hash {ca_hash} """)


def addons(api: Api, cfg: Config, server: str) -> None:
    imgs = IMAGES.get(minor(cfg.version), IMAGES["1.36"])
    repo = cfg.image_repository
    dns_ip = str(list(ipaddress.ip_network(cfg.service_subnet, strict=False).hosts())[9])
    meta_ns = {"namespace": "kube-system"}
    api.ensure({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta_ns}})
    api.ensure(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", **meta_ns},
            "data": {
                "Corefile": f".:53 {{\n    errors\n    health {{\n       lameduck 5s\n    }}\n    ready\n  "
                f"  kubernetes "
                f"{cfg.dns_domain} in-addr.arpa ip6.arpa {{\n       pods insecure\n       fallthrough "
                f"in-addr.arpa "
                "ip6.arpa\n       ttl 30\n    }\n    prometheus :9153\n    forward . /etc/resolv.conf {\n  "
                "     "
                "max_concurrent 1000\n    }\n    cache 30 {\n       disable success cluster.local\n       "
                "disable "
                "denial cluster.local\n    }\n    loop\n    reload\n    loadbalance\n}\n"
            },
        }
    )
    api.ensure(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", **meta_ns, "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "25%"},
                },
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-dns"}},
                    "spec": {
                        "priorityClassName": "system-cluster-critical",
                        "serviceAccountName": "coredns",
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "tolerations": [
                            {"key": "CriticalAddonsOnly", "operator": "Exists"},
                            {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                        ],
                        "containers": [
                            {
                                "name": "coredns",
                                "image": f"{repo}/coredns/coredns:{imgs['coredns']}",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [{"containerPort": 53, "name": "dns", "protocol": "UDP"}],
                                "volumeMounts": [
                                    {"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": True}
                                ],
                            }
                        ],
                        "volumes": [{"name": "config-volume", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        }
    )
    api.ensure(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kube-dns",
                **meta_ns,
                "labels": {
                    "k8s-app": "kube-dns",
                    "kubernetes.io/cluster-service": "true",
                    "kubernetes.io/name": "CoreDNS",
                },
            },
            "spec": {
                "clusterIP": dns_ip,
                "selector": {"k8s-app": "kube-dns"},
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                    {"name": "metrics", "port": 9153, "protocol": "TCP"},
                ],
            },
        }
    )
    api.ensure({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-proxy", **meta_ns}})
    proxy_conf = u.deep_merge(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clusterCIDR": cfg.pod_subnet,
            "mode": "",
            "bindAddress": "0.0.0.0",
        },
        cfg.kube_proxy,
    )
    api.ensure(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kube-proxy", **meta_ns, "labels": {"app": "kube-proxy"}},
            "data": {
                "config.conf": u.yaml_dump(proxy_conf),
                "kubeconfig.conf": u.yaml_dump(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [
                            {
                                "cluster": {
                                    "certificate-authority": SA_CA,
                                    "server": server,
                                },
                                "name": "default",
                            }
                        ],
                    }
                ),
            },
        }
    )
    api.ensure(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "kube-proxy", **meta_ns, "labels": {"k8s-app": "kube-proxy"}},
            "spec": {
                "selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-proxy"}},
                    "spec": {
                        "hostNetwork": True,
                        "priorityClassName": "system-node-critical",
                        "serviceAccountName": "kube-proxy",
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {
                                "name": "kube-proxy",
                                "image": f"{repo}/kube-proxy:{cfg.version}",
                                "command": [
                                    "/usr/local/bin/kube-proxy",
                                    "--config=/var/lib/kube-proxy/config.conf",
                                    "--hostname-override=$(NODE_NAME)",
                                ],
                                "securityContext": {"privileged": True},
                                "volumeMounts": [{"name": "kube-proxy", "mountPath": "/var/lib/kube-proxy"}],
                            }
                        ],
                        "volumes": [{"name": "kube-proxy", "configMap": {"name": "kube-proxy"}}],
                    },
                },
            },
        }
    )


# ---------------------------------------------------------------------------------------------- join


def cmd_join(host: Host, pos: list[str], flags: dict[str, str], o: Out) -> int:
    _check_mixed(flags, MIXED_OK)
    if "control-plane" in flags:
        raise Failure("joining additional control-plane nodes is not simulated in the gpuprov lab")
    if "config" in flags:
        cfg = load_config(host, flags["config"], o, "JoinConfiguration")
    else:
        cfg = Config()
        cfg.discovery_endpoint = pos[0] if pos else ""
        cfg.discovery_token = flags.get("discovery-token") or flags.get("token", "")
        cfg.tls_token = flags.get("tls-bootstrap-token") or flags.get("token", "")
        cfg.ca_hashes = [x for x in flags.get("discovery-token-ca-cert-hash", "").split(",") if x]
        cfg.unsafe_skip_ca = "discovery-token-unsafe-skip-ca-verification" in flags
        cfg.node_name = flags.get("node-name", "")
        cfg.cri_socket = flags.get("cri-socket", cfg.cri_socket)
    cfg.ignore |= {
        x.strip().lower() for x in flags.get("ignore-preflight-errors", "").split(",") if x.strip()
    }
    for key in ("discovery", "kubeletHealthCheck", "tlsBootstrap"):
        env = host.env.get(f"GPUPROV_SIM_KUBEADM_TIMEOUT_{key.upper()}")
        if env and cfg.timeouts[key] == DEFAULT_TIMEOUTS[key]:
            cfg.timeouts[key] = u.parse_duration(env)
    if not cfg.discovery_endpoint:
        raise Failure(
            'discovery: Invalid value: "": bootstrapToken or file must be set\nTo see the stack trace of '
            "this error execute with --v=5 or higher"
        )
    m = pki.TOKEN_RE.match(cfg.discovery_token)
    if not m:
        raise Failure(
            f'discovery.bootstrapToken.token: Invalid value: "{cfg.discovery_token}": the bootstrap token '
            f'"{cfg.discovery_token}" was not of the form "^([a-z0-9]{{6}})\\.([a-z0-9]{{16}})$"'
        )
    if not cfg.ca_hashes and not cfg.unsafe_skip_ca:
        raise Failure(
            'discovery.bootstrapToken: Invalid value: "": using token-based discovery without caCertHashes '
            "can be unsafe. Set unsafeSkipCAVerification as true in your kubeadm config file or pass "
            "--discovery-token-unsafe-skip-ca-verification flag to continue"
        )
    for h in cfg.ca_hashes:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", h):
            raise Failure(
                f'discovery.bootstrapToken.caCertHashes: Invalid value: "{h}": invalid hash "{h}", expected '
                'a "sha256:" prefix followed by 64 hex digits'
            )
    node = (cfg.node_name or host.node_name()).lower()
    o.p("[preflight] Running pre-flight checks")
    pf = Preflight(host, o, cfg.ignore)
    pf.file_available("/etc/kubernetes/kubelet.conf")
    pf.file_available("/etc/kubernetes/bootstrap-kubelet.conf")
    pf.runtime(cfg.cri_socket)
    pf.common(cfg, control_plane=False)
    pf.port(10250)
    pf.file_available(f"{PKI}/ca.crt")
    pf.finish()
    tid, secret = m.group(1), m.group(2)
    ca_pem, info_server = discover(host, cfg, tid, secret, o)
    server = info_server
    endpoint_host = _endpoint_url(host, server)
    boot = KubeConfig(
        server=endpoint_host,
        ca_pem=ca_pem,
        cert_pem=None,
        key_pem=None,
        token=cfg.tls_token,
        namespace="default",
    )
    c = Client(boot, timeout=30)
    try:
        o.p(
            '[preflight] Reading configuration from the "kubeadm-config" ConfigMap in namespace '
            '"kube-system"...'
        )
        o.p("[preflight] Use 'kubeadm init phase upload-config --config your-config-file' to re-upload it.")
        api = Api(c)
        kubeadm_cm = c.get(api.r("configmaps"), "kube-system", "kubeadm-config")
        cluster = u.yaml_load((kubeadm_cm.get("data") or {}).get("ClusterConfiguration", "")) or {}
        cluster_version = cluster.get("kubernetesVersion", VERSION)
        kubelet_cm = c.get(api.r("configmaps"), "kube-system", "kubelet-config")
        existing = c.find(api.r("nodes"), "", node)
        if existing is not None and any(
            x.get("type") == "Ready" and x.get("status") == "True"
            for x in u.dig(existing, "status", "conditions") or []
        ):
            raise Failure(
                f'error execution phase kubelet-start: a Node with name "{node}" and status "Ready" already '
                "exists in the cluster. You must delete the existing Node or change the name of this new "
                "joining Node\nTo see the stack trace of this error execute with --v=5 or higher"
            )
    finally:
        c.close()
    pf = Preflight(host, o, cfg.ignore)
    pf.kubelet_version(cluster_version)
    pf.finish()
    cfg.version = cluster_version
    cfg.image_repository = cluster.get("imageRepository", cfg.image_repository)
    kubelet_cfg = u.yaml_load((kubelet_cm.get("data") or {}).get("kubelet", "")) or {}
    host.write(f"{PKI}/ca.crt", ca_pem)
    boot_cfg = pki.kubeconfig(
        server, ca_pem, "tls-bootstrap-token-user", cluster=cfg.cluster_name, token=cfg.tls_token
    )
    host.write("/etc/kubernetes/bootstrap-kubelet.conf", u.yaml_dump(boot_cfg), 0o600)
    host.systemctl("stop", "kubelet")
    o.p('[kubelet-start] Writing kubelet configuration to file "/var/lib/kubelet/config.yaml"')
    host.write("/var/lib/kubelet/config.yaml", u.yaml_dump(kubelet_cfg))
    o.p(
        "[kubelet-start] Writing kubelet environment file with flags to file "
        '"/var/lib/kubelet/kubeadm-flags.env"'
    )
    host.write("/var/lib/kubelet/kubeadm-flags.env", kubelet_flags(cfg, host.hostname()))
    o.p("[kubelet-start] Starting the kubelet")
    host.systemctl("restart", "kubelet")
    wait_kubelet(host, cfg, kubelet_cfg, o, "kubelet-start")
    o.p("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap")
    deadline = time.monotonic() + cfg.timeouts["tlsBootstrap"]
    while not host.exists("/etc/kubernetes/kubelet.conf"):
        if time.monotonic() > deadline:
            raise Failure(
                "error execution phase kubelet-start: timed out waiting for the condition\nTo see the stack "
                "trace of this error execute with --v=5 or higher"
            )
        time.sleep(0.3)
    host.remove("/etc/kubernetes/bootstrap-kubelet.conf")
    o.p("""
This node has joined the cluster:
* Certificate signing request was sent to apiserver and a response was received.
* The Kubelet was informed of the new secure connection details.

Run 'kubectl get nodes' on the control-plane to see this node join the cluster.
""")
    return 0


def _endpoint_url(host: Host, server: str) -> str:
    """The server URL as this process reaches it (tests remap ports)."""
    url = urllib.parse.urlsplit(server)
    return f"https://{url.hostname}:{host.port(url.port or 443)}"


def discover(host: Host, cfg: Config, tid: str, secret: str, o: Out) -> tuple[str, str]:
    """Token discovery: cluster-info fetched without trust, its JWS checked with the token, its CA pinned."""
    ep = cfg.discovery_endpoint
    server = f"https://{ep}"
    insecure = KubeConfig(
        server=_endpoint_url(host, server),
        ca_pem=None,
        cert_pem=None,
        key_pem=None,
        token=None,
        namespace="default",
        insecure=True,
    )
    path = "/api/v1/namespaces/kube-public/configmaps/cluster-info"
    deadline = time.monotonic() + cfg.timeouts["discovery"]
    last = ""
    while True:
        c = Client(insecure, timeout=10)
        try:
            info = c.request("GET", path)
            data = info.get("data") or {}
            payload = data.get("kubeconfig", "")
            jws = data.get(f"jws-kubeconfig-{tid}")
            if jws:
                break
            last = f'could not find a JWS signature in the cluster-info ConfigMap for token ID "{tid}"'
        except (ClientError, ApiError) as exc:
            msg = str(exc) if isinstance(exc, ClientError) else exc.message
            last = (
                f'Get "{server}{path}?timeout=10s": {msg.removeprefix("Unable to connect to the server: ")}'
            )
            o.w(_klogw(f"token.go:217] [discovery] Failed to request cluster-info, will try again: {last}"))
        finally:
            c.close()
        if time.monotonic() > deadline:
            raise Failure(
                f"error execution phase preflight: couldn't validate the identity of the API Server: {last}\n"
                "To see the stack trace of this error execute with --v=5 or higher"
            )
        time.sleep(1)
    if not pki.jws_valid(jws, payload, tid, secret):
        raise Failure(
            "error execution phase preflight: couldn't validate the identity of the API Server: failed to "
            "verify JWS signature of received cluster info object, can't trust this API Server\nTo see the "
            "stack trace of this error execute with --v=5 or higher"
        )
    kc = u.yaml_load(payload) or {}
    cluster = u.dig(kc, "clusters", 0, "cluster") or {}
    ca_pem = base64.b64decode(cluster.get("certificate-authority-data", "")).decode()
    info_server = cluster.get("server", server)
    if not cfg.unsafe_skip_ca:
        pin = pki.spki_pin(host, ca_pem)
        if pin not in cfg.ca_hashes:
            raise Failure(
                "error execution phase preflight: couldn't validate the identity of the API Server: cluster "
                f'CA found in cluster-info ConfigMap is invalid: none of the public keys "{pin}" are pinned\n'
                "To see the stack trace of this error execute with --v=5 or higher"
            )
    secure = KubeConfig(
        server=_endpoint_url(host, server),
        ca_pem=ca_pem,
        cert_pem=None,
        key_pem=None,
        token=None,
        namespace="default",
    )
    c = Client(secure, timeout=10)
    try:
        again = c.request("GET", path)
    except (ClientError, ApiError) as exc:
        raise Failure(
            f"error execution phase preflight: couldn't validate the identity of the API Server: {exc}"
        ) from exc
    finally:
        c.close()
    if (again.get("data") or {}).get("kubeconfig") != payload:
        raise Failure(
            "error execution phase preflight: couldn't validate the identity of the API Server: the second "
            "cluster-info fetched with the pinned CA differs from the first"
        )
    return ca_pem, info_server


# ---------------------------------------------------------------------------------------------- reset


def cmd_reset(host: Host, pos: list[str], flags: dict[str, str], o: Out, stdin: TextIO) -> int:
    if "force" not in flags:
        o.p("[reset] Reading configuration from the cluster...")
        o.out.write("[reset] Are you sure you want to proceed? [y/N]: ")
        o.out.flush()
        answer = stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            raise Failure(
                "error execution phase preflight: won't proceed; the user didn't answer (Y|y) in order to "
                "continue\nTo see the stack trace of this error execute with --v=5 or higher"
            )
    o.p("[preflight] Running pre-flight checks")
    etcd_dir = "/var/lib/etcd"
    manifest = host.read(f"{MANIFESTS}/etcd.yaml")
    if manifest:
        for arg in u.dig(u.yaml_load(manifest), "spec", "containers", 0, "command", default=[]) or []:
            if str(arg).startswith("--data-dir="):
                etcd_dir = str(arg).split("=", 1)[1]
    if host.service_active(API_UNIT):
        host.systemctl("stop", API_UNIT)
    if manifest is not None or host.listdir(etcd_dir):
        for name in host.listdir(etcd_dir):
            host.remove(f"{etcd_dir}/{name}")
        o.p(f"[reset] Deleted contents of the etcd data directory: {etcd_dir}")
    else:
        o.p("[reset] No etcd config found. Assuming external etcd")
        o.p("[reset] Please, manually reset etcd to prevent further issues")
    o.p("[reset] Stopping the kubelet service")
    host.systemctl("stop", "kubelet")
    o.p('[reset] Unmounting mounted directories in "/var/lib/kubelet"')
    dirs = [MANIFESTS, "/var/lib/kubelet", PKI]
    for d in dirs:
        for name in host.listdir(d):
            host.remove(f"{d}/{name}")
    o.p(f"[reset] Deleting contents of directories: [{' '.join(dirs)}]")
    files = [f"/etc/kubernetes/{f}" for f in CONF_FILES]
    for f in files:
        host.remove(f)
    o.p(f"[reset] Deleting files: [{' '.join(files)}]")
    o.p("""
The reset process does not perform cleanup of CNI plugin configuration,
network filtering rules and kubeconfig files.

For information on how to perform this cleanup manually, please see:
    https://k8s.io/docs/reference/setup-tools/kubeadm/kubeadm-reset/
""")
    return 0


# ---------------------------------------------------------------------------------------------- token


def _admin(host: Host, flags: dict[str, str]) -> tuple[Client, Api]:
    path = flags.get("kubeconfig", "/etc/kubernetes/admin.conf")
    if not host.exists(path):
        raise Failure(
            f"failed to load admin kubeconfig: open {path}: no such file or directory\nTo see the stack "
            "trace of this error execute with --v=5 or higher"
        )
    kc = load_kubeconfig(host, path)
    kc.server = _endpoint_url(host, kc.server)
    c = Client(kc, timeout=30)
    return c, Api(c)


def cmd_token(host: Host, pos: list[str], flags: dict[str, str], o: Out) -> int:
    sub = pos[0] if pos else ""
    if sub == "generate":
        o.p(pki.new_token())
        return 0
    c, api = _admin(host, flags)
    try:
        if sub == "create":
            token = pos[1] if len(pos) > 1 else pki.new_token()
            if not pki.TOKEN_RE.match(token):
                raise Failure(
                    f'the bootstrap token "{token}" was not of the form '
                    f'"^([a-z0-9]{{6}})\\.([a-z0-9]{{16}})$"'
                )
            ttl = u.parse_duration(flags.get("ttl", "24h0m0s"))
            usages = [x for x in flags.get("usages", "signing,authentication").split(",") if x]
            groups = [
                x
                for x in flags.get("groups", "system:bootstrappers:kubeadm:default-node-token").split(",")
                if x
            ]
            api.ensure(token_secret(token, ttl, flags.get("description", ""), usages, groups))
            if "print-join-command" in flags:
                info = c.get(api.r("configmaps"), "kube-public", "cluster-info")
                kc = u.yaml_load((info.get("data") or {}).get("kubeconfig", "")) or {}
                cluster = u.dig(kc, "clusters", 0, "cluster") or {}
                ca_pem = base64.b64decode(cluster.get("certificate-authority-data", "")).decode()
                endpoint = cluster.get("server", "").removeprefix("https://")
                o.p(
                    f"kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash "
                    f"{pki.spki_pin(host, ca_pem)} "
                )
            else:
                o.p(token)
            return 0
        if sub == "list":
            rows = [["TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION", "EXTRA GROUPS"]]
            docs = []
            for sec in c.list(api.r("secrets"), "kube-system"):
                if sec.get("type") != "bootstrap.kubernetes.io/token":
                    continue
                d = {k: base64.b64decode(v).decode() for k, v in (sec.get("data") or {}).items()}
                exp = u.parse_iso(d.get("expiration"))
                ttl = "<forever>" if exp is None else u.human_age(exp - time.time())
                usages = [
                    k.removeprefix("usage-bootstrap-")
                    for k, v in sorted(d.items())
                    if k.startswith("usage-bootstrap-") and v == "true"
                ]
                rows.append(
                    [
                        f"{d.get('token-id')}.{d.get('token-secret')}",
                        ttl,
                        d.get("expiration", "<never>"),
                        ",".join(usages),
                        d.get("description", "<none>"),
                        d.get("auth-extra-groups", ""),
                    ]
                )
                docs.append(
                    {
                        "kind": "BootstrapToken",
                        "apiVersion": "output.kubeadm.k8s.io/v1alpha3",
                        "token": rows[-1][0],
                        "description": d.get("description", ""),
                        "ttl": ttl,
                        "expires": d.get("expiration", ""),
                        "usages": usages,
                        "groups": [g for g in d.get("auth-extra-groups", "").split(",") if g],
                    }
                )
            if flags.get("output") == "json":
                for d in docs:
                    o.p(u.dumps(d))
            elif len(rows) > 1:
                o.out.write(u.table(rows))
            return 0
        if sub == "delete":
            for t in pos[1:]:
                tid = t.split(".")[0]
                try:
                    c.delete(api.r("secrets"), "kube-system", f"bootstrap-token-{tid}")
                except ApiError as exc:
                    raise Failure(f'failed to delete bootstrap token "{tid}": {exc.message}') from exc
                o.p(f'bootstrap token "{tid}" deleted')
            return 0
    finally:
        c.close()
    raise Failure(f'unknown command "{sub}" for "kubeadm token"')


def cmd_config(host: Host, pos: list[str], flags: dict[str, str], o: Out) -> int:
    version = _version(flags.get("kubernetes-version", VERSION)) or VERSION
    imgs = IMAGES.get(minor(version), IMAGES["1.36"])
    repo = flags.get("image-repository", "registry.k8s.io")
    images = [
        f"{repo}/{n}:{version}"
        for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
    ] + [
        f"{repo}/coredns/coredns:{imgs['coredns']}",
        f"{repo}/pause:{imgs['pause']}",
        f"{repo}/etcd:{imgs['etcd']}",
    ]
    if pos[:2] == ["images", "list"]:
        for i in images:
            o.p(i)
        return 0
    if pos[:2] == ["images", "pull"]:
        if not host.service_active("containerd"):
            raise Failure(
                "failed to create new CRI runtime service: validate service connection: validate CRI v1 "
                'runtime API for endpoint "unix:///var/run/containerd/containerd.sock"'
            )
        for i in images:
            o.p(f"[config/images] Pulled {i}")
        return 0
    if pos[:2] == ["print", "init-defaults"]:
        o.out.write(
            u.yaml_dump(
                {
                    "apiVersion": "kubeadm.k8s.io/v1beta4",
                    "bootstrapTokens": [
                        {
                            "groups": ["system:bootstrappers:kubeadm:default-node-token"],
                            "token": "abcdef.0123456789abcdef",
                            "ttl": "24h0m0s",
                            "usages": ["signing", "authentication"],
                        }
                    ],
                    "kind": "InitConfiguration",
                    "localAPIEndpoint": {"advertiseAddress": "1.2.3.4", "bindPort": 6443},
                    "nodeRegistration": {
                        "criSocket": "unix:///var/run/containerd/containerd.sock",
                        "imagePullPolicy": "IfNotPresent",
                        "name": "node",
                        "taints": None,
                    },
                }
            )
        )
        o.p("---")
        o.out.write(
            u.yaml_dump(
                {
                    "apiVersion": "kubeadm.k8s.io/v1beta4",
                    "kind": "ClusterConfiguration",
                    "kubernetesVersion": version,
                    "networking": {"dnsDomain": "cluster.local", "serviceSubnet": "10.96.0.0/12"},
                    "imageRepository": repo,
                }
            )
        )
        return 0
    raise Failure(f'unknown command "{" ".join(pos)}" for "kubeadm config"')


def cmd_version(flags: dict[str, str], o: Out) -> int:
    major, mnr = VERSION.lstrip("v").split(".")[:2]
    info = {
        "major": major,
        "minor": mnr,
        "gitVersion": VERSION,
        "gitCommit": "0" * 40,
        "gitTreeState": "clean",
        "buildDate": "2025-09-09T00:00:00Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    }
    fmt = flags.get("output", "")
    if fmt == "short":
        o.p(VERSION)
    elif fmt == "json":
        o.p(u.dumps({"clientVersion": info}))
    elif fmt == "yaml":
        o.out.write(u.yaml_dump({"clientVersion": info}))
    else:
        o.p(
            f'kubeadm version: &version.Info{{Major:"{major}", Minor:"{mnr}", EmulationMajor:"", '
            f'EmulationMinor:"", '
            f'MinCompatibilityMajor:"", MinCompatibilityMinor:"", GitVersion:"{VERSION}", '
            f'GitCommit:"{info["gitCommit"]}", '
            f'GitTreeState:"clean", BuildDate:"{info["buildDate"]}", GoVersion:"go1.24.6", Compiler:"gc", '
            'Platform:"linux/amd64"}'
        )
    return 0


def main(
    argv: list[str],
    host: Host | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
    version: str | None = None,
) -> int:
    global VERSION
    if version:
        VERSION = version
    host = host or Host()
    o = Out(out or sys.stdout, err or sys.stderr)
    try:
        pos, flags = parse(argv)
        if not pos:
            o.p("kubeadm: easily bootstrap a secure Kubernetes cluster (SIMULATED, gpuprov lab)")
            return 0
        verb, rest = pos[0], pos[1:]
        if verb == "init":
            return cmd_init(host, rest, flags, o)
        if verb == "join":
            return cmd_join(host, rest, flags, o)
        if verb == "reset":
            return cmd_reset(host, rest, flags, o, stdin or sys.stdin)
        if verb == "token":
            return cmd_token(host, rest, flags, o)
        if verb == "config":
            return cmd_config(host, rest, flags, o)
        if verb == "version":
            return cmd_version(flags, o)
        raise Failure(
            f'unknown command "{verb}" for "kubeadm"\nTo see the stack trace of this error execute with '
            f"--v=5 "
            "or higher"
        )
    except Failure as exc:
        o.w(str(exc))
        return 1
    except (ClientError, ApiError) as exc:
        o.w(
            f"error: {exc.message if isinstance(exc, ApiError) else exc}\nTo see the stack trace of this "
            f"error execute "
            "with --v=5 or higher"
        )
        return 1
    except pki.PKIError as exc:
        o.w(f"error execution phase certs: {exc}")
        return 1
