"""Numbers read from a host's output (nvidia-smi, /proc, /sys, a snapshot file): parsed strictly.

A host's text is untrusted. `str.isdigit()` accepts superscripts and other scripts' digits that `int()`
refuses, `int()` accepts thousands of digits, `float()` accepts "inf", "nan" and 400 nines (infinity).
Each of those, reaching a report, breaks it for every host (JSON has no Infinity) or shows an
impossible value as a fact. Here a number is ASCII digits of bounded length, finite and in the range
the caller says is physically possible; anything else raises HostNumberError (a ValueError) for the
caller to turn into an error about that host or GPU.
"""

from __future__ import annotations

import math
import re

# Sixteen digits before the point and nine after hold every quantity a GPU host reports (bytes of
# memory, microseconds of uptime, counters) and keep conversion cheap.
_INT = re.compile(r"-?[0-9]{1,16}")
_DECIMAL = re.compile(r"-?[0-9]{1,16}(?:\.[0-9]{1,9})?")


class HostNumberError(ValueError):
    """A host's text is not a number in the range a real host could report."""


def _shown(text: str) -> str:
    return ascii(text[:24]) + ("…" if len(text) > 24 else "")


def parse_int(text: str, *, lo: int = 0, hi: int = 2**63 - 1, what: str = "value") -> int:
    """An integer written in ASCII digits (a minus sign only where `lo` is negative), within [lo, hi]."""
    s = text.strip()
    if not _INT.fullmatch(s) or (s.startswith("-") and lo >= 0):
        raise HostNumberError(f"{what}: not a whole number: {_shown(s)}")
    value = int(s)
    if not lo <= value <= hi:
        raise HostNumberError(f"{what}: {value} is outside {lo}..{hi}")
    return value


def parse_decimal(text: str, *, lo: float, hi: float, what: str = "value") -> float:
    """A finite decimal number in ASCII digits (no exponent, no inf/nan), within [lo, hi]."""
    s = text.strip()
    if not _DECIMAL.fullmatch(s):
        raise HostNumberError(f"{what}: not a number: {_shown(s)}")
    value = float(s)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise HostNumberError(f"{what}: {s} is outside {lo:g}..{hi:g}")
    return value


def is_index(text: str, *, hi: int = 4095) -> bool:
    """Whether `text` is a device index (ASCII digits, at most `hi`): nvidia-smi's GPU and MIG indices."""
    try:
        parse_int(text, lo=0, hi=hi)
    except HostNumberError:
        return False
    return True
