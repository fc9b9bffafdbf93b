"""helm, SIMULATED (gpuprov lab): chart repositories, install/upgrade/uninstall, list/status/get/history,
search and template, against the sim API server.

Charts are real chart archives (Chart.yaml, values.yaml, templates/, crds/, charts/ with dependency
conditions), rendered by the real helm's `helm template` (see REAL_HELM); the rest is simulated.
Releases are stored as real helm 3 stores them: a Secret ``sh.helm.release.v1.<name>.v<revision>``
of type ``helm.sh/release.v1`` holding the gzipped release JSON. Every upgrade makes a new revision,
as real helm does; the previous one becomes "superseded".
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import json
import re
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import kube_util as u
from .kube_client import Client, ClientError, load_kubeconfig
from .kube_host import Host
from .kube_store import ApiError, Obj, Resource

VERSION = "v4.2.3"
GIT_COMMIT = "43e8b7feece8beb0fcba47059ec9b522fd929a64"
KIND_ORDER = [
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
]


class HelmError(Exception):
    """helm prints 'Error: <message>' and exits 1."""


# --------------------------------------------------------------------------------------------- flags

FLAGS = {
    "kubeconfig": True,
    "namespace": True,
    "all-namespaces": False,
    "output": True,
    "install": False,
    "version": True,
    "create-namespace": False,
    "values": True,
    "set": True,
    "set-string": True,
    "wait": False,
    "timeout": True,
    "atomic": False,
    "reuse-values": False,
    "reset-values": False,
    "dry-run": False,
    "short": False,
    "versions": False,
    "force-update": False,
    "all": False,
    "revision": True,
    "deployed": False,
    "failed": False,
    "debug": False,
    "kube-context": True,
    "wait-for-jobs": False,
    "devel": False,
    "template": True,
    "keep-history": False,
    "skip-crds": False,
    "description": True,
    "max": True,
    "cleanup-on-fail": False,
    "reset-then-reuse-values": False,
    "repo": True,
    "filter": True,
    "pending": False,
    "superseded": False,
    "uninstalled": False,
    "username": True,
    "password": True,
    "include-crds": False,
    "insecure-skip-tls-verify": False,
    "pass-credentials": False,
    "ca-file": True,
    "force": False,
}
SHORT = {"n": "namespace", "A": "all-namespaces", "o": "output", "f": "values", "a": "all"}
MULTI = {"values", "set", "set-string"}


def parse(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    pos: list[str] = []
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        name = value = None
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if name not in FLAGS:
                raise HelmError(f"unknown flag: --{name}")
            if not eq:
                value = None
        elif a.startswith("-") and len(a) > 1 and a[1] in SHORT:
            name = SHORT[a[1]]
            value = a[2:].lstrip("=") or None
        else:
            pos.append(a)
            i += 1
            continue
        if FLAGS[name] and value is None:
            if i + 1 >= len(argv):
                raise HelmError(f"flag needs an argument: --{name}")
            value = argv[i + 1]
            i += 1
        elif not FLAGS[name]:
            value = value if value is not None else True
        if name in MULTI:
            flags.setdefault(name, []).append(value)
        else:
            flags[name] = value
        i += 1
    return pos, flags


# ------------------------------------------------------------------------------------------- values


def _typed(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if re.fullmatch(r"-?\d+", text) and not (len(text) > 1 and text.lstrip("-").startswith("0")):
        return int(text)
    return text


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur, esc = [], 0, "", False
    for ch in text:
        if esc:
            cur += ch
            esc = False
            continue
        if ch == "\\":
            cur += ch
            esc = True
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def apply_set(values: Obj, expr: str, as_string: bool = False) -> None:
    """--set a.b=c,d[0].e=f,g={x,y} into values."""
    for item in _split_top(expr):
        if not item:
            continue
        key, eq, raw = item.partition("=")
        if not eq:
            raise HelmError(f'failed parsing --set data: key "{key}" has no value')
        path = [p.replace("\\.", ".") for p in re.split(r"(?<!\\)\.", key)]
        if raw.startswith("{") and raw.endswith("}"):
            val: Any = [x if as_string else _typed(x) for x in _split_top(raw[1:-1]) if x != ""]
        else:
            val = raw.replace("\\,", ",") if as_string else _typed(raw.replace("\\,", ","))
        cur: Any = values
        for i, part in enumerate(path):
            m = re.fullmatch(r"(.+?)\[(\d+)\]", part)
            last = i == len(path) - 1
            if m:
                name, idx = m.group(1), int(m.group(2))
                lst = cur.setdefault(name, [])
                while len(lst) <= idx:
                    lst.append({} if not last else None)
                if last:
                    lst[idx] = val
                else:
                    if not isinstance(lst[idx], dict):
                        lst[idx] = {}
                    cur = lst[idx]
            elif last:
                cur[part] = val
            else:
                if not isinstance(cur.get(part), dict):
                    cur[part] = {}
                cur = cur[part]


# -------------------------------------------------------------------------------------------- charts


@dataclass
class Chart:
    meta: Obj
    values: Obj
    templates: dict[str, str]
    crds: dict[str, str]
    subcharts: list[Chart] = field(default_factory=list)
    notes: str = ""
    # What the real helm renders: the chart archive's bytes, or the chart directory's path.
    archive: bytes = b""
    directory: str = ""

    @property
    def name(self) -> str:
        return str(self.meta.get("name", ""))

    @property
    def version(self) -> str:
        return str(self.meta.get("version", ""))


def load_chart_archive(data: bytes) -> Chart:
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for m in tar.getmembers():
                if m.isfile():
                    fh = tar.extractfile(m)
                    if fh is not None:
                        files[m.name] = fh.read()
    except (tarfile.TarError, OSError) as exc:
        raise HelmError(f"file is not a chart archive: {exc}") from exc
    chart = _chart_from_files(files)
    chart.archive = data
    return chart


def load_chart_dir(host: Host, path: str) -> Chart:
    files: dict[str, bytes] = {}
    base = host.p(path)
    name = base.name
    for p in sorted(base.rglob("*")):
        if p.is_file():
            files[f"{name}/{p.relative_to(base)}"] = p.read_bytes()
    chart = _chart_from_files(files)
    chart.directory = str(base)
    return chart


def _chart_from_files(files: dict[str, bytes]) -> Chart:
    tops = {n.split("/", 1)[0] for n in files}
    top = next((t for t in tops if f"{t}/Chart.yaml" in files), None)
    if top is None:
        raise HelmError("Chart.yaml file is missing")
    return _chart(top, {n[len(top) + 1 :]: d for n, d in files.items() if n.startswith(top + "/")})


def _chart(name: str, files: dict[str, bytes]) -> Chart:
    meta = u.yaml_load(files["Chart.yaml"].decode()) or {}
    values = u.yaml_load(files.get("values.yaml", b"").decode()) or {}
    templates = {
        f"{meta.get('name', name)}/{n}": d.decode()
        for n, d in files.items()
        if n.startswith("templates/") and not n.endswith("NOTES.txt")
    }
    crds = {n: d.decode() for n, d in files.items() if n.startswith("crds/")}
    subs: list[Chart] = []
    sub_dirs = {n.split("/")[1] for n in files if n.startswith("charts/") and n.count("/") >= 2}
    for d in sorted(sub_dirs):
        sub_files = {n[len(f"charts/{d}/") :]: x for n, x in files.items() if n.startswith(f"charts/{d}/")}
        if "Chart.yaml" in sub_files:
            subs.append(_chart(d, sub_files))
    for n, d in files.items():
        if n.startswith("charts/") and n.endswith(".tgz") and n.count("/") == 1:
            subs.append(load_chart_archive(d))
    notes = files.get("templates/NOTES.txt", b"").decode()
    return Chart(meta, values, templates, crds, subs, notes)


def _semver_key(v: str) -> tuple[Any, ...]:
    nums = [int(x) for x in re.findall(r"\d+", v.lstrip("v").split("-")[0])[:3]]
    return (*nums, "-" not in v)


# --------------------------------------------------------------------------------------------- helm


class Helm:
    def __init__(self, host: Host, flags: dict[str, Any], out: TextIO, err: TextIO) -> None:
        self.host, self.flags, self.out, self.err = host, flags, out, err
        self._client: Client | None = None
        self.ns = flags.get("namespace") or host.env.get("HELM_NAMESPACE") or ""

    # -- paths
    def _home(self) -> str:
        return self.host.env.get("HOME") or "/root"

    def repo_config(self) -> str:
        return self.host.env.get("HELM_REPOSITORY_CONFIG") or (
            f"{self.host.env.get('XDG_CONFIG_HOME') or self._home() + '/.config'}/helm/repositories.yaml"
        )

    def repo_cache(self) -> str:
        return self.host.env.get("HELM_REPOSITORY_CACHE") or (
            f"{self.host.env.get('XDG_CACHE_HOME') or self._home() + '/.cache'}/helm/repository"
        )

    def p(self, text: str = "") -> None:
        self.out.write(text + "\n")

    # -- cluster
    @property
    def client(self) -> Client:
        if self._client is None:
            cfg = load_kubeconfig(
                self.host,
                self.flags.get("kubeconfig") or self.host.env.get("KUBECONFIG"),
                self.flags.get("kube-context"),
            )
            if not self.ns:
                self.ns = cfg.namespace
            self._client = Client(cfg, timeout=30)
        return self._client

    def namespace(self) -> str:
        if not self.ns:
            _ = self.client
        return self.ns or "default"

    def R(self, name: str) -> Resource:
        r = self.client.resource(name)
        if r is None:
            raise HelmError(f'the server doesn\'t have a resource type "{name}"')
        return r

    # -- repositories
    def repos(self) -> list[Obj]:
        text = self.host.read(self.repo_config())
        return list((u.yaml_load(text) or {}).get("repositories") or []) if text else []

    def save_repos(self, repos: list[Obj]) -> None:
        self.host.write(
            self.repo_config(),
            u.yaml_dump(
                {
                    "apiVersion": "",
                    "generated": time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime()),
                    "repositories": repos,
                }
            ),
            0o600,
        )

    def fetch(self, url: str) -> bytes:
        if url.startswith("file://"):
            data = self.host.read_bytes(urllib.parse.urlsplit(url).path)
            if data is None:
                raise HelmError(f"open {url[7:]}: no such file or directory")
            return data
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as exc:
            raise HelmError(f"failed to fetch {url} : {exc.code} {exc.reason}") from exc
        except OSError as exc:
            reason = getattr(exc, "reason", exc)
            raise HelmError(f'Get "{url}": dial tcp: {reason}') from exc

    def index(self, url: str) -> tuple[bytes, Obj]:
        data = self.fetch(url.rstrip("/") + "/index.yaml")
        try:
            doc = u.yaml_load(data.decode()) or {}
        except Exception as exc:
            raise HelmError(f"error unmarshaling JSON: {exc}") from exc
        if not isinstance(doc, dict) or "entries" not in doc:
            raise HelmError("no API version specified")
        return data, doc

    def cached_index(self, name: str) -> Obj:
        text = self.host.read(f"{self.repo_cache()}/{name}-index.yaml")
        if text is None:
            raise HelmError(
                f"no cached repo found. (try 'helm repo update'): open "
                f"{self.repo_cache()}/{name}-index.yaml: "
                "no such file or directory"
            )
        return u.yaml_load(text) or {}

    # -- releases
    def release_secrets(self, name: str | None, ns: str | None) -> list[Obj]:
        sel = "owner=helm" + (f",name={name}" if name else "")
        return self.client.list(self.R("secrets"), ns, sel)

    @staticmethod
    def decode(sec: Obj) -> Obj:
        raw = base64.b64decode(base64.b64decode(sec["data"]["release"]))
        return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)

    @staticmethod
    def encode(rel: Obj) -> str:
        inner = base64.b64encode(gzip.compress(json.dumps(rel).encode(), mtime=0)).decode()
        return base64.b64encode(inner.encode()).decode()

    def releases(self, name: str, ns: str) -> list[Obj]:
        return sorted((self.decode(s) for s in self.release_secrets(name, ns)), key=lambda r: r["version"])

    def store(self, rel: Obj) -> None:
        name, ns, rev = rel["name"], rel["namespace"], rel["version"]
        sec = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "helm.sh/release.v1",
            "metadata": {
                "name": f"sh.helm.release.v1.{name}.v{rev}",
                "namespace": ns,
                "labels": {
                    "name": name,
                    "owner": "helm",
                    "status": rel["info"]["status"],
                    "version": str(rev),
                },
            },
            "data": {"release": self.encode(rel)},
        }
        res = self.R("secrets")
        live = self.client.find(res, ns, sec["metadata"]["name"])
        if live is None:
            self.client.create(res, ns, sec)
        else:
            sec["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
            self.client.replace(res, ns, sec)


def table(rows: list[list[str]]) -> str:
    """helm's tables: cells padded to their column's width, joined by tabs."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("\t".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n" for r in rows)


