"""The Prometheus text exposition format, read strictly: what an exporter's /metrics page serves."""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioner.probes.base import ParseError


@dataclass(frozen=True)
class Sample:
    """One sample of the Prometheus text exposition format: a series (the metric's name and its labels),
    its value, and the line of the page it was read on."""

    name: str
    labels: dict[str, str]
    value: float
    line: int


# The text exposition format 0.0.4 (prometheus/docs, content/docs/instrumenting/exposition_formats.md):
# metric_name [ "{" label="value" { "," label="value" } [ "," ] "}" ] value [ timestamp ], label values
# escaping only backslash, double quote and line feed; # HELP and # TYPE comments; blank lines ignored.
# Read strictly: anything else in a line is an error, never skipped, and a line or a value too long to be
# an exporter's is refused before it is looked at further.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The exposition format's numbers, Inf and NaN included (an exporter may serve them), in ASCII digits.
_SAMPLE_VALUE = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|Inf|inf)|NaN"
)
_TIMESTAMP = re.compile(r"-?[0-9]{1,19}")
_PROM_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
_PROM_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
PROM_MAX_LINE = 16 * 1024
PROM_MAX_LABELS = 64
# C0 controls but tab (escape sequences start with ESC), DEL and C1: never in an exporter's page.
_UNSAFE_TEXT = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def _prom_labels(line: str, pos: int, n: int) -> tuple[dict[str, str], int]:
    """The label set starting after '{' at `pos`; returns the labels and the position after '}'."""
    labels: dict[str, str] = {}
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_NAME.match(line, pos)
        if not m:
            raise ParseError(f"metrics line {n}: expected a label name at column {pos + 1}")
        name, pos = m.group(), m.end()
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if line[pos : pos + 2] != '="':
            raise ParseError(f'metrics line {n}: expected =" after label {name}')
        pos += 2
        value: list[str] = []
        while True:
            if pos >= len(line):
                raise ParseError(f"metrics line {n}: label {name}: value not closed")
            ch = line[pos]
            if ch == '"':
                pos += 1
                break
            if ch == "\\":
                escaped = _PROM_ESCAPES.get(line[pos + 1 : pos + 2])
                if escaped is None:
                    raise ParseError(f"metrics line {n}: label {name}: unknown escape in its value")
                value.append(escaped)
                pos += 2
                continue
            value.append(ch)
            pos += 1
        if name in labels:
            raise ParseError(f"metrics line {n}: label {name} given twice")
        if len(labels) >= PROM_MAX_LABELS:
            raise ParseError(f"metrics line {n}: more than {PROM_MAX_LABELS} labels")
        labels[name] = "".join(value)
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif not (pos < len(line) and line[pos] == "}"):
            raise ParseError(f"metrics line {n}: expected , or }} after label {name}")


def parse_prometheus_text(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition; ParseError naming the line on anything malformed."""
    samples: list[Sample] = []
    for n, line in enumerate(text.split("\n"), 1):
        if len(line) > PROM_MAX_LINE:
            raise ParseError(f"metrics line {n}: longer than {PROM_MAX_LINE} characters")
        if _UNSAFE_TEXT.search(line):
            raise ParseError(f"metrics line {n}: control characters")
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 3)
            if parts[:1] == ["TYPE"] and (
                len(parts) != 3 or not _METRIC_NAME.fullmatch(parts[1]) or parts[2] not in _PROM_TYPES
            ):
                raise ParseError(f"metrics line {n}: malformed # TYPE comment")
            if parts[:1] == ["HELP"] and (len(parts) < 2 or not _METRIC_NAME.fullmatch(parts[1])):
                raise ParseError(f"metrics line {n}: malformed # HELP comment")
            continue
        m = _METRIC_NAME.match(line)
        if not m:
            raise ParseError(f"metrics line {n}: does not start with a metric name")
        name, pos = m.group(), m.end()
        labels: dict[str, str] = {}
        if line[pos : pos + 1] == "{":
            labels, pos = _prom_labels(line, pos + 1, n)
        rest = line[pos:].split()
        if not line[pos : pos + 1].isspace() or not 1 <= len(rest) <= 2:
            raise ParseError(f"metrics line {n}: expected a value (and a timestamp) after {name}")
        if not _SAMPLE_VALUE.fullmatch(rest[0]):
            raise ParseError(f"metrics line {n}: {name}: not a number: {rest[0][:40]!r}")
        if len(rest) == 2 and not _TIMESTAMP.fullmatch(rest[1]):
            raise ParseError(f"metrics line {n}: {name}: not a timestamp: {rest[1][:40]!r}")
        samples.append(Sample(name, labels, float(rest[0]), n))
    return samples
