"""The DCGM diagnostic (`dcgmi diag -r LEVEL -j`), where dcgmi is installed: level 1 for `verify`,
levels 1 to 3 for `certify`.

What the JSON looks like comes from DCGM itself (NVIDIA/DCGM at 4.6.0):
- dcgmi/Diag.cpp (HelperJsonBuildOutput, HelperJsonAddResult, HelperDisplayFailureMessage) writes
  {"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results": [{"entity_group",
  "entity_group_id", "entity_id", "status", "warnings": [{"warning", "error_id", ...}], "info": [...]}],
  "test_summary": {"status", ...}}]}]}, "entity_groups": [...], "metadata": {...}}; a diagnostic that could
  not run is {"DCGM Diagnostic": {"version", "runtime_error"}}. A result that was not run is left out, and
  a test not run has no test_summary; in JSON a warning reads "Fail" (HelperDisplayDiagResult without
  DDR_DISPLAY_WARN). The key names are nvvs/include/NvvsJsonStrings.h's; the schema DCGM's own tests
  check against is testing/python3/dcgm_diag_schema.json.
- DCGM 3 wrote {"DCGM GPU Diagnostic": ...} with "gpu_ids": "0,1,2,3" (one result for several GPUs) or
  "gpu_id", and upper-case statuses (testing/TestDiagManagerStrings.h holds such a sample).

Which tests each level adds (nvvs/src/NvidiaValidationSuite.cpp, FillTestVectors; the names are
nvvs/include/PluginStrings.h's): level 1 runs the software (Deployment) tests; level 2 adds memory and
pcie; level 3 adds diagnostic, eud, nvbandwidth, nccl_tests, memory_bandwidth, targeted_stress and
targeted_power; level 4 adds memtest and pulse_test. How long a level takes (dcgmi diag's reference,
https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html):
level 1 seconds, level 2 about two minutes, level 3 about 15 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.hostnumbers import is_index
from provisioner.hosttext import first_line
from provisioner.probes.base import ERROR, SKIP, HostFacts, ParseError, Probe, Unavailable, parse_json_object

DCGM_DIAG = "dcgmi-diag.json"  # level 1 (the name verify's snapshots and reports have always used)
DCGM_DIAG_R2 = "dcgmi-diag-r2.json"
DCGM_DIAG_R3 = "dcgmi-diag-r3.json"
DIAG_PROBE: dict[int, str] = {1: DCGM_DIAG, 2: DCGM_DIAG_R2, 3: DCGM_DIAG_R3}
_KEY_R2, _KEY_R3 = "dcgm-r2", "dcgm-r3"  # each level's parsed results, cached apart

# What DCGM's reference says each level normally takes, in seconds.
EXPECTED_SECONDS: dict[int, int] = {1: 30, 2: 120, 3: 900}
# What dcgmi is allowed before it is stopped: several times the expected time (a host with eight GPUs
# runs some tests GPU by GPU), and the probe's own limit a little longer so that the timeout reports.
LIMIT_SECONDS: dict[int, int] = {1: 300, 2: 1200, 3: 3600}
# How long a host engine whose service is running may take to answer. DCGM's units start nv-hostengine
# in the foreground (Type=simple), so `systemctl start` returns before it listens; it is started again
# right after a GPU reset, and the diagnostic that certifies the GPU follows.
HOSTENGINE_WAIT_SECONDS = 60
# The units DCGM's packages ship (datacenter-gpu-manager-4-core: nvidia-dcgm.service; DCGM 3: dcgm.service).
DCGM_UNITS = ("nvidia-dcgm.service", "dcgm.service")


def _probe(level: int) -> Probe:
    # `dcgmi discovery -l` connects to the host engine and lists its GPUs: once it answers, the engine
    # takes a diagnostic. While no DCGM unit is active there is nothing to wait for, and the diagnostic
    # says what it says (an engine run by hand, or none).
    body = f"""
    command -v dcgmi >/dev/null 2>&1 || {{ echo "dcgmi not installed" >&2; return 200; }}
    deadline=$(( $(date +%s) + {HOSTENGINE_WAIT_SECONDS} ))
    while ! t 10 dcgmi discovery -l >/dev/null 2>&1 \\
        && systemctl -q is-active {' '.join(DCGM_UNITS)} 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
        sleep 1
    done
    t {LIMIT_SECONDS[level]} dcgmi diag -r {level} -j
