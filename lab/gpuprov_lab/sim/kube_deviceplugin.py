"""The NVIDIA device plugin's configuration and the resources it advertises, SIMULATED (gpuprov lab).

No plugin binary runs on a lab host's kubelet; what it would advertise is worked out here from the same
inputs, following NVIDIA/k8s-device-plugin v0.18.0:

- cmd/config-manager/main.go (updateConfigName): the config-manager containers pick the ConfigMap key
  named by the node label nvidia.com/device-plugin.config, else DEFAULT_CONFIG (the GPU Operator sets it
  from devicePlugin.config.default), else the fallback "empty" (FALLBACK_STRATEGIES=empty, set by the
  operator's handleDevicePluginConfig): no config file at all. The sidecar signals the plugin (SIGHUP)
  only when its choice changes; the plugin then restarts and reads /config/config.yaml again
  (cmd/nvidia-device-plugin/main.go start: the config is read in startPlugins only). A change of the
  ConfigMap's content alone is never signalled, and the GPU Operator does not watch that ConfigMap: the
  plugin keeps what it read until its pod is recreated. The config a plugin read is kept per pod in
  LOADED_DIR (what the plugin process holds in memory).
- api/config/v1 (config.go parseConfigFrom, replicas.go, sharing.go): the file's version must be v1;
  sharing.timeSlicing / sharing.mps resources need a name and replicas >= 2; renameByDefault renames
  nvidia.com/gpu to nvidia.com/gpu.shared. Errors reach the container's log as the plugin prints them
  and the plugin exits (CrashLoopBackOff).
- internal/rm/rm.go AddDefaultResourcesToConfig and internal/rm/device_map.go: strategy none advertises
  every GPU as nvidia.com/gpu; single advertises the MIG devices as nvidia.com/gpu and requires every
  GPU to be MIG-enabled with one profile; mixed advertises nvidia.com/mig-<profile> per MIG device and
  nvidia.com/gpu for GPUs without MIG. Replicas multiply the devices of the shared resource.
- internal/lm (resource.go, mig-strategy.go): the labels gpu-feature-discovery publishes from the same
  config and devices.

The GPUs and MIG devices come from the host's nvidia-smi: ``nvidia-smi -L`` (MIG devices listed under
their GPU) and ``--query-gpu=index,name,memory.total,mig.mode.current``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from . import kube_mig
from . import kube_util as u

if TYPE_CHECKING:
    from .kube_host import Host
    from .kube_pods import PodRunner

CONFIG_LABEL = "nvidia.com/device-plugin.config"
LOADED_DIR = "/run/gpuprov-lab/device-plugin"  # SIMULATED: what each plugin pod read when it started
GPU = "nvidia.com/gpu"
QUERY = "index,name,memory.total,mig.mode.current"


class PluginError(Exception):
    """The plugin (or its config-manager) exits with this message."""


# ------------------------------------------------------------------------------------- config-manager
def select_config(label: str, available: list[str], default: str) -> str:
    """updateConfigName: the ConfigMap key to use ("" = no config file); PluginError as the real
    config-manager words it."""
    if not available:
        raise PluginError("no configuration files available")
    if label:
        if label not in available:
            raise PluginError(f"specified config {label} does not exist")
        return label
    if default:
        if default not in available:
            # The real message prints the (empty) label value, not the default's name.
            raise PluginError("specified config  does not exist")
        return default
    return ""  # FALLBACK_STRATEGIES=empty


# ------------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class Replicated:
    name: str  # the resource shared, e.g. nvidia.com/gpu
    replicas: int
    rename: str  # "" or the name it is advertised under


@dataclass(frozen=True)
class PluginConfig:
    mig_strategy: str = ""  # flags.migStrategy from the file ("" = unset)
    strategy: str = "none"  # none | time-slicing | mps
    shared: tuple[Replicated, ...] = ()

    def replicas_of(self, resource: str) -> Replicated | None:
        return next((r for r in self.shared if r.name == resource), None)


def _resource_name(raw: Any) -> str:
    name = str(raw)
    return name if name.startswith("nvidia.com/") else f"nvidia.com/{name}"


def _replicated(raw: Any) -> tuple[bool, tuple[Replicated, ...]]:
    """ReplicatedResources.UnmarshalJSON and ReplicatedResource.UnmarshalJSON (their messages)."""
    if not isinstance(raw, dict):
        raise PluginError("json: cannot unmarshal into Go value of type v1.ReplicatedResources")
    rename_default = bool(raw.get("renameByDefault", False))
    resources = raw.get("resources")
    if not isinstance(resources, list) or not resources:
        raise PluginError("no resources specified")
    out = []
    for r in resources:
        if not isinstance(r, dict) or "name" not in r:
            raise PluginError("no resource name specified")
        devices = r.get("devices", "all")
        if isinstance(devices, str) and devices != "all":
            raise PluginError(f"devices set as '{devices}' but the only valid string input is 'all'")
        if "replicas" not in r:
            raise PluginError("no replicas specified")
        replicas = r["replicas"]
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise PluginError(
                f"json: cannot unmarshal {type(replicas).__name__} into Go struct field "
                f"ReplicatedResource.replicas of type int"
            )
        if replicas < 2:
            raise PluginError("number of replicas must be >= 2")
        name = _resource_name(r["name"])
        # DisableResourceNamingInConfig: a custom rename is ignored; renameByDefault gives <name>.shared.
        out.append(Replicated(name, replicas, f"{name}.shared" if rename_default else ""))
    return rename_default, tuple(out)


def parse_config(text: str) -> PluginConfig:
    """parseConfigFrom as the plugin wraps its errors: PluginError with the real message chain."""

    def fail(why: str) -> PluginError:
        return PluginError(
            "unable to load config: unable to finalize config: unable to parse config file: "
            f"error parsing config file: {why}"
        )

    try:
        doc = u.yaml_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise fail(f"unmarshal error: error converting YAML to JSON: yaml: {exc}") from None
    if not isinstance(doc, dict):
        raise fail("unmarshal error: error unmarshaling JSON: json: cannot unmarshal into v1.Config")
    version = str(doc.get("version") or "v1")
    if version != "v1":
        raise fail(f"unknown version: {version}")
    sharing = doc.get("sharing") or {}
    try:
        ts = _replicated(sharing["timeSlicing"]) if sharing.get("timeSlicing") is not None else None
        mps = _replicated(sharing["mps"]) if sharing.get("mps") is not None else None
    except PluginError as exc:
        raise fail(f"unmarshal error: error unmarshaling JSON: while decoding JSON: {exc}") from None
    # Sharing.SharingStrategy: MPS first when it replicates anything, then time-slicing.
    if mps and mps[1]:
        strategy, shared = "mps", mps[1]
    elif ts and ts[1]:
        strategy, shared = "time-slicing", ts[1]
    else:
        strategy, shared = "none", ()
    flags = doc.get("flags") or {}
    return PluginConfig(str(flags.get("migStrategy") or ""), strategy, shared)


# ------------------------------------------------------------------------------------------ devices
@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: str
    mig_capable: bool
    mig_enabled: bool
    mig_devices: tuple[str, ...] = field(default=())  # one profile name per MIG device


def read_gpus(host: Host) -> list[Gpu]:
    """The host's GPUs as NVML shows them to the plugin, through nvidia-smi; PluginError when the
    driver does not answer."""
    q = host.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"], timeout=30)
    if q.returncode != 0:
        last = (q.stdout + q.stderr).strip().splitlines()
        raise PluginError(f"failed to initialize NVML: {last[-1] if last else 'ERROR_LIBRARY_NOT_FOUND'}")
    listing = host.run(["nvidia-smi", "-L"], timeout=30)
    migs = kube_mig.parse_listing(listing.stdout if listing.returncode == 0 else "")
    out = []
    for line in q.stdout.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4 or not cols[0].isdigit():
            continue
        index = int(cols[0])
        mode = cols[3]
        devices = tuple(p for p, n in sorted(migs.get(index, {}).items()) for _ in range(n))
        out.append(Gpu(index, cols[1], cols[2], mode not in ("[N/A]", "N/A", ""), mode == "Enabled", devices))
    return out


def mig_strategy(env: dict[str, str], config: PluginConfig) -> str:
    """--mig-strategy: the MIG_STRATEGY variable (applyMIGConfiguration sets it from ClusterPolicy
    mig.strategy) wins over the config file's flags.migStrategy; the default is none."""
    return env.get("MIG_STRATEGY") or config.mig_strategy or "none"


