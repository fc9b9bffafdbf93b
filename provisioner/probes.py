"""Read-only probes: what runs on a host, and pure parsers for what it prints.

The probe set IS the host-snapshot contract (shared design: host-snapshot.md): a probe's name is
the file `gpuprov snapshot` writes. Every probe for a host runs in ONE shell script over ONE
channel, printing delimited sections (output, rc, timing, stderr), because each extra SSH channel
is another session on the host and costs far more than the commands themselves.

The remote side is POSIX sh with coreutils only: no bash-isms, no lspci/systemctl/journalctl/
mokutil required (the real H200 host has none of them). Parsers take text and return plain data,
raising ParseError on garbled or truncated input; they never touch a host.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import textwrap
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import defusedxml
import defusedxml.ElementTree as defused_et

from provisioner.hostnumbers import HostNumberError, is_index, parse_decimal, parse_int
from provisioner.hosttext import first_line

# A probe that decides it does not apply here (no kubeconfig, no dcgmi, no such config file)
# exits with this code and says why on stderr. It is "not applicable", not a failure.
RC_NOT_APPLICABLE = 200


class ParseError(ValueError):
    """A probe's output could not be understood (garbled, truncated, unexpected format)."""


@dataclass(frozen=True)
class Probe:
    name: str  # the snapshot file name
    body: str  # POSIX sh function body; stdout is the file's content
    timeout_s: int = 20
    summary: str = ""

    @property
    def command(self) -> str:
        """The shell text recorded in a snapshot's meta.json (what produced the file)."""
        return textwrap.dedent(self.body).strip()


SERVICE_UNITS = ("nvidia-persistenced", "nvidia-fabricmanager", "docker", "containerd", "kubelet")

_PCI_FROM_SYSFS = r"""
    if command -v lspci >/dev/null 2>&1; then lspci -Dnn; return; fi
    for d in /sys/bus/pci/devices/*; do
      [ -r "$d/class" ] || continue
      read c <"$d/class"; read v <"$d/vendor"; read i <"$d/device"; r=
      [ -r "$d/revision" ] && read r <"$d/revision"
      c=${c#0x}; c=${c%??}; v=${v#0x}; i=${i#0x}; r=${r#0x}
      case $c in
        0300) n="VGA compatible controller";; 0302) n="3D controller";; 0380) n="Display controller";;
        0680) n="Bridge";; 0604) n="PCI bridge";; 0600) n="Host bridge";; 0601) n="ISA bridge";;
        0200) n="Ethernet controller";; 0207) n="Infiniband controller";;
        0108) n="Non-Volatile memory controller";;
        0106) n="SATA controller";; 0100) n="SCSI storage controller";; 0c03) n="USB controller";;
        *) n="Class $c";;
      esac
      case $v in 10de) vn="NVIDIA Corporation";; 8086) vn="Intel Corporation";;
        15b3) vn="Mellanox Technologies";;
        1af4) vn="Red Hat, Inc.";; 1022) vn="Advanced Micro Devices, Inc. [AMD]";; *) vn="Device";; esac
      if [ -n "$r" ]; then
        printf '%s %s [%s]: %s Device [%s:%s] (rev %s)\n' "${d##*/}" "$n" "$c" "$vn" "$v" "$i" "$r"
      else
        printf '%s %s [%s]: %s Device [%s:%s]\n' "${d##*/}" "$n" "$c" "$vn" "$v" "$i"
      fi
    done
"""

# PCI functions, loaded kernel modules, the loaded driver and Secure Boot come from the preflight role's
# own host probe (roles/preflight/files/gpu_host_facts.py, standard library only, Python 3.8+), so the
# role and verification read these facts one way. The probe scripts' functions are indented, which a
# heredoc would carry into Python: the file travels base64-encoded on one line instead.
HOST_FACTS = "host-facts.json"
HOST_FACTS_SECTIONS = "pci,modules,driver,secure_boot"


def _host_facts_body() -> str:
    import base64

    from provisioner.content import ROLES_DIR

    source = (ROLES_DIR / "preflight" / "files" / "gpu_host_facts.py").read_bytes()
    encoded = base64.b64encode(source).decode()
    return (
        'command -v python3 >/dev/null 2>&1 || { echo "python3 not found" >&2; return 127; }\n'
        f"printf '%s' '{encoded}' | base64 -d | t 20 python3 - --sections {HOST_FACTS_SECTIONS} --all-pci"
    )


_SERVICES = r"""
    if ! command -v systemctl >/dev/null 2>&1 || [ ! -d /run/systemd/system ]; then
      echo "no systemd on this host (systemctl absent or not booted with systemd)" >&2; return 200
    fi
    U="nvidia-persistenced nvidia-fabricmanager docker containerd kubelet"
    systemctl is-active $U 2>/dev/null |
      for u in $U; do read s || s=unknown; printf '%s\t%s\n' "$u" "$s"; done
"""

_SERVICE_PROCESSES = r"""
    C=$(cat /proc/[0-9]*/comm 2>/dev/null)
    for p in nvidia-persistenced:nvidia-persistenced nvidia-fabricmanager:nv-fabricmanager docker:dockerd \
             containerd:containerd kubelet:kubelet; do
      case "
$C
" in *"
${p#*:}
"*) s=running;; *) s=not-running;; esac
      printf '%s\t%s\n' "${p%%:*}" "$s"
    done
"""

_KERNEL_LOG = r"""
    if { [ -d /run/log/journal ] || [ -d /var/log/journal ]; } && command -v journalctl >/dev/null 2>&1 &&
       journalctl -k -b -n 1 -q --no-pager 2>/dev/null | grep -q .; then
      t 60 journalctl -k -b --no-pager -o short-monotonic
    else
      t 30 dmesg
    fi
"""

_SECUREBOOT = r"""
    if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state; return; fi
    if [ ! -d /sys/firmware/efi ]; then
      echo "SecureBoot not applicable (legacy BIOS boot: no /sys/firmware/efi)"; return 0
    fi
    f=/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c
    if [ ! -r "$f" ]; then echo "SecureBoot unknown (no SecureBoot EFI variable)"; return 0; fi
    v=$(od -An -t u1 -j 4 -N 1 "$f" | tr -d ' ')
    if [ "$v" = 1 ]; then echo "SecureBoot enabled"; else echo "SecureBoot disabled"; fi
"""

# What containerd really uses: config.toml with every file it imports merged in, as containerd merges
# them (containerd 1.x lets an imported plugin table replace config.toml's). Reads files only; no
# running daemon needed.
_CONTAINERD_DUMP = r"""
    command -v containerd >/dev/null 2>&1 || { echo "containerd not installed" >&2; return 200; }
    t 20 containerd config dump
"""

