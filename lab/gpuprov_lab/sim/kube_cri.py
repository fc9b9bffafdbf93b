"""crictl and the CNI plugins of kubernetes-cni, SIMULATED (gpuprov lab).

crictl answers from containerd's service state and configuration and from the pod snapshot the sim
kubelet keeps in containerd's state directory (no container runs on a lab host). The CNI plugins only
answer ``CNI_COMMAND=VERSION`` (and ``--version``), as a plugin binary does when probed.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from . import kube_util as u
from .kube_host import CONTAINERD_SOCK, Host, containerd_config

PODS_SNAPSHOT = "/run/containerd/io.containerd.gpuprov-lab.v1/pods.json"
ENDPOINT = "unix:///run/containerd/containerd.sock"


def _fatal(err: TextIO, msg: str) -> int:
    err.write(f'time="{u.iso()}" level=fatal msg="{msg}"\n')
    return 1


def main(
    argv: list[str],
    host: Host | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    version: str = "v1.36.0",
) -> int:
    host = host or Host()
    out = out or sys.stdout
    err = err or sys.stderr
    args = [
        a for a in argv if not a.startswith("--runtime-endpoint") and not a.startswith("--image-endpoint")
    ]
    if argv and argv[0] in ("--version", "-v"):
        out.write(f"crictl version {version}\n")
        return 0
    verb = args[0] if args else ""
    if verb in ("", "help", "--help", "-h"):
        out.write("crictl: client for CRI (SIMULATED, gpuprov lab)\n")
        return 0
    if not host.service_active("containerd") or not host.exists(CONTAINERD_SOCK):
        return _fatal(
            err,
            f'validate service connection: validate CRI v1 runtime API for endpoint \\"{ENDPOINT}\\": rpc '
            'error: code = Unavailable desc = connection error: desc = \\"transport: Error while dialing: '
            "dial "
            f'unix {CONTAINERD_SOCK}: connect: no such file or directory\\""',
        )
    cc = containerd_config(host)
    if not cc.cri_enabled:
        return _fatal(
            err,
            f'validate service connection: validate CRI v1 runtime API for endpoint \\"{ENDPOINT}\\": rpc '
            "error: code = Unimplemented desc = unknown service runtime.v1.RuntimeService",
        )
    ver = host.run(["containerd", "--version"], timeout=10).stdout.split()
    runtime_version = ver[2] if len(ver) >= 3 else "unknown"
    if verb == "version":
        out.write(
            f"Version:  0.1.0\nRuntimeName:  containerd\nRuntimeVersion:  {runtime_version}\n"
            "RuntimeApiVersion:  v1\n"
        )
        return 0
    if verb == "info":
        from .kube_let import cni_configured

        net = cni_configured(host)
        doc = {
            "status": {
                "conditions": [
                    {"type": "RuntimeReady", "status": True, "reason": "", "message": ""},
                    {
                        "type": "NetworkReady",
                        "status": net,
                        "reason": "" if net else "NetworkPluginNotReady",
                        "message": "" if net else "Network plugin returns error: cni plugin not initialized",
                    },
                ]
            },
            "config": {
                "containerd": {
                    "defaultRuntimeName": cc.default_runtime,
                    "runtimes": {
                        name: {"runtimeType": rt.get("runtime_type", ""), "options": rt.get("options") or {}}
                        for name, rt in cc.runtimes.items()
                    },
                },
                "cni": {"binDir": "/opt/cni/bin", "confDir": "/etc/cni/net.d"},
            },
        }
        out.write(json.dumps(doc, indent=2) + "\n")
        return 0
    pods = []
    try:
        pods = json.loads(host.read(PODS_SNAPSHOT, "[]") or "[]")
    except ValueError:
        pods = []
    if verb == "pods":
        rows = [["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"]]
        for p in pods:
            rows.append(
                [
                    p["uid"][:13],
                    p.get("age", ""),
                    "Ready" if p.get("running") else "NotReady",
                    p["name"],
                    p["namespace"],
                    "0",
                    p.get("runtime") or "(default)",
                ]
            )
        out.write(u.table(rows))
        return 0
    if verb == "ps":
        show_all = "-a" in args or "--all" in args
        rows = [["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD", "NAMESPACE"]]
        for p in pods:
            for c in p.get("containers", []):
                if not show_all and c.get("state") != "Running":
                    continue
                rows.append(
                    [
                        c["id"][:13],
                        c.get("image", ""),
                        p.get("age", ""),
                        c.get("state", ""),
                        c["name"],
                        str(c.get("restarts", 0)),
                        p["uid"][:13],
                        p["name"],
                        p["namespace"],
                    ]
                )
        out.write(u.table(rows))
        return 0
    if verb == "images":
        rows = [["IMAGE", "TAG", "IMAGE ID", "SIZE"]]
        seen = set()
        for p in pods:
            for c in p.get("containers", []):
                img = c.get("image", "")
                if img and img not in seen:
                    seen.add(img)
                    repo, _, tag = img.rpartition(":")
                    rows.append(
                        [repo or img, tag if repo else "latest", "sha256:" + str(abs(hash(img)))[:12], "0B"]
                    )
        out.write(u.table(rows))
        return 0
    err.write(f"No help topic for '{verb}'\n")
    return 1


CNI_PLUGINS = (
    "bandwidth",
    "bridge",
    "dhcp",
    "dummy",
    "firewall",
    "host-device",
    "host-local",
    "ipvlan",
    "loopback",
    "macvlan",
    "portmap",
    "ptp",
    "sbr",
    "static",
    "tap",
    "tuning",
    "vlan",
    "vrf",
)


def cni_plugin_script(name: str, version: str) -> str:
    return f"""#!/bin/sh
# CNI plugin "{name}" {version}: {u.SIM_LABEL}.
# It answers version probes only; pods get no real network in the lab.
V='"0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"'
case "$1" in
  --version|version)
    echo "CNI {name} plugin {version}"
    echo "CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"
    exit 0;;
esac
if [ "$CNI_COMMAND" = VERSION ]; then
  printf '{{"cniVersion":"1.1.0","supportedVersions":[%s]}}\\n' "$V"
  exit 0
fi
echo '{{"code":100,"msg":"SIMULATED CNI plugin {name}: not available on a gpuprov lab host"}}'
exit 1
"""