def _device_map(strategy: str, gpus: list[Gpu]) -> dict[str, int]:
    """buildDeviceMapFromConfigResources: resource → devices before replication."""
    if strategy not in ("none", "single", "mixed"):
        raise PluginError(f"unable to validate flags: unknown MIG strategy: {strategy}")
    prefix = (
        "error getting plugins: unable to create plugins: failed to construct resource managers: "
        "error building device map: error building device map from config.resources: "
    )
    devices: dict[str, int] = {}
    full = [g for g in gpus if strategy == "none" or not g.mig_enabled]
    if full:
        devices[GPU] = len(full)
    if strategy == "none":
        return devices
    enabled = [g for g in gpus if g.mig_enabled]
    empty = [g for g in enabled if not g.mig_devices]
    if strategy == "single":
        if empty:
            raise PluginError(
                prefix + "invalid MIG configuration: at least one device with migEnabled=true was not "
                f"configured correctly: device {empty[0].index} has no MIG devices configured"
            )
        if len({p for g in enabled for p in g.mig_devices}) > 1:
            raise PluginError(
                prefix + "invalid MIG configuration: more than one MIG device type present on node"
            )
        if full and enabled:
            raise PluginError(
                prefix + "all devices on the node must be configured with the same migEnabled value"
            )
        if enabled:
            devices[GPU] = sum(len(g.mig_devices) for g in enabled)
        return devices
    for g in enabled:  # mixed: one resource per profile ("+" becomes "." in the name)
        for profile in g.mig_devices:
            name = "nvidia.com/mig-" + profile.replace("+", ".")
            devices[name] = devices.get(name, 0) + 1
    return devices


