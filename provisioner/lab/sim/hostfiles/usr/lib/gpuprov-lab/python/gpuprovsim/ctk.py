"""Part of the gpuprov lab simulation: the NVIDIA Container Toolkit 1.18.0 tools.

``nvidia-ctk runtime configure`` edits the container engine's configuration as the real 1.18.0 does:

- docker: /etc/docker/daemon.json loaded as a JSON object, ``runtimes.nvidia = {"args": [], "path":
  "nvidia-container-runtime"}`` set (``default-runtime`` with --set-as-default, ``features.cdi`` with
  --cdi.enabled), every other key kept, written back with 4-space indentation and sorted keys (Go's
  json.MarshalIndent);
- containerd (config version 2, containerd 1.6): the ``nvidia`` runtime added under
  ``plugins."io.containerd.grpc.v1.cri".containerd.runtimes`` with the runc runtime's settings and
  ``options.BinaryName = "/usr/bin/nvidia-container-runtime"``. By default (1.18.0) into the drop-in
  file /etc/containerd/config.d/99-nvidia.toml, with the directory added to the top-level ``imports``;
  with ``--drop-in-config=""`` into config.toml itself. TOML is written the way go-toml does it (values
  before tables, keys sorted, two-space indentation per level), so a second run changes nothing.

``nvidia-ctk cdi generate`` writes a CDI spec for the simulated GPUs. ``nvidia-container-runtime`` hands
the OCI runtime call to runc (the lab has no GPU to inject).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import hashlib
import json
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from gpuprovsim import core, kmod, smi

CRI = "io.containerd.grpc.v1.cri"
CRI_V3 = "io.containerd.cri.v1.runtime"
DOCKER_CONFIG = "/etc/docker/daemon.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROP_IN = "/etc/containerd/config.d/99-nvidia.toml"
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_IN = "/etc/crio/conf.d/99-nvidia.toml"
RUNTIME_PATH = "/usr/bin/nvidia-container-runtime"
LOW_LEVEL = ("docker-runc", "runc", "crun")
NVML_INIT = "failed to initialize NVML"
CDI_FAILED = "failed to generate CDI spec: failed to create device CDI specs"


class CtkError(core.SimError):
    pass


# ---------------------------------------------------------------------------------------- logging


class Log:
    """logrus' text formatter: INFO[0000] on a terminal, time="..." level=info msg="..." otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def _emit(self, level: str, msg: str) -> None:
        if self.tty:
            sys.stderr.write(f"{level.upper()[:4]}[0000] {msg:<44} \n")
        else:
            now = dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="seconds").replace("+00:00", "Z")
            sys.stderr.write(f'time="{now}" level={level} msg={json.dumps(msg)}\n')

    def info(self, msg: str) -> None:
        self._emit("info", msg)

    def warning(self, msg: str) -> None:
        self._emit("warning", msg)

    def error(self, msg: str) -> None:
        self._emit("error", msg)


# ------------------------------------------------------------------------------------ TOML output


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in sorted(value.items())) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def toml_dumps(doc: dict[str, Any]) -> str:
    """go-toml (v1) Tree.WriteTo: plain values first, then tables, each group sorted by key; every table
    header preceded by an empty line and indented two spaces per level."""
    out: list[str] = []

    def write(table: dict[str, Any], indent: str, prefix: str) -> None:
        simple = sorted(k for k, v in table.items() if not _is_table(v) and not _is_table_array(v))
        complex_ = sorted(k for k, v in table.items() if _is_table(v) or _is_table_array(v))
        for k in simple:
            out.append(f"{indent}{_toml_key(k)} = {_toml_value(table[k])}\n")
        for k in complex_:
            name = f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k)
            v = table[k]
            if _is_table(v):
                out.append(f"\n{indent}[{name}]\n")
                write(v, indent + "  ", name)
            else:
                for item in v:
                    out.append(f"\n{indent}[[{name}]]\n")
                    write(item, indent + "  ", name)

    write(doc, "", "")
    text = "".join(out)
    return text[1:] if text.startswith("\n") else text


