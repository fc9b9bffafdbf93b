"""Part of the gpuprov lab simulation: the front end of nvidia-mig-parted on lab hosts.

SIMULATED (gpuprov lab). NVIDIA's real nvidia-mig-parted v0.15.0 (from the real nvidia-mig-manager
package, kept at /usr/bin/nvidia-mig-parted.distrib by image-setup.sh's dpkg-divert) reads /proc/modules
before it touches a GPU (cmd/nvidia-mig-parted/util/nvml.go IsNvidiaModuleLoaded), which most lab hosts
lack, and past that it needs NVML's MIG calls, which NVIDIA's mock NVML does not have (no MIG devices):
``apply``, ``assert`` and ``export`` cannot work on the lab's GPUs. This front end:

- hands ``assert --valid-config``, ``--help``/``--version``, ``generate-config``, ``checkpoint`` and
  ``restore`` to the real binary, and has the real binary parse every config file first (``assert
  --valid-config``), so parse and selection errors are NVIDIA's own;
- carries out ``apply``/``assert``/``export`` itself against the host's simulated GPUs, with what
  nvidia-smi's front end does to them (smi.py, mig.py) where mig-parted calls NVML: the MIG mode
  (``nvidia-smi -mig``), destroying compute then GPU instances to clear, creating GPU instances with
  their compute instance (``nvidia-smi mig -cgi LIST -C``), the GPU reset (``nvidia-smi -r``: util/
  device.go nvmlResetAllGPUs runs exactly that).

Semantics follow NVIDIA/mig-parted v0.15.0, cmd/nvidia-mig-parted:
- main.go: errors end the program through logrus' Fatal (exit status 1, message capitalized).
- assert/assert.go: config file required; ``selected-config`` may be left out when the file has one
  config; "assertion failure: selected configuration not currently applied"; the success lines.
- assert/mode.go, assert/config.go: per matching GPU (devices/device-filter), mode first; a non
  MIG-capable GPU matches a disabled entry; devices compared with MigConfig.Equals (same profiles,
  same counts); every GPU must match.
- apply/apply.go ApplyMigConfigWithHooks: apply-start; apply-exit always at the end; pre-apply-mode and
  the mode change only when the mode assert fails; ``--mode-only`` stops there; pre-apply-config and the
  device change only when the config assert fails. Hook environment: the hook's envs plus the apply
  flags' variables (GetHooksEnvsMap), nothing else; hook output shown only with --debug
  (api/hooks/v1/hooks.go).
- apply/mode.go: existing MIG devices cleared before a mode change; reset when a change is pending,
  unless --skip-reset. apply/config.go: the mode/config mismatch errors.
- pkg/mig/config/config.go SetMigConfig: clear, then create the devices one ordering after another
  (iteratePermutationsUntilSuccess) until one fits; "error attempting multiple config orderings: all
  orderings failed".
- export/export.go, export/config.go: per-GPU specs merged (mergeMigConfigSpecs), label ``current``,
  YAML or JSON (not byte for byte yaml.v2's or encoding/json's layout: nothing reads it but people).

Config and hooks files are read with PyYAML (the host image has python3-yaml), after the real binary has
validated them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml  # the host image's python3-yaml

from . import core, mig, smi

# NVIDIA's binary: the nvidia-mig-manager package's (hosts outside Kubernetes), else the copy every lab
# host image carries (Kubernetes nodes, where the GPU Operator's MIG manager runs this front end).
REAL_PACKAGED = "/usr/bin/nvidia-mig-parted.distrib"
REAL_IMAGE = "/usr/lib/gpuprov-lab/bin/nvidia-mig-parted.real"


# Handed to the real binary as they are.
REAL_COMMANDS = {"generate-config", "checkpoint", "restore", "help", "h"}


def real_path(host: core.Host) -> str:
    return REAL_PACKAGED if os.access(host.p(REAL_PACKAGED), os.X_OK) else REAL_IMAGE


class Fatal(Exception):
    """An error mig-parted ends with (main.go: log.Fatal(util.Capitalize(err))); exit status 1."""


# ----------------------------------------------------------------------------------------- output


def _log(level: str, msg: str) -> None:
    """A logrus text-formatter line (stderr is no terminal under systemd or Ansible)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sys.stderr.write(f"time={json.dumps(stamp)} level={level} msg={json.dumps(msg)}\n")