def _now_helm() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


def _updated(ts: str) -> str:
    """helm list's UPDATED ('2025-10-21 10:00:00.123456789 +0000 UTC')."""
    return ts.replace("T", " ").replace("Z", " +0000 UTC")


def _last_deployed(ts: str) -> str:
    t = time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")
    return time.strftime("%a %b %e %H:%M:%S %Y", t).replace("  ", " ")


# ------------------------------------------------------------------------------------------- commands


def cmd_version(h: Helm, pos: list[str]) -> int:
    if h.flags.get("short"):
        h.p(f"{VERSION}+g{GIT_COMMIT[:7]}")
    elif h.flags.get("template"):
        h.p(str(h.flags["template"]).replace("{{.Version}}", VERSION).replace("{{ .Version }}", VERSION))
    else:
        h.p(
            f'version.BuildInfo{{Version:"{VERSION}", GitCommit:"{GIT_COMMIT}", GitTreeState:"clean", '
            'GoVersion:"go1.26.5", KubeClientVersion:"v1.36"}'
        )
    return 0


def cmd_repo(h: Helm, pos: list[str]) -> int:
    sub = pos[0] if pos else ""
    if sub == "add":
        if len(pos) < 3:
            raise HelmError(
                '"helm repo add" requires 2 arguments\n\nUsage:  helm repo add [NAME] [URL] [flags]'
            )
        name, url = pos[1], pos[2]
        repos = h.repos()
        same = next((r for r in repos if r.get("name") == name), None)
        if same is not None and not h.flags.get("force-update"):
            if same.get("url") == url:
                h.p(f'"{name}" already exists with the same configuration, skipping')
                return 0
            raise HelmError(f"repository name ({name}) already exists, please specify a different name")
        try:
            data, _doc = h.index(url)
        except HelmError as exc:
            raise HelmError(
                f'looks like "{url}" is not a valid chart repository or cannot be reached: {exc}'
            ) from exc
        h.host.write(f"{h.repo_cache()}/{name}-index.yaml", data)
        repos = [r for r in repos if r.get("name") != name]
        repos.append(
            {
                "caFile": "",
                "certFile": "",
                "insecure_skip_tls_verify": False,
                "keyFile": "",
                "name": name,
                "pass_credentials_all": False,
                "password": "",
                "url": url,
                "username": "",
            }
        )
        h.save_repos(repos)
        h.p(f'"{name}" has been added to your repositories')
        return 0
    if sub == "update":
        repos = h.repos()
        if not repos:
            raise HelmError("no repositories found. You must add one before updating")
        wanted = pos[1:]
        h.p("Hang tight while we grab the latest from your chart repositories...")
        failed = False
        for r in repos:
            if wanted and r["name"] not in wanted:
                continue
            try:
                data, _ = h.index(r["url"])
                h.host.write(f"{h.repo_cache()}/{r['name']}-index.yaml", data)
                h.p(f'...Successfully got an update from the "{r["name"]}" chart repository')
            except HelmError as exc:
                h.p(
                    f'...Unable to get an update from the "{r["name"]}" chart repository '
                    f"({r['url']}):\n\t{exc}"
                )
                failed = True
        if failed:
            raise HelmError("Failed to update the following repositories: " + str([r["url"] for r in repos]))
        h.p("Update Complete. ⎈Happy Helming!⎈")
        return 0
    if sub == "list":
        repos = h.repos()
        if not repos:
            raise HelmError("no repositories to show")
        if h.flags.get("output") == "json":
            h.p(json.dumps([{"name": r["name"], "url": r["url"]} for r in repos]))
        else:
            h.out.write(table([["NAME", "URL"]] + [[r["name"], r["url"]] for r in repos]))
        return 0
    if sub == "remove":
        repos = h.repos()
        for name in pos[1:]:
            if not any(r["name"] == name for r in repos):
                raise HelmError(f'no repo named "{name}" found')
            repos = [r for r in repos if r["name"] != name]
            h.host.remove(f"{h.repo_cache()}/{name}-index.yaml")
            h.p(f'"{name}" has been removed from your repositories')
        h.save_repos(repos)
        return 0
    raise HelmError(f'unknown command "{sub}" for "helm repo"')


