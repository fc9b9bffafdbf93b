"""What the SIMULATED kubelet's containers do (gpuprov lab). No container runs: each container is judged
against the host and the cluster, and its effects on the host are made for real where roles and
checks look for them (flannel's CNI config and subnet.env, the GPU Operator validator's files).

- A pod sandbox needs the runtime (containerd with CRI and a matching cgroup driver), a CNI config
  unless the pod uses the host network, and containerd's runtime for the pod's RuntimeClass handler.
- ``cp SRC DST`` init containers copy from a ConfigMap volume (or the image) into a hostPath volume.
- flanneld needs the node's pod CIDR; it writes /run/flannel/subnet.env.
- node-feature-discovery's worker publishes the host's PCI devices (/sys/bus/pci/devices).
- GPU Operator: driver container crash-loops where a host driver is loaded; validations pass only when
  the host driver works (nvidia-smi), containerd has the nvidia runtime (or the toolkit pod runs), the
  device plugin advertises the GPUs ``nvidia-smi -L`` lists.
- Anything else is Running (Completed for run-to-completion pods).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import time
from typing import TYPE_CHECKING, Any

from . import kube_util as u
from .kube_store import ApiError, Obj

if TYPE_CHECKING:
    from .kube_let import Kubelet

OK, FAIL, WAIT = "ok", "fail", "wait"
Result = tuple[str, str]  # (OK|FAIL|WAIT, message)
FLANNEL_PLUGIN = """#!/bin/sh
# flannel CNI plugin: SIMULATED (gpuprov lab), installed by the kube-flannel DaemonSet's init container.
if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"]}'
  exit 0