"""
    limit = LIMIT_SECONDS[level] + HOSTENGINE_WAIT_SECONDS + 30
    return Probe(DIAG_PROBE[level], body, limit, f"DCGM diagnostic level {level}")


PROBES: tuple[Probe, ...] = tuple(_probe(level) for level in (1, 2, 3))

PASS, WARN, FAIL, NOT_RUN = "pass", "warn", "fail", "not run"
_STATUS = {"pass": PASS, "fail": FAIL, "warn": WARN, "warning": WARN, "skip": SKIP, "not run": NOT_RUN}

# The level that first runs each test (FillTestVectors); the software tests are the Deployment category.
# sm_stress is DCGM 3's name for what became diagnostic.
_TEST_LEVEL = {
    "memory": 2,
    "pcie": 2,
    "diagnostic": 3,
    "sm_stress": 3,
    "eud": 3,
    "cpu_eud": 3,
    "nvbandwidth": 3,
    "nccl_tests": 3,
    "rist": 3,
    "memory_bandwidth": 3,
    "targeted_stress": 3,
    "targeted_power": 3,
    "memtest": 4,
    "pulse_test": 4,
}


@dataclass(frozen=True)
class DiagResult:
    test: str
    status: str  # pass | warn | fail | skip | not run (anything else DCGM might print reads as skip)
    gpu: int | None
    info: str
    category: str = ""
    entity: str = ""  # "GPU 0", "CPU 1": what the result is about, as DCGM names it ("" for the whole test)

    def level(self, run_level: int) -> int:
        """The diagnostic level this test belongs to (a test DCGM adds later counts at the run's level)."""
        if self.category.strip().lower() == "deployment":
            return 1
        return _TEST_LEVEL.get(self.test.strip().lower(), run_level)


def _info(res: dict[str, object]) -> str:
    parts: list[str] = []
    for key in ("warnings", "info"):
        value = res.get(key)
        items = value if isinstance(value, list) else [value] if value else []
        for item in items:
            text = item.get("warning", item) if isinstance(item, dict) else item
            if text not in (None, ""):
                parts.append(str(text))
    return "; ".join(parts)


def _entities(res: dict[str, object]) -> list[tuple[int | None, str]]:
    """(GPU index or None, entity name) for each entity one result is about."""
    if "gpu_ids" in res:  # DCGM 3: one result for a comma-separated list of GPUs
        ids = [i.strip() for i in str(res["gpu_ids"]).split(",") if i.strip()]
        return [(int(i), f"GPU {i}") if is_index(i) else (None, "") for i in ids] or [(None, "")]
    group = str(res.get("entity_group", "GPU")).strip()
    raw = res.get("gpu_id", res.get("entity_id"))
    if raw is None or isinstance(raw, bool):
        return [(None, "")]
    index = str(raw)
    if group.upper() != "GPU":
        return [(None, f"{group[:16]} {index[:8]}")]
    return [(int(index), f"GPU {index}") if is_index(index) else (None, "")]


def parse_dcgm_diag(text: str) -> list[DiagResult]:
    """`dcgmi diag -r N -j` → one DiagResult per test and entity, plus one per test that reported only a
    summary (or nothing: not run). A diagnostic that did not run (runtime_error) is a ParseError saying
    why: it judged nothing."""
    start = text.find("{")
    if start < 0:
        raise ParseError(f"dcgmi diag: no JSON in output: {first_line(text)!r}")
    doc = parse_json_object(text[start:], "dcgmi diag")
    body = next((v for v in doc.values() if isinstance(v, dict) and "test_categories" in v), None)
    if body is None:
        failed = next((v for v in doc.values() if isinstance(v, dict) and v.get("runtime_error")), None)
        if failed is not None:
            raise ParseError(f"dcgmi diag did not run: {first_line(str(failed['runtime_error']))}")
        raise ParseError("dcgmi diag: no test_categories in the JSON")
    out: list[DiagResult] = []
    for cat in body.get("test_categories") or []:
        if not isinstance(cat, dict):
            continue
        category = str(cat.get("category", ""))
        for test in cat.get("tests") or []:
            if not isinstance(test, dict):
                continue
            name = str(test.get("name", "?"))
            results = [r for r in test.get("results") or [] if isinstance(r, dict)]
            for res in results:
                status = _STATUS.get(str(res.get("status", "")).strip().lower(), SKIP)
                info = _info(res)
                for gpu, entity in _entities(res):
                    out.append(DiagResult(name, status, gpu, info, category, entity))
            if not results:
                summary = test.get("test_summary")
                if isinstance(summary, dict):
                    status = _STATUS.get(str(summary.get("status", "")).strip().lower(), SKIP)
                    out.append(DiagResult(name, status, None, _info(summary), category))
                else:
                    out.append(DiagResult(name, NOT_RUN, None, "", category))
    return out


def diag_results(facts: HostFacts, probe: str = DCGM_DIAG) -> list[DiagResult]:
    """The diagnostic's results at the level `probe` runs. dcgmi exits non-zero when a test fails and
    still prints them, so a failed run is an error only when its output does not read."""
    res = facts.result(probe)
    if res.not_applicable:
        raise Unavailable(SKIP, res.reason())

    def load() -> list[DiagResult]:
        return parse_dcgm_diag(res.stdout)

    try:
        if probe == DCGM_DIAG_R3:
            return facts.parsed(_KEY_R3, load)
        if probe == DCGM_DIAG_R2:
            return facts.parsed(_KEY_R2, load)
        return facts.parsed("dcgm", load)
    except Unavailable:
        if not res.ok and not res.stdout.lstrip().startswith("{"):
            raise Unavailable(ERROR, f"dcgmi diag failed: {res.reason()}") from None
        raise
