"""Is this node fit for work? The decision half of `gpuprov certify`: from one host's facts to a result
with every reason. Pure functions over parsed facts (docs/health.md, "Certification").

Levels, each including the one before:
- quick: every verify check, the GPU model's expectations (skus.yaml), and DCGM's level-1 tests;
- standard: DCGM's level-2 tests (memory, pcie) and nvbandwidth's interconnect bandwidth where it is
  installed;
- extended: DCGM's level-3 tests (diagnostic, targeted stress and power, memory bandwidth, ...).

A level is reached when nothing of it (or of the levels before) failed, warned or could not be read,
and DCGM's tests of that level ran and passed. Whatever was not run is reported as not run, never as a
pass; the result says which level was reached, and a node is certified only at the level asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from provisioner.checks import CHECK_IDS, ERROR, FAIL, PASS, SKIP, WARN, evaluate
from provisioner.expectations import Expectations
from provisioner.health import skus
from provisioner.probes import dcgm, nvbandwidth, smi
from provisioner.probes.base import HostFacts, Unavailable
from provisioner.probes.dcgm import NOT_RUN, DiagResult

if TYPE_CHECKING:
    from provisioner.rollout.model import HostProbe

# basic: verify's checks and the GPU models' expectations, no DCGM diagnostic: for hosts DCGM cannot be
# installed on (NVIDIA publishes none for Debian 13); asked for by name, and the label says so.
BASIC, QUICK, STANDARD, EXTENDED = "basic", "quick", "standard", "extended"
LEVELS: tuple[str, ...] = (BASIC, QUICK, STANDARD, EXTENDED)
DCGM_LEVEL: dict[str, int] = {BASIC: 0, QUICK: 1, STANDARD: 2, EXTENDED: 3}

# verify's checks, but for the DCGM diagnostic: certify runs it at the level asked for.
VERIFY_CHECKS: tuple[str, ...] = tuple(c for c in CHECK_IDS if c != "dcgm.diag")
BLOCKING = (FAIL, WARN, ERROR)


def level_of(dcgm_level: int) -> str:
    """The certification level a DCGM diagnostic level belongs to (1: quick, 2: standard, 3: extended)."""
    return LEVELS[min(max(dcgm_level, 1), len(LEVELS) - 1)]


@dataclass(frozen=True)
class Part:
    """One thing certify judged: a verify check, a GPU against its model, a DCGM test, a bandwidth test."""

    id: str  # "verify gpu.ecc", "sku memory", "dcgm memory", "bandwidth host_to_device_memcpy_ce"
    status: str  # pass | warn | fail | skip (not run / not judged) | error
    detail: str
    level: str  # the certification level that needs it
    gpu: int | None = None

    @property
    def name(self) -> str:
        return self.id if self.gpu is None else f"{self.id} [GPU {self.gpu}]"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "status": self.status,
            "level": self.level,
            "detail": self.detail,
        }
        if self.gpu is not None:
            out["gpu"] = self.gpu
        return out


@dataclass
class CertResult:
    host: str
    level: str  # asked for
    reached: str | None  # the highest level reached (None: not even quick)
    parts: list[Part] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # the evidence a level needs that was not had
    warnings: list[str] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)  # index, name, model (None: unknown)
    error: str | None = None  # the host could not be read at all
    started_at: str = ""
    duration_s: float = 0.0
    label: str | None = None  # what was done with the node's label, where the host is a Kubernetes node
    # Who the host says it is and the address it was reached at: what tells its node apart (not shown).
    identity: HostProbe | None = field(default=None, repr=False)

    @property
    def certified(self) -> bool:
        return (
            self.error is None
            and self.reached is not None
            and LEVELS.index(self.reached) >= LEVELS.index(self.level)
        )

    @property
    def reasons(self) -> list[str]:
        """Why the node is not certified at its level (empty when it is): every blocking part, every
        level whose DCGM tests did not run, and the host's error."""
        if self.error is not None:
            return [f"host not read: {self.error}"]
        upto = LEVELS.index(self.level)
        blocking = [
            f"{p.name}: {p.status}: {p.detail}"
            for p in self.parts
            if p.status in BLOCKING and LEVELS.index(p.level) <= upto
        ]
        return blocking + self.missing

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host,
            "level": self.level,
            "certified": self.certified,
            "reached": self.reached,
            "reasons": self.reasons,
            "warnings": self.warnings,
            "gpus": self.gpus,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "parts": [p.to_json() for p in self.parts],
        }
        if self.error is not None:
            out["error"] = self.error
        if self.label is not None:
            out["label"] = self.label
        return out


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------- parts


