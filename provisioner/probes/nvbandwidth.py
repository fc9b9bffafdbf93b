"""Interconnect bandwidth measured by NVIDIA's nvbandwidth (github.com/NVIDIA/nvbandwidth), where it is
installed: host to GPU and GPU to host over PCIe, GPU to GPU over NVLink (or PCIe where a GPU has none).

`nvbandwidth -j` prints one JSON document (nvbandwidth v0.8, json_output.cpp): {"nvbandwidth": {"version",
"git_version", "CUDA Runtime Version", "Driver Version", "GPU Device list": [...], "testcases": [{"name",
"status": "Passed" | "Running" | "Waived" | "Not Found" | "Error", "bandwidth_description",
"bandwidth_matrix": [["276.07", "N/A", ...], ...], "sum", "error"}], "error", "warning"}}. A matrix value is
GB/s as a string, "N/A" where a pair was not measured; a test that needs peers on a host without them is
"Waived"; "Running" is left where a test stopped half way. The test names are nvbandwidth's own
(testcases_ce.cpp); several follow one -t (a multitoken option, nvbandwidth.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.hostnumbers import HostNumberError, parse_decimal
from provisioner.hosttext import first_line
from provisioner.probes.base import ERROR, SKIP, HostFacts, ParseError, Probe, Unavailable, parse_json_object

NVBANDWIDTH = "nvbandwidth.json"

HOST_TO_DEVICE = "host_to_device_memcpy_ce"
DEVICE_TO_HOST = "device_to_host_memcpy_ce"
DEVICE_TO_DEVICE = "device_to_device_memcpy_read_ce"
TESTCASES = (HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE)
LIMIT_SECONDS = 900

_NVBANDWIDTH = f"""
    command -v nvbandwidth >/dev/null 2>&1 || {{ echo "nvbandwidth not installed" >&2; return 200; }}
    t {LIMIT_SECONDS} nvbandwidth -j -t {" ".join(TESTCASES)}
"""

PROBES: tuple[Probe, ...] = (
    Probe(NVBANDWIDTH, _NVBANDWIDTH, LIMIT_SECONDS + 10, "nvbandwidth: host↔GPU and GPU↔GPU copy bandwidth"),
)


@dataclass
class Testcase:
    name: str
    status: str  # as nvbandwidth prints it
    matrix: list[list[float | None]] = field(default_factory=list)  # GB/s; None: not measured
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "Passed"


@dataclass
class BandwidthRun:
    testcases: list[Testcase]
    error: str = ""
    warning: str = ""


def _value(cell: object, where: str) -> float | None:
    text = str(cell).strip()
    if text in ("N/A", ""):
        return None
    try:
        return parse_decimal(text, lo=0, hi=1_000_000, what=f"nvbandwidth {where}")
    except HostNumberError as exc:
        raise ParseError(str(exc)) from None


def parse_nvbandwidth(text: str) -> BandwidthRun:
    start = text.find("{")
    if start < 0:
        raise ParseError(f"nvbandwidth: no JSON in output: {first_line(text)!r}")
    doc = parse_json_object(text[start:], "nvbandwidth")
    body = doc.get("nvbandwidth")
    if not isinstance(body, dict):
        raise ParseError("nvbandwidth: no 'nvbandwidth' object in the JSON")
    cases: list[Testcase] = []
    for raw in body.get("testcases") or []:
        if not isinstance(raw, dict):
            continue
        name = str(raw.get("name", "?"))[:80]
        matrix = [
            [_value(cell, name) for cell in row] if isinstance(row, list) else []
            for row in raw.get("bandwidth_matrix") or []
        ]
        cases.append(Testcase(name, str(raw.get("status", ""))[:40], matrix, str(raw.get("error", ""))[:300]))
    return BandwidthRun(cases, str(body.get("error", ""))[:300], str(body.get("warning", ""))[:300])


def bandwidth(facts: HostFacts) -> BandwidthRun:
    """nvbandwidth's measurements; skip where it is not installed. nvbandwidth exits non-zero on an error
    and still prints its JSON, so a failed run is an error only when its output does not read."""
    res = facts.result(NVBANDWIDTH)
    if res.not_applicable:
        raise Unavailable(SKIP, res.reason())
    try:
        return facts.parsed("nvbandwidth", lambda: parse_nvbandwidth(res.stdout))
    except Unavailable:
        if not res.ok:
            raise Unavailable(ERROR, f"nvbandwidth failed: {res.reason()}") from None
        raise