_KUBE_NODE = r"""
    if [ -r /etc/kubernetes/admin.conf ]; then kc=/etc/kubernetes/admin.conf
    elif [ -r /etc/kubernetes/kubelet.conf ]; then kc=/etc/kubernetes/kubelet.conf
    else echo "not a Kubernetes node: no /etc/kubernetes/admin.conf or kubelet.conf" >&2; return 200; fi
    command -v kubectl >/dev/null 2>&1 || {
      echo "kubectl not found (kubeconfig $kc present)" >&2; return 127; }
    read n </proc/sys/kernel/hostname; n=$(printf '%s' "$n" | tr 'A-Z' 'a-z')
    t 30 kubectl --kubeconfig "$kc" --request-timeout=20s get node "$n" -o json
"""

_DCGM = r"""
    command -v dcgmi >/dev/null 2>&1 || { echo "dcgmi not installed" >&2; return 200; }
    t 300 dcgmi diag -r 1 -j
"""

_SMOKE = r"""
    [ -n "$SMOKE_IMAGE" ] || { echo "no container.smoke_image configured" >&2; return 200; }
    command -v docker >/dev/null 2>&1 || { echo "docker not installed" >&2; return 200; }
    docker image inspect "$SMOKE_IMAGE" >/dev/null 2>&1 || {
      echo "image $SMOKE_IMAGE is not present locally (pull it first; verify never pulls)" >&2; return 200; }
    t 120 docker run --rm --gpus all "$SMOKE_IMAGE" nvidia-smi -L
"""


# The DCGM exporter of this node, scraped from the node itself. The GPU Operator runs it with no host
# port: containerPort 9400 ("metrics") behind a ClusterIP Service (NVIDIA/gpu-operator v25.10.0
# assets/state-dcgm-exporter 0400_service.yaml, 0800_daemonset.yaml), so the probe asks the API server
# for the exporter pod on this node and GETs http://<pod IP>:<port>/metrics (pod IPs are reachable from
# every node: the Kubernetes network model). It reads with the kubelet's own credentials, which the Node
# authorizer lets list pods only with the field selector spec.nodeName=<this node> (kubernetes/kubernetes
# plugin/pkg/auth/authorizer/node/node_authorizer.go, authorizePod: "can only list/watch pods with
# spec.nodeName field selector"; selector authorization is on by default from v1.32 and GA in v1.34), and
# that is the query made here; a label selector narrows it further. The kubelet's identity is
# system:node:<node name>, the node name being the host name as kubeadm registers it (lower-cased), the
# name the kube-node.json probe reads too. Standard library only (Python 3.8+), no proxy, bounded time
# and size; the pod IP is checked to be an IP address before it becomes a URL. Prints one JSON object:
# {"node", "kubeconfig", "pods": [{"namespace", "name", "phase", "ready", "reason", "ip", "port"}],
# "scrape": null | {"pod", "url", "status", "error", "truncated"}, "metrics": text}.
DCGM_EXPORTER = "dcgm-exporter.json"
DCGM_EXPORTER_LABEL = "app=nvidia-dcgm-exporter"
DCGM_EXPORTER_MAX_BYTES = 8 * 1024 * 1024
_DCGM_EXPORTER_PY = r"""
import ipaddress, json, subprocess, sys, urllib.error, urllib.request

kubeconfig, node, selector, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cmd = ["kubectl", "--kubeconfig", kubeconfig, "--request-timeout=15s", "get", "pods", "-A", "-l", selector,
       "--field-selector", "spec.nodeName=" + node, "-o", "json"]
try:
    run = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         timeout=25)
except subprocess.TimeoutExpired:
    sys.stderr.write("kubectl get pods timed out\n")
    sys.exit(124)
if run.returncode != 0:
    sys.stderr.write(run.stderr.decode("utf-8", "replace")[-2000:])
    sys.exit(run.returncode if 0 < run.returncode < 126 else 1)
pods = []
for item in json.loads(run.stdout.decode("utf-8", "replace")).get("items") or []:
    meta, status, spec = item.get("metadata") or {}, item.get("status") or {}, item.get("spec") or {}
    conditions, containers = status.get("conditions") or [], status.get("containerStatuses") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    waiting = [((c.get("state") or {}).get("waiting") or {}).get("reason") for c in containers]
    port = 9400
    for container in spec.get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == "metrics" and isinstance(p.get("containerPort"), int):
                port = p["containerPort"]
    pods.append({"namespace": meta.get("namespace"), "name": meta.get("name"), "phase": status.get("phase"),
                 "ready": ready, "reason": status.get("reason") or next((w for w in waiting if w), None),
                 "ip": status.get("podIP"), "port": port})
out = {"node": node, "kubeconfig": kubeconfig, "pods": pods, "scrape": None, "metrics": ""}
target = next((p for p in pods if p["phase"] == "Running" and p["ip"]), None)
if target is not None:
    scrape = {"pod": "%s/%s" % (target["namespace"], target["name"]), "url": None, "status": None,
              "error": None, "truncated": False}
    out["scrape"] = scrape
    try:
        ip = ipaddress.ip_address(str(target["ip"]))
    except ValueError:
        scrape["error"] = "the pod IP is not an IP address"
        ip = None
    if ip is not None and 0 < target["port"] < 65536:
        scrape["url"] = "http://%s:%d/metrics" % ("[%s]" % ip if ip.version == 6 else ip, target["port"])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        body = b""
        try:
            with opener.open(scrape["url"], timeout=10) as resp:
                scrape["status"] = resp.status
                body = resp.read(limit + 1)
        except urllib.error.HTTPError as exc:
            scrape["status"], scrape["error"] = exc.code, "HTTP %d" % exc.code
        except (urllib.error.URLError, OSError) as exc:
            scrape["error"] = str(getattr(exc, "reason", exc))[:300]
        scrape["truncated"] = len(body) > limit
        out["metrics"] = body[:limit].decode("utf-8", "replace")
sys.stdout.write(json.dumps(out))
"""


def _dcgm_exporter_body() -> str:
    import base64

    encoded = base64.b64encode(textwrap.dedent(_DCGM_EXPORTER_PY).encode()).decode()
    return (
        "if [ -r /etc/kubernetes/kubelet.conf ]; then kc=/etc/kubernetes/kubelet.conf\n"
        "elif [ -r /etc/kubernetes/admin.conf ]; then kc=/etc/kubernetes/admin.conf\n"
        'else echo "not a Kubernetes node: no /etc/kubernetes/kubelet.conf or admin.conf" >&2\n'
        "  return 200; fi\n"
        "command -v kubectl >/dev/null 2>&1 || {\n"
        '  echo "kubectl not found (kubeconfig $kc present)" >&2; return 127; }\n'
        'command -v python3 >/dev/null 2>&1 || { echo "python3 not found" >&2; return 127; }\n'
        "read n </proc/sys/kernel/hostname; n=$(printf '%s' \"$n\" | tr 'A-Z' 'a-z')\n"
        f"printf '%s' '{encoded}' | base64 -d | t 45 python3 - \"$kc\" \"$n\" "
        f"{DCGM_EXPORTER_LABEL} {DCGM_EXPORTER_MAX_BYTES}"
    )


