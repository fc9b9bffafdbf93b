"""kubectl, SIMULATED (gpuprov lab): the verbs the roles, checks and people use, against the sim API
server, with kubectl's flags, output formats (tables, json, yaml, name, wide, jsonpath,
custom-columns), messages and exit codes.

get, describe (nodes, pods), apply, create, delete, label, annotate, taint, patch, cordon, uncordon,
drain, wait, rollout status, logs, version, cluster-info, config view/current-context.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import kube_jsonpath as jp
from . import kube_util as u
from .kube_client import Client, ClientError, load_kubeconfig, resource_ref
from .kube_host import Host
from .kube_store import ApiError, Obj, Resource

VERSION = "v1.36.3"
KUSTOMIZE = "v5.6.0"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


class UsageError(Exception):
    """Bad command line: kubectl prints 'error: ...' and exits 1."""


class Exit(Exception):
    def __init__(self, rc: int) -> None:
        super().__init__(rc)
        self.rc = rc


# -------------------------------------------------------------------------------------------- flags

# flag → takes a value
FLAGS = {
    "kubeconfig": True,
    "namespace": True,
    "all-namespaces": False,
    "output": True,
    "selector": True,
    "field-selector": True,
    "filename": True,
    "overwrite": False,
    "ignore-daemonsets": False,
    "delete-emptydir-data": False,
    "delete-local-data": False,
    "force": False,
    "timeout": True,
    "grace-period": True,
    "pod-selector": True,
    "disable-eviction": False,
    "for": True,
    "all": False,
    "ignore-not-found": False,
    "dry-run": True,
    "no-headers": False,
    "show-labels": False,
    "type": True,
    "patch": True,
    "container": True,
    "client": False,
    "wait": True,
    "request-timeout": True,
    "context": True,
    "v": True,
    "raw": False,
    "minify": False,
    "server-side": False,
    "field-manager": True,
    "force-conflicts": False,
    "validate": True,
    "recursive": False,
    "label-columns": True,
    "watch": False,
    "chunk-size": True,
    "tail": True,
    "previous": False,
    "cascade": True,
    "now": False,
    "sort-by": True,
    "skip-wait-for-delete-timeout": True,
    "chunk_size": True,
    "insecure-skip-tls-verify": False,
}
SHORT = {
    "n": "namespace",
    "A": "all-namespaces",
    "o": "output",
    "l": "selector",
    "f": "filename",
    "p": "patch",
    "c": "container",
    "w": "watch",
    "L": "label-columns",
    "R": "recursive",
}
MULTI = {"filename", "label-columns"}


@dataclass
class Args:
    pos: list[str] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.flags.get(name, default)

    def has(self, name: str) -> bool:
        v = self.flags.get(name)
        return v is not None and v is not False and str(v).lower() != "false"


def parse(argv: list[str]) -> Args:
    a = Args()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            a.pos += argv[i + 1 :]
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name not in FLAGS:
                raise UsageError(f"unknown flag: --{name}")
            if FLAGS[name] and not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"flag needs an argument: --{name}")
                value = argv[i + 1]
                i += 1
            elif not FLAGS[name]:
                value = value if eq else True
            _set(a, name, value)
        elif arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
            key = arg[1]
            if key not in SHORT:
                raise UsageError(f"unknown shorthand flag: '{key}' in {arg}")
            name = SHORT[key]
            if FLAGS[name]:
                value = arg[2:].lstrip("=")
                if not value:
                    if i + 1 >= len(argv):
                        raise UsageError(f"flag needs an argument: '{key}' in -{key}")
                    value = argv[i + 1]
                    i += 1
                _set(a, name, value)
            else:
                _set(a, name, True)
        else:
            a.pos.append(arg)
        i += 1
    return a


def _set(a: Args, name: str, value: Any) -> None:
    if name in MULTI:
        a.flags.setdefault(name, []).append(value)
    else:
        a.flags[name] = value


def _timeout(value: Any, default: float) -> float:
    if value in (None, ""):
        return default
    try:
        return u.parse_duration(value)
    except ValueError as exc:
        raise UsageError(f'invalid argument "{value}" for "--timeout" flag: {exc}') from exc


# ------------------------------------------------------------------------------------------- context


class Kubectl:
    def __init__(self, host: Host, args: Args, out: TextIO, err: TextIO) -> None:
        self.host, self.a, self.out, self.err = host, args, out, err
        self._client: Client | None = None
        self._ns: str | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            cfg = load_kubeconfig(self.host, self.a.get("kubeconfig"), self.a.get("context"))
            if self.a.has("insecure-skip-tls-verify"):
                cfg.insecure = True
            self._ns = cfg.namespace
            self._client = Client(cfg, timeout=_timeout(self.a.get("request-timeout"), 30) or 30)
        return self._client

    @property
    def ns(self) -> str:
        if self.a.get("namespace"):
            return str(self.a.get("namespace"))
        _ = self.client
        return self._ns or "default"

    def resource(self, name: str) -> Resource:
        r = self.client.resource(name)
        if r is None:
            raise UsageError(f'the server doesn\'t have a resource type "{name}"')
        return r

    def p(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def e(self, text: str) -> None:
        self.err.write(text + "\n")


# --------------------------------------------------------------------------------------------- main


def main(
    argv: list[str],
    host: Host | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    version: str | None = None,
) -> int:
    global VERSION
    if version:
        VERSION = version
    host = host or Host()
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = parse(argv)
    except UsageError as exc:
        err.write(f"error: {exc}\nSee 'kubectl --help' for usage.\n")
        return 1
    if not args.pos:
        out.write("kubectl controls the Kubernetes cluster manager (SIMULATED, gpuprov lab).\n")
        return 0
    verb, rest = args.pos[0], args.pos[1:]
    k = Kubectl(host, Args(rest, args.flags), out, err)
    handler: Callable[[Kubectl], int] | None = VERBS.get(verb)
    if handler is None:
        err.write(f'error: unknown command "{verb}" for "kubectl"\n')
        return 1
    try:
        return handler(k)
    except Exit as ex:
        return ex.rc
    except UsageError as exc:
        err.write(f"error: {exc}\n")
        return 1
    except ApiError as exc:
        err.write(f"Error from server ({exc.reason}): {exc.message}\n")
        return 1
    except ClientError as exc:
        err.write(f"{exc}\n")
        return 1
    except jp.JSONPathError as exc:
        err.write(f"error: error executing jsonpath: {exc}\n")
        return 1
    finally:
        if k._client is not None:
            k._client.close()


# ----------------------------------------------------------------------------------------- targets


def targets(k: Kubectl, words: list[str]) -> list[tuple[Resource, str]]:
    """'node gpu1 gpu2' | 'node/gpu1 pod/x' → [(resource, name)]."""
    out: list[tuple[Resource, str]] = []
    if not words:
        raise UsageError("you must specify the type of resource to get")
    if "/" in words[0]:
        for w in words:
            if "/" not in w:
                raise UsageError(
                    "there is no need to specify a resource type as a separate argument when passing "
                    "arguments in resource/name form"
                )
            t, _, n = w.partition("/")
            out.append((k.resource(t), n))
        return out
    res = k.resource(words[0])
    return [(res, n) for n in words[1:]]


# ------------------------------------------------------------------------------------------ printing


def _age(o: Obj) -> str:
    t = u.parse_iso(u.dig(o, "metadata", "creationTimestamp"))
    return u.human_age(u.now() - t) if t else "<unknown>"


def node_status(n: Obj) -> str:
    ready = next((c for c in u.dig(n, "status", "conditions") or [] if c.get("type") == "Ready"), None)
    s = {"True": "Ready", "False": "NotReady"}.get((ready or {}).get("status", ""), "Unknown")
    if u.dig(n, "spec", "unschedulable"):
        s += ",SchedulingDisabled"
    return s


def node_roles(n: Obj) -> str:
    roles = []
    for k_, v in (u.dig(n, "metadata", "labels") or {}).items():
        if k_.startswith("node-role.kubernetes.io/"):
            roles.append(k_.split("/", 1)[1])
        elif k_ == "kubernetes.io/role":
            roles.append(v)
    return ",".join(sorted(r for r in roles if r)) or "<none>"


def pod_status(p: Obj) -> tuple[str, str, str]:
    """(READY, STATUS, RESTARTS) as kubectl prints them."""
    st = p.get("status") or {}
    spec = p.get("spec") or {}
    reason = st.get("reason") or st.get("phase") or "Unknown"
    total = len(spec.get("containers") or [])
    ready = 0
    restarts = 0
    last_restart: float | None = None
    initializing = False
    inits = st.get("initContainerStatuses") or []
    for i, c in enumerate(inits):
        restarts += int(c.get("restartCount", 0))
        state = c.get("state") or {}
        term, wait = state.get("terminated"), state.get("waiting")
        if term and term.get("exitCode") == 0:
            continue
        if term:
            reason = "Init:" + (term.get("reason") or f"ExitCode:{term.get('exitCode')}")
        elif wait and wait.get("reason") and wait.get("reason") != "PodInitializing":
            reason = "Init:" + wait["reason"]
        else:
            reason = f"Init:{i}/{len(spec.get('initContainers') or [])}"
        initializing = True
        break
    if not initializing:
        restarts = 0
        has_running = False
        for c in reversed(st.get("containerStatuses") or []):
            restarts += int(c.get("restartCount", 0))
            finished = u.parse_iso(u.dig(c, "lastState", "terminated", "finishedAt"))
            if finished and (last_restart is None or finished > last_restart):
                last_restart = finished
            state = c.get("state") or {}
            if (state.get("waiting") or {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif (state.get("terminated") or {}).get("reason"):
                reason = state["terminated"]["reason"]
            elif c.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            reason = "Running"
    if u.dig(p, "metadata", "deletionTimestamp"):
        reason = "Unknown" if st.get("reason") == "NodeLost" else "Terminating"
    rs = str(restarts)
    if last_restart:
        rs += f" ({u.human_age(u.now() - last_restart)} ago)"
    return f"{ready}/{total}", reason, rs


def _selector_text(sel: dict[str, str] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (sel or {}).items()) or "<none>"


def columns(res: Resource, wide: bool, crd: Obj | None) -> tuple[list[str], Callable[[Obj], list[str]]]:
    kind = res.kind
    if kind == "Node":
        hdr = ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]

        def row(n: Obj) -> list[str]:
            r = [
                n["metadata"]["name"],
                node_status(n),
                node_roles(n),
                _age(n),
                u.dig(n, "status", "nodeInfo", "kubeletVersion", default=""),
            ]
            if wide:
                addrs = {a["type"]: a["address"] for a in u.dig(n, "status", "addresses") or []}
                info = u.dig(n, "status", "nodeInfo") or {}
                r += [
                    addrs.get("InternalIP", "<none>"),
                    addrs.get("ExternalIP", "<none>"),
                    info.get("osImage", ""),
                    info.get("kernelVersion", ""),
                    info.get("containerRuntimeVersion", ""),
                ]
            return r

        if wide:
            hdr += ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"]
        return hdr, row
    if kind == "Pod":
        hdr = ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]

        def row(p: Obj) -> list[str]:
            ready, status, restarts = pod_status(p)
            r = [p["metadata"]["name"], ready, status, restarts, _age(p)]
            if wide:
                r += [
                    u.dig(p, "status", "podIP") or "<none>",
                    u.dig(p, "spec", "nodeName") or "<none>",
                    "<none>",
                    "<none>",
                ]
            return r

        if wide:
            hdr += ["IP", "NODE", "NOMINATED NODE", "READINESS GATES"]
        return hdr, row
    if kind == "Namespace":
        return ["NAME", "STATUS", "AGE"], lambda o: [
            o["metadata"]["name"],
            u.dig(o, "status", "phase", default=""),
            _age(o),
        ]
    if kind == "DaemonSet":
        hdr = ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR", "AGE"]

        def row(d: Obj) -> list[str]:
            st = d.get("status") or {}
            r = [
                d["metadata"]["name"],
                *(
                    str(st.get(k, 0))
                    for k in (
                        "desiredNumberScheduled",
                        "currentNumberScheduled",
                        "numberReady",
                        "updatedNumberScheduled",
                        "numberAvailable",
                    )
                ),
                _selector_text(u.dig(d, "spec", "template", "spec", "nodeSelector")),
                _age(d),
            ]
            if wide:
                cs = u.dig(d, "spec", "template", "spec", "containers") or []
                r += [
                    ",".join(c["name"] for c in cs),
                    ",".join(c.get("image", "") for c in cs),
                    _selector_text(u.dig(d, "spec", "selector", "matchLabels")),
                ]
            return r

        if wide:
            hdr += ["CONTAINERS", "IMAGES", "SELECTOR"]
        return hdr, row
    if kind == "Deployment":

        def row(d: Obj) -> list[str]:
            st = d.get("status") or {}
            return [
                d["metadata"]["name"],
                f"{st.get('readyReplicas', 0)}/{u.dig(d, 'spec', 'replicas', default=1)}",
                str(st.get("updatedReplicas", 0)),
                str(st.get("availableReplicas", 0)),
                _age(d),
            ]

        return ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"], row
    if kind == "ReplicaSet":

        def row(d: Obj) -> list[str]:
            st = d.get("status") or {}
            return [
                d["metadata"]["name"],
                str(u.dig(d, "spec", "replicas", default=1)),
                str(st.get("replicas", 0)),
                str(st.get("readyReplicas", 0)),
                _age(d),
            ]

        return ["NAME", "DESIRED", "CURRENT", "READY", "AGE"], row
    if kind == "Service":

        def row(s: Obj) -> list[str]:
            ports = ",".join(
                f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in u.dig(s, "spec", "ports") or []
            )
            return [
                s["metadata"]["name"],
                u.dig(s, "spec", "type", default="ClusterIP"),
                u.dig(s, "spec", "clusterIP", default="None"),
                "<none>",
                ports or "<none>",
                _age(s),
            ]

        return ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"], row
    if kind == "ConfigMap":
        return ["NAME", "DATA", "AGE"], lambda o: [
            o["metadata"]["name"],
            str(len(o.get("data") or {}) + len(o.get("binaryData") or {})),
            _age(o),
        ]
    if kind == "Secret":
        return ["NAME", "TYPE", "DATA", "AGE"], lambda o: [
            o["metadata"]["name"],
            o.get("type", "Opaque"),
            str(len(o.get("data") or {})),
            _age(o),
        ]
    if kind == "ServiceAccount":
        return ["NAME", "SECRETS", "AGE"], lambda o: [
            o["metadata"]["name"],
            str(len(o.get("secrets") or [])),
            _age(o),
        ]
    if kind == "PodDisruptionBudget":

        def row(o: Obj) -> list[str]:
            sp = o.get("spec") or {}
            return [
                o["metadata"]["name"],
                str(sp.get("minAvailable", "N/A")),
                str(sp.get("maxUnavailable", "N/A")),
                str(u.dig(o, "status", "disruptionsAllowed", default=0)),
                _age(o),
            ]

        return ["NAME", "MIN AVAILABLE", "MAX UNAVAILABLE", "ALLOWED DISRUPTIONS", "AGE"], row
    if kind == "CertificateSigningRequest":

        def row(o: Obj) -> list[str]:
            conds = [c["type"] for c in u.dig(o, "status", "conditions") or []]
            if u.dig(o, "status", "certificate"):
                conds.append("Issued")
            return [
                o["metadata"]["name"],
                _age(o),
                u.dig(o, "spec", "signerName", default=""),
                u.dig(o, "spec", "username", default=""),
                "<none>",
                ",".join(conds) or "Pending",
            ]

        return ["NAME", "AGE", "SIGNERNAME", "REQUESTOR", "REQUESTEDDURATION", "CONDITION"], row
    if kind == "RuntimeClass":
        return ["NAME", "HANDLER", "AGE"], lambda o: [o["metadata"]["name"], o.get("handler", ""), _age(o)]
    if kind == "CustomResourceDefinition":
        return ["NAME", "CREATED AT"], lambda o: [
            o["metadata"]["name"],
            o["metadata"].get("creationTimestamp", ""),
        ]
    printer_cols = []
    if crd is not None:
        for v in u.dig(crd, "spec", "versions") or []:
            if v.get("name") == res.version:
                printer_cols = v.get("additionalPrinterColumns") or []
    if printer_cols:
        hdr = ["NAME"] + [c["name"].upper() for c in printer_cols if wide or int(c.get("priority", 0)) == 0]

        def row(o: Obj) -> list[str]:
            r = [o["metadata"]["name"]]
            for c in printer_cols:
                if not wide and int(c.get("priority", 0)) != 0:
                    continue
                vals = jp.values(c["jsonPath"], o)
                v = vals[0] if vals else None
                if c.get("type") == "date" and isinstance(v, str):
                    t = u.parse_iso(v)
                    v = u.human_age(u.now() - t) if t else v
                r.append("" if v is None else str(v))
            return r

        return hdr, row
    return ["NAME", "AGE"], lambda o: [o["metadata"]["name"], _age(o)]


def print_objects(k: Kubectl, res_items: list[tuple[Resource, list[Obj]]], single: bool) -> None:
    fmt = str(k.a.get("output") or "")
    all_items = [o for _r, items in res_items for o in items]
    if fmt in ("json", "yaml"):
        doc: Any = (
            all_items[0]
            if single and len(all_items) == 1
            else {"apiVersion": "v1", "items": all_items, "kind": "List", "metadata": {"resourceVersion": ""}}
        )
        k.out.write(u.dumps(doc) + "\n" if fmt == "json" else u.yaml_dump(doc))
        return
    if fmt == "name":
        for r, items in res_items:
            for o in items:
                k.p(resource_ref(r, o["metadata"]["name"]))
        return
    if fmt.startswith(("jsonpath=", "jsonpath-as-json=")):
        template = fmt.split("=", 1)[1]
        doc = (
            all_items[0]
            if single and len(all_items) == 1
            else {"apiVersion": "v1", "items": all_items, "kind": "List", "metadata": {"resourceVersion": ""}}
        )
        if fmt.startswith("jsonpath-as-json"):
            k.out.write(u.dumps(jp.values(template, doc)) + "\n")
        else:
            k.out.write(jp.render(template, doc))
        return
    if fmt.startswith("custom-columns="):
        specs = [c.split(":", 1) for c in fmt.split("=", 1)[1].split(",")]
        rows = [] if k.a.has("no-headers") else [[h for h, _ in specs]]
        for o in all_items:
            row = []
            for _h, path in specs:
                vals = jp.values(path if path.startswith("{") else "{" + path + "}", o)
                row.append(",".join("<none>" if v is None else jp._fmt(v) for v in vals) or "<none>")
            rows.append(row)
        k.out.write(u.table(rows))
        return
    if fmt not in ("", "wide"):
        raise UsageError(
            f'unable to match a printer suitable for the output format "{fmt}", allowed formats are: '
            "custom-columns,custom-columns-file,go-template,go-template-file,json,jsonpath,jsonpath-as-json,"
            "jsonpath-file,name,template,templatefile,wide,yaml"
        )
    all_ns = k.a.has("all-namespaces")
    multi = len([r for r, items in res_items if items]) > 1
    first = True
    for r, items in res_items:
        if not items:
            continue
        crd = None
        if r.group and r.rid not in {x.rid for x in _builtin()}:
            crd = k.client.find(k.resource("customresourcedefinitions"), "", r.rid)
        hdr, row = columns(r, fmt == "wide", crd)
        rows = []
        if not k.a.has("no-headers"):
            rows.append(
                (["NAMESPACE"] if all_ns and r.namespaced else [])
                + hdr
                + (["LABELS"] if k.a.has("show-labels") else [])
            )
        for o in items:
            cells = row(o)
            if multi:
                cells[0] = resource_ref(r, cells[0])
            if k.a.has("show-labels"):
                cells.append(
                    ",".join(f"{a}={b}" for a, b in (o["metadata"].get("labels") or {}).items()) or "<none>"
                )
            rows.append(([o["metadata"].get("namespace", "")] if all_ns and r.namespaced else []) + cells)
        if not first:
            k.p()
        first = False
        k.out.write(u.table(rows))


def _builtin() -> list[Resource]:
    from .kube_store import BUILTIN

    return BUILTIN


# ---------------------------------------------------------------------------------------------- verbs


def cmd_get(k: Kubectl) -> int:
    words = k.a.pos
    if not words:
        raise UsageError(
            'You must specify the type of resource to get. Use "kubectl api-resources" for a complete list '
            "of "
            "supported resources."
        )
    all_ns = k.a.has("all-namespaces")
    sel, fsel = k.a.get("selector") or "", k.a.get("field-selector") or ""
    results: list[tuple[Resource, list[Obj]]] = []
    missing: list[str] = []
    single = False
    if "/" in words[0] or len(words) > 1:
        single = len(words) == 1 or ("/" not in words[0] and len(words) == 2)
        grouped: dict[str, tuple[Resource, list[Obj]]] = {}
        if "/" not in words[0] and "," in words[0]:
            raise UsageError("arguments in resource/name form may not have more than one slash")
        for res, name in targets(k, words):
            try:
                o = k.client.get(res, k.ns, name)
            except ApiError as exc:
                if exc.code == 404:
                    missing.append(exc.message)
                    continue
                raise
            grouped.setdefault(res.rid, (res, []))[1].append(o)
        results = list(grouped.values())
    else:
        for t in words[0].split(","):
            res = k.resource(t)
            ns = None if all_ns or not res.namespaced else k.ns
            try:
                items = k.client.list(res, ns, sel, fsel)
            except ApiError as exc:
                if exc.code == 400:
                    raise UsageError(exc.message) from exc
                raise
            results.append((res, items))
    if missing and k.a.has("ignore-not-found"):
        missing = []
    if any(items for _r, items in results) or (
        str(k.a.get("output") or "") in ("json", "yaml") and not single
    ):
        print_objects(k, results, single)
    elif not missing and not str(k.a.get("output") or "").startswith("jsonpath"):
        if all_ns:
            k.e("No resources found")
        else:
            ns_word = f" in {k.ns} namespace" if any(r.namespaced for r, _ in results) else ""
            k.e(f"No resources found{ns_word}.")
    for m in missing:
        k.e(f"Error from server (NotFound): {m}")
    return 1 if missing else 0


def _load_manifests(k: Kubectl) -> list[Obj]:
    files = k.a.get("filename") or []
    if not files:
        raise UsageError("must specify one of -f and -k")
    docs: list[Obj] = []
    for f in files:
        if f.startswith(("http://", "https://")):
            try:
                with urllib.request.urlopen(f, timeout=30) as resp:
                    text = resp.read().decode()
            except OSError as exc:
                raise UsageError(f'unable to read URL "{f}", server reported {exc}') from exc
        elif f == "-":
            text = sys.stdin.read()
        else:
            text = k.host.read(f)
            if text is None:
                raise UsageError(f'the path "{f}" does not exist')
        try:
            for d in u.yaml_load_all(text):
                if isinstance(d, dict) and d.get("kind", "").endswith("List") and "items" in d:
                    docs += d["items"]
                elif isinstance(d, dict):
                    docs.append(d)
        except Exception as exc:
            raise UsageError(f"error parsing {f}: {exc}") from exc
    for d in docs:
        if not d.get("apiVersion") or not d.get("kind"):
            raise UsageError(
                f'error validating data: [apiVersion not set, kind not set]; unable to decode "{files[0]}"'
            )
    return docs


def _dry(k: Kubectl) -> tuple[bool, str]:
    d = str(k.a.get("dry-run") or "none")
    if d in ("none", "false", "False"):
        return False, ""
    if d in ("client", "true", "True"):
        return True, " (dry run)"
    if d == "server":
        return True, " (server dry run)"
    raise UsageError(f'Invalid dry-run value ({d}). Must be "none", "server", or "client".')


def cmd_apply(k: Kubectl) -> int:
    import json

    dry, suffix = _dry(k)
    rc = 0
    for d in _load_manifests(k):
        res = k.client.resource_for(d["apiVersion"], d["kind"])
        if res is None:
            k.e(
                f'error: resource mapping not found for name: "{u.dig(d, "metadata", "name")}" namespace: '
                f'"" from '
                f'"{(k.a.get("filename") or [""])[0]}": no matches for kind "{d["kind"]}" in version '
                f'"{d["apiVersion"]}"\n'
                f"ensure CRDs are installed first"
            )
            rc = 1
            continue
        name = u.dig(d, "metadata", "name")
        ns = (u.dig(d, "metadata", "namespace") or k.ns) if res.namespaced else ""
        if (
            k.a.get("namespace")
            and u.dig(d, "metadata", "namespace")
            and d["metadata"]["namespace"] != k.a.get("namespace")
        ):
            k.e(
                f'error: the namespace from the provided object "{d["metadata"]["namespace"]}" does not '
                f"match the "
                f'namespace "{k.a.get("namespace")}". You must pass '
                f"'--namespace={d['metadata']['namespace']}' to "
                "perform this operation."
            )
            rc = 1
            continue
        applied = json.loads(json.dumps(d))
        applied.setdefault("metadata", {})
        if res.namespaced:
            applied["metadata"]["namespace"] = ns
        last = json.dumps(applied, sort_keys=True, separators=(",", ":"))
        body = json.loads(json.dumps(applied))
        body["metadata"].setdefault("annotations", {})[LAST_APPLIED] = last + "\n"
        ref = resource_ref(res, name)
        live = k.client.find(res, ns, name)
        if live is None:
            if k.a.get("dry-run") == "server" or not dry:
                k.client.create(res, ns, body, dry_run=dry)
            k.p(f"{ref} created{suffix}")
            continue
        prev_raw = (u.dig(live, "metadata", "annotations") or {}).get(LAST_APPLIED)
        if not prev_raw:
            k.e(
                f"Warning: resource {res.plural}/{name} is missing the {LAST_APPLIED} annotation which is "
                "required by kubectl apply. kubectl apply should only be used on resources created "
                "declaratively "
                "by either kubectl create --save-config or kubectl apply. The missing annotation will be "
                "patched "
                "automatically."
            )
        prev = json.loads(prev_raw) if prev_raw else {}
        patch = u.three_way_patch(prev, body, live)
        patch.pop("status", None)
        if not patch:
            k.p(f"{ref} unchanged{suffix}")
            continue
        if k.a.get("dry-run") == "server" or not dry:
            k.client.patch(res, ns, name, patch, dry_run=dry)
        k.p(f"{ref} configured{suffix}")
    return rc


def cmd_create(k: Kubectl) -> int:
    dry, suffix = _dry(k)
    if k.a.pos[:1] in (["namespace"], ["ns"]):
        if len(k.a.pos) < 2:
            raise UsageError("exactly one NAME is required, got 0")
        res = k.resource("namespaces")
        obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": k.a.pos[1]}}
        if not dry or k.a.get("dry-run") == "server":
            k.client.create(res, "", obj, dry_run=dry)
        if str(k.a.get("output") or "") in ("yaml", "json"):
            k.out.write(u.yaml_dump(obj) if k.a.get("output") == "yaml" else u.dumps(obj) + "\n")
        else:
            k.p(f"namespace/{k.a.pos[1]} created{suffix}")
        return 0
    if k.a.get("filename"):
        rc = 0
        for d in _load_manifests(k):
            res = k.client.resource_for(d["apiVersion"], d["kind"])
            if res is None:
                raise UsageError(f'no matches for kind "{d["kind"]}" in version "{d["apiVersion"]}"')
            ns = (u.dig(d, "metadata", "namespace") or k.ns) if res.namespaced else ""
            try:
                if not dry or k.a.get("dry-run") == "server":
                    k.client.create(res, ns, d, dry_run=dry)
                k.p(f"{resource_ref(res, d['metadata']['name'])} created{suffix}")
            except ApiError as exc:
                k.e(
                    f'Error from server ({exc.reason}): error when creating "{k.a.get("filename")[0]}": '
                    f"{exc.message}"
                )
                rc = 1
        return rc
    raise UsageError(f'unknown command "{" ".join(k.a.pos[:1])}" for "kubectl create"')


def cmd_delete(k: Kubectl) -> int:
    grace = k.a.get("grace-period")
    grace_i = int(grace) if grace not in (None, "") else None
    if k.a.has("now"):
        grace_i = 1
    if k.a.has("force") and grace_i == 0:
        k.e(
            "Warning: Immediate deletion does not wait for confirmation that the running resource has been "
            "terminated. The resource may continue to run on the cluster indefinitely."
        )
    items: list[tuple[Resource, str, str]] = []
    if k.a.get("filename"):
        for d in _load_manifests(k):
            res = k.client.resource_for(d["apiVersion"], d["kind"])
            if res is None:
                continue
            items.append(
                (
                    res,
                    (u.dig(d, "metadata", "namespace") or k.ns) if res.namespaced else "",
                    d["metadata"]["name"],
                )
            )
    elif k.a.get("selector") or k.a.has("all"):
        res = k.resource(k.a.pos[0])
        for o in k.client.list(res, k.ns if res.namespaced else None, k.a.get("selector") or ""):
            items.append((res, o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        if not items:
            k.p("No resources found")
            return 0
    else:
        for res, name in targets(k, k.a.pos):
            items.append((res, k.ns if res.namespaced else "", name))
    rc = 0
    deleted: list[tuple[Resource, str, str]] = []
    for res, ns, name in items:
        try:
            k.client.delete(res, ns, name, grace_i)
            k.p(f'{res.kind.lower()} "{name}" deleted' + (f" from {ns} namespace" if ns else ""))
            deleted.append((res, ns, name))
        except ApiError as exc:
            if exc.code == 404 and k.a.has("ignore-not-found"):
                continue
            k.e(f"Error from server ({exc.reason}): {exc.message}")
            rc = 1
    if str(k.a.get("wait", "true")).lower() != "false":
        deadline = time.monotonic() + _timeout(k.a.get("timeout"), 0) if k.a.get("timeout") else None
        for res, ns, name in deleted:
            while k.client.find(res, ns, name) is not None:
                if deadline and time.monotonic() > deadline:
                    k.e(f"error: timed out waiting for the condition on {res.rid}/{name}")
                    return 1
                time.sleep(0.3)
    return rc


def _label_like(k: Kubectl, field_name: str, verb: str) -> int:
    pos = k.a.pos
    if not pos:
        raise UsageError("one or more resources must be specified as <resource> <name> or <resource>/<name>")
    kv_start = next((i for i, w in enumerate(pos) if "=" in w or w.endswith("-")), len(pos))
    objs, pairs = pos[:kv_start], pos[kv_start:]
    if not pairs:
        raise UsageError(f"at least one {field_name[:-1]} update is required")
    sets: dict[str, str] = {}
    removes: list[str] = []
    for p in pairs:
        if p.endswith("-") and "=" not in p:
            removes.append(p[:-1])
        else:
            key, _, val = p.partition("=")
            sets[key] = val
    tlist: list[tuple[Resource, str]]
    if k.a.get("selector") or k.a.has("all"):
        res = k.resource(objs[0])
        tlist = [
            (res, o["metadata"]["name"])
            for o in k.client.list(res, k.ns if res.namespaced else None, k.a.get("selector") or "")
        ]
    else:
        tlist = targets(k, objs)
    dry, suffix = _dry(k)
    for res, name in tlist:
        ns = k.ns if res.namespaced else ""
        live = k.client.get(res, ns, name)
        cur = u.dig(live, "metadata", field_name) or {}
        if not k.a.has("overwrite"):
            conflicts = [
                f"'{key}' already has a value ({cur[key]})"
                for key, v in sets.items()
                if key in cur and cur[key] != v
            ]
            if conflicts:
                if verb == "labeled":
                    raise UsageError(f"{conflicts[0]}, and --overwrite is false")
                raise UsageError(
                    "--overwrite is false but found the following declared annotation(s): "
                    + "; ".join(conflicts)
                )
        patch: dict[str, Any] = {}
        for key, v in sets.items():
            if cur.get(key) != v:
                patch[key] = v
        for key in removes:
            if key in cur:
                patch[key] = None
        ref = resource_ref(res, name)
        if not patch:
            k.p(f"{ref} not {verb}" if verb == "labeled" else f"{ref} {verb}")
            continue
        if not dry or k.a.get("dry-run") == "server":
            k.client.patch(res, ns, name, {"metadata": {field_name: patch}}, dry_run=dry)
        k.p(f"{ref} {'unlabeled' if verb == 'labeled' and not sets else verb}{suffix}")
    return 0


def cmd_label(k: Kubectl) -> int:
    return _label_like(k, "labels", "labeled")


def cmd_annotate(k: Kubectl) -> int:
    return _label_like(k, "annotations", "annotated")


def cmd_patch(k: Kubectl) -> int:
    import json

    raw = k.a.get("patch")
    if not raw:
        raise UsageError("must specify -p to patch")
    try:
        patch = u.yaml_load(raw)
    except Exception as exc:
        raise UsageError(f'unable to parse "{raw}": {exc}') from exc
    ptype = k.a.get("type") or "strategic"
    if ptype == "json":
        raise UsageError("json patches are not supported by the lab's kubectl; use --type merge")
    res, name = targets(k, k.a.pos)[0]
    ns = k.ns if res.namespaced else ""
    before = k.client.get(res, ns, name)
    after = k.client.patch(res, ns, name, patch)
    changed = json.dumps(before.get("spec"), sort_keys=True) != json.dumps(
        after.get("spec"), sort_keys=True
    ) or before["metadata"].get("resourceVersion") != after["metadata"].get("resourceVersion")
    k.p(f"{resource_ref(res, name)} {'patched' if changed else 'patched (no change)'}")
    return 0


def cmd_taint(k: Kubectl) -> int:
    pos = k.a.pos
    if len(pos) < 3:
        raise UsageError("at least one taint update is required")
    res = k.resource(pos[0])
    name = pos[1]
    node = k.client.get(res, "", name)
    taints = list(u.dig(node, "spec", "taints") or [])
    for spec in pos[2:]:
        remove = spec.endswith("-")
        spec = spec.rstrip("-")
        kv, _, effect = spec.partition(":")
        key, _, value = kv.partition("=")
        if remove:
            before = len(taints)
            taints = [
                t for t in taints if not (t["key"] == key and (not effect or t.get("effect") == effect))
            ]
            if len(taints) == before:
                raise UsageError(f'taint "{spec}" not found')
        else:
            if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                raise UsageError(f"invalid taint effect: {effect}, unsupported taint effect")
            existing = [t for t in taints if t["key"] == key and t.get("effect") == effect]
            if existing and not k.a.has("overwrite"):
                raise UsageError(
                    f"node {name} already has {key} taint(s) with same effect(s) and --overwrite is false"
                )
            taints = [t for t in taints if not (t["key"] == key and t.get("effect") == effect)]
            t = {"key": key, "effect": effect}
            if value:
                t["value"] = value
            taints.append(t)
    k.client.patch(res, "", name, {"spec": {"taints": taints or None}})
    k.p(f"node/{name} {'untainted' if all(s.endswith('-') for s in pos[2:]) else 'tainted'}")
    return 0


def _cordon(k: Kubectl, name: str, on: bool) -> None:
    res = k.resource("nodes")
    node = k.client.get(res, "", name)
    word = "cordoned" if on else "uncordoned"
    if bool(u.dig(node, "spec", "unschedulable")) == on:
        k.p(f"node/{name} already {word}")
        return
    dry, suffix = _dry(k)
    if not dry or k.a.get("dry-run") == "server":
        k.client.patch(res, "", name, {"spec": {"unschedulable": True if on else None}}, dry_run=dry)
    k.p(f"node/{name} {word}{suffix}")


def cmd_cordon(k: Kubectl) -> int:
    if not k.a.pos:
        raise UsageError("USAGE: cordon NODE [flags]")
    for n in k.a.pos:
        _cordon(k, n, True)
    return 0


def cmd_uncordon(k: Kubectl) -> int:
    if not k.a.pos:
        raise UsageError("USAGE: uncordon NODE [flags]")
    for n in k.a.pos:
        _cordon(k, n, False)
    return 0


def cmd_drain(k: Kubectl) -> int:
    """kubectl drain: cordon, refuse or skip pods by the real rules, evict (retrying a refused eviction
    every 5s), wait for the pods to go, all within --timeout."""
    if not k.a.pos:
        raise UsageError("USAGE: drain NODE [flags]")
    timeout = _timeout(k.a.get("timeout"), 0)
    failed = []
    for name in k.a.pos:
        _cordon(k, name, True)
        err = _drain_node(k, name, timeout)
        if err is None:
            k.p(f"node/{name} drained")
            continue
        k.e(f'error: unable to drain node "{name}" due to error: {err}, continuing command...')
        failed.append((name, err))
    if failed:
        k.e("There are pending nodes to be drained:")
        for name, _ in failed:
            k.e(f" {name}")
        k.e(f"error: {failed[0][1]}" if len(failed) == 1 else "\n".join(e for _, e in failed))
        return 1
    return 0


def _drain_node(k: Kubectl, node: str, timeout: float) -> str | None:
    pods_res = k.resource("pods")
    pods = k.client.list(pods_res, None, k.a.get("pod-selector") or "", f"spec.nodeName={node}")
    errors: dict[str, list[str]] = {}
    warnings: dict[str, list[str]] = {}
    todo: list[Obj] = []
    for p in pods:
        meta = p["metadata"]
        ref = f"{meta['namespace']}/{meta['name']}"
        if (meta.get("annotations") or {}).get("kubernetes.io/config.mirror"):
            continue
        if meta.get("deletionTimestamp"):
            continue
        phase = u.dig(p, "status", "phase")
        finished = phase in ("Succeeded", "Failed")
        owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
        if owner and owner.get("kind") == "DaemonSet" and not finished:
            if k.a.has("ignore-daemonsets"):
                warnings.setdefault("ignoring DaemonSet-managed Pods", []).append(ref)
            else:
                errors.setdefault(
                    "cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore)", []
                ).append(ref)
            continue
        if owner is None and not finished:
            if k.a.has("force"):
                warnings.setdefault("deleting Pods that declare no controller", []).append(ref)
            else:
                errors.setdefault(
                    "cannot delete Pods that declare no controller (use --force to override)", []
                ).append(ref)
                continue
        if any("emptyDir" in v for v in u.dig(p, "spec", "volumes") or []) and not finished:
            if k.a.has("delete-emptydir-data") or k.a.has("delete-local-data"):
                warnings.setdefault("deleting Pods with local storage", []).append(ref)
            else:
                errors.setdefault(
                    "cannot delete Pods with local storage (use --delete-emptydir-data to override)", []
                ).append(ref)
                continue
        todo.append(p)
    if errors:
        return ", ".join(f"{msg}: {', '.join(refs)}" for msg, refs in errors.items())
    if warnings:
        k.e("Warning: " + "; ".join(f"{msg}: {', '.join(refs)}" for msg, refs in warnings.items()))
    if not todo:
        return None
    grace = k.a.get("grace-period")
    grace_i = int(grace) if grace not in (None, "", "-1") else None
    start = time.monotonic()
    pending = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in todo}
    next_try = dict.fromkeys(pending, 0.0)
    evicted: dict[tuple[str, str], str] = {}
    errs: list[str] = []
    while pending:
        now = time.monotonic()
        if timeout and now - start > timeout:
            dur = u.go_duration(timeout)
            for ns, name in pending:
                if (ns, name) in evicted:
                    errs.append(
                        f'error when waiting for pod "{name}" in namespace "{ns}" to terminate: global '
                        f"timeout "
                        f"reached: {dur}"
                    )
                else:
                    errs.append(f'error when evicting pods/"{name}" -n "{ns}": global timeout reached: {dur}')
            break
        for key in list(pending):
            ns, name = key
            if key in evicted:
                live = k.client.find(pods_res, ns, name)
                if live is None or live["metadata"]["uid"] != evicted[key]:
                    k.p(f"pod/{name} {'deleted' if k.a.has('disable-eviction') else 'evicted'}")
                    del pending[key]
                continue
            if now < next_try[key]:
                continue
            if k.a.has("disable-eviction"):
                k.p(f"deleting pod {ns}/{name}")
            else:
                k.p(f"evicting pod {ns}/{name}")
            try:
                if k.a.has("disable-eviction"):
                    k.client.delete(pods_res, ns, name, grace_i)
                else:
                    body: Obj = {
                        "apiVersion": "policy/v1",
                        "kind": "Eviction",
                        "metadata": {"name": name, "namespace": ns},
                    }
                    if grace_i is not None:
                        body["deleteOptions"] = {"gracePeriodSeconds": grace_i}
                    k.client.request("POST", pods_res.path(ns, name, "eviction"), body)
                evicted[key] = pending[key]["metadata"]["uid"]
            except ApiError as exc:
                if exc.code == 404:
                    k.p(f"pod/{name} evicted")
                    del pending[key]
                elif exc.code == 429:
                    k.e(f'error when evicting pods/"{name}" -n "{ns}" (will retry after 5s): {exc.message}')
                    next_try[key] = time.monotonic() + 5
                else:
                    errs.append(f'error when evicting pods/"{name}" -n "{ns}": {exc.message}')
                    del pending[key]
        if pending:
            time.sleep(0.3)
    if errs:
        msg = errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]"
        left = k.client.list(pods_res, None, k.a.get("pod-selector") or "", f"spec.nodeName={node}")
        left = [p for p in left if (p["metadata"]["namespace"], p["metadata"]["name"]) in pending]
        if left:
            k.e(f'There are pending pods in node "{node}" when an error occurred: {msg}')
            for p in left:
                k.e(f"pod/{p['metadata']['name']}")
        return msg
    return None


def cmd_wait(k: Kubectl) -> int:
    cond = k.a.get("for")
    if not cond:
        raise UsageError("--for must be specified")
    timeout = _timeout(k.a.get("timeout"), 30)
    if k.a.get("selector") or k.a.has("all"):
        res = k.resource(k.a.pos[0])
        ns = None if k.a.has("all-namespaces") or not res.namespaced else k.ns
        items = k.client.list(res, ns, k.a.get("selector") or "")
        tlist = [(res, o["metadata"]["name"], o["metadata"].get("namespace", "")) for o in items]
        if not tlist:
            raise UsageError("no matching resources found")
    else:
        tlist = [(r, n, k.ns if r.namespaced else "") for r, n in targets(k, k.a.pos)]

    def check(o: Obj | None) -> bool:
        if cond == "delete":
            return o is None
        if o is None:
            return False
        if cond.startswith("condition="):
            want = cond[len("condition=") :]
            ctype, _, value = want.partition("=")
            value = value or "True"
            for c in u.dig(o, "status", "conditions") or []:
                if c.get("type", "").lower() == ctype.lower():
                    return str(c.get("status")).lower() == value.lower()
            return False
        if cond.startswith("jsonpath="):
            expr = cond[len("jsonpath=") :]
            path, eq, want = expr.partition("=")
            if expr.startswith("{"):
                close = expr.find("}")
                path, want, eq = (
                    expr[: close + 1],
                    expr[close + 2 :],
                    "=" if expr[close + 1 : close + 2] == "=" else "",
                )
            vals = jp.values(path.strip("'\""), o)
            if not eq:
                return bool(vals)
            return any(jp._fmt(v) == want.strip("'\"") for v in vals)
        if cond == "create":
            return True
        raise UsageError(f'unrecognized condition: "{cond}"')

    deadline = time.monotonic() + timeout
    rc = 0
    for res, name, ns in tlist:
        while True:
            o = k.client.find(res, ns, name)
            if (
                o is None
                and cond != "delete"
                and not cond.startswith("create")
                and time.monotonic() > deadline
            ):
                k.e(f'Error from server (NotFound): {res.rid} "{name}" not found')
                rc = 1
                break
            if check(o):
                k.p(f"{resource_ref(res, name)} condition met")
                break
            if time.monotonic() > deadline:
                k.e(f"error: timed out waiting for the condition on {res.plural}/{name}")
                rc = 1
                break
            time.sleep(0.3)
    return rc


def cmd_rollout(k: Kubectl) -> int:
    if not k.a.pos or k.a.pos[0] != "status":
        raise UsageError("only 'kubectl rollout status' is available in the lab")
    res, name = targets(k, k.a.pos[1:])[0]
    timeout = _timeout(k.a.get("timeout"), 0)
    deadline = time.monotonic() + timeout if timeout else None
    last = ""
    while True:
        o = k.client.get(res, k.ns, name)
        st = o.get("status") or {}
        gen_ok = st.get("observedGeneration", 0) >= o["metadata"].get("generation", 1)
        if res.kind == "DaemonSet":
            want = st.get("desiredNumberScheduled", 0)
            upd, avail = st.get("updatedNumberScheduled", 0), st.get("numberAvailable", 0)
            if gen_ok and upd >= want and avail >= want:
                k.p(f'daemon set "{name}" successfully rolled out')
                return 0
            msg = (
                f'Waiting for daemon set "{name}" rollout to finish: {avail} of {want} updated pods are '
                "available..."
            )
        elif res.kind == "Deployment":
            want = u.dig(o, "spec", "replicas", default=1)
            upd, avail = st.get("updatedReplicas", 0), st.get("availableReplicas", 0)
            if gen_ok and upd >= want and avail >= want:
                k.p(f'deployment "{name}" successfully rolled out')
                return 0
            msg = (
                f'Waiting for deployment "{name}" rollout to finish: {avail} of {want} updated replicas are '
                "available..."
            )
        else:
            raise UsageError(f"no status viewer has been implemented for {res.kind}")
        if msg != last:
            k.p(msg)
            last = msg
        if deadline and time.monotonic() > deadline:
            k.e("error: timed out waiting for the condition")
            return 1
        time.sleep(0.5)


def cmd_logs(k: Kubectl) -> int:
    if not k.a.pos:
        raise UsageError("expected POD or TYPE/NAME is a required argument for the logs command")
    name = k.a.pos[0].split("/", 1)[-1]
    path = k.resource("pods").path(k.ns, name, "log")
    if k.a.get("container"):
        path += f"?container={k.a.get('container')}"
    k.out.write(str(k.client.request("GET", path)))
    return 0


def cmd_version(k: Kubectl) -> int:
    from .kube_api import version_info

    client = version_info(VERSION)
    client.pop("emulationMajor"), client.pop("emulationMinor")
    client.pop("minCompatibilityMajor"), client.pop("minCompatibilityMinor")
    server: Obj | None = None
    server_err = None
    if not k.a.has("client"):
        try:
            server = k.client.request("GET", "/version")
        except (ClientError, ApiError) as exc:
            server_err = str(exc)
    fmt = k.a.get("output")
    if fmt in ("json", "yaml"):
        doc: Obj = {"clientVersion": client, "kustomizeVersion": KUSTOMIZE}
        if server:
            doc["serverVersion"] = server
        k.out.write(u.dumps(doc) + "\n" if fmt == "json" else u.yaml_dump(doc))
    else:
        k.p(f"Client Version: {VERSION}")
        k.p(f"Kustomize Version: {KUSTOMIZE}")
        if server:
            k.p(f"Server Version: {server.get('gitVersion')}")
    if server_err:
        k.e(server_err)
        return 1
    return 0


def cmd_cluster_info(k: Kubectl) -> int:
    k.client.request("GET", "/version")
    k.p(f"\x1b[0;32mKubernetes control plane\x1b[0m is running at \x1b[0;33m{k.client.cfg.server}\x1b[0m")
    svc = k.client.find(k.resource("services"), "kube-system", "kube-dns")
    if svc:
        k.p(
            f"\x1b[0;32mCoreDNS\x1b[0m is running at "
            f"\x1b[0;33m{k.client.cfg.server}/api/v1/namespaces/kube-system/"
            "services/kube-dns:dns/proxy\x1b[0m"
        )
    k.p("\nTo further debug and diagnose cluster problems, use 'kubectl cluster-info dump'.")
    return 0


def cmd_config(k: Kubectl) -> int:
    sub = k.a.pos[:1]
    from .kube_client import kubeconfig_paths

    paths = kubeconfig_paths(k.host, k.a.get("kubeconfig"))
    text = next((t for t in (k.host.read(p) for p in paths) if t), None)
    if text is None:
        raise UsageError("current-context is not set")
    doc = u.yaml_load(text) or {}
    if sub == ["current-context"]:
        k.p(doc.get("current-context", ""))
        return 0
    if sub == ["view"]:
        if not k.a.has("raw"):
            for user in doc.get("users") or []:
                for key in ("client-certificate-data", "client-key-data", "token"):
                    if key in (user.get("user") or {}):
                        user["user"][key] = "DATA+OMITTED" if key.endswith("data") else "REDACTED"
            for c in doc.get("clusters") or []:
                if "certificate-authority-data" in (c.get("cluster") or {}):
                    c["cluster"]["certificate-authority-data"] = "DATA+OMITTED"
        k.out.write(u.yaml_dump(doc) if k.a.get("output") != "json" else u.dumps(doc) + "\n")
        return 0
    raise UsageError(f'unknown command "{" ".join(sub)}" for "kubectl config"')


def cmd_describe(k: Kubectl) -> int:
    """A short describe for nodes and pods (what an operator reads when something is wrong)."""
    res, name = (
        targets(k, k.a.pos)[0] if len(k.a.pos) > 1 or "/" in k.a.pos[0] else (k.resource(k.a.pos[0]), "")
    )
    ns = k.ns if res.namespaced else ""
    items = (
        [k.client.get(res, ns, name)] if name else k.client.list(res, ns or None, k.a.get("selector") or "")
    )
    for o in items:
        meta = o["metadata"]
        k.p(f"Name:               {meta['name']}")
        if res.namespaced:
            k.p(f"Namespace:          {meta.get('namespace')}")
        k.p(
            "Labels:             "
            + (
                "\n                    ".join(f"{a}={b}" for a, b in (meta.get("labels") or {}).items())
                or "<none>"
            )
        )
        k.p(
            "Annotations:        "
            + (
                "\n                    ".join(f"{a}: {b}" for a, b in (meta.get("annotations") or {}).items())
                or "<none>"
            )
        )
        k.p(f"CreationTimestamp:  {meta.get('creationTimestamp')}")
        if res.kind == "Node":
            k.p(
                "Taints:             "
                + (
                    "\n                    ".join(
                        f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}"
                        for t in u.dig(o, "spec", "taints") or []
                    )
                    or "<none>"
                )
            )
            k.p(f"Unschedulable:      {str(bool(u.dig(o, 'spec', 'unschedulable'))).lower()}")
            k.p("Conditions:")
            rows = [["  Type", "Status", "LastHeartbeatTime", "LastTransitionTime", "Reason", "Message"]]
            for c in u.dig(o, "status", "conditions") or []:
                rows.append(
                    [
                        f"  {c.get('type')}",
                        c.get("status", ""),
                        c.get("lastHeartbeatTime", ""),
                        c.get("lastTransitionTime", ""),
                        c.get("reason", ""),
                        c.get("message", ""),
                    ]
                )
            k.out.write(u.table(rows, padding=2))
            for section in ("capacity", "allocatable"):
                k.p(f"{section.capitalize()}:")
                for a, b in (u.dig(o, "status", section) or {}).items():
                    k.p(f"  {a}:{' ' * max(1, 20 - len(a))}{b}")
        elif res.kind == "Pod":
            _ready, status, _restarts = pod_status(o)
            k.p(f"Node:               {u.dig(o, 'spec', 'nodeName') or '<none>'}")
            k.p(f"Status:             {status}")
            k.p(f"IP:                 {u.dig(o, 'status', 'podIP') or ''}")
            for cs in (u.dig(o, "status", "initContainerStatuses") or []) + (
                u.dig(o, "status", "containerStatuses") or []
            ):
                state = cs.get("state") or {}
                for kind, detail in state.items():
                    k.p(
                        f"  {cs['name']}: {kind.capitalize()} {(detail or {}).get('reason', '')} "
                        f"{(detail or {}).get('message', '')}".rstrip()
                    )
            k.p("Conditions:")
            for c in u.dig(o, "status", "conditions") or []:
                k.p(f"  {c.get('type')}: {c.get('status')} {c.get('message', '')}".rstrip())
        k.p()
    return 0


VERBS: dict[str, Callable[[Kubectl], int]] = {
    "get": cmd_get,
    "apply": cmd_apply,
    "create": cmd_create,
    "delete": cmd_delete,
    "label": cmd_label,
    "annotate": cmd_annotate,
    "patch": cmd_patch,
    "taint": cmd_taint,
    "cordon": cmd_cordon,
    "uncordon": cmd_uncordon,
    "drain": cmd_drain,
    "wait": cmd_wait,
    "rollout": cmd_rollout,
    "logs": cmd_logs,
    "version": cmd_version,
    "cluster-info": cmd_cluster_info,
    "config": cmd_config,
    "describe": cmd_describe,
}