def cmd_search(h: Helm, pos: list[str]) -> int:
    if pos[:1] != ["repo"]:
        raise HelmError("only 'helm search repo' is available in the lab")
    keyword = pos[1].lower() if len(pos) > 1 else ""
    rows = []
    for r in h.repos():
        idx = h.cached_index(r["name"])
        for chart, entries in (idx.get("entries") or {}).items():
            full = f"{r['name']}/{chart}"
            ordered = sorted(entries, key=lambda e: _semver_key(str(e.get("version"))), reverse=True)
            if h.flags.get("version"):
                ordered = [e for e in ordered if str(e.get("version")) == h.flags["version"]]
            elif not h.flags.get("versions"):
                ordered = ordered[:1]
            if (
                keyword
                and keyword not in full.lower()
                and not any(keyword in str(e.get("description", "")).lower() for e in ordered)
            ):
                continue
            for e in ordered:
                rows.append(
                    {
                        "name": full,
                        "version": str(e.get("version")),
                        "app_version": str(e.get("appVersion", "")),
                        "description": e.get("description", ""),
                    }
                )
    if h.flags.get("output") == "json":
        h.p(json.dumps(rows))
    elif h.flags.get("output") == "yaml":
        h.out.write(u.yaml_dump(rows))
    elif not rows:
        h.p("No results found")
    else:
        h.out.write(
            table(
                [["NAME", "CHART VERSION", "APP VERSION", "DESCRIPTION"]]
                + [[r["name"], r["version"], r["app_version"], r["description"]] for r in rows],
            )
        )
    return 0