def _verify_parts(facts: HostFacts) -> list[Part]:
    exp = Expectations()
    # A node asked to be certified is a GPU node: a host without one fails gpu.present, never skips it.
    exp.gpu_present = True
    exp.sources["gpu.present"] = "certify: a GPU node"
    return [
        Part(f"verify {f.id}", f.status, f.detail, BASIC, f.gpu)
        for f in evaluate(facts, exp, list(VERIFY_CHECKS))
    ]


def _sku_parts(facts: HostFacts, table: skus.SkuTable) -> tuple[list[Part], list[str], list[dict[str, Any]]]:
    try:
        gpus = smi.smi_gpus(facts)
    except Unavailable as exc:
        # Not knowing what the GPUs are is never a pass: the model's expectations were not checked.
        return [Part("sku", ERROR, f"the GPUs' models not judged: {exc.reason}", BASIC)], [], []
    try:
        links: dict[int, smi.NvlinkGpu] | str = smi.nvlink_status(facts)
    except Unavailable as exc:
        links = exc.reason
    parts: list[Part] = []
    warnings: list[str] = []
    shown: list[dict[str, Any]] = []
    for gpu in gpus:
        judged = skus.judge_gpu(gpu, links, table, len(gpus))
        shown.append({"index": gpu.index, "name": gpu.name, "model": judged.sku.name if judged.sku else None})
        parts += [Part(f"sku {j.check}", j.status, j.detail, BASIC, gpu.index) for j in judged.judgements]
        warnings += [f"GPU {gpu.index}: {w}" for w in judged.warnings]
    return parts, warnings, shown


def _dcgm_status(r: DiagResult) -> str:
    return {dcgm.PASS: PASS, dcgm.FAIL: FAIL, dcgm.WARN: WARN}.get(r.status, SKIP)


def _dcgm_parts(facts: HostFacts, level: str) -> tuple[list[Part], list[DiagResult], list[str]]:
    n = DCGM_LEVEL[level]
    if n == 0:
        return [], [], []  # basic: no DCGM diagnostic asked for
    try:
        found = dcgm.diag_results(facts, dcgm.DIAG_PROBE[n])
    except Unavailable as exc:
        status = ERROR if exc.status == ERROR else SKIP
        return [Part("dcgm", status, f"dcgmi diag -r {n} not run: {exc.reason}", QUICK)], [], []
    parts: list[Part] = []
    warnings: list[str] = []
    for r in found:
        status = _dcgm_status(r)
        detail = r.status if not r.info else f"{r.status}: {r.info[:240]}"
        entity = f" ({r.entity})" if r.entity and r.gpu is None else ""
        parts.append(Part(f"dcgm {r.test}{entity}", status, detail, level_of(r.level(n)), r.gpu))
        if status == SKIP:
            who = f" on GPU {r.gpu}" if r.gpu is not None else entity
            warnings.append(f"DCGM {r.test}{who}: {'not run' if r.status == NOT_RUN else r.status}")
    return parts, found, warnings


def _cells(case: nvbandwidth.Testcase) -> tuple[list[float], list[str]]:
    """Measured values and the pairs not measured (a GPU-to-GPU test's diagonal is no pair)."""
    values: list[float] = []
    unmeasured: list[str] = []
    peer = case.name == nvbandwidth.DEVICE_TO_DEVICE
    for i, row in enumerate(case.matrix):
        for j, cell in enumerate(row):
            if peer and i == j:
                continue
            if cell is None or (peer and cell == 0):
                unmeasured.append(f"GPU {i}←GPU {j}" if peer else f"GPU {j}")
            else:
                values.append(cell)
    return values, unmeasured


