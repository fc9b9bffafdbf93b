"""containerd's config.toml, edited as TOML (runs on the controller).

``containerd_config_edit(text, containerd_version, settings)`` applies the settings gpuprov's roles ask
for to the text of /etc/containerd/config.toml and returns the new text. The file is parsed and written
with tomlkit, which keeps every key, comment, quoting style and layout that is already there: a file that
already has everything asked for comes back byte for byte, and only the keys asked for change otherwise.

Where a setting lives depends on the file's config version, which is what containerd itself goes by:
  version 2 (containerd 1.x, and read by 2.x): the CRI plugin "io.containerd.grpc.v1.cri" holds the
    runtimes (.containerd.runtimes), sandbox_image, cni.bin_dir and enable_cdi (1.7 and later).
  version 3 (containerd 2.x): runtimes, cni and enable_cdi moved to "io.containerd.cri.v1.runtime", the
    sandbox image to "io.containerd.cri.v1.images".pinned_images.sandbox. containerd 2.x writes these
    names single-quoted ([plugins.'io.containerd.cri.v1.runtime']); to TOML that is the same key.
  no version line: version 1 (what Docker's containerd.io package ships, with disabled_plugins =
    ["cri"] and nothing else). Plugin tables of version 1 use other names; such a file is refused, one
    with only top-level keys gets the version line of the installed containerd.
(containerd's own loader: cmd/containerd/server/config/config.go in 1.6/1.7, and
cmd/containerd/server/config/config.go + pkg/cri/config migration in 2.x; version 3 names from
`containerd config default` of 2.1.)

The nvidia runtime is written the way `nvidia-ctk runtime configure --runtime=containerd` (1.20.0) writes
it: a copy of the runc runtime's table with options.BinaryName set to the nvidia runtime (see
nvidia-container-toolkit pkg/config/engine/containerd/config.go, AddRuntime). It goes into config.toml
itself, not a drop-in: containerd 1.6 and 1.7 replace a plugin's whole table with an imported file's
(seen with their `containerd config dump`), so a drop-in would hide the runc runtime, SystemdCgroup and the
sandbox image of config.toml.

``containerd_config_effective(dump_text)`` reads the output of `containerd config dump` (what containerd
really uses, imports applied) into a small summary the roles assert on.
"""

from __future__ import annotations

import copy
import re
import tomllib
from typing import Any

try:
    import tomlkit
    from tomlkit.exceptions import ParseError as TomlkitParseError
except ImportError:  # reported when a filter is used, so that loading the plugin never fails
    tomlkit = None
    TomlkitParseError = ValueError

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # unit tests without Ansible on the path

    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        pass


RUNC_V2 = "io.containerd.runc.v2"
CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_RUNTIME_V3 = "io.containerd.cri.v1.runtime"
CRI_IMAGES_V3 = "io.containerd.cri.v1.images"
# Names under which the CRI plugin can be disabled (Docker's containerd.io ships disabled_plugins = ["cri"]).
CRI_PLUGIN_IDS = ("cri", CRI_V2, CRI_RUNTIME_V3, CRI_IMAGES_V3)
SETTINGS = {
    "cri_enabled",
    "systemd_cgroup",
    "cni_bin_dir",
    "sandbox_image",
    "runtimes",
    "default_runtime",
    "not_default_runtime",
    "enable_cdi",
    "registry_config_path",
}
_RUNTIME_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class ConfigError(AnsibleFilterError):
    """The file or the settings cannot be handled; the message says which and why."""


def parse_version(text: str) -> tuple[int, int]:
    """'containerd github.com/containerd/containerd/v2 2.1.9+unknown' (or '1.6.20~ds1') → (2, 1)."""
    m = re.search(r"(?:^|\s)v?(\d+)\.(\d+)", str(text))
    if not m:
        raise ConfigError(f"cannot read a containerd version from {str(text)[:200]!r}")
    return int(m.group(1)), int(m.group(2))


def _doc(text: str) -> Any:
    if tomlkit is None:
        raise ConfigError(
            "the Python package tomlkit is not installed on the controller (pip install tomlkit)"
        )
    try:
        return tomlkit.parse(text)
    except (TomlkitParseError, ValueError) as exc:
        raise ConfigError(f"/etc/containerd/config.toml is not valid TOML: {exc}") from exc


def _table(parent: Any, key: str, where: str) -> Any:
    """parent[key] as a table, created when missing; a key that is not a table is an error."""
    if key not in parent:
        parent[key] = tomlkit.table()
    value = parent[key]
    if not isinstance(value, dict):
        raise ConfigError(f"{where}.{key} is a {type(value).__name__}, not a table")
    return value


