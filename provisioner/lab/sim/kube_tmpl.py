"""The part of Go templates (with Helm's functions) the SIMULATED helm renders charts with (gpuprov lab):
``{{ }}`` actions with ``-`` trimming, comments, pipelines, ``if/else if/else``, ``with``, ``range`` (lists
and maps, with ``$i, $v :=``), variables, ``define``/``include``/``template``, and the functions charts use
most (default, quote, toYaml, nindent, indent, required, eq/ne/and/or/not, empty, hasKey, printf, ...)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from . import kube_util as u


class TemplateError(Exception):
    pass


# ------------------------------------------------------------------------------------------ lexing

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


def _split(text: str) -> list[tuple[str, str]]:
    """[('text', ...) | ('action', ...)], applying {{- and -}} whitespace trimming."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(text):
        chunk = text[pos : m.start()]
        if m.group(1):
            chunk = chunk.rstrip()
        out.append(("text", chunk))
        body = m.group(2).strip()
        out.append(("action", body))
        pos = m.end()
        if m.group(3):
            rest = text[pos:]
            pos += len(rest) - len(rest.lstrip())
    out.append(("text", text[pos:]))
    return [(k, v) for k, v in out if not (k == "text" and v == "")]


_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:\\.|[^"\\])*")|(?P<raw>`[^`]*`)|(?P<num>-?\d+(?:\.\d+)?)|(?P<lp>\()|(?P<rp>\))'
    r"|(?P<pipe>\|)|(?P<decl>:=)|(?P<assign>=)|(?P<comma>,)"
    r"|(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)|(?P<field>(?:\.[A-Za-z0-9_]+)+|\.)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*))"
)


def _tokens(expr: str) -> list[tuple[str, str]]:
    toks = []
    pos = 0
    expr = expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"unexpected {expr[pos:]!r} in {{{{ {expr} }}}}")
        kind = m.lastgroup or ""
        toks.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(expr) and expr[pos].isspace():
            pos += 1
    return toks


# -------------------------------------------------------------------------------------------- parsing

Node = tuple[Any, ...]


def parse(text: str) -> list[Node]:
    parts = _split(text)
    nodes, _i, end = _parse_block(parts, 0, ())
    if end is not None:
        raise TemplateError(f"unexpected {{{{ {end} }}}}")
    return nodes


def _parse_block(
    parts: list[tuple[str, str]], i: int, stops: tuple[str, ...]
) -> tuple[list[Node], int, str | None]:
    nodes: list[Node] = []
    while i < len(parts):
        kind, val = parts[i]
        i += 1
        if kind == "text":
            nodes.append(("text", val))
            continue
        if val.startswith("/*"):
            continue
        word = val.split(None, 1)[0] if val else ""
        if word in stops or (word == "else" and "else" in stops):
            return nodes, i, val
        if word in ("if", "with", "range"):
            expr = val[len(word) :].strip()
            body, i, end = _parse_block(parts, i, ("end", "else"))
            branches = [(expr, body)]
            otherwise: list[Node] = []
            while end is not None and end.startswith("else"):
                rest = end[4:].strip()
                if rest.startswith("if ") and word == "if":
                    body, i, end = _parse_block(parts, i, ("end", "else"))
                    branches.append((rest[3:].strip(), body))
                elif rest.startswith("with ") and word == "with":
                    body, i, end = _parse_block(parts, i, ("end", "else"))
                    branches.append((rest[5:].strip(), body))
                else:
                    otherwise, i, end = _parse_block(parts, i, ("end",))
            if end != "end":
                raise TemplateError(f"unclosed {{{{ {word} }}}}")
            nodes.append((word, branches, otherwise))
            continue
        if word in ("define", "block"):
            name = json.loads(val.split(None, 1)[1].split()[0])
            body, i, end = _parse_block(parts, i, ("end",))
            nodes.append(
                (
                    "define",
                    name,
                    body,
                    val.split(None, 2)[2] if word == "block" and len(val.split()) > 2 else None,
                )
            )
            continue
        if word == "template":
            rest = val[len("template") :].strip()
            m = re.match(r'("(?:\\.|[^"\\])*")\s*(.*)', rest)
            if not m:
                raise TemplateError(f"bad template call: {val}")
            nodes.append(("include", json.loads(m.group(1)), m.group(2) or "."))
            continue
        nodes.append(("expr", val))
    return nodes, i, None


# ------------------------------------------------------------------------------------------- evaluation


def _truthy(v: Any) -> bool:
    if v is None or v is False:
        return False
    if isinstance(v, int | float) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, str | list | dict | tuple):
        return len(v) > 0
    return True


def _to_yaml(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, dict | list) and not v:
        return "{}" if isinstance(v, dict) else "[]"
    return u.yaml_dump(v).rstrip("\n")


def _indent(n: int, s: Any) -> str:
    pad = " " * int(n)
    return "\n".join(pad + ln if ln else ln for ln in str(s).split("\n"))


def _quote(*args: Any) -> str:
    return " ".join(json.dumps("" if a is None else a if isinstance(a, str) else _fmt(a)) for a in args)


def _fmt(v: Any) -> str:
    if v is None:
        return "<no value>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_fmt(x)}" for k, x in sorted(v.items())) + "]"
    if isinstance(v, list):
        return "[" + " ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _required(msg: str, v: Any) -> Any:
    if v is None or v == "":
        raise TemplateError(msg)
    return v


def _printf(fmt: str, *args: Any) -> str:
    out = re.sub(r"%[-+ #0]*\d*(?:\.\d+)?[vdsqtf]", "{}", fmt.replace("%%", "\x00"))
    vals = []
    for spec, a in zip(
        re.findall(r"%[-+ #0]*\d*(?:\.\d+)?([vdsqtf])", fmt.replace("%%", "")), args, strict=False
    ):
        vals.append(json.dumps(str(a)) if spec == "q" else _fmt(a))
    return out.format(*vals).replace("\x00", "%")


FUNCS: dict[str, Callable[..., Any]] = {
    "default": lambda d, v=None: v if _truthy(v) else d,
    "quote": _quote,
    "squote": lambda *a: " ".join(f"'{'' if x is None else _fmt(x)}'" for x in a),
    "toYaml": _to_yaml,
    "toJson": lambda v: json.dumps(v, separators=(",", ":")),
    "fromYaml": lambda s: u.yaml_load(s) or {},
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "trim": lambda s: str(s).strip(),
    "trimSuffix": lambda suf, s: str(s).removesuffix(suf),
    "trimPrefix": lambda pre, s: str(s).removeprefix(pre),
    "trunc": lambda n, s: str(s)[: int(n)] if int(n) >= 0 else str(s)[int(n) :],
    "lower": lambda s: str(s).lower(),
    "upper": lambda s: str(s).upper(),
    "title": lambda s: str(s).title(),
    "replace": lambda old, new, s: str(s).replace(old, new),
    "contains": lambda sub, s: sub in str(s),
    "hasPrefix": lambda pre, s: str(s).startswith(pre),
    "hasSuffix": lambda suf, s: str(s).endswith(suf),
    "eq": lambda a, *b: any(a == x for x in b),
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "not": lambda v: not _truthy(v),
    "and": lambda *a: next((x for x in a if not _truthy(x)), a[-1] if a else None),
    "or": lambda *a: next((x for x in a if _truthy(x)), a[-1] if a else None),
    "empty": lambda v: not _truthy(v),
    "hasKey": lambda d, k: isinstance(d, Mapping) and k in d,
    "required": _required,
    "printf": _printf,
    "print": lambda *a: "".join(_fmt(x) for x in a),
    "b64enc": lambda s: base64.b64encode(str(s).encode()).decode(),
    "b64dec": lambda s: base64.b64decode(str(s)).decode(),
    "list": lambda *a: list(a),
    "dict": lambda *a: {str(a[i]): a[i + 1] for i in range(0, len(a) - 1, 2)},
    "toString": _fmt,
    "int": lambda v: int(v or 0),
    "kindIs": lambda k, v: {
        "map": isinstance(v, dict),
        "slice": isinstance(v, list),
        "string": isinstance(v, str),
        "bool": isinstance(v, bool),
        "int": isinstance(v, int),
    }.get(k, False),
    "ternary": lambda a, b, c: a if _truthy(c) else b,
    "coalesce": lambda *a: next((x for x in a if _truthy(x)), None),
    "semverCompare": lambda c, v: _semver_compare(c, v),
    "keys": lambda d: sorted(d) if isinstance(d, Mapping) else [],
    "join": lambda sep, lst: sep.join(_fmt(x) for x in lst or []),
    "split": lambda sep, s: {f"_{i}": p for i, p in enumerate(str(s).split(sep))},
    "lookup": lambda *a: {},
}


def _semver_compare(constraint: str, version: str) -> bool:
    def vt(s: str) -> tuple[int, ...]:
        nums = re.findall(r"\d+", s.split("-")[0])
        return tuple(int(n) for n in nums[:3]) + (0,) * (3 - len(nums[:3]))

    m = re.match(r"\s*(>=|<=|>|<|=|\^|~)?\s*(\S+)", constraint)
    if not m:
        return False
    op, want = m.group(1) or "=", vt(m.group(2))
    have = vt(version)
    return {
        ">=": have >= want,
        "<=": have <= want,
        ">": have > want,
        "<": have < want,
        "=": have == want,
        "^": have[0] == want[0] and have >= want,
        "~": have[:2] == want[:2] and have >= want,
    }[op]


class Renderer:
    def __init__(self, defines: dict[str, list[Node]] | None = None) -> None:
        self.defines: dict[str, list[Node]] = defines or {}

    def collect(self, nodes: list[Node]) -> None:
        for n in nodes:
            if n[0] == "define":
                self.defines[n[1]] = n[2]
            elif n[0] in ("if", "with", "range"):
                for _e, body in n[1]:
                    self.collect(body)
                self.collect(n[2])

    def render(self, nodes: list[Node], dot: Any, root: Any, scope: dict[str, Any]) -> str:
        out: list[str] = []
        for n in nodes:
            kind = n[0]
            if kind == "text":
                out.append(n[1])
            elif kind == "define":
                continue
            elif kind == "include":
                out.append(self.include(n[1], self.eval(n[2], dot, root, scope), root))
            elif kind == "expr":
                expr = n[1]
                m = re.match(r"^(\$[A-Za-z0-9_]+)\s*(:=|=)\s*(.*)$", expr, re.S)
                if m:
                    scope[m.group(1)] = self.eval(m.group(3), dot, root, scope)
                    continue
                v = self.eval(expr, dot, root, scope)
                out.append(_fmt(v) if not isinstance(v, str) else v)
            elif kind == "if":
                for expr, body in n[1]:
                    if _truthy(self.eval(expr, dot, root, scope)):
                        out.append(self.render(body, dot, root, dict(scope)))
                        break
                else:
                    out.append(self.render(n[2], dot, root, dict(scope)))
            elif kind == "with":
                for expr, body in n[1]:
                    v = self.eval(expr, dot, root, scope)
                    if _truthy(v):
                        out.append(self.render(body, v, root, dict(scope)))
                        break
                else:
                    out.append(self.render(n[2], dot, root, dict(scope)))
            elif kind == "range":
                expr, body = n[1][0]
                m = re.match(r"^(\$[A-Za-z0-9_]+)(?:\s*,\s*(\$[A-Za-z0-9_]+))?\s*:=\s*(.*)$", expr, re.S)
                kvar, vvar, src = (m.group(1), m.group(2), m.group(3)) if m else (None, None, expr)
                coll = self.eval(src, dot, root, scope)
                items = sorted(coll.items()) if isinstance(coll, Mapping) else list(enumerate(coll or []))
                if not items:
                    out.append(self.render(n[2], dot, root, dict(scope)))
                for k, v in items:
                    sc = dict(scope)
                    if kvar and vvar:
                        sc[kvar], sc[vvar] = k, v
                    elif kvar:
                        sc[kvar] = v
                    out.append(self.render(body, v, root, sc))
        return "".join(out)

    def include(self, name: str, dot: Any, root: Any) -> str:
        if name not in self.defines:
            raise TemplateError(f'no template "{name}" associated with template "gotpl"')
        return self.render(self.defines[name], dot, root, {"$": root})

    # -- expressions
    def eval(self, expr: str, dot: Any, root: Any, scope: dict[str, Any]) -> Any:
        toks = _tokens(expr)
        val, pos = self._pipeline(toks, 0, dot, root, scope)
        if pos != len(toks):
            raise TemplateError(f"unexpected {toks[pos][1]!r} in {{{{ {expr} }}}}")
        return val

    def _pipeline(
        self, toks: list[tuple[str, str]], pos: int, dot: Any, root: Any, scope: dict[str, Any]
    ) -> tuple[Any, int]:
        val, pos = self._command(toks, pos, dot, root, scope, None, False)
        while pos < len(toks) and toks[pos][0] == "pipe":
            val, pos = self._command(toks, pos + 1, dot, root, scope, val, True)
        return val, pos

    def _command(
        self,
        toks: list[tuple[str, str]],
        pos: int,
        dot: Any,
        root: Any,
        scope: dict[str, Any],
        piped: Any,
        has_piped: bool,
    ) -> tuple[Any, int]:
        if pos >= len(toks):
            raise TemplateError("missing value in pipeline")
        kind, text = toks[pos]
        if (kind == "ident" and text in FUNCS) or (kind == "ident" and text == "include"):
            pos += 1
            args = []
            while pos < len(toks) and toks[pos][0] not in ("pipe", "rp"):
                a, pos = self._operand(toks, pos, dot, root, scope)
                args.append(a)
            if has_piped:
                args.append(piped)
            if text == "include":
                return self.include(str(args[0]), args[1] if len(args) > 1 else None, root), pos
            try:
                return FUNCS[text](*args), pos
            except TemplateError:
                raise
            except Exception as exc:
                raise TemplateError(f"error calling {text}: {exc}") from exc
        val, pos = self._operand(toks, pos, dot, root, scope)
        if has_piped:
            raise TemplateError(f"can't give argument to non-function {text}")
        return val, pos

    def _operand(
        self, toks: list[tuple[str, str]], pos: int, dot: Any, root: Any, scope: dict[str, Any]
    ) -> tuple[Any, int]:
        kind, text = toks[pos]
        if kind == "lp":
            val, pos = self._pipeline(toks, pos + 1, dot, root, scope)
            if pos >= len(toks) or toks[pos][0] != "rp":
                raise TemplateError("unclosed parenthesis")
            return val, pos + 1
        if kind == "str":
            return json.loads(text), pos + 1
        if kind == "raw":
            return text[1:-1], pos + 1
        if kind == "num":
            return (float(text) if "." in text else int(text)), pos + 1
        if kind == "field":
            return _walk(dot, text), pos + 1
        if kind == "var":
            name, _, rest = text.partition(".")
            base = root if name == "$" else scope.get(name)
            if name != "$" and name not in scope:
                raise TemplateError(f"undefined variable: {name}")
            return (_walk(base, "." + rest) if rest else base), pos + 1
        if kind == "ident":
            if text in ("true", "false"):
                return text == "true", pos + 1
            if text == "nil":
                return None, pos + 1
            if text in FUNCS:
                return FUNCS[text](), pos + 1
        raise TemplateError(f"unexpected {text!r}")


def _walk(base: Any, path: str) -> Any:
    if path == ".":
        return base
    cur = base
    for part in path.strip(".").split("."):
        if isinstance(cur, Mapping):
            cur = cur.get(part)
        else:
            return None
    return cur


def render_chart_templates(templates: dict[str, str], context: Mapping[str, Any]) -> dict[str, str]:
    """Render every template (names starting with '_' only define helpers) with one shared set of defines."""
    r = Renderer()
    parsed = {name: parse(text) for name, text in templates.items()}
    for nodes in parsed.values():
        r.collect(nodes)
    out = {}
    for name, nodes in parsed.items():
        if name.rsplit("/", 1)[-1].startswith("_"):
            continue
        ctx = dict(context)
        ctx["Template"] = {"Name": name, "BasePath": name.rsplit("/", 1)[0]}
        try:
            out[name] = r.render(nodes, ctx, ctx, {"$": ctx})
        except TemplateError as exc:
            raise TemplateError(f"template: {name}: {exc}") from exc
    return out