def resolve_chart(h: Helm, ref: str) -> tuple[Chart, str]:
    """(chart, where it came from) for repo/chart, a local directory or archive, or a URL."""
    version = h.flags.get("version")
    if h.flags.get("repo"):
        repo_url = str(h.flags["repo"])
        _data, idx = h.index(repo_url)
        return _from_index(h, idx, repo_url, ref, ref, version)
    if ref.startswith(("http://", "https://", "file://")):
        return load_chart_archive(h.fetch(ref)), ref
    local = h.host.p(ref)
    if (ref.startswith(("/", ".")) or "/" not in ref or local.exists()) and local.exists():
        if local.is_dir():
            return load_chart_dir(h.host, ref), ref
        return load_chart_archive(local.read_bytes()), ref
    repo_name, _, chart_name = ref.partition("/")
    repo = next((r for r in h.repos() if r["name"] == repo_name), None)
    if repo is None or not chart_name:
        raise HelmError(
            f"repo {repo_name} not found"
            if chart_name
            else f"non-absolute URLs should be in form of repo_name/path_to_chart, got: {ref}"
        )
    return _from_index(h, h.cached_index(repo_name), repo["url"], chart_name, repo_name, version)


def _from_index(
    h: Helm, idx: Obj, repo_url: str, chart_name: str, repo_name: str, version: str | None
) -> tuple[Chart, str]:
    entries = (idx.get("entries") or {}).get(chart_name)
    if not entries:
        raise HelmError(
            f"chart \"{chart_name}\" not found in {repo_name} index. (try 'helm repo update'): no chart "
            f"name found"
        )
    if version:
        cands = [e for e in entries if str(e.get("version")) in (version, f"v{version}", version.lstrip("v"))]
        if not cands:
            raise HelmError(
                f'chart "{chart_name}" matching {version} not found in {repo_name} index. (try \'helm repo '
                f"update'): no chart version found for {chart_name}-{version}"
            )
        entry = cands[0]
    else:
        entry = sorted(entries, key=lambda e: _semver_key(str(e.get("version"))))[-1]
    url = (entry.get("urls") or [""])[0]
    full = urllib.parse.urljoin(repo_url.rstrip("/") + "/", url)
    return load_chart_archive(h.fetch(full)), full


def user_values(h: Helm) -> Obj:
    vals: Obj = {}
    for f in h.flags.get("values") or []:
        if f == "-":
            text = sys.stdin.read()
        elif f.startswith(("http://", "https://")):
            text = h.fetch(f).decode()
        else:
            text = h.host.read(f)
            if text is None:
                raise HelmError(f"open {f}: no such file or directory")
        try:
            doc = u.yaml_load(text) or {}
        except Exception as exc:
            raise HelmError(f"failed to parse {f}: error converting YAML to JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise HelmError(
                f"failed to parse {f}: error unmarshaling JSON: cannot unmarshal into Go value of type map"
            )
        vals = u.deep_merge(vals, doc)
    for s in h.flags.get("set") or []:
        apply_set(vals, s)
    for s in h.flags.get("set-string") or []:
        apply_set(vals, s, as_string=True)
    return vals


def _condition(values: Obj, cond: str) -> bool | None:
    for c in cond.split(","):
        cur: Any = values
        for part in c.strip().split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if isinstance(cur, bool):
            return cur
    return None


# The real helm (a helm v4 binary, from a PyPI package) that renders charts: the lab's helm package
# carries it here; tests off-host name it in GPUPROV_LAB_REAL_HELM. The role installs the same helm release
# (4.2.3) on real hosts.
REAL_HELM = "/usr/lib/gpuprov-lab/kube/helm/real-helm"
# The hook phases an install and an upgrade run (helm's pkg/release hook events); a hook of another
# phase (delete, rollback, test) does not run then, so the lab's helm leaves it out.
RUN_HOOKS = {True: {"pre-install", "post-install"}, False: {"pre-upgrade", "post-upgrade"}}


def real_helm() -> str:
    import os

    path = os.environ.get("GPUPROV_LAB_REAL_HELM") or REAL_HELM
    if not os.access(path, os.X_OK):
        raise HelmError(f"the lab's helm renders charts with the real helm, and {path} is missing")
    return path