def _path(doc: Any, keys: list[str]) -> Any:
    node = doc
    where = ""
    for key in keys:
        node = _table(node, key, where or "config.toml")
        where = f"{where}.{key}" if where else key
    return node


def _get(doc: Any, keys: list[str]) -> Any:
    node = doc
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _set(table: Any, key: str, value: Any) -> bool:
    current = table.get(key)
    current = current.unwrap() if hasattr(current, "unwrap") else current
    if current == value and type(current) is type(value):
        return False
    table[key] = value
    return True


def _config_version(doc: Any, major: int) -> int:
    version = doc.get("version")
    version = version.unwrap() if hasattr(version, "unwrap") else version
    if version is None:
        if doc.get("plugins"):
            raise ConfigError(
                "/etc/containerd/config.toml has no version line (config version 1) but has plugin tables, "
                "whose names version 1 spells differently; convert it first (containerd 2.x: `containerd "
                "config migrate`; 1.x: start from `containerd config default`) and run again"
            )
        return 0  # version 1 with top-level keys only: the version line is added
    if version not in (2, 3):
        raise ConfigError(f"/etc/containerd/config.toml: config version {version!r} is not 2 or 3")
    if version == 3 and major < 2:
        raise ConfigError(
            f"/etc/containerd/config.toml is config version 3, which containerd {major}.x cannot read"
        )
    return int(version)


def _layout(version: int) -> dict[str, list[str]]:
    """Where each setting lives for a config version."""
    if version == 3:
        runtime = ["plugins", CRI_RUNTIME_V3]
        return {
            "runtime_plugin": runtime,
            "containerd": [*runtime, "containerd"],
            "runtimes": [*runtime, "containerd", "runtimes"],
            "cni": [*runtime, "cni"],
            "sandbox": ["plugins", CRI_IMAGES_V3, "pinned_images"],
            "registry": ["plugins", CRI_IMAGES_V3, "registry"],
        }
    cri = ["plugins", CRI_V2]
    return {
        "runtime_plugin": cri,
        "containerd": [*cri, "containerd"],
        "runtimes": [*cri, "containerd", "runtimes"],
        "cni": [*cri, "cni"],
        "sandbox": cri,
        "registry": [*cri, "registry"],
    }


def _check_settings(settings: Any) -> dict[str, Any]:
    if not isinstance(settings, dict):
        raise ConfigError(f"containerd settings must be a mapping, not {type(settings).__name__}")
    unknown = sorted(set(settings) - SETTINGS)
    if unknown:
        raise ConfigError(
            f"unknown containerd settings: {', '.join(unknown)} (known: {', '.join(sorted(SETTINGS))})"
        )
    for name in ("runtimes",):
        runtimes = settings.get(name) or {}
        if not isinstance(runtimes, dict):
            raise ConfigError("containerd setting runtimes must map runtime names to {binary: PATH}")
        for rt, spec in runtimes.items():
            if (
                not _RUNTIME_NAME.match(str(rt))
                or not isinstance(spec, dict)
                or not str(spec.get("binary", "")).startswith("/")
            ):
                raise ConfigError(
                    f"containerd setting runtimes.{rt}: needs a name of [A-Za-z0-9_.-] "
                    "and binary: an absolute path"
                )
    for name in ("default_runtime", "not_default_runtime"):
        value = settings.get(name)
        if value not in (None, "") and not _RUNTIME_NAME.match(str(value)):
            raise ConfigError(f"containerd setting {name}: {value!r} is not a runtime name")
    return settings


def _new_table_like(source: Any) -> Any:
    """A copy of a runtime table (with its options), to be added next to it."""
    table = copy.deepcopy(source)
    return table