# The cluster's namespaces, ResourceQuotas and LimitRanges, for the declared GPU tenants: read on the
# control plane with its admin kubeconfig (a kubelet may not read them), in one request.
KUBE_TENANTS = "kube-tenants.json"
_KUBE_TENANTS = r"""
    [ -r /etc/kubernetes/admin.conf ] || {
      echo "not the control plane: no /etc/kubernetes/admin.conf" >&2; return 200; }
    command -v kubectl >/dev/null 2>&1 || { echo "kubectl not found" >&2; return 127; }
    t 30 kubectl --kubeconfig /etc/kubernetes/admin.conf --request-timeout=20s \
      get namespaces,resourcequotas,limitranges -A -o json
"""

# `nvidia-smi -L`: one line per GPU, then one indented line per MIG device under its GPU ("  MIG 1g.18gb
# Device  0: (UUID: MIG-...)"), the listing of NVIDIA's Multi-Instance GPU User Guide (Getting Started:
# listing the MIG devices after creating them).
SMI_LIST = "nvidia-smi-L.txt"

_HAVE_SMI = (
    'command -v nvidia-smi >/dev/null 2>&1 || { echo "nvidia-smi: command not found" >&2; return 127; }'
)


def _cat(path: str) -> str:
    return f'[ -e {path} ] || {{ echo "{path}: absent" >&2; return 200; }}\ncat {path}'


PROBES: tuple[Probe, ...] = (
    Probe(
        "os-release",
        "[ -r /etc/os-release ] && rd /etc/os-release || rd /usr/lib/os-release",
        5,
        "/etc/os-release",
    ),
    Probe(
        "uname-r", 'read v </proc/sys/kernel/osrelease && echo "$v"', 5, "running kernel release (uname -r)"
    ),
    Probe(HOST_FACTS, _host_facts_body(), 25, "PCI functions, kernel modules, loaded driver, Secure Boot"),
    Probe("nvidia-smi-q.xml", f"{_HAVE_SMI}\nt 60 nvidia-smi -q -x", 70, "nvidia-smi -q -x"),
    Probe("nvidia-smi-version.txt", f"{_HAVE_SMI}\nt 20 nvidia-smi --version", 25, "nvidia-smi --version"),
    Probe("kernel-log.txt", _KERNEL_LOG, 70, "kernel log of this boot (journalctl -k -b, else dmesg)"),
    Probe("nvcc-version.txt", "/usr/local/cuda/bin/nvcc --version", 25, "nvcc of /usr/local/cuda"),
    Probe(
        "packages.tsv",
        "dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'",
        30,
        "installed packages",
    ),
    # The same dpkg selection state `apt-mark showhold` reports, without loading the apt cache
    # (apt-mark takes ~1 s of CPU per host; this takes ~10 ms).
    Probe(
        "apt-holds.txt", "dpkg --get-selections '*' | awk '$2 == \"hold\" {print $1}'", 20, "held packages"
    ),
    Probe("services.tsv", _SERVICES, 20, "systemctl is-active for the GPU stack's units"),
    Probe("service-processes.tsv", _SERVICE_PROCESSES, 10, "the same units judged by running process"),
    Probe("docker-daemon.json", _cat("/etc/docker/daemon.json"), 5, "Docker daemon config"),
    Probe("containerd-config.toml", _cat("/etc/containerd/config.toml"), 5, "containerd config"),
    Probe(
        "containerd-config-dump.toml", _CONTAINERD_DUMP, 25, "containerd config dump (config.toml + imports)"
    ),
    Probe("kube-node.json", _KUBE_NODE, 35, "this host's Kubernetes Node object"),
    Probe("dcgmi-diag.json", _DCGM, 310, "DCGM diagnostic level 1"),
    Probe("container-smoke.txt", _SMOKE, 130, "nvidia-smi -L in a container with --gpus all"),
    Probe(SMI_LIST, f"{_HAVE_SMI}\nt 20 nvidia-smi -L", 25, "nvidia-smi -L: GPUs and their MIG devices"),
    Probe(DCGM_EXPORTER, _dcgm_exporter_body(), 50, "this node's DCGM exporter pod and its /metrics"),
    Probe(KUBE_TENANTS, _KUBE_TENANTS, 35, "namespaces, ResourceQuotas and LimitRanges (control plane)"),
)
# Snapshots made before host-facts.json held these files instead; replaying one reads them (and only
# then: live hosts are never asked for them).
LEGACY_PROBES: tuple[Probe, ...] = (
    Probe("pci-devices.txt", _PCI_FROM_SYSFS, 20, "PCI devices, lspci -Dnn format"),
    Probe("proc-driver-nvidia-version", "rd /proc/driver/nvidia/version", 5, "kernel module version"),
    Probe("sys-module-nvidia-version", "rd /sys/module/nvidia/version", 5, "loaded module version"),
    Probe("modules.txt", "cat /proc/modules", 5, "loaded kernel modules"),
    Probe("secureboot.txt", _SECUREBOOT, 10, "Secure Boot state"),
)
PROBES_BY_NAME: dict[str, Probe] = {p.name: p for p in (*PROBES, *LEGACY_PROBES)}
# What `gpuprov snapshot` writes: every read-only probe. The DCGM diagnostic and the container smoke
# test exercise the GPU (and the smoke test needs an image named by a policy), so a support snapshot
# leaves them out; `verify` runs them.
SNAPSHOT_PROBES: tuple[str, ...] = tuple(
    p.name for p in PROBES if p.name not in ("container-smoke.txt", "dcgmi-diag.json")
)


# ------------------------------------------------------------------------------------ the script

# No subshell per probe (a fork costs ~1.6 ms; ~25 probes): each probe is a function run in the
# script's own shell, its stderr goes to the channel's stderr behind the same markers, and small
# files are read with builtins (`rd`) instead of forking cat.
_PRELUDE = r"""
PATH="$PATH:/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LC_ALL=C; export PATH LC_ALL
if command -v timeout >/dev/null 2>&1; then t() { timeout -k 3 "$@"; }; else t() { shift; "$@"; }; fi
now() { if [ -n "${EPOCHREALTIME:-}" ]; then T=$EPOCHREALTIME; else read T _ </proc/uptime || T=0; fi; }
rd() {
  [ -r "$1" ] || { echo "$1: No such file or directory" >&2; return 1; }
  while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done <"$1"
}
run() {
  now; t0=$T
  printf '@@%s B %s\n' "$K" "$1"; printf '@@%s B %s\n' "$K" "$1" >&2
  "$2" </dev/null
  r=$?
  now
  printf '\n@@%s E %s %s %s %s\n' "$K" "$1" "$r" "$t0" "$T"
}
"""


# The probes' output reaches the controller in a few large SSH packets instead of hundreds of small
# ones (each printf is a write, each write a packet): dd re-blocks stdout and stderr into one write
# at the end. That takes the controller's CPU per host from ~9 ms to ~3 ms for this step.
_COALESCE = r"""
if command -v dd >/dev/null 2>&1; then
  { main 2>&1 1>&3 3>&- | dd ibs=64k obs=8M 1>&2 2>/dev/null; } 3>&1 | dd ibs=64k obs=8M 2>/dev/null
else
  main
fi
"""