def run_real_helm(chart: Chart, args: list[str]) -> str:
    """Run the real helm on the chart (``helm ARGS[0] [ARGS[1]] CHART ARGS[2:]`` for show, ``helm
    template NAME CHART ...`` for template), offline, with a throw-away home; its stdout."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpuprov-helm-") as tmp:
        ref = chart.directory
        if chart.archive:
            ref = os.path.join(tmp, "chart.tgz")
            with open(ref, "wb") as fh:
                fh.write(chart.archive)
        if not ref:
            raise HelmError(f"chart {chart.name}: nothing to render (no archive, no directory)")
        argv = [real_helm(), *args[:2], ref, *args[2:]]
        env = {"HOME": tmp, "PATH": "/usr/bin:/bin", **{k: os.path.join(tmp, k) for k in (
            "HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}}  # fmt: skip
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    if res.returncode != 0:
        why = res.stderr.strip().removeprefix("Error: ")
        raise HelmError(why or f"helm {args[0]} failed (rc {res.returncode})")
    return res.stdout


def render(
    h: Helm, chart: Chart, values: Obj, name: str, ns: str, revision: int, install: bool
) -> tuple[str, list[Obj], list[Obj], str]:
    """(manifest text, resource docs, CRD docs, notes): the real helm's `helm template` of the chart
    with the user's values, for the cluster's Kubernetes version. CRDs come from the chart's crds/
    directories (its own and its subcharts'), as helm installs them."""
    import os
    import tempfile

    kv = "v1.36.3"
    with contextlib.suppress(ClientError, ApiError):
        kv = h.client.request("GET", "/version").get("gitVersion", kv)
    with tempfile.TemporaryDirectory(prefix="gpuprov-helm-") as tmp:
        values_file = os.path.join(tmp, "values.yaml")
        with open(values_file, "w") as fh:
            fh.write(u.yaml_dump(values))
        args = ["template", name, "--namespace", ns, "--values", values_file, "--kube-version", kv]
        stdout = run_real_helm(chart, args + ([] if install else ["--is-upgrade"]))
    parts: list[str] = []
    docs: list[Obj] = []
    for chunk in re.split(r"(?m)^---[ \t]*$", stdout):
        if not chunk.strip():
            continue
        doc = u.yaml_load(chunk)
        if not isinstance(doc, dict) or not doc.get("kind"):
            continue
        hook = str((u.dig(doc, "metadata", "annotations") or {}).get("helm.sh/hook") or "")
        if hook:
            phases = {p.strip() for p in hook.split(",")}
            if not phases & RUN_HOOKS[install]:
                continue
            raise HelmError(
                f"{doc['kind']} {u.dig(doc, 'metadata', 'name')} is a {hook} hook: the lab's helm runs no "
                "hooks (hook jobs need the real images); set the value that turns it off"
            )
        docs.append(doc)
        parts.append(f"---\n{chunk.strip()}\n")

    def crd_docs(c: Chart, vals: Obj) -> list[Obj]:
        # A subchart whose dependency condition is false is left out, its crds/ included (as helm does).
        own = [d for n in sorted(c.crds) for d in u.yaml_load_all(c.crds[n]) if isinstance(d, dict)]
        deps = {d.get("name"): d for d in c.meta.get("dependencies") or []}
        for sub in c.subcharts:
            cond = deps.get(sub.name, {}).get("condition")
            if cond and _condition(vals, cond) is False:
                continue
            own += crd_docs(sub, u.deep_merge(sub.values, vals.get(sub.name) or {}))
        return own

    return "".join(parts), docs, crd_docs(chart, u.deep_merge(chart.values, values)), ""


def _ordered(docs: list[Obj]) -> list[Obj]:
    def key(d: Obj) -> int:
        k = d.get("kind", "")
        return KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)

    return sorted(docs, key=key)


def _apply(
    h: Helm, docs: list[Obj], name: str, ns: str, old_keys: set[tuple[str, str, str]], verb: str
) -> None:
    for d in _ordered(docs):
        res = h.client.resource_for(d.get("apiVersion", ""), d.get("kind", ""))
        if res is None:
            raise HelmError(
                f"{verb} FAILED: unable to build kubernetes objects from release manifest: resource mapping "
                f'not found for name: "{u.dig(d, "metadata", "name")}" namespace: "{ns}" from "": no matches '
                f'for kind "{d.get("kind")}" in version "{d.get("apiVersion")}"\nensure CRDs are installed '
                "first"
            )
        obj = json.loads(json.dumps(d))
        meta = obj.setdefault("metadata", {})
        obj_ns = (meta.get("namespace") or ns) if res.namespaced else ""
        if res.namespaced:
            meta["namespace"] = obj_ns
        meta.setdefault("labels", {})["app.kubernetes.io/managed-by"] = "Helm"
        meta.setdefault("annotations", {}).update(
            {"meta.helm.sh/release-name": name, "meta.helm.sh/release-namespace": ns}
        )
        live = h.client.find(res, obj_ns, meta["name"])
        if live is None:
            h.client.create(res, obj_ns, obj)
            continue
        owner = (u.dig(live, "metadata", "annotations") or {}).get("meta.helm.sh/release-name")
        if (res.rid, obj_ns, meta["name"]) not in old_keys and owner != name:
            raise HelmError(
                f"{verb} FAILED: Unable to continue with "
                f"{'install' if verb == 'INSTALLATION' else 'update'}: "
                f'{d["kind"]} "{meta["name"]}" in namespace "{obj_ns}" exists and cannot be imported into '
                f"the current "
                "release: invalid ownership metadata; label validation error: missing key "
                '"app.kubernetes.io/managed-by": must be set to "Helm"; annotation validation error: '
                "missing key "
                f'"meta.helm.sh/release-name": must be set to "{name}"; annotation validation error: '
                f"missing key "
                f'"meta.helm.sh/release-namespace": must be set to "{ns}"'
            )
        meta["resourceVersion"] = live["metadata"]["resourceVersion"]
        if "status" in live:
            obj["status"] = live["status"]
        if res.kind == "Service" and u.dig(live, "spec", "clusterIP"):
            obj.setdefault("spec", {}).setdefault("clusterIP", live["spec"]["clusterIP"])
        h.client.replace(res, obj_ns, obj)