def edit(text: str, containerd_version: str, settings: dict[str, Any]) -> str:
    """The config.toml text with the settings applied (the same text when nothing changes)."""
    settings = _check_settings(settings)
    major, minor = parse_version(containerd_version)
    doc = _doc(text)
    version = _config_version(doc, major)
    changed = False
    if version == 0:
        version = 3 if major >= 2 else 2
        # The version line goes before the first key (after the file's leading comments), so that it is a
        # top-level key: after a table header it would belong to that table.
        body = list(doc.body)
        doc = tomlkit.document()
        placed = False
        for key, item in body:
            if key is not None and not placed:
                doc.add("version", version)
                placed = True
            if key is None:
                doc.add(item)
            else:
                doc.add(key, item)
        if not placed:
            doc.add("version", version)
        changed = True
    where = _layout(version)

    if settings.get("cri_enabled"):
        disabled = doc.get("disabled_plugins")
        if disabled is not None:
            keep = [p for p in disabled if str(p) not in CRI_PLUGIN_IDS]
            if len(keep) != len(disabled):
                for item in [p for p in disabled if str(p) in CRI_PLUGIN_IDS]:
                    disabled.remove(item)
                changed = True

    runtimes = None
    if settings.get("systemd_cgroup") or settings.get("runtimes"):
        runtimes = _path(doc, where["runtimes"])
        runc = _table(runtimes, "runc", ".".join(where["runtimes"]))
        if "runtime_type" not in runc:
            runc["runtime_type"] = RUNC_V2
            changed = True

    for name, spec in (settings.get("runtimes") or {}).items():
        if name not in runtimes:
            # As nvidia-ctk does: the new runtime starts as a copy of runc's (type and options).
            runtimes[name] = _new_table_like(runtimes["runc"])
            changed = True
        table = runtimes[name]
        changed |= _set(table, "runtime_type", RUNC_V2) if "runtime_type" not in table else False
        options = _table(table, "options", f"{'.'.join(where['runtimes'])}.{name}")
        changed |= _set(options, "BinaryName", str(spec["binary"]))

    if settings.get("systemd_cgroup"):
        for name in list(runtimes.keys()):
            table = runtimes[name]
            if not isinstance(table, dict):
                continue
            rtype = table.get("runtime_type")
            if (rtype.unwrap() if hasattr(rtype, "unwrap") else rtype) != RUNC_V2:
                continue
            options = _table(table, "options", f"{'.'.join(where['runtimes'])}.{name}")
            changed |= _set(options, "SystemdCgroup", True)

    default = settings.get("default_runtime")
    not_default = settings.get("not_default_runtime")
    if default or not_default:
        current = _get(doc, [*where["containerd"], "default_runtime_name"])
        current = current.unwrap() if hasattr(current, "unwrap") else current
        if default:
            if runtimes is None or default not in runtimes:
                known = _get(doc, where["runtimes"]) or {}
                if default not in known:
                    raise ConfigError(
                        f"containerd setting default_runtime: no runtime {default!r} is configured"
                    )
            changed |= _set(_path(doc, where["containerd"]), "default_runtime_name", str(default))
        elif current == not_default:
            changed |= _set(_path(doc, where["containerd"]), "default_runtime_name", "runc")

    if settings.get("enable_cdi"):
        if (major, minor) < (1, 7):
            raise ConfigError(
                f"containerd {major}.{minor} has no CDI support (enable_cdi came in containerd 1.7)"
            )
        plugin = _path(doc, where["runtime_plugin"])
        # containerd 2.x turns CDI on by default; only an explicit false needs changing there.
        if version == 2 or "enable_cdi" in plugin:
            changed |= _set(plugin, "enable_cdi", True)

    if settings.get("cni_bin_dir"):
        wanted = str(settings["cni_bin_dir"])
        cni = _path(doc, where["cni"])
        if version == 3 and ("bin_dirs" in cni or ("bin_dir" not in cni and (major, minor) >= (2, 1))):
            dirs = cni.get("bin_dirs")
            if dirs is None:
                cni["bin_dirs"] = [wanted]
                changed = True
            elif wanted not in [str(d) for d in dirs]:
                dirs.append(wanted)
                changed = True
        else:
            changed |= _set(cni, "bin_dir", wanted)

    if settings.get("sandbox_image"):
        key = "sandbox" if version == 3 else "sandbox_image"
        changed |= _set(_path(doc, where["sandbox"]), key, str(settings["sandbox_image"]))

    if settings.get("registry_config_path"):
        # Where the CRI plugin reads per-registry hosts.toml files (mirrors), config versions 2 and 3.
        changed |= _set(_path(doc, where["registry"]), "config_path", str(settings["registry_config_path"]))

    return tomlkit.dumps(doc) if changed else text