def build_script(names: Sequence[str], token: str, smoke_image: str | None = None) -> str:
    """One POSIX sh script that runs the named probes in order and prints delimited sections."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", token):
        raise ValueError("token must be hex")
    parts = ["# gpuprov probes", f"K={token}", f"SMOKE_IMAGE={shlex.quote(smoke_image or '')}", _PRELUDE]
    calls = []
    for i, name in enumerate(names):
        probe = PROBES_BY_NAME[name]
        parts.append(f"p{i}() {{\n{textwrap.indent(probe.command, '  ')}\n}}")
        calls.append(f"  run {name} p{i}")
    parts.append("main() {\n" + "\n".join(calls or ["  :"]) + "\n}")
    parts.append(_COALESCE)
    return "\n".join(parts) + "\n"


def new_token() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class ProbeResult:
    """One probe's outcome. `rc is None` means it was not collected (see `note`)."""

    name: str
    rc: int | None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    note: str = ""

    @property
    def collected(self) -> bool:
        return self.rc is not None

    @property
    def not_applicable(self) -> bool:
        return self.rc == RC_NOT_APPLICABLE

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def reason(self) -> str:
        """A one-line why for a probe that did not simply succeed."""
        if self.rc is None:
            return self.note or "not collected"
        msg = first_line(self.stderr) or first_line(self.stdout)
        if self.rc == RC_NOT_APPLICABLE:
            return msg or "not applicable"
        if self.rc == 124:
            return "timed out" + (f": {msg}" if msg else "")
        if self.rc == 127 and not msg:
            return "command not found"
        return f"exit {self.rc}" + (f": {msg}" if msg else "")


_MAX_STDERR = 4000


def _seconds_between(stamps: Sequence[str]) -> float:
    """A probe's duration from its two clock readings (EPOCHREALTIME or /proc/uptime); 0 when either is
    missing or no finite clock reading (the duration only informs, the output stands)."""
    try:
        start, end = (parse_decimal(t, lo=0, hi=1e12, what="clock") for t in stamps)
    except (HostNumberError, ValueError):
        return 0.0
    return max(0.0, end - start)


def parse_script_output(
    text: str, token: str, names: Sequence[str], stderr: str = ""
) -> dict[str, ProbeResult]:
    """Split the script's stdout (and stderr) into per-probe results; probes cut short are 'not collected'."""
    marker = re.compile(rf"@@{re.escape(token)} ([BE]) (\S+)([^\n]*)\n?")
    begun: dict[str, int] = {}
    pending: dict[str, ProbeResult] = {}
    for m in marker.finditer(text):
        kind, name, rest = m.group(1), m.group(2), m.group(3)
        if kind == "B":
            begun[name] = m.end()
        elif name in begun:
            body_end = m.start() - 1 if m.start() > 0 and text[m.start() - 1] == "\n" else m.start()
            body = text[begun[name] : max(begun[name], body_end)]
            fields = rest.split()
            try:
                rc = parse_int(fields[0], hi=255, what="exit status")
            except (HostNumberError, IndexError):
                continue
            duration = _seconds_between(fields[1:3])
            pending[name] = ProbeResult(name, rc, body, "", round(duration, 3))
    # stderr carries only B markers: each probe's stderr runs from its marker to the next one.
    errors: dict[str, str] = {}
    starts = list(re.finditer(rf"^@@{re.escape(token)} B (\S+)\n?", stderr, re.M))
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(stderr)
        errors[m.group(1)] = stderr[m.end() : end].strip("\n")[:_MAX_STDERR]
    results: dict[str, ProbeResult] = {}
    for name in names:
        if name in pending:
            p = pending[name]
            results[name] = ProbeResult(name, p.rc, p.stdout, errors.get(name, ""), p.duration_s)
        elif name in begun:
            results[name] = ProbeResult(
                name, None, errors.get(name, ""), note="output cut short while this probe ran"
            )
        else:
            results[name] = ProbeResult(name, None, note="not run: the probe script ended early")
    return results


# ----------------------------------------------------------------------------------------- parsers