def advertised(config: PluginConfig, strategy: str, gpus: list[Gpu]) -> dict[str, int]:
    """What the plugin registers with the kubelet: resource name → devices (replicas included)."""
    if config.strategy == "mps" and strategy == "mixed":
        raise PluginError("unable to validate flags: using --mig-strategy=mixed is not supported with MPS")
    devices = _device_map(strategy, gpus)
    out: dict[str, int] = {}
    for name, count in devices.items():
        rep = config.replicas_of(name)  # updateDeviceMapWithReplicas
        if rep is None:
            out[name] = out.get(name, 0) + count
        else:
            target = rep.rename or name
            out[target] = out.get(target, 0) + count * rep.replicas
    return {k: v for k, v in out.items() if v > 0}


# ------------------------------------------------------------------------------------------- labels
def _sanitise(text: str) -> str:
    kept = "".join(ch for ch in text if ch.isalnum() or ch in "-_. ")
    return "-".join(kept.split())


def _resource_labels(
    resource: str, config: PluginConfig | None, count: int, parts: list[str]
) -> dict[str, str]:
    """resourceLabeler.baseLabeler: product, count, replicas, sharing-strategy of one resource."""
    rep = config.replicas_of(resource) if config is not None else None
    replicas = 0 if config is None else (rep.replicas if rep else 1)
    shared = rep is not None and rep.replicas > 1
    product = "-".join(_sanitise(p) for p in parts if p)
    if shared and not rep.rename:  # type: ignore[union-attr]
        product += "-SHARED"
    strategy = config.strategy if config is not None and replicas > 1 else "none"
    return {
        f"{resource}.product": product,
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": strategy,
    }