def _keys(h: Helm, docs: list[Obj], ns: str) -> dict[tuple[str, str, str], Resource]:
    out = {}
    for d in docs:
        res = h.client.resource_for(d.get("apiVersion", ""), d.get("kind", ""))
        if res is None:
            continue
        obj_ns = (u.dig(d, "metadata", "namespace") or ns) if res.namespaced else ""
        out[(res.rid, obj_ns, u.dig(d, "metadata", "name"))] = res
    return out


def ready(h: Helm, docs: list[Obj], ns: str) -> bool:
    """helm --wait: Deployments, DaemonSets, StatefulSets available, Pods ready, PVCs bound."""
    for (_rid, obj_ns, name), res in _keys(h, docs, ns).items():
        o = h.client.find(res, obj_ns, name)
        if o is None:
            return False
        st = o.get("status") or {}
        gen_ok = st.get("observedGeneration", o["metadata"].get("generation", 1)) >= o["metadata"].get(
            "generation", 1
        )
        if res.kind == "Deployment":
            want = u.dig(o, "spec", "replicas", default=1)
            if not gen_ok or st.get("updatedReplicas", 0) < want or st.get("availableReplicas", 0) < want:
                return False
        elif res.kind == "DaemonSet":
            want = st.get("desiredNumberScheduled", 0)
            if not gen_ok or st.get("numberReady", 0) < want or st.get("updatedNumberScheduled", 0) < want:
                return False
        elif res.kind == "StatefulSet":
            if st.get("readyReplicas", 0) < u.dig(o, "spec", "replicas", default=1):
                return False
        elif res.kind == "Pod":
            if not any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
            ):
                return False
        elif res.kind == "PersistentVolumeClaim" and st.get("phase") != "Bound":
            return False
    return True


def print_release(h: Helm, rel: Obj) -> None:
    fmt = h.flags.get("output")
    if fmt == "json":
        h.p(json.dumps(rel))
        return
    if fmt == "yaml":
        h.out.write(u.yaml_dump(rel))
        return
    info = rel["info"]
    h.p(f"NAME: {rel['name']}")
    h.p(f"LAST DEPLOYED: {_last_deployed(info['last_deployed'])}")
    h.p(f"NAMESPACE: {rel['namespace']}")
    h.p(f"STATUS: {info['status']}")
    h.p(f"REVISION: {rel['version']}")
    h.p("TEST SUITE: None")
    if info.get("notes"):
        h.p("NOTES:")
        h.p(info["notes"].rstrip("\n"))


