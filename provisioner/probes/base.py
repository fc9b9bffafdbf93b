"""What every fact module builds on: a probe (the command whose output is one snapshot file), its result,
the error its parser raises, and HostFacts: one host's results, each fact parsed once, with the reason a
check cannot have it."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from provisioner.hosttext import first_line

# A probe that decides it does not apply here (no kubeconfig, no dcgmi, no such config file)
# exits with this code and says why on stderr. It is "not applicable", not a failure.
RC_NOT_APPLICABLE = 200

# What a fact that cannot be had makes of a check: skip where it does not apply or was not collected,
# error where it could not be read. They are check statuses (checks.model), defined here because every
# fact raises them and the checks build on the facts, not the other way round.
SKIP, ERROR = "skip", "error"

T = TypeVar("T")
D = TypeVar("D")
_MISSING = object()


class ParseError(ValueError):
    """A probe's output could not be understood (garbled, truncated, unexpected format)."""


class Unavailable(Exception):
    """A fact a check needs is missing or unreadable: the check becomes skip/error with the reason."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def or_default(read: Callable[[], T], default: D) -> T | D:
    """What `read` returns, or `default` where the fact it reads is unavailable."""
    try:
        return read()
    except Unavailable:
        return default


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


class HostFacts:
    """What the probes said about one host. The fact modules' accessors read it; they raise
    Unavailable(status, reason)."""

    def __init__(self, host: str, results: Mapping[str, ProbeResult]) -> None:
        self.host = host
        self.results = dict(results)
        self._cache: dict[str, Any] = {}

    def result(self, name: str) -> ProbeResult:
        res = self.results.get(name)
        if res is None:
            raise Unavailable(SKIP, f"{name} was not collected")
        if res.rc is None:
            # Cut short, or a snapshot file refused (a link, a device, too big): an error, never a skip.
            bad = "cut short" in res.note or "ended early" in res.note or res.note.startswith("refused:")
            raise Unavailable(ERROR if bad else SKIP, f"{name}: {res.reason()}")
        return res

    def settle(self, key: str, value: Any) -> None:
        """What `parsed(key, ...)` gives from now on: a reading of the facts that knows more than they
        do (the Xids a GPU reset since answered, say)."""
        self._cache[key] = value

    def parsed(self, key: str, fn: Callable[[], T]) -> T:
        """fn's value (or the Unavailable it raised) under `key`, computed once; a ParseError is an error."""
        cached = self._cache.get(key, _MISSING)
        if cached is _MISSING:
            try:
                cached = fn()
            except Unavailable as exc:
                cached = exc
            except ParseError as exc:
                cached = Unavailable(ERROR, str(exc))
            self._cache[key] = cached
        if isinstance(cached, Unavailable):
            raise cached
        return cached  # type: ignore[return-value]

    def ok_text(self, name: str) -> str:
        """stdout of a probe that must have succeeded; otherwise error with its reason."""
        res = self.result(name)
        if res.not_applicable:
            raise Unavailable(SKIP, f"{name}: {res.reason()}")
        if not res.ok:
            raise Unavailable(ERROR, f"{name}: {res.reason()}")
        return res.stdout


def parse_json_object(text: str, probe: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"{probe}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ParseError(f"{probe}: expected a JSON object")
    return value