def _capitalize(s: str) -> str:
    return s[:1].upper() + s[1:]


# -------------------------------------------------------------------------------------- arguments


@dataclass
class Flag:
    names: tuple[str, ...]
    env: str
    boolean: bool = False


FLAGS = {
    "config-file": Flag(("--config-file", "-f"), "MIG_PARTED_CONFIG_FILE"),
    "selected-config": Flag(("--selected-config", "-c"), "MIG_PARTED_SELECTED_CONFIG"),
    "hooks-file": Flag(("--hooks-file", "-k"), "MIG_PARTED_HOOKS_FILE"),
    "skip-reset": Flag(("--skip-reset", "-s"), "MIG_PARTED_SKIP_RESET", True),
    "mode-only": Flag(("--mode-only", "-m"), "MIG_PARTED_MODE_CHANGE_ONLY", True),
    "valid-config": Flag(("--valid-config", "-a"), "MIG_PARTED_VALID_CONFIG", True),
    "output-format": Flag(("--output-format", "-o"), "MIG_PARTED_OUTPUT_FORMAT"),
    "config-label": Flag(("--config-label", "-l"), "MIG_PARTED_CONFIG_LABEL"),
}
# Each subcommand's flags, in the order it declares them (apply's order feeds the hook environment).
COMMAND_FLAGS = {
    "apply": ("config-file", "selected-config", "hooks-file", "skip-reset", "mode-only"),
    "assert": ("config-file", "selected-config", "mode-only", "valid-config"),
    "export": ("output-format", "config-label"),
}
DEFAULTS = {"output-format": "yaml", "config-label": "current"}


def _parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool, which urfave/cli uses for boolean flags and their variables."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise Fatal(f"could not parse {text!r} as bool value")


