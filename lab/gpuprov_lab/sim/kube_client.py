"""Client side of the SIMULATED cluster: kubeconfig loading (--kubeconfig, $KUBECONFIG, ~/.kube/config)
and an HTTPS client with the kubeconfig's CA and client certificate or token, as kubectl, kubeadm,
helm and the kubelet use. Errors carry the API server's Status or the message kubectl prints when the
server cannot be reached."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import kube_util as u
from .kube_host import Host
from .kube_store import ApiError, Obj, Resource


class ClientError(Exception):
    """Not an API answer: no kubeconfig, no server, TLS failure (kubectl's wording in message)."""


@dataclass
class KubeConfig:
    server: str
    ca_pem: str | None
    cert_pem: str | None
    key_pem: str | None
    token: str | None
    namespace: str
    insecure: bool = False
    path: str = ""


def _data_or_file(host: Host, entry: Mapping[str, Any], key: str, base: str) -> str | None:
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"]).decode()
    if entry.get(key):
        path = entry[key] if entry[key].startswith("/") else os.path.join(base, entry[key])
        text = host.read(path)
        if text is None:
            raise ClientError(f"error: unable to read {key} {path!r}: open {path}: no such file or directory")
        return text
    return None


def kubeconfig_paths(host: Host, explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    env = host.env.get("KUBECONFIG")
    if env:
        return [p for p in env.split(":") if p]
    home = host.env.get("HOME") or "/root"
    return [f"{home}/.kube/config"]


def load_kubeconfig(host: Host, explicit: str | None = None, context: str | None = None) -> KubeConfig:
    """The effective configuration (first file that exists wins for each part, like kubectl's merge)."""
    docs: list[tuple[str, Obj]] = []
    for path in kubeconfig_paths(host, explicit):
        text = host.read(path)
        if text is None:
            if explicit:
                raise ClientError(f"error: stat {path}: no such file or directory")
            continue
        try:
            doc = u.yaml_load(text) or {}
        except Exception as exc:
            raise ClientError(f'error: error loading config file "{path}": {exc}') from exc
        docs.append((path, doc))
    if not docs:
        raise ClientError(
            "The connection to the server localhost:8080 was refused - did you specify the right host or "
            "port?"
        )

    def merged(key: str) -> dict[str, Obj]:
        out: dict[str, Obj] = {}
        for _p, d in docs:
            for item in d.get(key) or []:
                out.setdefault(item.get("name", ""), item)
        return out

    clusters, users, contexts = merged("clusters"), merged("users"), merged("contexts")
    current = context or next((d.get("current-context") for _p, d in docs if d.get("current-context")), None)
    ctx = (contexts.get(current or "") or {}).get("context") or {}
    if not ctx:
        raise ClientError(
            "The connection to the server localhost:8080 was refused - did you specify the right host or "
            "port?"
        )
    cluster = (clusters.get(ctx.get("cluster", "")) or {}).get("cluster") or {}
    user = (users.get(ctx.get("user", "")) or {}).get("user") or {}
    base = os.path.dirname(docs[0][0])
    return KubeConfig(
        server=cluster.get("server", ""),
        ca_pem=_data_or_file(host, cluster, "certificate-authority", base),
        cert_pem=_data_or_file(host, user, "client-certificate", base),
        key_pem=_data_or_file(host, user, "client-key", base),
        token=user.get("token"),
        namespace=ctx.get("namespace") or "default",
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        path=docs[0][0],
    )


class Client:
    """One keep-alive HTTPS connection to the API server; thread-safe by a lock."""

    def __init__(self, cfg: KubeConfig, timeout: float = 30.0) -> None:
        self.cfg = cfg
        url = urllib.parse.urlsplit(cfg.server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ClientError(f'error: invalid server URL "{cfg.server}" in the kubeconfig')
        self.hostport = f"{url.hostname}:{url.port or 443}"
        self.host, self.port = url.hostname, url.port or 443
        self.timeout = timeout
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if cfg.insecure or not cfg.ca_pem:
            self.ctx.check_hostname = False
            self.ctx.verify_mode = ssl.CERT_NONE
        else:
            self.ctx.load_verify_locations(cadata=cfg.ca_pem)
        if cfg.cert_pem and cfg.key_pem:
            with tempfile.TemporaryDirectory(prefix="kubesim-") as d:
                cert, key = os.path.join(d, "c"), os.path.join(d, "k")
                for path, data in ((cert, cfg.cert_pem), (key, cfg.key_pem)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                    with os.fdopen(fd, "w") as fh:
                        fh.write(data)
                self.ctx.load_cert_chain(cert, key)
        self.conn: http.client.HTTPSConnection | None = None
        self.lock = threading.Lock()
        self._resources: list[Resource] | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def raw(
        self, method: str, path: str, body: bytes | None = None, ctype: str = "application/json"
    ) -> tuple[int, bytes]:
        headers = {"Accept": "application/json", "User-Agent": "kubectl/v1.36.3 (linux/amd64) SIMULATED"}
        if body is not None:
            headers["Content-Type"] = ctype
        if self.cfg.token:
            headers["Authorization"] = f"Bearer {self.cfg.token}"
        with self.lock:
            for attempt in (0, 1):
                if self.conn is None:
                    self.conn = http.client.HTTPSConnection(
                        self.host, self.port, context=self.ctx, timeout=self.timeout
                    )
                try:
                    self.conn.request(method, path, body=body, headers=headers)
                    resp = self.conn.getresponse()
                    return resp.status, resp.read()
                except ConnectionRefusedError as exc:
                    self.close()
                    raise ClientError(
                        f"The connection to the server {self.hostport} was refused - did you specify the "
                        f"right host "
                        "or port?"
                    ) from exc
                except ssl.SSLCertVerificationError as exc:
                    self.close()
                    raise ClientError(
                        "Unable to connect to the server: tls: failed to verify certificate: x509: "
                        + (
                            "certificate signed by unknown authority"
                            if "unknown" in str(exc) or "self" in str(exc)
                            else exc.verify_message
                        )
                    ) from exc
                except (
                    http.client.RemoteDisconnected,
                    BrokenPipeError,
                    ConnectionResetError,
                    http.client.CannotSendRequest,
                    http.client.ResponseNotReady,
                ) as exc:
                    self.close()
                    if attempt:
                        raise ClientError(f"Unable to connect to the server: {exc}") from exc
                except (TimeoutError, OSError) as exc:
                    self.close()
                    reason = "i/o timeout" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
                    raise ClientError(
                        f"Unable to connect to the server: dial tcp {self.hostport}: connect: {reason}"
                    ) from exc
        raise ClientError("Unable to connect to the server")

    def request(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        status, raw = self.raw(method, path, data, ctype)
        text = raw.decode(errors="replace")
        try:
            doc = json.loads(text) if text and text[:1] in "{[" else text
        except ValueError:
            doc = text
        if status >= 400:
            if isinstance(doc, dict) and doc.get("kind") == "Status":
                raise ApiError(status, doc.get("reason", ""), doc.get("message", ""), doc.get("details"))
            reason = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(status, "InternalError")
            raise ApiError(status, reason, text.strip() or reason)
        return doc

    # ------------------------------------------------------------------------------------ typed
    def resources(self, refresh: bool = False) -> list[Resource]:
        """Discovery (aggregated /api and /apis), cached for the life of the client."""
        if self._resources is None or refresh:
            out: list[Resource] = []
            for path in ("/api", "/apis"):
                doc = self.request("GET", path)
                for group in doc.get("items") or []:
                    gname = group["metadata"].get("name", "")
                    for ver in group.get("versions") or []:
                        for r in ver.get("resources") or []:
                            out.append(
                                Resource(
                                    r["responseKind"]["kind"],
                                    r["resource"],
                                    gname,
                                    ver["version"],
                                    r.get("scope") == "Namespaced",
                                    tuple(r.get("shortNames") or []),
                                    r.get("singularResource") or r["responseKind"]["kind"].lower(),
                                    any(
                                        s.get("subresource") == "status" for s in r.get("subresources") or []
                                    ),
                                )
                            )
            self._resources = out
        return self._resources

    def resource(self, name: str) -> Resource | None:
        """kubectl's resolution of a resource argument (plural, singular, short name, kind, plural.group)."""
        for refresh in (False, True):
            name_l = name.lower()
            plain, _, group = name_l.partition(".")
            for r in self.resources(refresh):
                if group:
                    if (r.group == group or r.group.startswith(group)) and plain in (
                        r.plural,
                        r.singular,
                        r.kind.lower(),
                    ):
                        return r
                elif name_l in (r.plural, r.singular, r.kind.lower(), *r.short):
                    return r
        return None

    def resource_for(self, api_version: str, kind: str) -> Resource | None:
        group = api_version.rpartition("/")[0]
        for refresh in (False, True):
            for r in self.resources(refresh):
                if r.kind == kind and r.group == group:
                    return r
        return None

    def get(self, res: Resource, ns: str, name: str) -> Obj:
        return self.request("GET", res.path(ns, name))

    def find(self, res: Resource, ns: str, name: str) -> Obj | None:
        try:
            return self.get(res, ns, name)
        except ApiError as err:
            if err.code == 404:
                return None
            raise

    def list(
        self, res: Resource, ns: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> list[Obj]:
        q = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        path = res.path(ns or None) + (("?" + urllib.parse.urlencode(q)) if q else "")
        return list(self.request("GET", path).get("items") or [])

    def create(self, res: Resource, ns: str, obj: Obj, dry_run: bool = False) -> Obj:
        return self.request("POST", res.path(ns) + ("?dryRun=All" if dry_run else ""), obj)

    def replace(self, res: Resource, ns: str, obj: Obj, sub: str = "") -> Obj:
        return self.request("PUT", res.path(ns, obj["metadata"]["name"], sub), obj)

    def patch(
        self, res: Resource, ns: str, name: str, patch: Obj, sub: str = "", dry_run: bool = False
    ) -> Obj:
        return self.request(
            "PATCH",
            res.path(ns, name, sub) + ("?dryRun=All" if dry_run else ""),
            patch,
            "application/merge-patch+json",
        )

    def delete(self, res: Resource, ns: str, name: str, grace: int | None = None) -> Obj:
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        return self.request("DELETE", res.path(ns, name), body)


def client_for(host: Host, kubeconfig: str | None = None, timeout: float = 30.0) -> Client:
    return Client(load_kubeconfig(host, kubeconfig), timeout=timeout)


def resource_ref(res: Resource, name: str) -> str:
    """'node/gpu1', 'daemonset.apps/kube-flannel-ds', 'clusterpolicy.nvidia.com/cluster-policy'."""
    kind = res.kind.lower()
    return f"{kind}.{res.group}/{name}" if res.group else f"{kind}/{name}"
