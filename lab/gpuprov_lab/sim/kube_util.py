"""Small helpers shared by the SIMULATED Kubernetes tools of the gpuprov lab (kubeadm, kubelet, kubectl,
helm and the sim API server): time and duration formats as Go prints them, YAML, label and field
selectors, JSON merge patches and kubectl's column printer.

These modules run inside lab hosts (copied into the sim packages, standard library + PyYAML only) and in
the test suite; they import each other relatively and nothing else from the project.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import random
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

SIM_LABEL = "SIMULATED (gpuprov lab)"
Obj = dict[str, Any]


# ------------------------------------------------------------------------------------------------ time


def now() -> float:
    return time.time()


def iso(t: float | None = None) -> str:
    """RFC 3339 in UTC with seconds, as the API server writes timestamps."""
    return dt.datetime.fromtimestamp(now() if t is None else t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return dt.datetime.strptime(value[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None


_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DUR_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str | int | float) -> float:
    """Go duration ("4m0s", "300s", "1h") → seconds; a bare number is seconds. ValueError when invalid."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    pos, total = 0, 0.0
    for m in _DUR_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DUR_UNIT[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f'time: invalid duration "{text}"')
    return total


def go_duration(seconds: float) -> str:
    """Seconds → Go's Duration.String() ("30s", "4m0s", "1h0m0s", "500ms")."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:g}ms" if ms >= 1 else f"{seconds * 1e6:g}µs"
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    s_txt = f"{s:.9f}".rstrip("0").rstrip(".") + "s"
    if h:
        return f"{int(h)}h{int(m)}m{s_txt}"
    if m:
        return f"{int(m)}m{s_txt}"
    return s_txt


def human_age(seconds: float) -> str:
    """kubectl's duration.HumanDuration (the AGE column)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{hours // 24 // 365}y"


# --------------------------------------------------------------------------------------------- names

_ALNUM = "bcdfghjklmnpqrstvwxz2456789"  # the API server's random-suffix alphabet


def rand_suffix(n: int = 5) -> str:
    return "".join(random.choice(_ALNUM) for _ in range(n))


def stable_hash(obj: Any, n: int = 10) -> str:
    """A short deterministic hash of a JSON-able value in the suffix alphabet (pod-template-hash)."""
    import hashlib

    digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).digest()
    return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:n])


DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# ---------------------------------------------------------------------------------------------- YAML


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)


def yaml_dump(obj: Any) -> str:
    return yaml.dump(
        obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16
    )


def yaml_load(text: str) -> Any:
    return yaml.safe_load(text)


def yaml_load_all(text: str) -> list[Any]:
    """Every non-empty document of a multi-document YAML (or JSON) text."""
    return [d for d in yaml.safe_load_all(text) if d is not None]


# --------------------------------------------------------------------------------------- dicts/patches


def dig(obj: Any, *keys: Any, default: Any = None) -> Any:
    cur = obj
    for k in keys:
        if (isinstance(cur, Mapping) and k in cur) or (
            isinstance(cur, list) and isinstance(k, int) and -len(cur) <= k < len(cur)
        ):
            cur = cur[k]
        else:
            return default
    return cur


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes a key); returns a new value."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def deep_merge(base: Any, over: Any) -> Any:
    """Helm-style values merge: maps merge recursively, anything else is replaced; null removes."""
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        out = dict(copy.deepcopy(base))
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = deep_merge(out[k], v)
            else:
                out[k] = copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def three_way_patch(last: Any, new: Any, live: Any) -> Any:
    """What ``kubectl apply`` sends: the fields of ``new`` that differ from ``live`` and null for the
    fields ``last`` (the previous applied configuration) had that ``new`` dropped."""
    if not isinstance(new, Mapping):
        return None if new == live else copy.deepcopy(new)
    patch: dict[str, Any] = {}
    last_map = last if isinstance(last, Mapping) else {}
    live_map = live if isinstance(live, Mapping) else {}
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(live_map.get(k), Mapping):
            sub = three_way_patch(last_map.get(k), v, live_map[k])
            if sub:
                patch[k] = sub
        elif live_map.get(k) != v:
            patch[k] = copy.deepcopy(v)
    for k in last_map:
        if k not in new and k in live_map:
            patch[k] = None
    return patch