def parse_flags(command: str, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    names = COMMAND_FLAGS[command]
    values: dict[str, Any] = {}
    for name in names:
        flag = FLAGS[name]
        if flag.env in env and env[flag.env] != "":
            values[name] = _parse_bool(env[flag.env]) if flag.boolean else env[flag.env]
        else:
            values[name] = False if flag.boolean else DEFAULTS.get(name, "")
    args = list(argv)
    while args:
        arg = args.pop(0)
        option, eq, inline = arg.partition("=")
        name = next((n for n in names if option in FLAGS[n].names), None)
        if name is None:
            raise Fatal(f"flag provided but not defined: {option}")
        if FLAGS[name].boolean:
            values[name] = _parse_bool(inline) if eq else True
        elif eq:
            values[name] = inline
        elif args:
            values[name] = args.pop(0)
        else:
            raise Fatal(f"flag needs an argument: {option}")
    return values


# ------------------------------------------------------------------------------------------ config


@dataclass
class Spec:
    """One entry of a mig-config (api/spec/v1/spec.go MigConfigSpec)."""

    device_filter: list[str]
    devices: Any  # "all" or [int]
    mig_enabled: bool
    mig_devices: dict[str, int] = field(default_factory=dict)

    def matches(self, index: int, device_id: str) -> bool:
        if self.device_filter and not any(_same_device(f, device_id) for f in self.device_filter):
            return False
        if self.devices == "all":
            return True
        return isinstance(self.devices, list) and index in self.devices


def _same_device(filter_id: str, device_id: str) -> bool:
    """pkg/types DeviceID.Matches: the device and vendor ids (0xDDDDVVVV)."""
    return filter_id.strip().lower() == device_id.strip().lower()


def selected_specs(text: str, selected: str) -> list[Spec]:
    doc = yaml.safe_load(text) or {}
    configs = doc.get("mig-configs") or {}
    if not selected and len(configs) == 1:
        selected = next(iter(configs))
    entries = configs.get(selected) or []
    specs = []
    for e in entries:
        df = e.get("device-filter")
        specs.append(
            Spec(
                device_filter=[df] if isinstance(df, str) and df else list(df or []),
                devices=e.get("devices"),
                mig_enabled=bool(e.get("mig-enabled")),
                mig_devices={str(k): int(v) for k, v in (e.get("mig-devices") or {}).items()},
            )
        )
    return specs


# -------------------------------------------------------------------------------------------- GPUs
# The simulated GPUs, through what nvidia-smi's front end runs on them (smi.py, mig.py), as mig-parted's
# NVML calls reach the driver.


@dataclass
class Gpu:
    index: int
    gpu: dict[str, Any]  # the host profile's GPU
    device_id: str  # 0xDDDDVVVV, as device-filter names it
    capable: bool
    enabled: bool
    pending: bool


def gpus() -> list[Gpu]:
    host = core.Host()
    try:
        st, _nvml = smi.driver_state(host, "")
    except core.SimError as exc:
        raise Fatal(f"error initializing NVML: {str(exc).strip()}") from None
    out = []
    for i, g in enumerate(smi.visible(host, st)):
        capable = mig.profiles(g) is not None
        cur = mig.gpu_state(st, g) if capable else {"current": False, "pending": False}
        device_id = f"0x{int(g['device_id'], 16):04X}{int(g['vendor_id'], 16):04X}"
        out.append(Gpu(i, g, device_id, capable, bool(cur["current"]), bool(cur["pending"])))
    return out


def mig_devices(gpu_list: list[Gpu]) -> dict[int, dict[str, int]]:
    """GPU index → {profile: count} of its MIG devices."""
    st = core.Host().state()
    out: dict[int, dict[str, int]] = {}
    for g in gpu_list:
        counts = out.setdefault(g.index, {})
        for name, _uuid in mig.mig_devices(st, g.gpu):
            counts[name] = counts.get(name, 0) + 1
    return out


def walk(specs: list[Spec], gpu_list: list[Gpu]) -> list[tuple[Spec, Gpu]]:
    """assert.WalkSelectedMigConfigForEachGPU: every (entry, GPU) the entry matches, entry order."""
    return [(s, g) for s in specs for g in gpu_list if s.matches(g.index, g.device_id)]


def mode_error(specs: list[Spec], gpu_list: list[Gpu]) -> str:
    """assert/mode.go AssertMigMode: the first mismatch's reason, or ''."""
    for s, g in walk(specs, gpu_list):
        if not g.capable:
            if s.mig_enabled:
                return "unable to assert MIG mode enabled on non MIG-capable GPU"
            continue
        if s.mig_enabled != g.enabled:
            return "current mode different than mode being asserted"
    return ""


def config_error(specs: list[Spec], gpu_list: list[Gpu]) -> str:
    """assert/config.go AssertMigConfig: '' when every GPU matches its entry."""
    devices = mig_devices(gpu_list)
    matched = {g.index: False for g in gpu_list}
    for s, g in walk(specs, gpu_list):
        if (not g.capable and not s.mig_enabled) or (not s.mig_enabled and not g.enabled):
            matched[g.index] = True
            continue
        matched[g.index] = devices.get(g.index, {}) == s.mig_devices
    if not all(matched.values()):
        return "not all GPUs match the specified config"
    return ""


# ------------------------------------------------------------------------------------------- apply


def _driver(what: str, change: Callable[[], object], not_found_is_done: bool = False) -> None:
    """A change to the simulated GPUs; its failure is mig-parted's error (nvidia-smi's text after it)."""
    try:
        change()
    except mig.MigError as exc:
        if not (not_found_is_done and exc.rc == mig.RC_NOT_FOUND):
            raise Fatal(f"{what}: {str(exc).strip()}") from None


def clear(g: Gpu) -> None:
    """pkg/mig/config ClearMigConfig: every compute instance, then every GPU instance."""
    host, one = core.Host(), [(g.index, g.gpu)]
    _driver(f"error destroying compute instances on GPU {g.index}",
            lambda: mig.run(host, mig.MigCommand("dci"), one), not_found_is_done=True)  # fmt: skip
    _driver(f"error destroying GPU instances on GPU {g.index}",
            lambda: mig.run(host, mig.MigCommand("dgi"), one), not_found_is_done=True)  # fmt: skip


def _profile_size(name: str) -> tuple[int, float]:
    m = re.match(r"^(\d+)g\.(\d+)gb", name)
    return (int(m.group(1)), float(m.group(2))) if m else (0, 0.0)


def orderings(devices: dict[str, int]) -> list[list[str]]:
    """The distinct orders iteratePermutationsUntilSuccess tries, largest profiles first (the order that
    fits in the common case comes first; Go's map order decides the real first try)."""
    flat = sorted(
        (p for p, n in devices.items() for _ in range(max(n, 0))),
        key=lambda p: (_profile_size(p), p),
        reverse=True,
    )
    out: list[list[str]] = []

    def permute(items: list[str], i: int) -> None:
        if i >= len(items):
            out.append(list(items))
            return
        seen: set[str] = set()
        for j in range(i, len(items)):
            if items[j] in seen:
                continue
            seen.add(items[j])
            items[i], items[j] = items[j], items[i]
            permute(items, i + 1)
            items[i], items[j] = items[j], items[i]

    permute(flat, 0)
    return out


def set_config(g: Gpu, devices: dict[str, int]) -> None:
    """pkg/mig/config SetMigConfig: GPU instances with their compute instance, one ordering after another."""
    for order in orderings(devices):
        clear(g)
        if not order:
            return
        try:
            command = mig.MigCommand("cgi", profiles=tuple(order), default_ci=True)
            mig.run(core.Host(), command, [(g.index, g.gpu)])
            return
        except mig.MigError as exc:
            _log("error", _capitalize(f"error creating GPU instance for {','.join(order)}: {exc}".strip()))
    clear(g)
    raise Fatal("error attempting multiple config orderings: all orderings failed")


def apply_mode(specs: list[Spec], skip_reset: bool) -> None:
    """apply/mode.go ApplyMigMode."""
    gpu_list = gpus()
    for s, g in walk(specs, gpu_list):
        if not g.capable:
            if s.mig_enabled and s.devices != "all":
                raise Fatal("cannot set MIG mode on non MIG-capable GPU")
            continue
        if g.enabled:
            clear(g)
        on = s.mig_enabled
        _driver("error setting MIG mode", lambda g=g, on=on: mig.set_mode(core.Host(), [g.gpu], on))
    pending = [g.gpu for g in gpus() if g.capable and g.pending != g.enabled]
    if not skip_reset and pending:
        _driver("error resetting all GPUs", lambda: mig.reset(core.Host(), pending))


def apply_config(specs: list[Spec]) -> None:
    """apply/config.go ApplyMigConfig."""
    for s, g in walk(specs, gpus()):
        if not g.capable:
            if s.mig_enabled and s.devices != "all":
                raise Fatal("cannot set MIG config on non MIG-capable GPU")
            continue
        if s.mig_enabled and not g.enabled:
            raise Fatal("unable to apply MIG config with MIG mode disabled")
        if not s.mig_enabled and g.enabled:
            raise Fatal(
                "MIG mode is currently enabled, but the configuration specifies it should be disabled"
            )
        if s.mig_enabled:
            set_config(g, s.mig_devices)


def run_hooks(hooks: dict[str, Any], point: str, envs: dict[str, str], output: bool) -> None:
    """api/hooks/v1 HooksMap.Run: each hook of the point, in order, with only the given environment."""
    for hook in hooks.get(point) or []:
        env = {**{str(k): str(v) for k, v in (hook.get("envs") or {}).items()}, **envs}
        argv = [str(hook.get("command") or ""), *[str(a) for a in hook.get("args") or []]]
        try:
            res = subprocess.run(
                argv,
                env=env,
                cwd=hook.get("workdir") or None,
                stdout=None if output else subprocess.DEVNULL,
                stderr=None if output else subprocess.DEVNULL,
                check=False,
            )
        except OSError as exc:
            raise Fatal(f"error running {point} hook: {exc.strerror}") from None
        if res.returncode != 0:
            raise Fatal(f"error running {point} hook: exit status {res.returncode}")


def apply(flags: dict[str, Any], config_text: str, debug: bool) -> str:
    specs = selected_specs(config_text, flags["selected-config"])
    hooks: dict[str, Any] = {}
    if flags["hooks-file"]:
        try:
            with open(flags["hooks-file"], encoding="utf-8") as fh:
                hooks = (yaml.safe_load(fh) or {}).get("hooks") or {}
        except OSError as exc:
            raise Fatal(f"error parsing hooks file: read error: {exc}") from None
        except yaml.YAMLError as exc:
            raise Fatal(f"error parsing hooks file: unmarshal error: {exc}") from None
    envs = {
        FLAGS[n].env: (str(flags[n]).lower() if FLAGS[n].boolean else str(flags[n]))
        for n in COMMAND_FLAGS["apply"]
    }
    prefix = "error applying MIG configuration with hooks: "
    try:
        run_hooks(hooks, "apply-start", envs, debug)
    except Fatal as exc:
        raise Fatal(prefix + str(exc)) from None
    error: Fatal | None = None
    try:
        if mode_error(specs, gpus()):
            run_hooks(hooks, "pre-apply-mode", envs, debug)
            apply_mode(specs, bool(flags["skip-reset"]))
        if not flags["mode-only"]:
            gpu_list = gpus()
            if mode_error(specs, gpu_list) or config_error(specs, gpu_list):
                run_hooks(hooks, "pre-apply-config", envs, debug)
                apply_config(specs)
    except Fatal as exc:
        error = exc
    try:
        run_hooks(hooks, "apply-exit", envs, debug)
    except Fatal as exc:
        if error is None:
            error = exc
        else:
            _log("error", _capitalize(str(exc)))
    if error is not None:
        raise Fatal(prefix + str(error))
    return "MIG configuration applied successfully\n"


def assert_applied(flags: dict[str, Any], config_text: str, debug: bool) -> str:
    specs = selected_specs(config_text, flags["selected-config"])
    gpu_list = gpus()

    def refuse(reason: str) -> None:
        if reason:
            if debug:
                _log("debug", _capitalize(reason))
            raise Fatal("assertion failure: selected configuration not currently applied")

    refuse(mode_error(specs, gpu_list))
    if flags["mode-only"]:
        return "Selected MIG mode settings from configuration currently applied\n"
    refuse(config_error(specs, gpu_list))
    return "Selected MIG configuration currently applied\n"


# ------------------------------------------------------------------------------------------ export


def export(flags: dict[str, Any]) -> str:
    fmt = flags["output-format"]
    if fmt not in ("json", "yaml"):
        raise Fatal(f"unrecognized 'output-format': {fmt}")
    gpu_list = gpus()
    devices = mig_devices(gpu_list)
    specs = [
        {
            "device-filter": [g.device_id],
            "devices": [g.index],
            "mig-enabled": g.capable and g.enabled,
            "mig-devices": dict(devices.get(g.index, {})) if g.capable and g.enabled else {},
        }
        for g in gpu_list
    ]
    spec = {"version": "v1", "mig-configs": {flags["config-label"]: merge_specs(specs)}}
    if fmt == "json":
        return json.dumps(spec, indent=2)
    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=None)


