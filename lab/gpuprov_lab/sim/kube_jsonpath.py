"""kubectl's JSONPath templates (``-o jsonpath=...``, ``kubectl wait --for=jsonpath=...``) for the
SIMULATED kubectl: fields with escaped dots, ``[*]``, indexes and slices, ``['key']``, filters
``[?(@.a=="b")]``, recursive ``..name``, ``{range ...}{end}`` and string literals."""

from __future__ import annotations

import json
import re
from typing import Any


class JSONPathError(ValueError):
    pass


def _split_template(template: str) -> list[tuple[str, str]]:
    """[('text', ...) | ('action', ...)]; braces inside quoted literals do not end an action."""
    out: list[tuple[str, str]] = []
    i, buf = 0, ""
    while i < len(template):
        ch = template[i]
        if ch == "{":
            if buf:
                out.append(("text", buf))
                buf = ""
            j, quote = i + 1, ""
            while j < len(template):
                c = template[j]
                if quote:
                    if c == "\\":
                        j += 1
                    elif c == quote:
                        quote = ""
                elif c in "\"'":
                    quote = c
                elif c == "}":
                    break
                j += 1
            if j >= len(template):
                raise JSONPathError(f"unclosed action in template {template!r}")
            out.append(("action", template[i + 1 : j].strip()))
            i = j + 1
            continue
        buf += ch
        i += 1
    if buf:
        out.append(("text", buf))
    return out


def _tokens(expr: str) -> list[tuple[str, Any]]:
    """Path → [('field', name) | ('recursive', name) | ('sub', text)]."""
    toks: list[tuple[str, Any]] = []
    i = 0
    if expr.startswith(("$", "@")):
        i = 1
    while i < len(expr):
        if expr.startswith("..", i):
            i += 2
            m = re.match(r"((?:\\.|[^.\[\\])+)", expr[i:])
            name = m.group(1) if m else ""
            toks.append(("recursive", name.replace("\\.", ".")))
            i += len(name)
        elif expr[i] == ".":
            i += 1
            m = re.match(r"((?:\\.|[^.\[\\])*)", expr[i:])
            name = m.group(1) if m else ""
            if name:
                toks.append(("field", name.replace("\\.", ".")))
            i += len(name)
        elif expr[i] == "[":
            depth, j, quote = 0, i, ""
            while j < len(expr):
                c = expr[j]
                if quote:
                    if c == quote:
                        quote = ""
                elif c in "\"'":
                    quote = c
                elif c == "[":
                    depth += 1
                elif c == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            toks.append(("sub", expr[i + 1 : j].strip()))
            i = j + 1
        else:
            m = re.match(r"((?:\\.|[^.\[\\])+)", expr[i:])
            name = m.group(1) if m else expr[i:]
            toks.append(("field", name.replace("\\.", ".")))
            i += len(name)
    return toks


_CMP = re.compile(r"^(.*?)\s*(==|!=|<=|>=|<|>|=~)\s*(.*)$")


def _literal(text: str) -> Any:
    text = text.strip()
    if text[:1] in "\"'" and text[-1:] == text[:1]:
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        return text


def _filter(items: list[Any], cond: str) -> list[Any]:
    out = []
    for item in items:
        m = _CMP.match(cond)
        if m:
            left = _eval(m.group(1).strip(), item, item)
            right = _literal(m.group(3))
            op = m.group(2)
            lv = left[0] if left else None
            try:
                ok = {
                    "==": lv == right or (lv is not None and str(lv) == str(right)),
                    "!=": lv != right and not (lv is not None and str(lv) == str(right)),
                    "<": lv is not None and lv < right,
                    ">": lv is not None and lv > right,
                    "<=": lv is not None and lv <= right,
                    ">=": lv is not None and lv >= right,
                    "=~": lv is not None and re.search(str(right), str(lv)) is not None,
                }[op]
            except TypeError:
                ok = False
        else:
            ok = bool(_eval(cond.strip(), item, item))
        if ok:
            out.append(item)
    return out


def _recurse(value: Any, name: str) -> list[Any]:
    out = []
    if isinstance(value, dict):
        if name in value:
            out.append(value[name])
        for v in value.values():
            out += _recurse(v, name)
    elif isinstance(value, list):
        for v in value:
            out += _recurse(v, name)
    return out


def _eval(expr: str, root: Any, current: Any) -> list[Any]:
    if expr in ("", "@"):
        return [current]
    if expr == "$":
        return [root]
    start = root if expr.startswith("$") else current
    values = [start]
    for kind, arg in _tokens(expr):
        nxt: list[Any] = []
        for v in values:
            if kind == "field":
                if arg == "*":
                    nxt += list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, list) else []
                elif isinstance(v, dict) and arg in v:
                    nxt.append(v[arg])
            elif kind == "recursive":
                nxt += _recurse(v, arg)
            else:
                if arg == "*":
                    nxt += list(v) if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else []
                elif arg.startswith("?(") and arg.endswith(")"):
                    nxt += _filter(v if isinstance(v, list) else [v], arg[2:-1])
                elif arg[:1] in "\"'":
                    for key in (k.strip().strip("\"'") for k in arg.split(",")):
                        if isinstance(v, dict) and key in v:
                            nxt.append(v[key])
                elif ":" in arg and isinstance(v, list):
                    parts = [int(p) if p.strip() else None for p in arg.split(":")]
                    nxt += v[slice(*parts[:3])]
                elif isinstance(v, list):
                    for idx in arg.split(","):
                        try:
                            k = int(idx)
                        except ValueError as exc:
                            raise JSONPathError(f"invalid array index {idx!r}") from exc
                        if -len(v) <= k < len(v):
                            nxt.append(v[k])
                        else:
                            raise JSONPathError(f"array index out of bounds: index {k}, length {len(v)}")
        values = nxt
    return values


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict | list):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _unescape(text: str) -> str:
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def render(template: str, data: Any) -> str:
    """Render a kubectl JSONPath template; missing keys print nothing (as ``kubectl get`` allows)."""
    t = template.strip()
    if not t.startswith("{") and "{" not in t:
        t = "{" + t + "}"
    parts = _split_template(t)
    out, _ = _render(parts, 0, data, data)
    return out


def _render(parts: list[tuple[str, str]], i: int, root: Any, cur: Any) -> tuple[str, int]:
    out = ""
    while i < len(parts):
        kind, text = parts[i]
        if kind == "text":
            out += text
            i += 1
            continue
        if text == "end":
            return out, i + 1
        if text.startswith("range "):
            items = _eval(text[6:].strip(), root, cur)
            body_start = i + 1
            end = _skip_block(parts, body_start)
            for item in items:
                piece, _ = _render(parts, body_start, root, item)
                out += piece
            i = end
            continue
        if text[:1] in "\"'":
            out += _unescape(text[1:-1])
        else:
            out += " ".join(_fmt(v) for v in _eval(text, root, cur))
        i += 1
    return out, i


def _skip_block(parts: list[tuple[str, str]], i: int) -> int:
    depth = 1
    while i < len(parts):
        kind, text = parts[i]
        if kind == "action" and text.startswith("range "):
            depth += 1
        elif kind == "action" and text == "end":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise JSONPathError("range without end")


def values(expr: str, data: Any) -> list[Any]:
    """The values one path selects (for ``kubectl wait --for=jsonpath``)."""
    e = expr.strip()
    if e.startswith("{") and e.endswith("}"):
        e = e[1:-1]
    return _eval(e, data, data)