# ------------------------------------------------------------------------------------------ selectors


class SelectorError(ValueError):
    pass


_SEL_RE = re.compile(
    r"\s*(?:(?P<notexists>!)\s*(?P<k0>[^\s,!=()]+)"
    r"|(?P<k1>[^\s,!=()]+)\s*(?P<op>==|=|!=)\s*(?P<v1>[^\s,!=()]*)"
    r"|(?P<k2>[^\s,!=()]+)\s+(?P<setop>in|notin)\s*\((?P<vals>[^)]*)\)"
    r"|(?P<k3>[^\s,!=()]+))\s*(?:,|$)"
)


def parse_label_selector(text: str) -> list[tuple[str, str, list[str]]]:
    """'a=b,c!=d,e in (f,g),!h,i' → [(key, op, values)] with op in =,!=,in,notin,exists,!exists."""
    reqs: list[tuple[str, str, list[str]]] = []
    text = (text or "").strip()
    pos = 0
    while pos < len(text):
        m = _SEL_RE.match(text, pos)
        if not m or m.end() == pos:
            raise SelectorError(f"unable to parse requirement: found '{text[pos:]}'")
        if m.group("notexists"):
            reqs.append((m.group("k0"), "!exists", []))
        elif m.group("k1"):
            reqs.append((m.group("k1"), "!=" if m.group("op") == "!=" else "=", [m.group("v1")]))
        elif m.group("k2"):
            vals = [v.strip() for v in m.group("vals").split(",") if v.strip()]
            reqs.append((m.group("k2"), m.group("setop"), vals))
        else:
            reqs.append((m.group("k3"), "exists", []))
        pos = m.end()
    return reqs


def labels_match(reqs: Iterable[tuple[str, str, list[str]]], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    for key, op, vals in reqs:
        have = key in labels
        val = labels.get(key)
        if (
            (op == "=" and val != vals[0])
            or (op == "!=" and have and val == vals[0])
            or (op == "in" and (not have or val not in vals))
            or (op == "notin" and have and val in vals)
            or (op == "exists" and not have)
            or (op == "!exists" and have)
        ):
            return False
    return True


def match_label_selector(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """metav1.LabelSelector (matchLabels + matchExpressions) against labels; an empty selector matches all."""
    if selector is None:
        return False
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, vals = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in vals:
            return False
        if op == "NotIn" and key in labels and labels[key] in vals:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def parse_field_selector(text: str) -> list[tuple[str, str, str]]:
    out = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-/]+)\s*(==|=|!=)\s*(.*)", part)
        if not m:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        out.append((m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
    return out


def field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def fields_match(reqs: Iterable[tuple[str, str, str]], obj: Mapping[str, Any]) -> bool:
    for path, op, val in reqs:
        have = field_value(obj, path)
        if (op == "=" and have != val) or (op == "!=" and have == val):
            return False
    return True


# ---------------------------------------------------------------------------------------- tabwriter


def table(rows: list[list[str]], padding: int = 3) -> str:
    """kubectl's column printer: left-aligned cells, at least ``padding`` spaces between columns."""
    if not rows:
        return ""
    widths = [0] * max(len(r) for r in rows)
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for r in rows:
        cells = [c.ljust(widths[i] + padding) if i < len(r) - 1 else c for i, c in enumerate(r)]
        lines.append("".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def quantity_to_int(q: Any) -> int:
    """Resource quantity ('8', '2Gi', '500m' → 0) as an integer count (enough for GPUs, pods, memory)."""
    if q is None:
        return 0
    text = str(q).strip()
    units = {
        "Ki": 1 << 10,
        "Mi": 1 << 20,
        "Gi": 1 << 30,
        "Ti": 1 << 40,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
        "m": 0,
    }
    for suffix, mult in units.items():
        if text.endswith(suffix):
            try:
                return int(float(text[: -len(suffix)]) * mult) if mult else 0
            except ValueError:
                return 0
    try:
        return int(float(text))
    except ValueError:
        return 0


def dumps(obj: Any) -> str:
    """JSON as kubectl prints it (4-space indent)."""
    return json.dumps(obj, indent=4, ensure_ascii=False)
