"""The SIMULATED kube-apiserver (with the controller manager and scheduler folded in): an HTTPS REST
server over the one object store of the lab's cluster, with the real paths, verbs, status codes and
authentication (client certificates of the cluster CA, bootstrap tokens, anonymous).

It runs as its own systemd unit on the control plane, started by the sim kubelet for the static pod
manifest kubeadm writes (/etc/kubernetes/manifests/kube-apiserver.yaml), and takes its settings from the
static pod manifests as the real components would: ports, certificates, service and pod CIDRs. State is
persisted under the etcd data dir (/var/lib/etcd), which ``kubeadm reset`` removes.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import kube_util as u
from .kube_host import Host
from .kube_store import ApiError, Obj, Resource, Store

MANIFESTS = "/etc/kubernetes/manifests"
STORE_FILE = "gpuprov-lab-sim-store.json"
UNIT = "gpuprov-lab-kube-apiserver.service"
ADMIN_GROUPS = {"system:masters", "kubeadm:cluster-admins"}


@dataclass
class User:
    name: str
    groups: list[str] = field(default_factory=list)

    @property
    def admin(self) -> bool:
        return bool(ADMIN_GROUPS & set(self.groups)) or "system:nodes" in self.groups


ANONYMOUS = User("system:anonymous", ["system:unauthenticated"])


# ---------------------------------------------------------------------------------------- settings


def _flags(manifest: Obj | None) -> dict[str, str]:
    out: dict[str, str] = {}
    containers = u.dig(manifest, "spec", "containers", default=[]) or []
    for c in containers[:1]:
        for arg in [*(c.get("command") or []), *(c.get("args") or [])]:
            if isinstance(arg, str) and arg.startswith("--"):
                k, _, v = arg[2:].partition("=")
                out[k] = v
    return out


def _image_tag(manifest: Obj | None) -> str:
    image = u.dig(manifest, "spec", "containers", 0, "image", default="") or ""
    return image.rpartition(":")[2] if ":" in image else ""


@dataclass
class Settings:
    """What the API server, controller manager, scheduler and etcd static pods say."""

    version: str = "v1.36.3"
    advertise: str = "127.0.0.1"
    port: int = 6443
    bind: str = "0.0.0.0"
    service_cidr: str = "10.96.0.0/12"
    cluster_cidr: str = ""
    node_cidr_mask: int = 24
    allocate_cidrs: bool = False
    client_ca: str = "/etc/kubernetes/pki/ca.crt"
    tls_cert: str = "/etc/kubernetes/pki/apiserver.crt"
    tls_key: str = "/etc/kubernetes/pki/apiserver.key"
    signing_cert: str = "/etc/kubernetes/pki/ca.crt"
    signing_key: str = "/etc/kubernetes/pki/ca.key"
    data_dir: str = "/var/lib/etcd"
    cm_port: int = 10257
    sched_port: int = 10259
    etcd_ports: tuple[int, int] = (2379, 2380)
    # --enable-admission-plugins / --disable-admission-plugins (kube_admission.enabled_plugins)
    admission_enable: str = ""
    admission_disable: str = ""

    @classmethod
    def from_manifests(cls, host: Host) -> Settings:
        def load(name: str) -> Obj | None:
            text = host.read(f"{MANIFESTS}/{name}.yaml")
            return u.yaml_load(text) if text else None

        api, cm, sched, etcd = (
            load(n) for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
        )
        if api is None:
            raise SystemExit(f"{MANIFESTS}/kube-apiserver.yaml: no such file: nothing to run")
        a, c, s, e = _flags(api), _flags(cm), _flags(sched), _flags(etcd)
        st = cls()
        st.version = _image_tag(api) or st.version
        st.advertise = a.get("advertise-address", st.advertise)
        st.port = int(a.get("secure-port", st.port))
        st.bind = a.get("bind-address", st.bind)
        st.service_cidr = a.get("service-cluster-ip-range", st.service_cidr)
        st.client_ca = a.get("client-ca-file", st.client_ca)
        st.admission_enable = a.get("enable-admission-plugins", "")
        st.admission_disable = a.get("disable-admission-plugins", "")
        st.tls_cert = a.get("tls-cert-file", st.tls_cert)
        st.tls_key = a.get("tls-private-key-file", st.tls_key)
        st.cluster_cidr = c.get("cluster-cidr", "")
        st.allocate_cidrs = c.get("allocate-node-cidrs", "false") == "true"
        st.node_cidr_mask = int(c.get("node-cidr-mask-size", c.get("node-cidr-mask-size-ipv4", 24)))
        st.signing_cert = c.get("cluster-signing-cert-file", st.signing_cert)
        st.signing_key = c.get("cluster-signing-key-file", st.signing_key)
        st.cm_port = int(c.get("secure-port", st.cm_port))
        st.sched_port = int(s.get("secure-port", st.sched_port))
        st.data_dir = e.get("data-dir", st.data_dir)
        client = e.get("listen-client-urls", "https://127.0.0.1:2379").split(",")[0]
        peer = e.get("listen-peer-urls", "https://127.0.0.1:2380").split(",")[0]
        st.etcd_ports = (int(client.rsplit(":", 1)[1]), int(peer.rsplit(":", 1)[1]))
        return st


def version_info(version: str) -> Obj:
    major, minor = version.lstrip("v").split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "minCompatibilityMajor": major,
        "minCompatibilityMinor": str(int(minor) - 1),
        "gitVersion": version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-09-09T00:00:00Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


# -------------------------------------------------------------------------------------- the server


class ApiServer:
    """Store + controllers + HTTPS listeners; ``start()``/``stop()`` for in-process use."""

    def __init__(self, host: Host, settings: Settings | None = None) -> None:
        from . import kube_ctrl

        self.host = host
        self.settings = settings or Settings.from_manifests(host)
        self.store = Store(host.p(self.settings.data_dir) / STORE_FILE)
        self.store.service_cidr = self.settings.service_cidr  # type: ignore[attr-defined]
        self.controllers = kube_ctrl.Controllers(self)
        self.servers: list[ThreadingHTTPServer] = []
        self.raw_sockets: list[socket.socket] = []
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    # TLS context for the secure port (client certificates of the cluster CA are optional: anonymous
    # and bootstrap-token requests come without one).
    def _tls(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.host.p(self.settings.tls_cert), self.host.p(self.settings.tls_key))
        ctx.load_verify_locations(cafile=str(self.host.p(self.settings.client_ca)))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def start(self) -> None:
        st, host = self.settings, self.host
        tls = self._tls()
        self._listen(host.bind_address(st.bind), host.port(st.port), tls, full=True)
        self._listen("127.0.0.1", host.port(st.cm_port), tls, full=False)
        self._listen("127.0.0.1", host.port(st.sched_port), tls, full=False)
        for p in st.etcd_ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", host.port(p)))
            s.listen(8)
            self.raw_sockets.append(s)
        self.controllers.bootstrap()
        for name, fn in (("controllers", self.controllers.run), ("flusher", self._flusher)):
            t = threading.Thread(target=fn, name=f"apiserver-{name}", daemon=True)
            t.start()
            self.threads.append(t)

    def _listen(self, addr: str, port: int, tls: ssl.SSLContext, full: bool) -> None:
        api = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def finish_request(self, request: Any, client_address: Any) -> None:
                try:
                    conn = tls.wrap_socket(request, server_side=True)
                except (ssl.SSLError, OSError):
                    return
                Handler(conn, client_address, self)

        class Handler(_Handler):
            server_api = api
            health_only = not full

        srv = Server((addr, port), Handler)
        self.servers.append(srv)
        t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        t.start()
        self.threads.append(t)

    def _flusher(self) -> None:
        while not self.stopping.wait(0.5):
            self.store.flush()

    def stop(self) -> None:
        self.stopping.set()
        for srv in self.servers:
            srv.shutdown()
            srv.server_close()
        for s in self.raw_sockets:
            s.close()
        self.store.flush()

    # ------------------------------------------------------------------------------------ requests
    def authenticate(self, peer: dict[str, Any] | None, auth_header: str | None) -> User:
        if peer and peer.get("subject"):
            cn, orgs = "", []
            for rdn in peer["subject"]:
                for k, v in rdn:
                    if k == "commonName":
                        cn = v
                    elif k == "organizationName":
                        orgs.append(v)
            return User(cn, [*orgs, "system:authenticated"])
        if auth_header and auth_header.lower().startswith("bearer "):
            token = auth_header[7:].strip()
            user = self.controllers.bootstrap_token_user(token)
            if user is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            return user
        return ANONYMOUS

    def authorize(self, user: User, verb: str, res: Resource | None, ns: str, name: str, sub: str) -> None:
        if user.admin:
            return
        allowed = False
        plural = res.plural if res else ""
        if "system:bootstrappers" in user.groups:
            allowed = (
                (plural == "certificatesigningrequests" and verb in ("create", "get", "list", "watch"))
                or (plural == "nodes" and verb == "get")
                or (
                    plural == "configmaps"
                    and verb == "get"
                    and (ns, name)
                    in {
                        ("kube-public", "cluster-info"),
                        ("kube-system", "kubeadm-config"),
                        ("kube-system", "kubelet-config"),
                    }
                )
            )
        if plural == "configmaps" and verb == "get" and (ns, name) == ("kube-public", "cluster-info"):
            allowed = True
        if allowed:
            return
        group = res.group if res else ""
        target = f'{plural} "{name}"' if name else plural
        scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        resource = f"{plural}/{sub}" if sub else plural
        raise ApiError(
            403,
            "Forbidden",
            f'{target} is forbidden: User "{user.name}" cannot {verb} resource "{resource}" in API group '
            f'"{group}" {scope}',
            {"name": name, "kind": plural},
        )

    def handle(self, method: str, raw_path: str, body: bytes, user: User, ctype: str) -> tuple[int, Any]:
        parsed = urllib.parse.urlsplit(raw_path)
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
        parts = [urllib.parse.unquote(p) for p in parsed.path.strip("/").split("/") if p]
        if parsed.path in ("/livez", "/readyz", "/healthz") or parsed.path.startswith(
            ("/livez/", "/readyz/")
        ):
            return 200, "ok"
        if parsed.path == "/version":
            return 200, version_info(self.settings.version)
        if parts[:1] == ["api"] and len(parts) == 1:
            return 200, self._discovery("")
        if parts[:1] == ["apis"] and len(parts) == 1:
            return 200, self._discovery("apis")
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return 200, self._resource_list(group, version)
        ns = ""
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            ns, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else ""), (rest[2] if len(rest) > 2 else "")
        res = self.store.resource_by_path(group, version, plural)
        if res is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verb = {
            "GET": "get" if name else "list",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(method, "")
        if sub == "eviction":
            verb = "create"
        self.authorize(user, verb, res, ns, name, sub)
        doc: Any = None
        if body:
            try:
                doc = json.loads(body)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from exc
        dry = q.get("dryRun") == "All"
        store = self.store
        if method == "GET":
            if q.get("watch") in ("1", "true"):
                raise ApiError(405, "MethodNotAllowed", "watch is not supported by the lab's API server")
            if name:
                if sub == "log":
                    return 200, self.controllers.pod_log(ns, name, q.get("container", ""))
                return 200, store.get(res, ns, name)
            try:
                items = store.list(res, ns or None, q.get("labelSelector", ""), q.get("fieldSelector", ""))
            except u.SelectorError as exc:
                raise ApiError(400, "BadRequest", str(exc)) from exc
            return 200, {
                "kind": f"{res.kind}List",
                "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(store.rv)},
                "items": items,
            }
        if method == "POST":
            if sub == "eviction":
                return self.controllers.evict(res, ns, name, doc or {})
            if not isinstance(doc, dict):
                raise ApiError(400, "BadRequest", "the request body must be an object")
            self._check_body(res, doc, ns)
            if dry:
                if store.find(res, ns, u.dig(doc, "metadata", "name", default="")):
                    raise ApiError(
                        409, "AlreadyExists", f'{res.rid} "{doc["metadata"]["name"]}" already exists'
                    )
                return 201, doc
            obj = self.controllers.admit_create(res, doc, ns, user)
            return 201, store.create(res, obj, ns or None)
        if method == "PUT":
            if not isinstance(doc, dict):
                raise ApiError(400, "BadRequest", "the request body must be an object")
            self._check_body(res, doc, ns)
            if dry:
                return 200, doc
            return 200, store.replace(res, doc, subresource=sub)
        if method == "PATCH":
            if "json-patch" in ctype:
                raise ApiError(415, "UnsupportedMediaType", f"the lab's API server does not accept {ctype}")
            if not isinstance(doc, dict):
                raise ApiError(400, "BadRequest", "the patch must be an object")
            if dry:
                return 200, u.merge_patch(store.get(res, ns, name), doc)
            return 200, store.patch(res, ns, name, doc, subresource=sub)
        if method == "DELETE":
            grace = (doc or {}).get("gracePeriodSeconds")
            if "gracePeriodSeconds" in q:
                grace = int(q["gracePeriodSeconds"])
            if dry:
                return 200, store.get(res, ns, name)
            if not name:
                deleted = [
                    store.delete(res, ns, o["metadata"]["name"], grace)
                    for o in store.list(res, ns or None, q.get("labelSelector", ""))
                ]
                return 200, {"kind": f"{res.kind}List", "apiVersion": res.api_version, "items": deleted}
            return 200, store.delete(res, ns, name, grace)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    def _check_body(self, res: Resource, doc: Obj, ns: str) -> None:
        kind, api_version = doc.get("kind"), doc.get("apiVersion")
        if (kind and kind != res.kind) or (api_version and api_version != res.api_version):
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({res.api_version})"
                if kind == res.kind
                else f"{kind} in body does not match the resource {res.rid}",
            )
        body_ns = u.dig(doc, "metadata", "namespace")
        if ns and body_ns and body_ns != ns:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )

    def _discovery(self, prefix: str) -> Obj:
        """Aggregated discovery (apidiscovery.k8s.io/v2): every group, version and resource at once."""
        groups: dict[str, dict[str, list[Obj]]] = {}
        for r in self.store.resources():
            if (prefix == "") != (r.group == ""):
                continue
            entry = {
                "resource": r.plural,
                "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                "scope": "Namespaced" if r.namespaced else "Cluster",
                "singularResource": r.singular,
                "shortNames": list(r.short),
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            }
            if r.status_sub:
                entry["subresources"] = [{"subresource": "status", "verbs": ["get", "patch", "update"]}]
            groups.setdefault(r.group, {}).setdefault(r.version, []).append(entry)
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": [
                {
                    "metadata": {"name": g},
                    "versions": [
                        {"version": v, "resources": rs, "freshness": "Current"} for v, rs in vs.items()
                    ],
                }
                for g, vs in groups.items()
            ],
        }

    def _resource_list(self, group: str, version: str) -> Obj:
        gv = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": [
                {
                    "name": r.plural,
                    "singularName": r.singular,
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "shortNames": list(r.short),
                    "verbs": [
                        "create",
                        "delete",
                        "deletecollection",
                        "get",
                        "list",
                        "patch",
                        "update",
                        "watch",
                    ],
                }
                for r in self.store.resources()
                if r.group == group and r.version == version
            ],
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_api: ApiServer
    health_only = False

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, code: int, payload: Any) -> None:
        if isinstance(payload, str):
            data, ctype = payload.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(payload).encode(), "application/json"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _do(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        api = self.server_api
        if self.health_only:
            path = self.path.split("?")[0]
            self._send(200 if path in ("/healthz", "/livez", "/readyz") else 404, "ok" if path else "")
            return
        try:
            peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
            user = api.authenticate(peer, self.headers.get("Authorization"))
            code, payload = api.handle(
                self.command, self.path, body, user, self.headers.get("Content-Type", "")
            )
        except ApiError as err:
            code, payload = err.code, err.status()
        except Exception as exc:  # a bug in the sim must answer, not hang the client
            code, payload = 500, ApiError(500, "InternalError", f"lab API server error: {exc!r}").status()
        self._send(code, payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _do


# --------------------------------------------------------------------------------------- the unit


def main(argv: list[str] | None = None, host: Host | None = None) -> int:
    """Entry of gpuprov-lab-kube-apiserver.service: serve until SIGTERM."""
    host = host or Host()
    try:
        api = ApiServer(host)
        api.start()
    except (OSError, SystemExit, ValueError) as exc:
        sys.stderr.write(f"kube-apiserver (SIMULATED): {exc}\n")
        return 1
    sys.stderr.write(
        f"kube-apiserver {api.settings.version} (SIMULATED, gpuprov lab) serving on "
        f"{api.settings.bind}:{api.settings.port}\n"
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(1):
        pass
    api.stop()
    return 0


def b64decode(text: str) -> str:
    return base64.b64decode(text).decode()


def wait_until(pred: Any, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


def store_path(host: Host, settings: Settings) -> Path:
    return host.p(settings.data_dir) / STORE_FILE