def _load_toml(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CtkError(f"unable to load config for runtime containerd: failed to load config: {exc}") from exc


def _dig(doc: dict[str, Any], *keys: str) -> Any:
    cur: Any = doc
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def _set(doc: dict[str, Any], keys: list[str], value: Any) -> None:
    cur = doc
    for k in keys[:-1]:
        nxt = cur.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[k] = nxt
        cur = nxt
    cur[keys[-1]] = value


# -------------------------------------------------------------------------------------- containerd


def containerd_add_runtime(
    config: dict[str, Any], name: str, path: str, set_default: bool, cdi: bool, version: int, log: Log
) -> dict[str, Any]:
    """The config with the runtime added (a new dict; config is not changed)."""
    new = copy.deepcopy(config)
    plugin = CRI if version <= 2 else CRI_V3
    new["version"] = version
    runtimes = ["runc"]
    default = _dig(new, "plugins", plugin, "containerd", "default_runtime_name")
    if isinstance(default, str) and default and default not in runtimes:
        runtimes.append(default)
    base = None
    for r in (*LOW_LEVEL, *runtimes):
        base = _dig(new, "plugins", plugin, "containerd", "runtimes", r)
        if isinstance(base, dict):
            break
        base = None
    path_rt = ["plugins", plugin, "containerd", "runtimes", name]
    if base is not None:
        _set(new, path_rt, copy.deepcopy(base))
    elif not isinstance(_dig(new, *path_rt), dict):
        log.warning(f"could not infer options from runtimes {list(LOW_LEVEL)}; using defaults")
        _set(new, [*path_rt, "runtime_type"], "io.containerd.runc.v2")
        _set(new, [*path_rt, "runtime_root"], "")
        _set(new, [*path_rt, "runtime_engine"], "")
        _set(new, [*path_rt, "privileged_without_host_devices"], False)
    _set(new, [*path_rt, "options", "BinaryName"], path)
    if set_default:
        _set(new, ["plugins", plugin, "containerd", "default_runtime_name"], name)
    if cdi:
        _set(new, ["plugins", plugin, "enable_cdi"], True)
    return new


def _diff(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """What new sets that old does not have (the drop-in holds only the changes)."""
    out: dict[str, Any] = {}
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(old.get(k), dict):
            sub = _diff(v, old[k])
            if sub:
                out[k] = sub
        elif k not in old or old[k] != v:
            out[k] = v
    return out


def configure_containerd(opts: dict[str, Any], log: Log, host: core.Host) -> None:
    top_path = host.p(opts["config"] or CONTAINERD_CONFIG)
    top = _load_toml(top_path)
    version = 2
    if top:
        v = top.get("version")
        version = 1 if v is None else int(v)
    log.info(f"Using config version {version}")
    plugin = {1: "cri", 2: CRI}.get(version, CRI_V3)
    log.info(f'Using CRI runtime plugin name "{plugin}"')
    if version == 1:
        raise CtkError("unable to update config: config version 1 is not supported by the gpuprov lab")
    top = top or {}
    new = containerd_add_runtime(
        top, opts["name"], opts["path"], opts["set_default"], opts["cdi"], version, log
    )
    drop_in = opts["drop_in"]
    if opts["dry_run"]:
        sys.stdout.write(toml_dumps(_with_version(_diff(new, top), version) if drop_in else new))
        return
    if not drop_in:
        _write(top_path, toml_dumps(new))
        log.info(f"Wrote updated config to {opts['config'] or CONTAINERD_CONFIG}")
    else:
        dpath = host.p(drop_in)
        changes = _with_version(_diff(new, top), version)
        _write(dpath, toml_dumps(changes))
        pattern = f"{os.path.dirname(drop_in)}/*.toml"
        imports = list(top.get("imports") or [])
        if pattern not in imports:
            imports.append(pattern)
            updated = dict(top)
            if not updated:
                updated["version"] = version
            updated["imports"] = imports
            _write(top_path, toml_dumps(updated))
        elif top_path.exists():
            _write(top_path, toml_dumps(top))
        log.info(f"Wrote updated config to {drop_in}")
    log.info("It is recommended that containerd daemon be restarted.")


def _with_version(changes: dict[str, Any], version: int) -> dict[str, Any]:
    out = dict(changes)
    out["version"] = version
    return out


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    with contextlib.suppress(OSError):
        tmp.chmod(path.stat().st_mode & 0o777 if path.exists() else 0o644)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------ docker


def _go_json(value: Any, indent: str = "    ") -> str:
    """json.MarshalIndent(v, "", "    ") of a map[string]interface{}: sorted keys, <>& escaped."""
    text = json.dumps(_go_numbers(value), indent=len(indent), sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _go_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _go_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_go_numbers(v) for v in value]
    return value


def configure_docker(opts: dict[str, Any], log: Log, host: core.Host) -> None:
    path = host.p(opts["config"] or DOCKER_CONFIG)
    if path.exists() and path.read_text().strip():
        try:
            config = json.loads(path.read_text())
        except ValueError as exc:
            raise CtkError(
                f"unable to load config for runtime docker: unable to parse config: {exc}"
            ) from exc
        if not isinstance(config, dict):
            raise CtkError("unable to load config for runtime docker: config is not a JSON object")
    else:
        log.info("Config file does not exist; using empty config")
        config = {}
    runtimes = config.get("runtimes") if isinstance(config.get("runtimes"), dict) else {}
    runtimes[opts["name"]] = {"args": [], "path": opts["path"]}
    config["runtimes"] = runtimes
    if opts["set_default"]:
        config["default-runtime"] = opts["name"]
    if opts["cdi"]:
        features = config.get("features") if isinstance(config.get("features"), dict) else {}
        features["cdi"] = True
        config["features"] = features
    text = _go_json(config)
    if opts["dry_run"]:
        sys.stdout.write(text)
        return
    _write(path, text)
    log.info(f"Wrote updated config to {opts['config'] or DOCKER_CONFIG}")
    log.info("It is recommended that docker daemon be restarted.")


# --------------------------------------------------------------------------------------------- CDI


def cdi_spec(host: core.Host, gpus: list[dict[str, Any]], st: dict[str, Any], nvml: str) -> str:
    """The nvidia.com/gpu CDI spec (YAML) for the visible GPUs."""
    lines = ["---", "cdiVersion: 0.5.0", "containerEdits:", "  deviceNodes:"]
    for node in ("/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"):
        lines.append(f"  - path: {node}")
    lines += [
        "  env:",
        "  - NVIDIA_VISIBLE_DEVICES=void",
        "  hooks:",
        "  - args:",
        "    - nvidia-cdi-hook",
        "    - create-symlinks",
        "    - --link",
        f"    - libnvidia-ml.so.{nvml}::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "    hookName: createContainer",
        "    path: /usr/bin/nvidia-cdi-hook",
        "  - args:",
        "    - nvidia-cdi-hook",
        "    - update-ldcache",
        "    - --folder",
        "    - /usr/lib/x86_64-linux-gnu",
        "    hookName: createContainer",
        "    path: /usr/bin/nvidia-cdi-hook",
        "  mounts:",
    ]
    for lib in (f"libcuda.so.{nvml}", f"libnvidia-ml.so.{nvml}"):
        lines += [
            f"  - containerPath: /usr/lib/x86_64-linux-gnu/{lib}",
            f"    hostPath: /usr/lib/x86_64-linux-gnu/{lib}",
            "    options:",
            "    - ro",
            "    - nosuid",
            "    - nodev",
            "    - rbind",
            "    - rprivate",
        ]
    lines.append("devices:")
    for i, g in enumerate(gpus):
        for name in (str(i), g["uuid"]):
            lines += [
                "- containerEdits:",
                "    deviceNodes:",
                f"    - path: /dev/nvidia{g['minor_number']}",
                f"  name: {json.dumps(name) if name.isdigit() else name}",
            ]
    lines += ["- containerEdits:", "    deviceNodes:"]
    lines += [f"    - path: /dev/nvidia{g['minor_number']}" for g in gpus]
    lines += ["  name: all", "kind: nvidia.com/gpu", ""]
    return "\n".join(lines)


def cdi_generate(host: core.Host, argv: list[str], log: Log) -> int:
    output = None
    for i, a in enumerate(argv):
        if a.startswith("--output="):
            output = a.split("=", 1)[1]
        elif a == "--output" and i + 1 < len(argv):
            output = argv[i + 1]
    nvml = smi.nvml_version(host, "")
    if nvml is None:
        log.error(f"{CDI_FAILED}: {NVML_INIT}: ERROR_LIBRARY_NOT_FOUND")
        return 1
    try:
        st, nvml = smi.driver_state(host, nvml)
    except core.SimError as exc:
        why = "Driver/library version mismatch" if exc.rc == smi.RC_MISMATCH else "Driver Not Loaded"
        log.error(f"{CDI_FAILED}: {NVML_INIT}: {why}")
        return 1
    gpus = smi.visible(host, st)
    log.info(f"Using /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{nvml}")
    log.info("Auto-detected mode as 'nvml'")
    for g in gpus:
        log.info(f"Selecting /dev/nvidia{g['minor_number']} as /dev/nvidia{g['minor_number']}")
    spec = cdi_spec(host, gpus, st, nvml)
    if output:
        _write(host.p(output), spec)
        log.info("Generated CDI spec with version 0.5.0")
    else:
        sys.stdout.write(spec)
    return 0


def cdi_list(host: core.Host, log: Log) -> int:
    names: list[str] = []
    for d in ("/etc/cdi", "/var/run/cdi"):
        for f in sorted(host.p(d).glob("*.yaml")) if host.p(d).is_dir() else []:
            kind = "nvidia.com/gpu"
            for line in f.read_text().splitlines():
                if line.startswith("kind:"):
                    kind = line.split(":", 1)[1].strip()
                m = re.match(r"^  name: (.+)$", line)
                if m:
                    names.append(f"{kind}={m.group(1).strip().strip(chr(34))}")
    log.info(f"Found {len(names)} CDI devices")
    sys.stdout.write("".join(n + "\n" for n in names))
    return 0


# ------------------------------------------------------------------------------------------- CLIs


def commit_id(version: str) -> str:
    return hashlib.sha1(f"gpuprov lab nvidia-container-toolkit {version}".encode()).hexdigest()


def parse_configure(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "runtime": "docker",
        "config": "",
        "drop_in": None,
        "name": "nvidia",
        "path": "nvidia-container-runtime",
        "set_default": False,
        "cdi": False,
        "dry_run": False,
    }
    args = list(argv)
    while args:
        a = args.pop(0)
        key, eq, value = a.partition("=")
        if not eq and key in (
            "--runtime",
            "--config",
            "--drop-in-config",
            "--nvidia-runtime-name",
            "--nvidia-runtime-path",
            "--runtime-path",
        ):
            value = args.pop(0) if args else ""
        if key == "--runtime":
            opts["runtime"] = value
        elif key == "--config":
            opts["config"] = value
        elif key == "--drop-in-config":
            opts["drop_in"] = value
        elif key == "--nvidia-runtime-name":
            opts["name"] = value
        elif key in ("--nvidia-runtime-path", "--runtime-path"):
            opts["path"] = value
        elif key in ("--set-as-default", "--nvidia-set-as-default"):
            opts["set_default"] = value.lower() != "false" if eq else True
        elif key in ("--cdi.enabled", "--cdi.enable", "--enable-cdi"):
            opts["cdi"] = value.lower() != "false" if eq else True
        elif key == "--dry-run":
            opts["dry_run"] = True
        elif key in ("--config-mode", "--config-source", "--executable-path"):
            if not eq and args:
                args.pop(0)
        else:
            raise CtkError(f"flag provided but not defined: -{key.lstrip('-')}", 1)
    if opts["runtime"] not in ("docker", "containerd", "crio"):
        raise CtkError(f"unrecognized runtime '{opts['runtime']}'")
    if opts["runtime"] in ("containerd", "crio"):
        if opts["path"] == "nvidia-container-runtime":
            opts["path"] = RUNTIME_PATH
        if not opts["path"].startswith("/"):
            raise CtkError(f'the NVIDIA runtime path "{opts["path"]}" is not an absolute path')
    if opts["drop_in"] is None:
        opts["drop_in"] = {"containerd": CONTAINERD_DROP_IN, "crio": CRIO_DROP_IN}.get(opts["runtime"], "")
    if opts["drop_in"] and opts["runtime"] == "docker":
        raise CtkError(f"runtime {opts['runtime']} does not support drop-in configs")
    if opts["drop_in"] and not opts["drop_in"].startswith("/"):
        raise CtkError(f'the drop-in-config path "{opts["drop_in"]}" is not an absolute path')
    return opts


def nvidia_ctk(host: core.Host, argv: list[str], version: str) -> int:
    log = Log()
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(
            f"NAME:\n   NVIDIA Container Toolkit CLI - Tools to configure the NVIDIA Container Toolkit\n\n"
            f"USAGE:\n   nvidia-ctk [global options] [command [command options]]\n\nVERSION:\n   {version}\n"
            f"   ({core.SIMULATED})\n"
        )
        return 0
    if argv[0] in ("-v", "--version"):
        sys.stdout.write(f"NVIDIA Container Toolkit CLI version {version}\ncommit: {commit_id(version)}\n")
        return 0
    args = [a for a in argv if a not in ("-d", "--debug", "--quiet")]
    try:
        if args[:2] == ["runtime", "configure"]:
            opts = parse_configure(args[2:])
            if opts["runtime"] == "docker":
                configure_docker(opts, log, host)
            elif opts["runtime"] == "containerd":
                configure_containerd(opts, log, host)
            else:
                raise CtkError("unable to update config: cri-o is not present on gpuprov lab hosts")
            return 0
        if args[:2] == ["cdi", "generate"]:
            return cdi_generate(host, args[2:], log)
        if args[:2] == ["cdi", "list"]:
            return cdi_list(host, log)
    except CtkError as exc:
        log.error(str(exc))
        return exc.rc
    log.error(f"No help topic for '{' '.join(args[:2])}' ({core.SIMULATED})")
    return 3


def runtime(argv: list[str]) -> int:
    """nvidia-container-runtime: hand the OCI runtime call to runc unchanged."""
    for candidate in ("/usr/sbin/runc", "/usr/bin/runc", "/usr/bin/crun"):
        if os.access(candidate, os.X_OK):
            os.execv(candidate, [candidate, *argv])
    sys.stderr.write("nvidia-container-runtime: error: no low-level runtime (runc, crun) found\n")
    return 1


def main(prog: str, argv: list[str], nct: str = "", **_: str) -> int:
    host = core.Host()
    if prog == "nvidia-ctk":
        return nvidia_ctk(host, argv, nct)
    if prog == "nvidia-container-runtime":
        if argv[:1] in (["--version"], ["-v"]):
            sys.stdout.write(
                f"NVIDIA Container Runtime version {nct}\ncommit: {commit_id(nct)}\nspec: 1.2.0\n\n"
            )
            sys.stdout.flush()
        return runtime(argv)
    if prog in ("nvidia-container-runtime-hook", "nvidia-cdi-hook"):
        if argv[:1] in (["--version"], ["-v"]):
            sys.stdout.write(f"NVIDIA Container Runtime Hook version {nct}\ncommit: {commit_id(nct)}\n")
        return 0
    if prog == "nvidia-container-cli":
        if argv[:1] in (["--version"], ["-V"]):
            sys.stdout.write(f"cli-version: {nct}\nlib-version: {nct}\nbuild date: 2025-10-07T00:00+00:00\n")
            return 0
        if argv[:1] == ["info"]:
            try:
                st, nvml = smi.driver_state(host, smi.nvml_version(host, "") or "")
            except core.SimError:
                sys.stderr.write(
                    "nvidia-container-cli: initialization error: nvml error: driver not loaded\n"
                )
                return 1
            gpus = smi.visible(host, st)
            out = [f"NVRM version:   {kmod.driver_version(st)}", "CUDA version:   13.0", ""]
            for i, g in enumerate(gpus):
                out += [
                    f"Device Index:   {i}",
                    f"Device Minor:   {g['minor_number']}",
                    f"Model:          {g['name']}",
                    "Brand:          NVIDIA",
                    f"GPU UUID:       {g['uuid']}",
                    f"Bus Location:   {g['bus_id']}",
                    f"Architecture:   {g['compute_cap']}",
                    "",
                ]
            del nvml
            sys.stdout.write("\n".join(out))
            return 0
        sys.stderr.write(f"nvidia-container-cli: {' '.join(argv[:1])}: not provided by the gpuprov lab\n")
        return 1
    sys.stderr.write(f"gpuprov lab ctk: unknown program {prog}\n")
    return 2