fi
echo '{"code":100,"msg":"SIMULATED flannel CNI plugin: pods get no real network in the gpuprov lab"}'
exit 1
"""


def _backoff_restarts(elapsed: float) -> int:
    """How many restarts CrashLoopBackOff has done after ``elapsed`` seconds (10s doubling, 5m cap)."""
    n, t, delay = 0, 0.0, 10.0
    while t + delay <= elapsed:
        t += delay
        n += 1
        delay = min(delay * 2, 300.0)
    return n


class PodRunner:
    def __init__(self, kubelet: Kubelet, node: Obj, pod: Obj) -> None:
        self.k = kubelet
        self.host = kubelet.host
        self.node = node
        self.pod = pod
        self.spec = pod.get("spec") or {}
        self.meta = pod["metadata"]
        self.uid = self.meta["uid"]
        self.old = pod.get("status") or {}

    # --------------------------------------------------------------------------------- mounts
    def volume(self, container: Obj, path: str) -> tuple[Obj, str] | None:
        """(volume, path inside it) for a path in the container, via its volumeMounts."""
        best: tuple[Obj, str] | None = None
        best_len = -1
        for m in container.get("volumeMounts") or []:
            mp = m.get("mountPath", "").rstrip("/")
            if (path == mp or path.startswith(mp + "/")) and len(mp) > best_len:
                vol = next(
                    (v for v in self.spec.get("volumes") or [] if v.get("name") == m.get("name")), None
                )
                if vol is not None:
                    rest = path[len(mp) :].lstrip("/")
                    if m.get("subPath"):
                        rest = f"{m['subPath']}/{rest}".rstrip("/")
                    best, best_len = (vol, rest), len(mp)
        return best

    def read_in(self, container: Obj, path: str) -> str | None:
        found = self.volume(container, path)
        if found is None:
            return None
        vol, rest = found
        if "configMap" in vol:
            cm = self._configmap(vol["configMap"].get("name", ""))
            if cm is None:
                return None
            items = vol["configMap"].get("items")
            key = rest
            if items:
                key = next((i["key"] for i in items if i.get("path") == rest), rest)
            return (cm.get("data") or {}).get(key)
        if "hostPath" in vol:
            return self.host.read(f"{vol['hostPath']['path'].rstrip('/')}/{rest}".rstrip("/"))
        return None

    def write_in(self, container: Obj, path: str, data: str, mode: int = 0o644) -> bool:
        found = self.volume(container, path)
        if found is None or "hostPath" not in found[0]:
            return False
        vol, rest = found
        self.host.write(f"{vol['hostPath']['path'].rstrip('/')}/{rest}", data, mode)
        return True

    def _configmap(self, name: str) -> Obj | None:
        assert self.k.client is not None
        return self.k.client.find(self.k.R("configmaps"), self.meta["namespace"], name)

    # -------------------------------------------------------------------------------- sandbox
    def sandbox(self) -> str | None:
        ok, why = self._runtime()
        if not ok:
            return why or "container runtime is down"
        if why:
            return (
                f"failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                f"SIMULATED: {why}"
            )
        if not self.spec.get("hostNetwork"):
            from .kube_let import cni_configured

            if not cni_configured(self.host):
                return (
                    'networkPlugin cni failed to set up pod network: plugin type="" failed: '
                    "cni plugin not initialized"
                )
            if not u.dig(self.node, "spec", "podCIDR"):
                return "failed to allocate for range 0: no IP addresses available in range set"
        rc_name = self.spec.get("runtimeClassName")
        if rc_name:
            rc = self.k.client.find(self.k.R("runtimeclasses"), "", rc_name) if self.k.client else None
            handler = (rc or {}).get("handler") or rc_name
            if not self.k.containerd().has_runtime(handler):
                return (
                    f"failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox "
                    f"runtime: "
                    f'no runtime for "{handler}" is configured'
                )
        return None

    def _runtime(self) -> tuple[bool, str | None]:
        return self.k.runtime()

    def pod_ip(self) -> str:
        if self.spec.get("hostNetwork"):
            return self.k.s.node_ip
        if self.uid in self.k.pod_ips:
            return self.k.pod_ips[self.uid]
        cidr = u.dig(self.node, "spec", "podCIDR")
        if (
            self.old.get("podIP")
            and cidr
            and ipaddress.ip_address(self.old["podIP"]) in ipaddress.ip_network(cidr)
        ):
            ip = self.old["podIP"]
        else:
            net = ipaddress.ip_network(cidr)
            used = set(self.k.pod_ips.values())
            start = int(hashlib.md5(self.uid.encode()).hexdigest(), 16) % max(1, net.num_addresses - 4)
            hosts = list(net.hosts())[1:]
            ip = str(hosts[start % len(hosts)])
            for i in range(len(hosts)):
                cand = str(hosts[(start + i) % len(hosts)])
                if cand not in used:
                    ip = cand
                    break
        self.k.pod_ips[self.uid] = ip
        return ip

    # --------------------------------------------------------------------------------- status
    def status(self) -> Obj:
        if self.old.get("phase") in ("Succeeded", "Failed"):  # a finished pod is not run again
            return self.old
        now_iso = u.iso()
        start = self.old.get("startTime") or now_iso
        containers = self.spec.get("containers") or []
        inits = self.spec.get("initContainers") or []
        prev = {
            c["name"]: c
            for c in (self.old.get("containerStatuses") or []) + (self.old.get("initContainerStatuses") or [])
        }
        blocked = self.sandbox()
        base: Obj = {
            "hostIP": self.k.s.node_ip,
            "hostIPs": [{"ip": self.k.s.node_ip}],
            "startTime": start,
            "qosClass": self.old.get("qosClass", "BestEffort"),
        }
        sched = {"type": "PodScheduled", "status": "True"}
        if blocked:
            waiting = {"waiting": {"reason": "ContainerCreating", "message": blocked}}
            return {
                **base,
                "phase": "Pending",
                "conditions": [
                    {"type": "PodReadyToStartContainers", "status": "False"},
                    {
                        "type": "Initialized",
                        "status": "False" if inits else "True",
                        **({"reason": "ContainersNotInitialized"} if inits else {}),
                    },
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                    {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
                    sched,
                ],
                **(
                    {
                        "initContainerStatuses": [
                            self._cs(c, False, {"waiting": {"reason": "PodInitializing"}}, prev)
                            for c in inits
                        ]
                    }
                    if inits
                    else {}
                ),
                "containerStatuses": [self._cs(c, False, waiting, prev) for c in containers],
            }
        ip = self.pod_ip()
        base.update({"podIP": ip, "podIPs": [{"ip": ip}]})
        run_once = self.spec.get("restartPolicy") in ("Never", "OnFailure")
        init_statuses = []
        initialized = True
        for c in inits:
            if not initialized:
                init_statuses.append(self._cs(c, False, {"waiting": {"reason": "PodInitializing"}}, prev))
                continue
            state, msg = self.run_container(c, init=True)
            if state == OK:
                self.k.failures.pop((self.uid, c["name"]), None)
                old_term = u.dig(prev.get(c["name"]) or {}, "state", "terminated") or {}
                init_statuses.append(
                    self._cs(
                        c,
                        False,
                        {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "startedAt": old_term.get("startedAt", now_iso),
                                "finishedAt": old_term.get("finishedAt", now_iso),
                            }
                        },
                        prev,
                    )
                )
            elif state == WAIT:  # still running (an init container that waits for something)
                initialized = False
                running = u.dig(prev.get(c["name"]) or {}, "state", "running") or {"startedAt": now_iso}
                init_statuses.append(self._cs(c, False, {"running": running}, prev, started=True))
            else:
                initialized = False
                init_statuses.append(self._failing(c, state, msg, prev))
        cstatuses = []
        all_ready = initialized
        phase = "Running" if initialized else "Pending"
        done = failed = 0
        for c in containers:
            if not initialized:
                cstatuses.append(self._cs(c, False, {"waiting": {"reason": "PodInitializing"}}, prev))
                all_ready = False
                continue
            state, msg = self.run_container(c, init=False)
            if state == OK and run_once:
                cstatuses.append(
                    self._cs(
                        c,
                        False,
                        {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "startedAt": start,
                                "finishedAt": now_iso,
                                # What the container printed (kubectl logs shows it).
                                **({"message": msg} if msg else {}),
                            }
                        },
                        prev,
                    )
                )
                done += 1
                all_ready = False
            elif state == OK:
                self.k.failures.pop((self.uid, c["name"]), None)
                running = u.dig(prev.get(c["name"]) or {}, "state", "running") or {"startedAt": now_iso}
                cstatuses.append(self._cs(c, True, {"running": running}, prev))
            elif state == WAIT:
                running = u.dig(prev.get(c["name"]) or {}, "state", "running") or {"startedAt": now_iso}
                cstatuses.append(self._cs(c, False, {"running": running}, prev, started=True))
                all_ready = False
            elif self.spec.get("restartPolicy") == "Never":  # not restarted: it stays terminated
                term = u.dig(prev.get(c["name"]) or {}, "state", "terminated") or {}
                cstatuses.append(
                    self._cs(
                        c,
                        False,
                        {
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "startedAt": term.get("startedAt", start),
                                "finishedAt": term.get("finishedAt", now_iso),
                                **({"message": msg} if msg else {}),
                            }
                        },
                        prev,
                    )
                )
                failed += 1
                all_ready = False
            else:
                cstatuses.append(self._failing(c, state, msg, prev))
                all_ready = False
        if run_once and containers and done == len(containers):
            phase = "Succeeded"
        elif failed and done + failed == len(containers):
            phase = "Failed"
        ready = "True" if all_ready else "False"
        conds = [
            {"type": "PodReadyToStartContainers", "status": "True"},
            {
                "type": "Initialized",
                "status": "True" if initialized else "False",
                **({} if initialized else {"reason": "ContainersNotInitialized"}),
            },
            {"type": "Ready", "status": ready, **({} if all_ready else {"reason": "ContainersNotReady"})},
            {
                "type": "ContainersReady",
                "status": ready,
                **({} if all_ready else {"reason": "ContainersNotReady"}),
            },
            sched,
        ]
        old_conds = {c["type"]: c for c in self.old.get("conditions") or []}
        for c in conds:
            prev_c = old_conds.get(c["type"], {})
            c["lastTransitionTime"] = (
                prev_c.get("lastTransitionTime") if prev_c.get("status") == c["status"] else now_iso
            )
            c["lastProbeTime"] = None
        out = {**base, "phase": phase, "conditions": conds, "containerStatuses": cstatuses}
        if inits:
            out["initContainerStatuses"] = init_statuses
        return out

    def _cs(
        self,
        c: Obj,
        ready: bool,
        state: Obj,
        prev: dict[str, Obj],
        started: bool | None = None,
        restarts: int | None = None,
        last: Obj | None = None,
    ) -> Obj:
        p = prev.get(c["name"]) or {}
        cs = {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": ready,
            "restartCount": restarts if restarts is not None else int(p.get("restartCount", 0)),
            "started": bool(started if started is not None else "running" in state),
            "state": state,
            "lastState": last if last is not None else p.get("lastState") or {},
        }
        if "running" in state or "terminated" in state:
            cs["containerID"] = (
                "containerd://" + hashlib.sha256(f"{self.uid}/{c['name']}".encode()).hexdigest()
            )
        return cs

    def _failing(self, c: Obj, state: str, msg: str, prev: dict[str, Obj]) -> Obj:
        key = (self.uid, c["name"])
        first = self.k.failures.setdefault(key, time.time())
        p = prev.get(c["name"]) or {}
        restarts = max(int(p.get("restartCount", 0)), _backoff_restarts(time.time() - first))
        finished = u.iso()
        last = {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "message": msg,
                "startedAt": u.iso(first),
                "finishedAt": finished,
            }
        }
        if restarts == 0:
            return self._cs(c, False, last, prev, started=False, restarts=0, last={})
        return self._cs(
            c,
            False,
            {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": (
                        f"back-off {min(10 * 2 ** (restarts - 1), 300)}s restarting failed "
                        f"container={c['name']} "
                        f"pod={self.meta['name']}_{self.meta['namespace']}({self.uid}): {msg}"
                    ),
                }
            },
            prev,
            started=False,
            restarts=restarts,
            last=last,
        )

    # ------------------------------------------------------------------------------- behaviour
    def run_container(self, c: Obj, init: bool) -> Result:
        name = c.get("name", "")
        image = str(c.get("image", ""))
        cmd = [*(c.get("command") or []), *(c.get("args") or [])]
        try:
            if "flannel-io/flannel" in image and any("flanneld" in str(x) for x in cmd):
                return self.flanneld(c)
            if cmd[:1] == ["cp"]:
                return self.copy(c, cmd, image)
            if "node-feature-discovery" in image and (
                name == "worker" or "nfd-worker" in " ".join(map(str, cmd))
            ):
                return self.nfd_worker(c)
            waited = _waits_for_file(cmd)
            if waited is not None:
                return self.wait_for_file(c, waited)
            fn = GPU_OPERATOR.get(name)
            if fn is not None and ("nvidia" in image or "nvcr.io" in image):
                return fn(self, c)
            wanted = u.quantity_to_int(u.dig(c, "resources", "limits", "nvidia.com/gpu"))
            if wanted > 0:
                return self.gpu_workload(c, wanted)
        except ApiError as exc:
            return FAIL, f"error talking to the API server: {exc.message}"
        return OK, ""

    def runtime_handler(self) -> str | None:
        """The containerd runtime of the pod: its RuntimeClass's handler (None: containerd's default)."""
        rc_name = self.spec.get("runtimeClassName")
        if not rc_name:
            return None
        rc = self.k.client.find(self.k.R("runtimeclasses"), "", rc_name) if self.k.client else None
        return (rc or {}).get("handler") or rc_name

    def wait_for_file(self, c: Obj, path: str) -> Result:
        """`until [ -f PATH ]; do ...; sleep N; done` (the operands' wait for a validation): done once
        the file is there, through the container's mounts."""
        found = self.volume(c, path)
        if found is not None and "hostPath" in found[0]:
            vol, rest = found
            if self.host.exists(f"{vol['hostPath']['path'].rstrip('/')}/{rest}"):
                return OK, ""
        return WAIT, f"waiting for {path}"

    def device_plugin_env(self) -> dict[str, str]:
        """The environment of this node's device plugin container (the GPU Operator's DaemonSet): what
        decides the plugin's Allocate answers. Empty when no device plugin runs here."""
        assert self.k.client is not None
        try:
            pods = self.k.client.list(
                self.k.R("pods"), None, "app=nvidia-device-plugin-daemonset",
                f"spec.nodeName={self.k.s.node_name}",
            )  # fmt: skip
        except ApiError:
            return {}
        for pod in pods:
            for c in u.dig(pod, "spec", "containers") or []:
                if c.get("name") == "nvidia-device-plugin":
                    return {str(e.get("name")): str(e.get("value", "")) for e in c.get("env") or []}
        return {}

    def gpu_workload(self, c: Obj, wanted: int) -> Result:
        """A container that requests nvidia.com/gpu: it runs when it gets GPU device nodes, which
        kube_gpu works out from the device plugin's strategies, `containerd config dump` and the CDI
        specs. Its log is the device nodes it would see (what `ls /dev/nvidia*` in it prints)."""
        from .kube_gpu import DevicePlugin, access

        try:
            profile = json.loads(self.host.read("/etc/gpuprov-lab/profile.json", "") or "{}")
        except ValueError:
            profile = {}
        gpus = (profile.get("gpus") or [])[:wanted]
        plugin = DevicePlugin.from_env(self.device_plugin_env())
        got = access(self.host, plugin, self.runtime_handler(), gpus, self.k.containerd())
        if not got.devices:
            return FAIL, f"ls: /dev/nvidia*: No such file or directory (SIMULATED: no GPU: {got.how})"
        return OK, "\n".join(got.devices) + f"\n(SIMULATED: {got.how})"

    def copy(self, c: Obj, cmd: list[Any], image: str) -> Result:
        files = [str(x) for x in cmd[1:] if not str(x).startswith("-")]
        if len(files) != 2:
            return OK, ""
        src, dst = files
        data = self.read_in(c, src)
        if data is None and "flannel-cni-plugin" in image and src == "/flannel":
            data = FLANNEL_PLUGIN
        if data is None:
            return FAIL, f"cp: cannot stat '{src}': No such file or directory"
        mode = 0o755 if dst.startswith("/opt/cni/bin") else 0o644
        if not self.write_in(c, dst, data, mode):
            return FAIL, f"cp: cannot create regular file '{dst}': Read-only file system"
        return OK, ""

    def br_netfilter(self) -> bool:
        """Is br_netfilter loaded? Judged from the boot-time module configuration: lab hosts share this
        machine's kernel, so its live /proc/modules and /proc/sys/net/bridge say nothing about the host."""
        for path in ["/etc/modules", *self.host.glob("/etc/modules-load.d/*.conf")]:
            for line in (self.host.read(path, "") or "").splitlines():
                if line.split("#", 1)[0].strip() == "br_netfilter":
                    return True
        return False

    def flanneld(self, c: Obj) -> Result:
        node_name = self.k.s.node_name
        if not self.br_netfilter():
            return FAIL, (
                "Failed to check br_netfilter: stat /proc/sys/net/bridge/bridge-nf-call-iptables: no such "
                "file or directory"
            )
        cidr = u.dig(self.node, "spec", "podCIDR")
        if not cidr:
            return (
                FAIL,
                f'Error registering network: failed to acquire lease: node "{node_name}" pod cidr not '
                f"assigned",
            )
        conf_text = self.read_in(c, "/etc/kube-flannel/net-conf.json")
        if conf_text is None:
            return (
                FAIL,
                "Failed to create SubnetManager: error reading net conf: open "
                "/etc/kube-flannel/net-conf.json",
            )
        try:
            conf = json.loads(conf_text)
        except ValueError as exc:
            return FAIL, f"Failed to create SubnetManager: error parsing subnet config: {exc}"
        network = conf.get("Network", "")
        if network and not ipaddress.ip_network(cidr).subnet_of(ipaddress.ip_network(network)):  # type: ignore[arg-type]
            return FAIL, (
                f"Error registering network: failed to configure interface flannel.1: pod cidr {cidr} is not "
                f"within the flannel network {network}"
            )
        backend = u.dig(conf, "Backend", "Type", default="vxlan")
        mtu = 1450 if backend == "vxlan" else 1500
        first = str(next(ipaddress.ip_network(cidr).hosts()))
        prefix = ipaddress.ip_network(cidr).prefixlen
        masq = (
            "true"
            if "--ip-masq" in [*map(str, c.get("command") or []), *map(str, c.get("args") or [])]
            else "false"
        )
        env = (
            f"FLANNEL_NETWORK={network}\nFLANNEL_SUBNET={first}/{prefix}\nFLANNEL_MTU={mtu}\n"
            f"FLANNEL_IPMASQ={masq}\n"
        )
        if not self.write_in(c, "/run/flannel/subnet.env", env):
            self.host.write("/run/flannel/subnet.env", env)
        ann = u.dig(self.node, "metadata", "annotations") or {}
        want = {
            "flannel.alpha.coreos.com/backend-type": backend,
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": self.k.s.node_ip,
            "flannel.alpha.coreos.com/backend-data": json.dumps(
                {"VNI": 1, "VtepMAC": _mac(node_name)}, separators=(",", ":")
            ),
        }
        if any(ann.get(k) != v for k, v in want.items()):
            assert self.k.client is not None
            self.k.client.patch(self.k.R("nodes"), "", node_name, {"metadata": {"annotations": want}})
        return OK, ""

    def nfd_worker(self, c: Obj) -> Result:
        """Publish this host's PCI devices as NodeFeature labels (the master applies them)."""
        conf_text = None
        for v in self.spec.get("volumes") or []:
            if "configMap" in v:
                cm = self._configmap(v["configMap"].get("name", ""))
                if cm and "nfd-worker.conf" in (cm.get("data") or {}):
                    conf_text = cm["data"]["nfd-worker.conf"]
        conf = (u.yaml_load(conf_text) or {}) if conf_text else {}
        pci = u.dig(conf, "sources", "pci") or {}
        classes = [str(x) for x in pci.get("deviceClassWhitelist") or ["03", "0b40", "12"]]
        fields = list(pci.get("deviceLabelFields") or ["class", "vendor"])
        labels: dict[str, str] = {}
        for dev in self.host.listdir("/sys/bus/pci/devices"):
            base = f"/sys/bus/pci/devices/{dev}"
            cls = (self.host.read(f"{base}/class", "") or "").strip().removeprefix("0x")
            vendor = (self.host.read(f"{base}/vendor", "") or "").strip().removeprefix("0x")
            device = (self.host.read(f"{base}/device", "") or "").strip().removeprefix("0x")
            if not cls or not any(cls.startswith(w) for w in classes):
                continue
            parts = {"class": cls[:4], "vendor": vendor, "device": device}
            key = "_".join(parts[f] for f in fields if f in parts)
            labels[f"feature.node.kubernetes.io/pci-{key}.present"] = "true"
        osr = self.host.os_release()
        kernel = self.host.kernel_release()
        full = kernel.split("-")[0].split(".")
        labels.update(
            {
                "feature.node.kubernetes.io/kernel-version.full": kernel,
                "feature.node.kubernetes.io/kernel-version.major": full[0],
                "feature.node.kubernetes.io/kernel-version.minor": full[1] if len(full) > 1 else "0",
                "feature.node.kubernetes.io/system-os_release.ID": osr.get("ID", "linux"),
                "feature.node.kubernetes.io/system-os_release.VERSION_ID": osr.get("VERSION_ID", ""),
                "feature.node.kubernetes.io/system-os_release.VERSION_ID.major": osr.get(
                    "VERSION_ID", ""
                ).split(".")[0],
            }
        )
        labels = {k: v for k, v in labels.items() if v}
        assert self.k.client is not None
        nf = self.k.client.resource("nodefeatures.nfd.k8s-sigs.io")
        if nf is None:
            return (
                FAIL,
                "failed to create NodeFeature object: the server could not find the requested resource",
            )
        ns, name = self.meta["namespace"], self.k.s.node_name
        have = self.k.client.find(nf, ns, name)
        body = {
            "apiVersion": f"{nf.group}/{nf.version}",
            "kind": "NodeFeature",
            "metadata": {"name": name, "namespace": ns, "labels": {"nfd.node.kubernetes.io/node-name": name}},
            "spec": {"labels": labels},
        }
        if have is None:
            self.k.client.create(nf, ns, body)
        elif u.dig(have, "spec", "labels") != labels:
            self.k.client.patch(nf, ns, name, {"spec": {"labels": None}})
            self.k.client.patch(nf, ns, name, {"spec": {"labels": labels}})
        return OK, ""

    # ---------------------------------------------------------------------------- GPU Operator
    def _node_pod(self, selector: str) -> Obj | None:
        assert self.k.client is not None
        pods = self.k.client.list(
            self.k.R("pods"), self.meta["namespace"], selector, f"spec.nodeName={self.k.s.node_name}"
        )
        return pods[0] if pods else None

    def _validated(self, c: Obj, component: str, ok: bool, msg: str) -> Result:
        path = f"{_validations_dir(self, c)}/{component}-ready"
        if ok:
            content = f"{component.upper()}_VALIDATED=true\n"
            if self.host.read(path) != content:
                self.host.write(path, content)
            return OK, ""
        self.host.remove(path)
        return FAIL, msg

    def driver_validation(self, c: Obj) -> Result:
        drv = self._node_pod("app=nvidia-driver-daemonset")
        if drv is not None:
            from .kube_ctrl import pod_ready

            return self._validated(
                c,
                "driver",
                pod_ready(drv),
                "driver container is not ready: waiting for nvidia-driver-daemonset on this node",
            )
        ok, out = self.k.nvidia_smi()
        return self._validated(
            c, "driver", ok, f"running nvidia-smi on the host failed: {out.splitlines()[-1] if out else ''}"
        )

    def toolkit_validation(self, c: Obj) -> Result:
        tk = self._node_pod("app=nvidia-container-toolkit-daemonset")
        if tk is not None:
            from .kube_ctrl import pod_ready

            return self._validated(
                c, "toolkit", pod_ready(tk), "waiting for nvidia-container-toolkit-daemonset"
            )
        ok = self.k.containerd().has_runtime("nvidia")
        return self._validated(
            c,
            "toolkit",
            ok,
            "toolkit is not ready: the nvidia runtime is not configured in "
            "containerd (/etc/containerd/config.toml)",
        )

    def cuda_validation(self, c: Obj) -> Result:
        ok = self.host.exists(f"{_validations_dir(self, c)}/driver-ready")
        return self._validated(c, "cuda", ok, "cuda workload validation failed: the driver is not validated")

    def plugin_validation(self, c: Obj) -> Result:
        # gpu-operator v25.10.0 cmd/nvidia-validator/main.go validateGPUResource: any capacity named
        # nvidia.com/mig-* or nvidia.com/gpu* of at least 1.
        capacity = u.dig(self.node, "status", "capacity") or {}
        gpus = sum(
            u.quantity_to_int(v)
            for k, v in capacity.items()
            if k.startswith(("nvidia.com/mig-", "nvidia.com/gpu"))
        )
        return self._validated(
            c,
            "plugin",
            gpus > 0,
            "no GPU resources (nvidia.com/gpu) found on the node: the device plugin has not registered",
        )

    def validator(self, c: Obj) -> Result:
        d = _validations_dir(self, c)
        missing = [
            x for x in ("driver", "toolkit", "cuda", "plugin") if not self.host.exists(f"{d}/{x}-ready")
        ]
        return (OK, "") if not missing else (FAIL, f"validations not complete: {', '.join(missing)}")

    def driver_ctr(self, c: Obj) -> Result:
        loaded = self.host.exists("/proc/driver/nvidia/version") or self.k.nvidia_smi()[0]
        if loaded:
            return FAIL, (
                "Could not unload NVIDIA driver kernel modules, driver is in use (a driver is already "
                "installed on the host)"
            )
        return (
            FAIL,
            "SIMULATED (gpuprov lab): a containerized NVIDIA driver cannot be built and loaded on a lab host",
        )

    def device_plugin(self, c: Obj) -> Result:
        """The device plugin: NVML must answer; with a CDI device-list strategy it writes its CDI spec
        (k8s-device-plugin v0.18.0 internal/cdi/cdi.go CreateSpecFile: vendor k8s.device-plugin.nvidia.com,
        class gpu, devices named by DEVICE_ID_STRATEGY, /var/run/cdi/<vendor>-<class>.json). The lab
        has the host's real nvidia-ctk generate it (the plugin links the same nvcdi library)."""
        from .kube_gpu import DevicePlugin

        gpus = self.k.gpu_list()
        if not gpus:
            _ok, out = self.k.nvidia_smi()
            return (
                FAIL,
                f"Failed to initialize NVML: "
                f"{out.splitlines()[-1] if out else 'could not load NVML library'}",
            )
        env = {str(e.get("name")): str(e.get("value", "")) for e in c.get("env") or []}
        started = self._plugin_resources(c, env)
        if started is not None:
            return started
        plugin = DevicePlugin.from_env(env)
        if not plugin.cdi:
            return OK, ""
        spec_path = plugin.spec_path()
        hook = env.get("NVIDIA_CDI_HOOK_PATH") or env.get("NVIDIA_CTK_PATH") or "/usr/bin/nvidia-ctk"
        argv = [
            "nvidia-ctk", "cdi", "generate", "--vendor", plugin.vendor, "--class", "gpu",
            "--device-name-strategy", plugin.id_strategy, "--nvidia-cdi-hook-path", hook,
            "--output", spec_path,
        ]  # fmt: skip

        def generate() -> tuple[int, str]:
            if self.host.which("nvidia-ctk") is None:
                return 1, (
                    "SIMULATED (gpuprov lab): the lab's device plugin writes its CDI spec with the "
                    "host's nvidia-ctk, which is not installed"
                )
            res = self.host.run(argv, timeout=60)
            return res.returncode, (res.stdout + res.stderr).strip()

        key = f"device-plugin-cdi/{self.uid}"
        rc, out = self.k.cached(key, 3600, generate)
        if rc != 0:
            # A plugin that failed restarts (CrashLoopBackOff) and tries again; not on every pass.
            stamp = (self.k.cache.get(key) or (0.0,))[0]
            if time.monotonic() - stamp > 30:
                self.k.cache.pop(key, None)
            return FAIL, f"failed to create CDI spec file: {out.splitlines()[-1] if out else rc}"
        return OK, ""

    def dcgm_exporter(self, c: Obj) -> Result:
        """dcgm-exporter: serves /metrics on the pod's IP while it runs (kube_exporter)."""
        from . import kube_exporter

        ok, why = kube_exporter.run_container(self, c)
        return (OK, "") if ok else (FAIL, why)

    def _plugin_resources(self, c: Obj, env: dict[str, str]) -> Result | None:
        """The plugin's config and the resources it registers (kube_deviceplugin), kept for the pod as
        the process would keep them; a FAIL result when the plugin exits, None when it runs."""
        from . import kube_deviceplugin as dp

        try:
            loaded, restarted = dp.loaded_config(self, c)
            if restarted or "resources" not in loaded:
                config = dp.parse_config(loaded["text"])
                gpus = dp.read_gpus(self.host)
                strategy = dp.mig_strategy(env, config)
                loaded["resources"] = dp.advertised(config, strategy, gpus)
                dp.write_loaded(self.host, self.uid, loaded)
        except dp.PluginError as exc:
            dp.forget(self.host, self.uid)
            return FAIL, f"error starting plugins: {exc}"
        return None

    def config_manager(self, c: Obj) -> Result:
        """k8s-device-plugin v0.18.0 cmd/config-manager: picks the ConfigMap key for the node label
        (init container: once; sidecar: on every label change); it exits on a key it cannot find."""
        from . import kube_deviceplugin as dp

        main = next(
            (x for x in self.spec.get("containers") or [] if "CONFIG_FILE" in dp._env(x)),
            None,
        )
        try:
            dp.current_choice(self, main or c)
        except dp.PluginError as exc:
            return FAIL, f"Error: {exc}"
        return OK, ""

    def mig_manager(self, c: Obj) -> Result:
        """The MIG manager (kube_mig): after the entrypoint's wait for the driver validation, one
        manager thread per pod watches the node's nvidia.com/mig.config label."""
        from . import kube_mig
        from .kube_client import Client, load_kubeconfig

        ready = self.host.read(f"{_validations_dir(self, c)}/driver-ready")
        if ready is None:
            return WAIT, "waiting for the driver validations to be ready..."
        status = dict(ln.split("=", 1) for ln in ready.splitlines() if "=" in ln)
        # IS_HOST_DRIVER as the real validator writes it; the lab's validator file lacks it, and the
        # validator's rule is: a host driver unless the driver container runs on the node.
        host_driver = (
            status.get("IS_HOST_DRIVER") or str(self._node_pod("app=nvidia-driver-daemonset") is None).lower()
        )
        env = {str(e.get("name")): str(e.get("value", "")) for e in c.get("env") or []}

        def ref(path: str) -> tuple[str, str] | None:
            found = self.volume(c, path) if path else None
            if found is None or "configMap" not in found[0]:
                return None
            cm, rest = found[0]["configMap"], found[1]
            key = next((i["key"] for i in cm.get("items") or [] if i.get("path") == rest), rest)
            return str(cm.get("name", "")), key

        # v0.15.0 without CONFIG_FILE generates its config from NVML's MIG profiles and falls back to
        # DEFAULT_CONFIG_FILE; the lab's GPUs answer MIG through the simulated nvidia-smi, not the mock
        # NVML, so the simulated manager takes the fallback.
        config_path = env.get("CONFIG_FILE") or env.get("DEFAULT_CONFIG_FILE", "")

        ns, name, kubeconfig = self.meta["namespace"], self.meta["name"], self.k.s.kubeconfig
        settings = kube_mig.Settings(
            node=self.k.s.node_name,
            namespace=ns,
            pod=name,
            uid=self.uid,
            config_file=ref(config_path),
            clients_file=ref(env.get("GPU_CLIENTS_FILE", "")),
            shutdown_host_clients=host_driver == "true",
            with_reboot=env.get("WITH_REBOOT", "").lower() == "true",
            log_path=f"/var/log/pods/{ns}_{name}_{self.uid}/{c['name']}/0.log",
        )

        def make() -> kube_mig.MigManager:
            m = kube_mig.MigManager(
                self.host, lambda: Client(load_kubeconfig(self.host, kubeconfig), timeout=10), settings
            )
            m.log("info", f"WITH_SHUTDOWN_HOST_GPU_CLIENTS={host_driver}")
            m.log("info", "Starting nvidia-mig-manager")
            m.log("info", f"Using config: {config_path}")
            return m

        kube_mig.ensure_running(self.host, self.uid, make)
        return OK, ""

    def needs_driver(self, c: Obj) -> Result:
        ok, out = self.k.nvidia_smi()
        return (
            (OK, "")
            if ok
            else (FAIL, f"Failed to initialize NVML: {out.splitlines()[-1] if out else 'no driver'}")
        )

    def gfd(self, c: Obj) -> Result:
        from . import kube_deviceplugin as dp

        res = self.k.cached(
            f"gfd-query/{self.uid}",
            30,
            lambda: self.host.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,memory.total,driver_version,mig.mode.current",
                    "--format=csv,noheader,nounits",
                ],
                timeout=30,
            ),
        )
        if res.returncode != 0:
            return FAIL, "Failed to initialize NVML: " + (res.stdout + res.stderr).strip()
        rows = [[x.strip() for x in ln.split(",")] for ln in res.stdout.splitlines() if ln.strip()]
        if not rows:
            return FAIL, "no GPUs found"
        name, mem, drv = (
            rows[0][0],
            rows[0][1] if len(rows[0]) > 1 else "",
            rows[0][2] if len(rows[0]) > 2 else "",
        )
        mig = rows[0][3] if len(rows[0]) > 3 else "[N/A]"
        labels = {
            "nvidia.com/gpu.product": name.replace(" ", "-"),
            "nvidia.com/gpu.count": str(len(rows)),
            "nvidia.com/gpu.memory": mem,
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/mig.capable": "false" if mig in ("[N/A]", "N/A", "") else "true",
            "nvidia.com/gfd.timestamp": str(int(time.time() // 3600 * 3600)),
        }
        if drv.count(".") >= 1:
            parts = drv.split(".")
            labels.update(
                {
                    "nvidia.com/cuda.driver.major": parts[0],
                    "nvidia.com/cuda.driver.minor": parts[1],
                    "nvidia.com/cuda.driver.rev": parts[2] if len(parts) > 2 else "",
                }
            )
        # k8s-device-plugin v0.18.0 internal/lm: the resource labels from the config the process read
        # at its start (the same config-manager choice as the plugin's) and the devices NVML shows.
        env = {str(e.get("name")): str(e.get("value", "")) for e in c.get("env") or []}
        try:
            loaded, restarted = dp.loaded_config(self, c)
            config = dp.parse_config(loaded["text"])
            if restarted:
                dp.write_loaded(self.host, self.uid, loaded)
            gpus = self.k.cached(f"gfd-gpus/{self.uid}", 30, lambda: dp.read_gpus(self.host))
        except dp.PluginError as exc:
            dp.forget(self.host, self.uid)
            return FAIL, str(exc)
        labels.update(dp.gfd_labels(config, dp.mig_strategy(env, config), gpus))
        labels["nvidia.com/mig.capable"] = str(any(g.mig_capable for g in gpus)).lower()
        have = u.dig(self.node, "metadata", "labels") or {}
        # Labels of resources no longer there go (NFD drops what GFD's features file no longer has).
        gone = {
            k: None
            for k in have
            if k not in labels
            and (
                k.startswith(("nvidia.com/mig-", "nvidia.com/gpu.slices.")) or k == "nvidia.com/mig.strategy"
            )
        }
        patch = {k: v for k, v in labels.items() if have.get(k) != v and k != "nvidia.com/gfd.timestamp"}
        if patch or gone:
            assert self.k.client is not None
            self.k.client.patch(
                self.k.R("nodes"), "", self.k.s.node_name, {"metadata": {"labels": {**labels, **gone}}}
            )
        return OK, ""


def _waits_for_file(cmd: list[Any]) -> str | None:
    """The file a `sh -c "until [ -f FILE ]; do ...; done"` container waits for."""
    import re

    text = " ".join(str(x) for x in cmd)
    m = re.search(r"until \[ -f (\S+) \]", text)
    return m.group(1) if m and cmd[:1] in (["sh"], ["/bin/sh"], ["bash"]) else None


def _validations_dir(runner: PodRunner, c: Obj) -> str:
    found = runner.volume(c, "/run/nvidia/validations")
    if found and "hostPath" in found[0]:
        return found[0]["hostPath"]["path"].rstrip("/")
    from .kube_let import VALIDATIONS

    return VALIDATIONS


def _mac(seed: str) -> str:
    h = hashlib.md5(seed.encode()).hexdigest()
    return "5a:" + ":".join(h[i : i + 2] for i in range(0, 10, 2))


GPU_OPERATOR: dict[str, Any] = {
    "driver-validation": PodRunner.driver_validation,
    "toolkit-validation": PodRunner.toolkit_validation,
    "cuda-validation": PodRunner.cuda_validation,
    "plugin-validation": PodRunner.plugin_validation,
    "nvidia-operator-validator": PodRunner.validator,
    "nvidia-driver-ctr": PodRunner.driver_ctr,
    "nvidia-device-plugin": PodRunner.device_plugin,
    "nvidia-dcgm-exporter": PodRunner.dcgm_exporter,
    "nvidia-dcgm-ctr": PodRunner.needs_driver,
    "gpu-feature-discovery": PodRunner.gfd,
    "nvidia-mig-manager": PodRunner.mig_manager,
    "config-manager-init": PodRunner.config_manager,
    "config-manager": PodRunner.config_manager,
}
