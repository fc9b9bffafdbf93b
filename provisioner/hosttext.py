"""Text that came from a host or a bundle (host names, probe output, Kubernetes' answers), made safe to
show: it never drives the terminal, breaks XML or hides what a message says."""

from __future__ import annotations

import re

# Control characters (C0 but tab and newline, DEL, C1) and the Unicode controls that reorder or hide text
# (bidi overrides and isolates, zero-width marks).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def safe_text(text: str) -> str:
    """Unsafe characters shown as escapes (\\x1b, \\u202e); everything else as it is."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def short_safe_text(text: str, limit: int = 80) -> str:
    """safe_text on one line (newlines and tabs escaped too), cut to `limit` characters first: one value
    inside a one-line message."""
    shown = safe_text(text if len(text) <= limit else text[:limit] + "…")
    return shown.replace("\t", "\\t").replace("\n", "\\n")


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line, stripped, cut at `limit` with an ellipsis (a reason in one line)."""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def last_line(text: str, limit: int = 300) -> str:
    """The last non-blank line, stripped, cut at `limit`: where tools such as kubectl put their error."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:limit]