def gfd_labels(config: PluginConfig, strategy: str, gpus: list[Gpu]) -> dict[str, str]:
    """internal/lm NewResourceLabeler (mig-strategy.go) for the node's GPUs: full GPU labels, then the
    MIG strategy's labels; later labelers win on the same key."""
    labels: dict[str, str] = {}
    if not gpus:
        return labels
    by_name: dict[tuple[str, bool], list[Gpu]] = {}
    for g in gpus:
        by_name.setdefault((g.name, g.mig_enabled and strategy != "none"), []).append(g)
    # MIG-enabled GPUs first, without sharing; full GPUs override them.
    for (name, mig_on), group in sorted(by_name.items(), key=lambda kv: not kv[0][1]):
        labels.update(_resource_labels(GPU, None if mig_on else config, len(group), [name]))
        if group[0].memory_mib.isdigit():
            labels[f"{GPU}.memory"] = group[0].memory_mib
    if strategy == "none":
        return labels
    labels["nvidia.com/mig.strategy"] = strategy
    enabled = [g for g in gpus if g.mig_enabled]
    profiles: dict[str, list[Gpu]] = {}
    for g in enabled:
        for p in g.mig_devices:
            profiles.setdefault(p, []).append(g)
    if strategy == "single":
        if not enabled:
            return labels
        reason = ""
        if any(not g.mig_devices for g in enabled):
            reason = "at least one MIG device is enabled but empty"
        elif len(enabled) != len(gpus):
            reason = "devices with MIG enabled and disable detected"
        elif len(profiles) != 1:
            reason = "more than one MIG device type present on node"
        if reason:  # newInvalidMigStrategyLabeler
            labels.update(
                {
                    f"{GPU}.product": f"{_sanitise(enabled[0].name)}-MIG-INVALID",
                    f"{GPU}.count": "0",
                    f"{GPU}.replicas": "0",
                    f"{GPU}.sharing-strategy": "",
                    f"{GPU}.memory": "0",
                }
            )
            return labels
    for profile, devs in profiles.items():
        resource = GPU if strategy == "single" else f"nvidia.com/mig-{profile}"
        labels.update(_resource_labels(resource, config, len(devs), [devs[0].name, "MIG", profile]))
        # MIG attributes: the compute slices are the profile name's "<N>g" for the GPU and compute
        # instance alike (mig-parted creates one full-size compute instance per GPU instance).
        slices = profile.split("g.", 1)[0]
        labels[f"{resource}.slices.gi"] = slices
        labels[f"{resource}.slices.ci"] = slices
    return labels


# ------------------------------------------------------------------------------ what a pod loaded
def loaded_path(uid: str) -> str:
    return f"{LOADED_DIR}/{uid}.json"


def read_loaded(host: Host, uid: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(host.read(loaded_path(uid), "") or "null")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def write_loaded(host: Host, uid: str, doc: dict[str, Any]) -> None:
    text = json.dumps(doc, sort_keys=True)
    if host.read(loaded_path(uid)) != text:
        host.write(loaded_path(uid), text)


def advertised_by(host: Host, uid: str) -> dict[str, int] | None:
    """The resources the plugin of pod ``uid`` registered (None: it has not registered any)."""
    doc = read_loaded(host, uid)
    if not doc or "resources" not in doc:
        return None
    return {str(k): int(v) for k, v in doc["resources"].items()}


# --------------------------------------------------------------------------- the containers' view
def _env(c: dict[str, Any]) -> dict[str, str]:
    return {str(e.get("name")): str(e.get("value", "")) for e in c.get("env") or []}


def current_choice(runner: PodRunner, c: dict[str, Any]) -> tuple[str, str] | None:
    """(ConfigMap key, its text) the config-manager would link to /config/config.yaml now; None when
    the container has no CONFIG_FILE (no devicePlugin.config.name: the plugin runs on its flags).
    PluginError when the config-manager cannot choose."""
    if "CONFIG_FILE" not in _env(c):
        return None
    found = runner.volume(c, "/available-configs/x")
    cm_name = found[0].get("configMap", {}).get("name", "") if found else ""
    cm = runner._configmap(cm_name) if cm_name else None
    if cm is None:
        raise PluginError(
            "error getting list of configuration files: open /available-configs: no such file or directory"
        )
    data = {str(k): str(v) for k, v in (cm.get("data") or {}).items()}
    manager = next(
        (
            x
            for x in [*(runner.spec.get("initContainers") or []), *(runner.spec.get("containers") or [])]
            if x.get("name") in ("config-manager", "config-manager-init")
        ),
        {},
    )
    labels = (runner.node.get("metadata") or {}).get("labels") or {}
    key = select_config(
        str(labels.get(CONFIG_LABEL, "")), sorted(data), _env(manager).get("DEFAULT_CONFIG", "")
    )
    return key, data.get(key, "")


def loaded_config(runner: PodRunner, c: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The config the plugin (or gpu-feature-discovery) of this pod runs with, and whether it (re)started
    on this pass: read at its first start and again only when the config-manager's choice of key changes
    (SIGHUP). A choice the config-manager cannot make leaves the running process as it is."""
    uid = runner.uid
    have = read_loaded(runner.host, uid)
    try:
        choice = current_choice(runner, c)
    except PluginError:
        if have is not None:
            return have, False
        raise
    key, text = choice if choice is not None else ("", "")
    if have is not None and have.get("key") == key and have.get("has_file") == (choice is not None):
        return have, False
    return {"key": key, "text": text, "has_file": choice is not None}, True


def forget(host: Host, uid: str) -> None:
    """The process exited: what it read is gone."""
    host.remove(loaded_path(uid))