def cmd_upgrade(h: Helm, pos: list[str], install_verb: bool = False) -> int:
    if len(pos) < 2:
        raise HelmError(f'"helm {"install" if install_verb else "upgrade"}" requires 2 arguments')
    name, ref = pos[0], pos[1]
    ns = h.namespace()
    if (
        not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name)
        or len(name) > 53
    ):
        raise HelmError(
            f'release name "{name}": invalid release name, must match regex ^[a-z0-9]([-a-z0-9]*[a-z0-9])?'
            r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ and the length must not be longer than 53"
        )
    history = h.releases(name, ns)
    current = next(
        (
            r
            for r in reversed(history)
            if r["info"]["status"] in ("deployed", "failed", "pending-install", "pending-upgrade")
        ),
        None,
    )
    install = not history or all(r["info"]["status"] == "uninstalled" for r in history)
    if install_verb and not install:
        raise HelmError("INSTALLATION FAILED: cannot re-use a name that is still in use")
    if not install_verb and install and not h.flags.get("install"):
        raise HelmError(f'UPGRADE FAILED: "{name}" has no deployed releases')
    verb = "INSTALLATION" if install else "UPGRADE"
    chart, _src = resolve_chart(h, ref)
    values = user_values(h)
    if (
        not install
        and current is not None
        and h.flags.get("reuse-values")
        and not h.flags.get("reset-values")
    ):
        values = u.deep_merge(current.get("config") or {}, values)
    revision = (max(r["version"] for r in history) + 1) if history else 1
    manifest, docs, crds, notes = render(h, chart, values, name, ns, revision, install)
    if h.flags.get("dry-run"):
        h.p(
            f"NAME: {name}\nNAMESPACE: {ns}\nSTATUS: "
            f"pending-{'install' if install else 'upgrade'}\nREVISION: "
            f"{revision}\nTEST SUITE: None\nHOOKS:\nMANIFEST:\n{manifest}"
        )
        return 0
    ns_res = h.R("namespaces")
    if h.client.find(ns_res, "", ns) is None:
        if not h.flags.get("create-namespace"):
            raise HelmError(f'{verb} FAILED: create: failed to create: namespaces "{ns}" not found')
        h.client.create(ns_res, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    if install and not install_verb:
        h.p(f'Release "{name}" does not exist. Installing it now.')
    if not h.flags.get("skip-crds"):
        crd_res = h.R("customresourcedefinitions")
        for crd in crds:
            if h.client.find(crd_res, "", u.dig(crd, "metadata", "name")) is None:
                h.client.create(crd_res, "", crd)
        if crds:
            h.client.resources(refresh=True)
    now = _now_helm()
    chart_doc = {
        "metadata": {**chart.meta},
        "lock": None,
        "templates": [],
        "values": chart.values,
        "schema": None,
        "files": [],
    }
    rel = {
        "name": name,
        "info": {
            "first_deployed": history[0]["info"]["first_deployed"] if history else now,
            "last_deployed": now,
            "deleted": "",
            "description": "Install complete" if install else "Upgrade complete",
            "status": "deployed",
            "notes": notes,
        },
        "chart": chart_doc,
        "config": values,
        "manifest": manifest,
        "version": revision,
        "namespace": ns,
    }
    old_docs: list[Obj] = []
    if current is not None:
        old_docs = [d for d in u.yaml_load_all(current.get("manifest", "")) if isinstance(d, dict)]
    old_keys = _keys(h, old_docs, ns)
    try:
        _apply(h, docs, name, ns, set(old_keys), verb)
        new_keys = _keys(h, docs, ns)
        for key, res in old_keys.items():
            if key not in new_keys and h.client.find(res, key[1], key[2]) is not None:
                h.client.delete(res, key[1], key[2])
    except HelmError:
        raise
    except ApiError as exc:
        rel["info"].update({"status": "failed", "description": f'Release "{name}" failed: {exc.message}'})
        h.store(rel)
        raise HelmError(f"{verb} FAILED: {exc.message}") from exc
    if h.flags.get("wait") or h.flags.get("atomic"):
        timeout = u.parse_duration(h.flags.get("timeout") or "5m0s")
        deadline = time.monotonic() + timeout
        while not ready(h, docs, ns):
            if time.monotonic() > deadline:
                rel["info"].update(
                    {"status": "failed", "description": f'Release "{name}" failed: context deadline exceeded'}
                )
                h.store(rel)
                if h.flags.get("atomic") and install:
                    _uninstall(h, name, ns, quiet=True)
                    raise HelmError(
                        f"{verb} FAILED: release {name} failed, and has been uninstalled due to atomic being "
                        "set: context deadline exceeded"
                    )
                raise HelmError(f"{verb} FAILED: context deadline exceeded")
            time.sleep(0.5)
    for old in history:
        if old["info"]["status"] in ("deployed", "failed") and old["version"] != revision:
            old["info"]["status"] = "superseded"
            h.store(old)
    h.store(rel)
    if not install:
        h.p(f'Release "{name}" has been upgraded. Happy Helming!')
    print_release(h, rel)
    return 0


def cmd_install(h: Helm, pos: list[str]) -> int:
    return cmd_upgrade(h, pos, install_verb=True)


def _latest(h: Helm, name: str, ns: str) -> Obj:
    rels = [r for r in h.releases(name, ns) if r["info"]["status"] != "uninstalled"]
    if not rels:
        raise HelmError("release: not found")
    return rels[-1]


def cmd_list(h: Helm, pos: list[str]) -> int:
    ns = None if h.flags.get("all-namespaces") else h.namespace()
    latest: dict[tuple[str, str], Obj] = {}
    for sec in h.release_secrets(None, ns):
        r = h.decode(sec)
        key = (r["namespace"], r["name"])
        if key not in latest or r["version"] > latest[key]["version"]:
            latest[key] = r
    wanted = {st for st in ("deployed", "failed", "pending", "superseded", "uninstalled") if h.flags.get(st)}
    if not wanted:
        wanted = {"deployed", "failed"}
    pattern = re.compile(h.flags["filter"]) if h.flags.get("filter") else None
    rows = []
    for (_ns, _name), r in sorted(latest.items()):
        st = r["info"]["status"]
        shown = "pending" if st.startswith("pending") else st
        if not h.flags.get("all") and shown not in wanted:
            continue
        if pattern is not None and not pattern.search(r["name"]):
            continue
        chart = r["chart"]["metadata"]
        rows.append(
            {
                "name": r["name"],
                "namespace": r["namespace"],
                "revision": str(r["version"]),
                "updated": _updated(r["info"]["last_deployed"]),
                "status": st,
                "chart": f"{chart.get('name')}-{chart.get('version')}",
                "app_version": str(chart.get("appVersion", "")),
            }
        )
    fmt = h.flags.get("output")
    if fmt == "json":
        h.p(json.dumps(rows))
    elif fmt == "yaml":
        h.out.write(u.yaml_dump(rows))
    else:
        grid = [["NAME", "NAMESPACE", "REVISION", "UPDATED", "STATUS", "CHART", "APP VERSION"]]
        grid += [
            [
                r["name"],
                r["namespace"],
                r["revision"],
                r["updated"],
                r["status"],
                r["chart"],
                r["app_version"],
            ]
            for r in rows
        ]
        h.out.write(table(grid))
    return 0


def cmd_status(h: Helm, pos: list[str]) -> int:
    if not pos:
        raise HelmError('"helm status" requires 1 argument')
    rel = _latest(h, pos[0], h.namespace())
    if h.flags.get("revision"):
        found = [
            r for r in h.releases(pos[0], h.namespace()) if str(r["version"]) == str(h.flags["revision"])
        ]
        if not found:
            raise HelmError("release: not found")
        rel = found[0]
    out = dict(rel)
    if h.flags.get("output") in ("json", "yaml"):
        out.pop("chart", None)
        out.pop("config", None)
        if h.flags["output"] == "json":
            h.p(json.dumps(out))
        else:
            h.out.write(u.yaml_dump(out))
        return 0
    print_release(h, rel)
    return 0


def cmd_get(h: Helm, pos: list[str]) -> int:
    if len(pos) < 2:
        raise HelmError('"helm get" requires a subcommand and a release name')
    what, name = pos[0], pos[1]
    rels = h.releases(name, h.namespace())
    if not rels:
        raise HelmError("release: not found")
    rel = rels[-1]
    if h.flags.get("revision"):
        rel = next((r for r in rels if str(r["version"]) == str(h.flags["revision"])), None) or rel
    if what == "values":
        vals = rel.get("config") or {}
        if h.flags.get("all"):
            vals = u.deep_merge(rel["chart"].get("values") or {}, vals)
        fmt = h.flags.get("output")
        if fmt == "json":
            h.p(json.dumps(vals if vals else None))
        elif fmt == "yaml":
            h.out.write(u.yaml_dump(vals) if vals else "null\n")
        else:
            h.p("COMPUTED VALUES:" if h.flags.get("all") else "USER-SUPPLIED VALUES:")
            h.out.write(u.yaml_dump(vals) if vals else "null\n")
        return 0
    if what == "manifest":
        h.out.write(rel.get("manifest", ""))
        return 0
    if what == "notes":
        h.p("NOTES:\n" + rel["info"].get("notes", ""))
        return 0
    if what == "all":
        h.out.write(u.yaml_dump(rel))
        return 0
    raise HelmError(f'unknown command "{what}" for "helm get"')


def cmd_history(h: Helm, pos: list[str]) -> int:
    if not pos:
        raise HelmError('"helm history" requires 1 argument')
    rels = h.releases(pos[0], h.namespace())
    if not rels:
        raise HelmError("release: not found")
    rows = [
        {
            "revision": r["version"],
            "updated": r["info"]["last_deployed"],
            "status": r["info"]["status"],
            "chart": f"{r['chart']['metadata'].get('name')}-{r['chart']['metadata'].get('version')}",
            "app_version": str(r["chart"]["metadata"].get("appVersion", "")),
            "description": r["info"]["description"],
        }
        for r in rels
    ]
    if h.flags.get("output") == "json":
        h.p(json.dumps(rows))
    else:
        h.out.write(
            table(
                [["REVISION", "UPDATED", "STATUS", "CHART", "APP VERSION", "DESCRIPTION"]]
                + [
                    [
                        str(r["revision"]),
                        _last_deployed(r["updated"]),
                        r["status"],
                        r["chart"],
                        r["app_version"],
                        r["description"],
                    ]
                    for r in rows
                ],
            )
        )
    return 0


def _uninstall(h: Helm, name: str, ns: str, quiet: bool = False) -> None:
    rels = h.releases(name, ns)
    if not rels:
        raise HelmError(f"uninstall: Release not loaded: {name}: release: not found")
    rel = rels[-1]
    docs = [d for d in u.yaml_load_all(rel.get("manifest", "")) if isinstance(d, dict)]
    for (_rid, obj_ns, obj_name), res in reversed(list(_keys(h, _ordered(docs), ns).items())):
        try:
            h.client.delete(res, obj_ns, obj_name)
        except ApiError as exc:
            if exc.code != 404:
                raise
    for sec in h.release_secrets(name, ns):
        h.client.delete(h.R("secrets"), ns, sec["metadata"]["name"])


def cmd_uninstall(h: Helm, pos: list[str]) -> int:
    if not pos:
        raise HelmError('"helm uninstall" requires at least 1 argument')
    for name in pos:
        _uninstall(h, name, h.namespace())
        h.p(f'release "{name}" uninstalled')
    return 0


def cmd_template(h: Helm, pos: list[str]) -> int:
    if len(pos) < 2:
        raise HelmError('"helm template" requires at least 1 argument')
    name, ref = pos[0], pos[1]
    chart, _ = resolve_chart(h, ref)
    ns = h.ns or "default"
    h.ns = ns
    manifest, _docs, crds, _notes = render(h, chart, user_values(h), name, ns, 1, True)
    if h.flags.get("include-crds"):
        for c in crds:
            h.out.write("---\n" + u.yaml_dump(c))
    h.out.write(manifest)
    return 0


def cmd_show(h: Helm, pos: list[str]) -> int:
    """helm show crds|values|chart|readme|all: the real helm's answer for the chart (offline)."""
    if len(pos) < 2 or pos[0] not in ("crds", "values", "chart", "readme", "all"):
        raise HelmError('"helm show" requires a subcommand (crds, values, chart, readme or all) and a chart')
    chart, _ = resolve_chart(h, pos[1])
    h.out.write(run_real_helm(chart, ["show", pos[0]]))
    return 0


COMMANDS = {
    "version": cmd_version,
    "show": cmd_show,
    "repo": cmd_repo,
    "search": cmd_search,
    "upgrade": cmd_upgrade,
    "install": cmd_install,
    "list": cmd_list,
    "ls": cmd_list,
    "status": cmd_status,
    "get": cmd_get,
    "history": cmd_history,
    "uninstall": cmd_uninstall,
    "delete": cmd_uninstall,
    "template": cmd_template,
}


def main(
    argv: list[str], host: Host | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    host = host or Host()
    out = out or sys.stdout
    err = err or sys.stderr
    h: Helm | None = None
    try:
        pos, flags = parse(argv)
        if not pos:
            out.write("The Kubernetes package manager (SIMULATED, gpuprov lab)\n")
            return 0
        fn = COMMANDS.get(pos[0])
        if fn is None:
            raise HelmError(f'unknown command "{pos[0]}" for "helm"\nRun \'helm --help\' for usage.')
        h = Helm(host, flags, out, err)
        return fn(h, pos[1:])
    except HelmError as exc:
        err.write(f"Error: {exc}\n")
        return 1
    except ApiError as exc:
        err.write(f"Error: {exc.message}\n")
        return 1
    except ClientError as exc:
        err.write(f"Error: Kubernetes cluster unreachable: {exc}\n")
        return 1
    finally:
        if h is not None and h._client is not None:
            h._client.close()


def chart_archive(files: dict[str, bytes], top: str) -> bytes:
    """A reproducible chart .tgz (sorted entries, fixed mtimes) of files relative to the chart dir."""
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):  # type: ignore[arg-type]
        for name in sorted(files):
            data = files[name]
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mtime = 1735689600
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