def merge_specs(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """export/config.go mergeMigConfigSpecs."""
    merged: list[dict[str, Any]] = []
    for s in specs:
        for m in merged:
            if m["mig-enabled"] == s["mig-enabled"] and m["mig-devices"] == s["mig-devices"]:
                m["devices"] = sorted(set(m["devices"]) | set(s["devices"]))
                m["device-filter"] = sorted(set(m["device-filter"]) | set(s["device-filter"]))
                break
        else:
            merged.append({k: list(v) if isinstance(v, list) else v for k, v in s.items()})
    by_filter: dict[str, set[int]] = {}
    for s in specs:
        by_filter.setdefault(s["device-filter"][0], set()).update(s["devices"])
    for m in merged:
        filters = m["device-filter"]
        covered = sorted(set().union(*(by_filter[f] for f in filters)))
        if len(by_filter) == 1:
            m["device-filter"] = None
        elif len(filters) == 1:
            m["device-filter"] = filters[0]
        if m["devices"] == covered:
            m["devices"] = "all"
    if len(merged) == 1:
        merged[0]["device-filter"] = None
    return [{k: v for k, v in m.items() if not (k == "device-filter" and not v)} for m in merged]


# -------------------------------------------------------------------------------------------- main


def exec_real(host: core.Host, argv: list[str]) -> int:
    real = host.p(real_path(host))
    if not os.access(real, os.X_OK):
        sys.stderr.write(f"gpuprov lab: NVIDIA's nvidia-mig-parted is missing at {real_path(host)}\n")
        return 127
    sys.stdout.flush()
    return subprocess.run([str(real), *argv], check=False).returncode


def _validate(host: core.Host, flags: dict[str, Any], config_text: str) -> int:
    """The real parser on the config (from stdin: the text already read); its own messages on failure."""
    argv = [str(host.p(real_path(host))), "assert", "--valid-config", "--config-file", "-"]
    if flags["selected-config"]:
        argv += ["--selected-config", flags["selected-config"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIG_PARTED_")}
    res = subprocess.run(argv, input=config_text, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
    return res.returncode


def main(prog: str, argv: list[str]) -> int:
    host = core.Host()
    args = list(argv)
    debug = os.environ.get("MIG_PARTED_DEBUG", "") in ("1", "t", "T", "TRUE", "true", "True")
    while args and (args[0] in ("-d", "--debug") or args[0].startswith("--debug=")):
        a = args.pop(0)
        debug = _parse_bool(a.partition("=")[2]) if "=" in a else True
    if not args or args[0].startswith("-") or args[0] in REAL_COMMANDS or args[0] not in COMMAND_FLAGS:
        return exec_real(host, argv)
    command, rest = args[0], args[1:]
    if any(a in ("-h", "--help") for a in rest):
        return exec_real(host, argv)
    try:
        flags = parse_flags(command, rest, dict(os.environ))
        if command == "assert" and flags["valid-config"]:
            return exec_real(host, argv)
        if command == "export":
            sys.stdout.write(export(flags))
            return 0
        if not flags["config-file"]:
            subprocess.run([str(host.p(real_path(host))), command, "--help"], check=False)
            raise Fatal("missing required flags 'config-file'")
        if flags["config-file"] == "-":
            config_text = sys.stdin.read()
        else:
            try:
                with open(flags["config-file"], encoding="utf-8") as fh:
                    config_text = fh.read()
            except OSError as exc:
                raise Fatal(f"error parsing config file: read error: {exc}") from None
        rc = _validate(host, flags, config_text)
        if rc != 0:
            return rc
        text = (
            apply(flags, config_text, debug)
            if command == "apply"
            else assert_applied(flags, config_text, debug)
        )
        sys.stdout.write(text)
        return 0
    except (Fatal, yaml.YAMLError) as exc:
        _log("fatal", _capitalize(str(exc)))
        return 1