def _bandwidth_parts(
    facts: HostFacts, models: list[skus.Sku | None], table: skus.SkuTable, gpu_count: int
) -> tuple[list[Part], list[str]]:
    try:
        run = nvbandwidth.bandwidth(facts)
    except Unavailable as exc:
        if exc.status == ERROR:
            return [Part("bandwidth", ERROR, exc.reason, STANDARD)], []
        return [Part("bandwidth", SKIP, f"not run: {exc.reason}", STANDARD)], [
            f"interconnect bandwidth not measured: {exc.reason}"
        ]
    if run.error:
        return [Part("bandwidth", ERROR, f"nvbandwidth: {run.error}", STANDARD)], []
    floors = skus.bandwidth_floors(models, table)
    links = [m.get("nvlink_links") for m in models if m is not None]
    nvlink_expected = any(v is not None and v.value for v in links)
    parts: list[Part] = []
    warnings: list[str] = []
    by_name = {c.name: c for c in run.testcases}
    for name in nvbandwidth.TESTCASES:
        case = by_name.get(name)
        pid = f"bandwidth {name}"
        floor = floors["nvlink" if name == nvbandwidth.DEVICE_TO_DEVICE else "pcie"]
        if case is None:
            parts.append(Part(pid, ERROR, "nvbandwidth did not report this test", STANDARD))
            continue
        if case.status == "Waived":
            if gpu_count > 1 and nvlink_expected and name == nvbandwidth.DEVICE_TO_DEVICE:
                parts.append(
                    Part(pid, FAIL, "waived: the GPUs cannot reach each other (no peer access)", STANDARD)
                )
            else:
                parts.append(
                    Part(pid, SKIP, "not run: waived by nvbandwidth (needs GPUs with peer access)", STANDARD)
                )
            continue
        if not case.passed:
            why = f": {case.error}" if case.error else ""
            parts.append(Part(pid, FAIL, f"nvbandwidth reports {case.status or 'no status'}{why}", STANDARD))
            continue
        values, unmeasured = _cells(case)
        if unmeasured and name == nvbandwidth.DEVICE_TO_DEVICE and not nvlink_expected:
            # GPUs without NVLink may have no peer access at all (a PCIe host that does not allow it).
            warnings.append(f"{name}: not measured (no peer access): {', '.join(unmeasured[:8])}")
        elif unmeasured:
            parts.append(Part(pid, FAIL, f"not measured: {', '.join(unmeasured[:8])}", STANDARD))
            continue
        if not values and unmeasured:
            parts.append(Part(pid, SKIP, "not run: no pair of GPUs with peer access", STANDARD))
            continue
        if not values:
            parts.append(Part(pid, ERROR, "nvbandwidth reported no measurement", STANDARD))
            continue
        low = min(values)
        if floor is None:
            parts.append(
                Part(pid, PASS, f"lowest {low:g} GB/s (no floor: the GPUs' model sets none)", STANDARD)
            )
            warnings.append(f"{name}: {low:g} GB/s not compared with a floor (the GPUs' model sets none)")
        elif low < floor:
            parts.append(Part(pid, FAIL, f"lowest {low:g} GB/s, below the floor of {floor:g} GB/s", STANDARD))
        else:
            parts.append(Part(pid, PASS, f"lowest {low:g} GB/s (floor {floor:g} GB/s)", STANDARD))
    return parts, warnings


# ------------------------------------------------------------------------------------------- decision


def _reached(
    level: str, parts: list[Part], found: list[DiagResult], ran: int, gpus: list[int]
) -> tuple[str | None, list[str]]:
    """The highest level whose parts (and the lower levels') passed and whose DCGM tests ran on every
    GPU; and, for the first level that was not reached for want of DCGM's tests, why."""
    reached: str | None = None
    for t in LEVELS[: LEVELS.index(level) + 1]:
        upto = LEVELS.index(t)
        blocked = any(p.status in BLOCKING and LEVELS.index(p.level) <= upto for p in parts)
        n = DCGM_LEVEL[t]
        if n == 0:  # basic: no DCGM tests belong to it
            if blocked:
                return reached, []
            reached = t
            continue
        tier = [r for r in found if level_of(r.level(ran)) == t]
        passed = [r for r in tier if r.status == dcgm.PASS]
        if not passed:
            not_run = next((p for p in parts if p.id == "dcgm"), None)
            if not_run is not None and not_run.status == ERROR:
                return reached, []  # a reason of its own already
            why = not_run.detail if not_run is not None else ""
            if not why:
                why = "DCGM reported none of them" if not tier else "none of them passed (skipped or not run)"
            return reached, [f"{t}: DCGM's level-{n} tests did not run: {why}"]
        tested = {r.gpu for r in passed if r.gpu is not None}
        untested = [g for g in gpus if g not in tested] if tested else []
        if untested:
            shown = ", ".join(map(str, untested))
            return reached, [f"{t}: DCGM's level-{n} tests passed on no result for GPU {shown}"]
        if blocked:
            return reached, []
        reached = t
    return reached, []


def decide(facts: HostFacts, level: str, table: skus.SkuTable | None = None) -> CertResult:
    """Certify one host from its facts (probed or replayed). `level` must be one of LEVELS."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}")
    table = table or skus.sku_table()
    result = CertResult(facts.host, level, None)
    result.parts += _verify_parts(facts)
    sku_parts, warnings, result.gpus = _sku_parts(facts, table)
    result.parts += sku_parts
    result.warnings += warnings
    dcgm_parts, found, warnings = _dcgm_parts(facts, level)
    result.parts += dcgm_parts
    result.warnings += warnings
    if LEVELS.index(level) >= LEVELS.index(STANDARD):
        models = [table.match(g) for g in smi.smi_log(facts).gpus] if result.gpus else [None]
        bw_parts, warnings = _bandwidth_parts(facts, models, table, len(result.gpus))
        result.parts += bw_parts
        result.warnings += warnings
    indexes = [g["index"] for g in result.gpus]
    result.reached, result.missing = _reached(level, result.parts, found, DCGM_LEVEL[level], indexes)
    return result