def parse_os_release(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            parts = shlex.split(value)
        except ValueError as exc:
            raise ParseError(f"os-release: bad line {line!r}") from exc
        out[key.strip()] = parts[0] if parts else ""
    if "ID" not in out:
        raise ParseError("os-release: no ID= line")
    return out


@dataclass(frozen=True)
class PciDevice:
    address: str  # 0000:00:06.0 (lowercase)
    class_code: str  # 4 hex digits, e.g. 0302
    vendor: str  # 10de
    device: str  # 2335
    description: str

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == "10de" and self.class_code in ("0300", "0302")

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == "10de" and self.class_code == "0680"


_PCI_LINE = re.compile(
    r"^(?P<addr>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<cname>.*?)\s*"
    r"\[(?P<cls>[0-9a-fA-F]{4})\]:\s*(?P<rest>.*)$"
)
_PCI_IDS = re.compile(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")


def parse_pci_devices(text: str) -> list[PciDevice]:
    devices: list[PciDevice] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _PCI_LINE.match(line.strip())
        ids = _PCI_IDS.findall(m.group("rest")) if m else []
        if not m or not ids:
            raise ParseError(f"pci-devices.txt line {n}: not in lspci -Dnn format: {line.strip()[:80]!r}")
        vendor, device = ids[-1]
        devices.append(
            PciDevice(
                address=normalize_bus_id(m.group("addr")),
                class_code=m.group("cls").lower(),
                vendor=vendor.lower(),
                device=device.lower(),
                description=line.strip(),
            )
        )
    return devices


@dataclass(frozen=True)
class HostFactsDoc:
    """host-facts.json: what the preflight role's host probe read (see HOST_FACTS)."""

    pci: list[PciDevice]
    modules: dict[str, dict[str, Any]]  # loaded module → {"refcount", "used_by"}
    driver: KernelDriver | None  # None: no NVIDIA kernel module loaded
    module_version: str  # /sys/module/nvidia/version, "" when not loaded
    secure_boot: str  # enabled | disabled | not-applicable | unknown


_SYSFS_ID = re.compile(r"0x[0-9a-f]{4}")
_SYSFS_CLASS = re.compile(r"0x[0-9a-f]{6}")


def parse_host_facts(text: str) -> HostFactsDoc:
    """The host probe's JSON, checked field by field (a host's output is data, not trusted)."""
    doc = parse_json_object(text, HOST_FACTS)
    pci: list[PciDevice] = []
    for n, dev in enumerate(doc.get("pci") or []):
        if not isinstance(dev, dict):
            raise ParseError(f"{HOST_FACTS}: pci[{n}] is not an object")
        addr, vendor, device, cls = (
            str(dev.get(k, "")).lower() for k in ("address", "vendor", "device", "class")
        )
        if not (_SYSFS_ID.fullmatch(vendor) and _SYSFS_ID.fullmatch(device) and _SYSFS_CLASS.fullmatch(cls)):
            raise ParseError(f"{HOST_FACTS}: pci[{n}]: not sysfs ids: {str(dev)[:80]!r}")
        if not re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", addr):
            raise ParseError(f"{HOST_FACTS}: pci[{n}]: not a PCI address: {addr[:40]!r}")
        pci.append(
            PciDevice(
                address=normalize_bus_id(addr),
                class_code=cls[2:6],
                vendor=vendor[2:],
                device=device[2:],
                description=f"{addr} [{cls[2:6]}]: [{vendor[2:]}:{device[2:]}]",
            )
        )
    modules = doc.get("modules") or {}
    if not isinstance(modules, dict):
        raise ParseError(f"{HOST_FACTS}: modules is not an object")
    drv = doc.get("driver") or {}
    if not isinstance(drv, dict):
        raise ParseError(f"{HOST_FACTS}: driver is not an object")
    driver = parse_driver_proc(str(drv["proc_version"])) if drv.get("proc_version") else None
    module_version = str(drv.get("version") or "")
    if module_version and not _VERSION.match(module_version):
        raise ParseError(f"{HOST_FACTS}: driver.version: not a version: {module_version[:40]!r}")
    sb = doc.get("secure_boot") or {}
    state = str(sb.get("state", "unknown")) if isinstance(sb, dict) else "unknown"
    return HostFactsDoc(
        pci=pci,
        modules={str(k): v for k, v in modules.items() if isinstance(v, dict)},
        driver=driver,
        module_version=module_version,
        secure_boot=state.replace("_", "-")
        if state in ("enabled", "disabled", "not_applicable")
        else "unknown",
    )


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:00:06.0' (nvidia-smi) and '0000:00:06.0' (lspci) name the same device."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if not rest:
        return bus_id
    return f"{int(domain, 16):04x}:{rest}" if re.fullmatch(r"[0-9a-f]+", domain) else bus_id


@dataclass
class SmiGpu:
    index: int
    bus_id: str
    name: str = ""
    uuid: str = ""
    persistence: str | None = None  # Enabled / Disabled
    ecc_current: str | None = None  # Enabled / Disabled / N/A
    ecc_pending: str | None = None
    ecc_volatile_uncorrectable: int | None = None
    ecc_volatile_correctable: int | None = None
    # Each volatile uncorrectable counter as printed ("0", "N/A", ...), for the check to judge.
    ecc_volatile_uncorrectable_texts: list[tuple[str, str]] = field(default_factory=list)
    retired_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remap_uncorrectable: int | None = None
    unrepairable_memory: bool | None = None
    repair_pending: list[str] = field(default_factory=list)
    link_gen_current: int | None = None
    link_gen_max: int | None = None
    link_width_current: int | None = None
    link_width_max: int | None = None
    performance_state: str | None = None
    event_reasons: dict[str, bool] = field(default_factory=dict)
    mig_mode: str | None = None


@dataclass
class SmiLog:
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: list[SmiGpu]


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return value or None


_COUNT = re.compile(r"(?P<digits>[0-9]+)(?: ?[A-Za-z]+)?")


def _int(value: str | None, what: str = "count") -> int | None:
    """A count as nvidia-smi -q -x prints it ("0", "16x", "262144 MiB"); None where it prints none ("N/A",
    "[Unknown Error]"). ParseError for digits of another script, more digits than a counter holds or a
    number run into other text: no driver prints those, and reading a prefix would misread them."""
    if value is None:
        return None
    v = value.strip()
    if not v[:1].isdigit():
        return None
    m = _COUNT.fullmatch(v)
    if not m:
        raise ParseError(f"nvidia-smi -q -x: {what}: not a number: {v[:24]!r}")
    try:
        return parse_int(m["digits"], what=f"nvidia-smi -q -x: {what}")
    except HostNumberError as exc:
        raise ParseError(str(exc)) from None


def _yes(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("yes", "true", "active", "enabled"):
        return True
    if v in ("no", "false", "not active", "disabled", "none"):
        return False
    return None


def _counter(value: str | None, what: str) -> int | None:
    """An ECC counter's count, None where it does not read as one: gpu.ecc judges each counter's text as
    printed (ecc_volatile_uncorrectable_texts), so a bad counter is that GPU's error, not the host's."""
    try:
        return _int(value, what)
    except ParseError:
        return None


def _volatile_uncorrectable(volatile: ET.Element | None) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable) volatile ECC counts across driver generations' layouts."""
    if volatile is None:
        return None, None
    double = volatile.find("double_bit")
    if double is not None:  # older drivers: single_bit/double_bit with a total each
        return (
            _counter(_text(double, "total"), "double_bit total"),
            _counter(_text(volatile.find("single_bit"), "total"), "single_bit total"),
        )
    unc: int | None = None
    cor: int | None = None
    for child in volatile:
        value = _counter(child.text, child.tag)
        if value is None:
            continue
        if "uncorrectable" in child.tag:
            unc = (unc or 0) + value
        elif "correctable" in child.tag:
            cor = (cor or 0) + value
    return unc, cor


def _volatile_uncorrectable_texts(volatile: ET.Element | None) -> list[tuple[str, str]]:
    """(counter, text as printed) of each volatile uncorrectable ECC counter, in either layout."""
    if volatile is None:
        return []
    double = volatile.find("double_bit")
    if double is not None:
        found = double.find("total")
        return [] if found is None else [("double_bit/total", (found.text or "").strip())]
    return [(c.tag, (c.text or "").strip()) for c in volatile if "uncorrectable" in c.tag]


def parse_nvidia_smi_xml(text: str) -> SmiLog:
    if not text.strip():
        raise ParseError("nvidia-smi -q -x printed nothing")
    try:
        # Host output is untrusted: real nvidia-smi writes a DOCTYPE naming its DTD (kept allowed), but
        # entity declarations (entity expansion bombs) and external references are refused outright
        # instead of resting on the linked expat's limits.
        root = defused_et.fromstring(text, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as exc:
        raise ParseError("nvidia-smi -q -x output declares XML entities (nvidia-smi never does)") from exc
    except ET.ParseError as exc:
        raise ParseError(f"nvidia-smi -q -x output is not well-formed XML (truncated?): {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"nvidia-smi -q -x: unexpected root element <{root.tag}>")
    gpus: list[SmiGpu] = []
    for index, g in enumerate(root.findall("gpu")):
        bus = g.get("id") or _text(g, "pci/pci_bus_id")
        if not bus:
            raise ParseError(f"nvidia-smi -q -x: GPU {index} has no PCI bus id")
        gpu = SmiGpu(index=index, bus_id=normalize_bus_id(bus))
        gpu.name = _text(g, "product_name") or ""
        gpu.uuid = _text(g, "uuid") or ""
        gpu.persistence = _text(g, "persistence_mode")
        gpu.ecc_current = _text(g, "ecc_mode/current_ecc")
        gpu.ecc_pending = _text(g, "ecc_mode/pending_ecc")
        gpu.ecc_volatile_uncorrectable, gpu.ecc_volatile_correctable = _volatile_uncorrectable(
            g.find("ecc_errors/volatile")
        )
        gpu.ecc_volatile_uncorrectable_texts = _volatile_uncorrectable_texts(g.find("ecc_errors/volatile"))
        gpu.retired_pending = _yes(_text(g, "retired_pages/pending_retirement"))
        gpu.remap_pending = _yes(_text(g, "remapped_rows/remapped_row_pending"))
        gpu.remap_failure = _yes(_text(g, "remapped_rows/remapped_row_failure"))
        gpu.remap_uncorrectable = _int(_text(g, "remapped_rows/remapped_row_unc"), "remapped_row_unc")
        gpu.unrepairable_memory = _yes(_text(g, "ecc_errors/unrepairable_memory"))
        gpu.repair_pending = [
            tag.replace("_repair_pending", "")
            for tag in ("channel_repair_pending", "tpc_repair_pending")
            if _yes(_text(g, f"ecc_errors/{tag}"))
        ]
        link = g.find("pci/pci_gpu_link_info")
        gpu.link_gen_current = _int(_text(link, "pcie_gen/current_link_gen"), "current_link_gen")
        gpu.link_gen_max = _int(_text(link, "pcie_gen/max_link_gen"), "max_link_gen")
        gpu.link_width_current = _int(_text(link, "link_widths/current_link_width"), "current_link_width")
        gpu.link_width_max = _int(_text(link, "link_widths/max_link_width"), "max_link_width")
        gpu.performance_state = _text(g, "performance_state")
        gpu.mig_mode = _text(g, "mig_mode/current_mig")
        for container, prefix in (
            ("clocks_event_reasons", "clocks_event_reason_"),
            ("clocks_throttle_reasons", "clocks_throttle_reason_"),
        ):
            reasons = g.find(container)
            if reasons is None:
                continue
            for child in reasons:
                state = _yes(child.text)
                if state is not None:
                    gpu.event_reasons[child.tag.removeprefix(prefix)] = state
        gpus.append(gpu)
    attached = _int(_text(root, "attached_gpus"), "attached_gpus")
    return SmiLog(_text(root, "driver_version"), _text(root, "cuda_version"), attached, gpus)


@dataclass(frozen=True)
class KernelDriver:
    version: str
    open_modules: bool | None  # True: "Open Kernel Module"; False: proprietary
    line: str


_NVRM_VERSION = re.compile(
    r"NVRM version:.*?(?P<open>Open )?Kernel Module\b.*?\s(?P<ver>\d+\.\d+(?:\.\d+)?)\s"
)


def parse_driver_proc(text: str) -> KernelDriver:
    line = first_line(text, 400)
    m = _NVRM_VERSION.search(line + " ")
    if not m:
        raise ParseError(f"/proc/driver/nvidia/version: no 'NVRM version' line: {line[:80]!r}")
    return KernelDriver(m.group("ver"), m.group("open") is not None, line)


_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")


def parse_module_version(text: str) -> str:
    value = text.strip()
    if not _VERSION.match(value):
        raise ParseError(f"/sys/module/nvidia/version: not a version: {value[:40]!r}")
    return value


def parse_smi_version(text: str) -> dict[str, str]:
    """`nvidia-smi --version`: 'NVIDIA-SMI version : 580.159.04', 'NVML version : 580.159', ..."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            out[key.strip().lower()] = value.strip()
    if "nvidia-smi version" not in out:
        raise ParseError(f"nvidia-smi --version: no 'NVIDIA-SMI version' line: {first_line(text)!r}")
    return out


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str  # as printed: 0000:00:06 (domain:bus:device, no function) or with function
    message: str
    line: str


# The Xid number is ASCII digits ending at a separator: "7²9" or "٧٩" are no Xid 7 or 79. Its size is
# checked where it is read (xid_number): an absurd number is an error, not a line to skip.
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9])?)\): "
    r"(?P<xid>[0-9]+)(?=[\s,]|$)\s*,?\s*(?P<msg>.*)$"
)
_FALLEN = re.compile(
    r"NVRM: (?:The NVIDIA )?GPU (?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9])"
)
# NVIDIA's catalog of Xids stops below 200; four digits leave room for years of new ones.
XID_MAX = 9999


def xid_number(text: str) -> int:
    """The number of an Xid line (XID_LINE's `xid`); HostNumberError when no driver would print it."""
    return parse_int(text, lo=0, hi=XID_MAX, what="Xid")


# dmesg "[   12.345678] ...", journalctl short-monotonic "[   12.345678] host kernel: ...", journalctl
# short "Dec 02 15:10:01 host kernel: ...", and ISO timestamps.
_KLOG_LINE = re.compile(r"^(\[\s*\d+\.\d+\]|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d |\d{4}-\d\d-\d\dT\d\d:\d\d)")


def parse_kernel_log(text: str) -> list[XidEvent]:
    """NVRM Xid events of this boot. A 'GPU ... has fallen off the bus' report without an Xid
    line (newer drivers print it over several lines) counts as Xid 79. Text that has no kernel-log
    line at all is refused: "no Xid" must mean a log was read."""
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise ParseError("kernel log is empty: no messages for this boot were readable")
    if not any(_KLOG_LINE.match(line) for line in lines[:200]):
        raise ParseError(f"kernel log: not in dmesg/journalctl format: {first_line(text, 80)!r}")
    events: list[XidEvent] = []
    fallen: list[XidEvent] = []
    for i, line in enumerate(lines):
        if "NVRM" not in line:
            continue
        m = XID_LINE.search(line)
        if m:
            try:
                xid = xid_number(m.group("xid"))
            except HostNumberError as exc:
                raise ParseError(f"kernel log line {i + 1}: {exc}") from None
            events.append(XidEvent(xid, m.group("pci").lower(), m.group("msg").strip(), line))
            continue
        f = _FALLEN.search(line)
        if f:
            window = " ".join(lines[i : i + 4])
            if "fallen off the bus" in window:
                fallen.append(XidEvent(79, f.group("pci").lower(), "GPU has fallen off the bus", line))
    # Drivers that print an Xid 79 line also print the "fallen off the bus" report: one event, not two.
    seen_79 = {pci_device(e.pci) for e in events if e.xid == 79}
    events.extend(e for e in fallen if pci_device(e.pci) not in seen_79)
    return events


def pci_device(pci: str) -> str:
    """domain:bus:device, without the function and with an 8-digit domain cut to 4 (as lspci prints)."""
    base = pci.split(".", 1)[0].lower()
    domain, _, rest = base.partition(":")
    return f"{domain[-4:]}:{rest}"


@dataclass(frozen=True)
class CudaToolkit:
    release: str  # 13.0
    version: str  # 13.0.88


_NVCC = re.compile(r"release (?P<rel>\d+\.\d+), V(?P<ver>\d+\.\d+(?:\.\d+)?)")


def parse_nvcc(text: str) -> CudaToolkit:
    m = _NVCC.search(text)
    if not m:
        raise ParseError(f"nvcc --version: no 'release X.Y, VX.Y.Z': {first_line(text)!r}")
    return CudaToolkit(m.group("rel"), m.group("ver"))


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    status: str  # dpkg's db:Status-Abbrev, e.g. "ii ", "hi "

    @property
    def installed(self) -> bool:
        return len(self.status) >= 2 and self.status[1] in "iWt"

    @property
    def held(self) -> bool:
        return self.status[:1] == "h"


def parse_packages(text: str) -> dict[str, Package]:
    pkgs: dict[str, Package] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 3 or not parts[0]:
            raise ParseError(f"packages.tsv line {n}: expected package<TAB>version<TAB>status: {line[:80]!r}")
        name = parts[0].strip()
        pkgs[name] = Package(name, parts[1].strip(), parts[2])
    return pkgs


def parse_holds(text: str) -> set[str]:
    held: set[str] = set()
    for line in text.splitlines():
        name = line.strip()
        if not name:
            continue
        if " " in name or "\t" in name:
            raise ParseError(f"apt-holds.txt: not a package name: {name[:60]!r}")
        held.add(name.split(":", 1)[0])
    return held


def parse_tsv_states(text: str, probe: str) -> dict[str, str]:
    states: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        unit, sep, state = line.partition("\t")
        if not sep or not unit.strip():
            raise ParseError(f"{probe} line {n}: expected unit<TAB>state: {line[:80]!r}")
        states[unit.strip()] = state.strip()
    return states


def parse_modules(text: str) -> dict[str, str]:
    """/proc/modules: name → state (Live/Loading/Unloading)."""
    mods: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 5:
            raise ParseError(f"modules.txt line {n}: not /proc/modules format: {line[:80]!r}")
        mods[parts[0]] = parts[4]
    return mods


def parse_secureboot(text: str) -> str:
    """enabled | disabled | not-applicable | unknown."""
    t = text.lower()
    if "not applicable" in t or "efi variables are not supported" in t or "doesn't support secure boot" in t:
        return "not-applicable"
    if "secureboot enabled" in t:
        return "enabled"
    if "secureboot disabled" in t:
        return "disabled"
    return "unknown"


def parse_json_object(text: str, probe: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"{probe}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ParseError(f"{probe}: expected a JSON object")
    return value


def parse_toml(text: str, probe: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ParseError(f"{probe}: not valid TOML: {exc}") from exc


@dataclass(frozen=True)
class ContainerdRuntime:
    runtime_type: str
    binary: str


@dataclass(frozen=True)
class ContainerdConfig:
    """The part of `containerd config dump` the checks read (the CRI plugin's runtimes and CDI)."""

    version: int
    runtimes: dict[str, ContainerdRuntime]
    default_runtime: str
    enable_cdi: bool
    imports: list[str]


def parse_containerd_dump(text: str) -> ContainerdConfig:
    """`containerd config dump`: config version 2 (containerd 1.x) keeps the runtimes in the plugin
    "io.containerd.grpc.v1.cri", version 3 (2.x) in "io.containerd.cri.v1.runtime"."""
    data = parse_toml(text, "containerd-config-dump.toml")
    raw = data.get("version") or 1
    try:
        # TOML may hold the version as a float (inf, nan) or a string; only a whole number is a version.
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise HostNumberError("not a whole number")
        version = parse_int(str(raw), lo=1, hi=99, what="version")
    except HostNumberError as exc:
        shown = ascii(raw)[:40]
        raise ParseError(f"containerd-config-dump.toml: version {shown} is not a config version") from exc
    plugins = data.get("plugins") if isinstance(data.get("plugins"), dict) else {}
    cri = plugins.get("io.containerd.cri.v1.runtime" if version >= 3 else "io.containerd.grpc.v1.cri")
    cri = cri if isinstance(cri, dict) else {}
    containerd = cri.get("containerd") if isinstance(cri.get("containerd"), dict) else {}
    runtimes: dict[str, ContainerdRuntime] = {}
    raw = containerd.get("runtimes") if isinstance(containerd.get("runtimes"), dict) else {}
    for name, table in raw.items():
        if isinstance(table, dict):
            options = table.get("options") if isinstance(table.get("options"), dict) else {}
            runtimes[str(name)] = ContainerdRuntime(
                str(table.get("runtime_type", "")), str(options.get("BinaryName", ""))
            )
    imports = data.get("imports") if isinstance(data.get("imports"), list) else []
    return ContainerdConfig(
        version=version,
        runtimes=runtimes,
        default_runtime=str(containerd.get("default_runtime_name", "")),
        enable_cdi=cri.get("enable_cdi") is True,
        imports=[str(i) for i in imports],
    )


@dataclass(frozen=True)
class DiagResult:
    test: str
    status: str  # pass | warn | fail | skip
    gpu: int | None
    info: str


def parse_dcgm_diag(text: str) -> list[DiagResult]:
    """`dcgmi diag -r 1 -j`: {"DCGM GPU Diagnostic" | "DCGM Diagnostic": {"test_categories": [...]}}."""
    start = text.find("{")
    if start < 0:
        raise ParseError(f"dcgmi diag: no JSON in output: {first_line(text)!r}")
    doc = parse_json_object(text[start:], "dcgmi diag")
    body = next((v for v in doc.values() if isinstance(v, dict) and "test_categories" in v), None)
    if body is None:
        raise ParseError("dcgmi diag: no test_categories in the JSON")
    out: list[DiagResult] = []
    for cat in body.get("test_categories") or []:
        for test in (cat or {}).get("tests") or []:
            name = str(test.get("name", "?"))
            for res in test.get("results") or []:
                raw = str(res.get("status", "")).strip().lower()
                status = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn"}.get(raw, "skip")
                gpu = res.get("gpu_id", res.get("entity_id"))
                info = res.get("info") or res.get("warnings") or ""
                if isinstance(info, list):
                    info = "; ".join(
                        str(i.get("warning", i)) if isinstance(i, dict) else str(i) for i in info
                    )
                index = int(str(gpu)) if is_index(str(gpu)) else None
                out.append(DiagResult(name, status, index, str(info)))
    return out


def parse_smoke(text: str) -> list[str]:
    gpus = [line.strip() for line in text.splitlines() if re.match(r"^\s*GPU \d+:", line)]
    if not gpus:
        raise ParseError(f"container nvidia-smi -L listed no GPU: {first_line(text)!r}")
    return gpus


def nvidia_gpus(devices: Iterable[PciDevice]) -> list[PciDevice]:
    """NVIDIA GPUs on the PCI bus, in bus order (the order nvidia-smi numbers them)."""
    return sorted((d for d in devices if d.is_nvidia_gpu), key=lambda d: d.address)


# ------------------------------------------------------------------------- the DCGM exporter's output


@dataclass(frozen=True)
class ExporterPod:
    namespace: str
    name: str
    phase: str
    ready: bool
    reason: str
    ip: str


@dataclass(frozen=True)
class ExporterScrape:
    pod: str
    url: str
    status: int | None
    error: str
    truncated: bool


@dataclass(frozen=True)
class ExporterProbe:
    """dcgm-exporter.json: the exporter pods on the node and, when one runs, what its /metrics said."""

    node: str
    pods: list[ExporterPod]
    scrape: ExporterScrape | None
    metrics: str


def _str_field(doc: dict[str, Any], key: str, where: str, optional: bool = True) -> str:
    value = doc.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise ParseError(f"{DCGM_EXPORTER}: {where}.{key} is not a string")
    return value


def parse_dcgm_exporter(text: str) -> ExporterProbe:
    """The probe's JSON, checked field by field (the pod list and the page come from the cluster)."""
    doc = parse_json_object(text, DCGM_EXPORTER)
    pods_raw = doc.get("pods")
    if not isinstance(pods_raw, list):
        raise ParseError(f"{DCGM_EXPORTER}: pods is not a list")
    pods = []
    for i, raw in enumerate(pods_raw):
        if not isinstance(raw, dict):
            raise ParseError(f"{DCGM_EXPORTER}: pods[{i}] is not an object")
        w = f"pods[{i}]"
        pods.append(
            ExporterPod(
                _str_field(raw, "namespace", w),
                _str_field(raw, "name", w),
                _str_field(raw, "phase", w),
                raw.get("ready") is True,
                _str_field(raw, "reason", w),
                _str_field(raw, "ip", w),
            )
        )
    scrape: ExporterScrape | None = None
    raw_scrape = doc.get("scrape")
    if raw_scrape is not None:
        if not isinstance(raw_scrape, dict):
            raise ParseError(f"{DCGM_EXPORTER}: scrape is not an object")
        status = raw_scrape.get("status")
        if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
            raise ParseError(f"{DCGM_EXPORTER}: scrape.status is not an HTTP status")
        scrape = ExporterScrape(
            _str_field(raw_scrape, "pod", "scrape"),
            _str_field(raw_scrape, "url", "scrape"),
            status,
            _str_field(raw_scrape, "error", "scrape"),
            raw_scrape.get("truncated") is True,
        )
    return ExporterProbe(_str_field(doc, "node", "probe"), pods, scrape, _str_field(doc, "metrics", "probe"))


@dataclass(frozen=True)
class Sample:
    """One sample of the Prometheus text exposition format."""

    name: str
    labels: dict[str, str]
    value: float
    line: int


# The text exposition format 0.0.4 (prometheus/docs, content/docs/instrumenting/exposition_formats.md):
# metric_name [ "{" label="value" { "," label="value" } [ "," ] "}" ] value [ timestamp ], label values
# escaping only backslash, double quote and line feed; # HELP and # TYPE comments; blank lines ignored.
# Read strictly: anything else in a line is an error, never skipped, and a line or a value too long to be
# an exporter's is refused before it is looked at further.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The exposition format's numbers, Inf and NaN included (an exporter may serve them), in ASCII digits.
_SAMPLE_VALUE = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|Inf|inf)|NaN"
)
_TIMESTAMP = re.compile(r"-?[0-9]{1,19}")
_PROM_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
_PROM_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
PROM_MAX_LINE = 16 * 1024
PROM_MAX_LABELS = 64


def _prom_labels(line: str, pos: int, n: int) -> tuple[dict[str, str], int]:
    """The label set starting after '{' at `pos`; returns the labels and the position after '}'."""
    labels: dict[str, str] = {}
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_NAME.match(line, pos)
        if not m:
            raise ParseError(f"metrics line {n}: expected a label name at column {pos + 1}")
        name, pos = m.group(), m.end()
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if line[pos : pos + 2] != '="':
            raise ParseError(f'metrics line {n}: expected =" after label {name}')
        pos += 2
        value: list[str] = []
        while True:
            if pos >= len(line):
                raise ParseError(f"metrics line {n}: label {name}: value not closed")
            ch = line[pos]
            if ch == '"':
                pos += 1
                break
            if ch == "\\":
                escaped = _PROM_ESCAPES.get(line[pos + 1 : pos + 2])
                if escaped is None:
                    raise ParseError(f"metrics line {n}: label {name}: unknown escape in its value")
                value.append(escaped)
                pos += 2
                continue
            value.append(ch)
            pos += 1
        if name in labels:
            raise ParseError(f"metrics line {n}: label {name} given twice")
        if len(labels) >= PROM_MAX_LABELS:
            raise ParseError(f"metrics line {n}: more than {PROM_MAX_LABELS} labels")
        labels[name] = "".join(value)
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif not (pos < len(line) and line[pos] == "}"):
            raise ParseError(f"metrics line {n}: expected , or }} after label {name}")


def parse_prometheus_text(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition; ParseError naming the line on anything malformed."""
    samples: list[Sample] = []
    for n, line in enumerate(text.split("\n"), 1):
        if len(line) > PROM_MAX_LINE:
            raise ParseError(f"metrics line {n}: longer than {PROM_MAX_LINE} characters")
        if _UNSAFE_TEXT.search(line):
            raise ParseError(f"metrics line {n}: control characters")
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 3)
            if parts[:1] == ["TYPE"] and (
                len(parts) != 3 or not _METRIC_NAME.fullmatch(parts[1]) or parts[2] not in _PROM_TYPES
            ):
                raise ParseError(f"metrics line {n}: malformed # TYPE comment")
            if parts[:1] == ["HELP"] and (len(parts) < 2 or not _METRIC_NAME.fullmatch(parts[1])):
                raise ParseError(f"metrics line {n}: malformed # HELP comment")
            continue
        m = _METRIC_NAME.match(line)
        if not m:
            raise ParseError(f"metrics line {n}: does not start with a metric name")
        name, pos = m.group(), m.end()
        labels: dict[str, str] = {}
        if line[pos : pos + 1] == "{":
            labels, pos = _prom_labels(line, pos + 1, n)
        rest = line[pos:].split()
        if not line[pos : pos + 1].isspace() or not 1 <= len(rest) <= 2:
            raise ParseError(f"metrics line {n}: expected a value (and a timestamp) after {name}")
        if not _SAMPLE_VALUE.fullmatch(rest[0]):
            raise ParseError(f"metrics line {n}: {name}: not a number: {rest[0][:40]!r}")
        if len(rest) == 2 and not _TIMESTAMP.fullmatch(rest[1]):
            raise ParseError(f"metrics line {n}: {name}: not a timestamp: {rest[1][:40]!r}")
        samples.append(Sample(name, labels, float(rest[0]), n))
    return samples


# C0 controls but tab (escape sequences start with ESC), DEL and C1: never in an exporter's page.
_UNSAFE_TEXT = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def parse_smi_list(text: str) -> str:
    """`nvidia-smi -L` as printed, checked to be that listing (a line "GPU <n>: ..." first)."""
    if not re.match(r"GPU \d+: ", text.lstrip("\n")):
        raise ParseError(f"{SMI_LIST}: not nvidia-smi -L output: {first_line(text, 80)!r}")
    return text
