"""The DCGM diagnostic, level 1 (`dcgmi diag -r 1 -j`), where dcgmi is installed."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.hostnumbers import is_index
from provisioner.hosttext import first_line
from provisioner.probes.base import ERROR, SKIP, HostFacts, ParseError, Probe, Unavailable, parse_json_object

DCGM_DIAG = "dcgmi-diag.json"

_DCGM = r"""
    command -v dcgmi >/dev/null 2>&1 || { echo "dcgmi not installed" >&2; return 200; }
    t 300 dcgmi diag -r 1 -j
"""

PROBES: tuple[Probe, ...] = (Probe(DCGM_DIAG, _DCGM, 310, "DCGM diagnostic level 1"),)


@dataclass(frozen=True)
class DiagResult:
    test: str
    status: str  # pass | warn | fail | skip
    gpu: int | None
    info: str


def parse_dcgm_diag(text: str) -> list[DiagResult]:
    """`dcgmi diag -r 1 -j`: {"DCGM GPU Diagnostic" | "DCGM Diagnostic": {"test_categories": [...]}}."""
    start = text.find("{")
    if start < 0:
        raise ParseError(f"dcgmi diag: no JSON in output: {first_line(text)!r}")
    doc = parse_json_object(text[start:], "dcgmi diag")
    body = next((v for v in doc.values() if isinstance(v, dict) and "test_categories" in v), None)
    if body is None:
        raise ParseError("dcgmi diag: no test_categories in the JSON")
    out: list[DiagResult] = []
    for cat in body.get("test_categories") or []:
        for test in (cat or {}).get("tests") or []:
            name = str(test.get("name", "?"))
            for res in test.get("results") or []:
                raw = str(res.get("status", "")).strip().lower()
                status = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn"}.get(raw, "skip")
                gpu = res.get("gpu_id", res.get("entity_id"))
                info = res.get("info") or res.get("warnings") or ""
                if isinstance(info, list):
                    info = "; ".join(
                        str(i.get("warning", i)) if isinstance(i, dict) else str(i) for i in info
                    )
                index = int(str(gpu)) if is_index(str(gpu)) else None
                out.append(DiagResult(name, status, index, str(info)))
    return out


def diag_results(facts: HostFacts) -> list[DiagResult]:
    """The diagnostic's results. dcgmi exits non-zero when a test fails and still prints them, so a
    failed run is an error only when its output does not read."""
    res = facts.result(DCGM_DIAG)
    if res.not_applicable:
        raise Unavailable(SKIP, res.reason())
    try:
        return facts.parsed("dcgm", lambda: parse_dcgm_diag(res.stdout))
    except Unavailable:
        if not res.ok:
            raise Unavailable(ERROR, f"dcgmi diag failed: {res.reason()}") from None
        raise