def effective(dump_text: str) -> dict[str, Any]:
    """What `containerd config dump` says containerd uses, in the few keys the roles check."""
    try:
        data = tomllib.loads(dump_text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"`containerd config dump` printed no valid TOML: {exc}") from exc
    version = int(data.get("version") or 1)
    plugins = data.get("plugins") or {}
    if version == 3:
        runtime_plugin = plugins.get(CRI_RUNTIME_V3) or {}
        images = plugins.get(CRI_IMAGES_V3) or {}
        sandbox = (images.get("pinned_images") or {}).get("sandbox")
        registry = images.get("registry") or {}
        cri_name = CRI_RUNTIME_V3
    else:
        runtime_plugin = plugins.get(CRI_V2) or {}
        sandbox = runtime_plugin.get("sandbox_image")
        registry = runtime_plugin.get("registry") or {}
        cri_name = CRI_V2
    containerd = runtime_plugin.get("containerd") or {}
    cni = runtime_plugin.get("cni") or {}
    runtimes = {}
    for name, table in (containerd.get("runtimes") or {}).items():
        if isinstance(table, dict):
            options = table.get("options") or {}
            runtimes[name] = {
                "runtime_type": table.get("runtime_type", ""),
                "binary": options.get("BinaryName", ""),
                "systemd_cgroup": bool(options.get("SystemdCgroup", False)),
            }
    bin_dirs = list(cni.get("bin_dirs") or [])
    if cni.get("bin_dir"):
        bin_dirs.insert(0, cni["bin_dir"])
    disabled = [str(p) for p in data.get("disabled_plugins") or []]
    return {
        "version": version,
        "cri_plugin": cri_name,
        "cri_enabled": bool(runtime_plugin) and not any(p in CRI_PLUGIN_IDS for p in disabled),
        "runtimes": runtimes,
        "default_runtime": containerd.get("default_runtime_name", ""),
        "enable_cdi": bool(runtime_plugin.get("enable_cdi", False)),
        "cdi_spec_dirs": list(runtime_plugin.get("cdi_spec_dirs") or []),
        "sandbox_image": sandbox or "",
        "cni_bin_dirs": bin_dirs,
        "imports": list(data.get("imports") or []),
        "registry_config_path": str(registry.get("config_path") or ""),
    }


def unmet(eff: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The settings that containerd's effective configuration (from :func:`effective`) does not show."""
    missing = []
    where = f"plugins.{eff.get('cri_plugin')}"
    runtimes = eff.get("runtimes") or {}
    if settings.get("cri_enabled") and not eff.get("cri_enabled"):
        missing.append("the CRI plugin is disabled (disabled_plugins)")
    for name, spec in (settings.get("runtimes") or {}).items():
        got = runtimes.get(name)
        if not got:
            missing.append(f"no runtime {name} in {where}.containerd.runtimes")
        elif got.get("binary") != spec.get("binary"):
            missing.append(f"runtime {name} has BinaryName {got.get('binary')!r}, not {spec.get('binary')!r}")
    if settings.get("systemd_cgroup"):
        for name, got in runtimes.items():
            if got.get("runtime_type") == RUNC_V2 and not got.get("systemd_cgroup"):
                missing.append(f"runtime {name} has SystemdCgroup = false")
        if "runc" not in runtimes:
            missing.append(f"no runtime runc in {where}.containerd.runtimes")
    default = settings.get("default_runtime")
    if default and eff.get("default_runtime") != default:
        missing.append(f"the default runtime is {eff.get('default_runtime')!r}, not {default!r}")
    not_default = settings.get("not_default_runtime")
    if not_default and eff.get("default_runtime") == not_default:
        missing.append(f"the default runtime is still {not_default!r}")
    if settings.get("enable_cdi") and not eff.get("enable_cdi"):
        missing.append("enable_cdi is false")
    if settings.get("cni_bin_dir") and settings["cni_bin_dir"] not in (eff.get("cni_bin_dirs") or []):
        missing.append(
            f"the CNI plugin directories are {eff.get('cni_bin_dirs')}, without {settings['cni_bin_dir']}"
        )
    if settings.get("sandbox_image") and eff.get("sandbox_image") != settings["sandbox_image"]:
        missing.append(
            f"the sandbox image is {eff.get('sandbox_image')!r}, not {settings['sandbox_image']!r}"
        )
    wanted = settings.get("registry_config_path")
    if wanted and eff.get("registry_config_path") != wanted:
        missing.append(f"the registry config_path is {eff.get('registry_config_path')!r}, not {wanted!r}")
    return missing


def containerd_config_edit(text: str, containerd_version: str, settings: dict[str, Any]) -> str:
    return edit(str(text), str(containerd_version), dict(settings))


def containerd_config_effective(dump_text: str) -> dict[str, Any]:
    return effective(str(dump_text))


def containerd_version(text: str) -> str:
    major, minor = parse_version(text)
    return f"{major}.{minor}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "containerd_config_edit": containerd_config_edit,
            "containerd_config_effective": containerd_config_effective,
            "containerd_config_unmet": lambda eff, settings: unmet(dict(eff), dict(settings)),
            "containerd_version": containerd_version,
        }
