"""GPU models and what a healthy GPU of each reports (skus.yaml, every value with its sources), and the
judgement of one GPU against its model: memory size, PCIe generation and width, NVLink links, power
limit, temperature thresholds and margin. Pure functions over parsed facts.

A GPU of a model the table does not know is judged on the generic checks (power not capped below the
board's default, temperature below the driver's own thresholds) and gets a warning naming it: never a
silent pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from provisioner.probes.base import ERROR, SKIP
from provisioner.probes.smi import NvlinkGpu, SmiGpu

PASS, FAIL = "pass", "fail"
SKU_TABLE = Path(__file__).with_name("skus.yaml")
CHECKS = ("memory", "pcie", "nvlink", "power", "temperature")

# PCIe transfer rate per lane (GT/s) and encoding efficiency, by generation (PCI-SIG's base specifications:
# 8b/10b to Gen2, 128b/130b for Gen3 to Gen5, FLIT mode from Gen6, taken here as 242/256).
_PCIE_GTS = {1: (2.5, 0.8), 2: (5.0, 0.8), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130),
             6: (64.0, 242 / 256)}  # fmt: skip


def pcie_gbs(gen: int, width: int) -> float | None:
    """A PCIe link's rate per direction in GB/s (None for a generation not in the table)."""
    rate = _PCIE_GTS.get(gen)
    return None if rate is None else rate[0] * rate[1] * width / 8


@dataclass(frozen=True)
class Value:
    value: Any
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Sku:
    key: str
    name: str
    device_ids: tuple[str, ...]
    product_names: tuple[str, ...]
    values: Mapping[str, Value]

    def get(self, name: str) -> Value | None:
        return self.values.get(name)


@dataclass(frozen=True)
class SkuTable:
    skus: tuple[Sku, ...]
    sources: Mapping[str, str]
    memory_tolerance_pct: float
    bandwidth_floor: float

    def cite(self, value: Value) -> str:
        return "; ".join(" ".join(self.sources[s].split()) for s in value.sources)

    def match(self, gpu: SmiGpu) -> Sku | None:
        """The GPU's model: by PCI device id, else (a driver that prints none) by product name."""
        for sku in self.skus:
            if gpu.device_id and gpu.device_id in sku.device_ids:
                return sku
        if not gpu.device_id:
            name = gpu.name.strip().lower()
            for sku in self.skus:
                if name and name in (n.lower() for n in sku.product_names):
                    return sku
        return None


_VALUE_KEYS = ("memory_mib", "memory_gb", "pcie", "nvlink_links", "nvlink_gbs", "power_w", "tlimit_c")


def _value(key: str, field_name: str, raw: Any, sources: Mapping[str, str]) -> Value:
    where = f"SKU table: {key}.{field_name}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping with a value and its sources")
    cited = raw.get("sources")
    if not isinstance(cited, list) or not cited:
        raise ValueError(f"{where}: no sources")
    unknown = [s for s in cited if s not in sources]
    if unknown:
        raise ValueError(f"{where}: unknown source {unknown[0]!r}")
    if field_name == "pcie":
        gen, width = raw.get("gen"), raw.get("width")
        if not isinstance(gen, int) or gen not in _PCIE_GTS or not isinstance(width, int) or width < 1:
            raise ValueError(f"{where}: expected gen (1-6) and width")
        value: Any = {"gen": gen, "width": width}
    elif field_name == "power_w":
        value = raw.get("value")
        if not isinstance(value, list) or not value or not all(isinstance(v, int | float) for v in value):
            raise ValueError(f"{where}: expected a list of watts")
        value = tuple(float(v) for v in value)
    elif field_name == "tlimit_c":
        value = raw.get("value")
        if not isinstance(value, dict) or set(value) != {"shutdown", "slowdown", "max_operating"}:
            raise ValueError(f"{where}: expected shutdown, slowdown and max_operating")
    else:
        value = raw.get("value")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{where}: expected a number")
    return Value(value, tuple(cited))


def table_from(doc: Any) -> SkuTable:
    """The SKU table from its YAML document; ValueError when it is malformed (a packaging bug)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("skus"), dict):
        raise ValueError("SKU table: expected a mapping with 'sources' and 'skus'")
    sources = {str(k): str(v) for k, v in (doc.get("sources") or {}).items()}
    skus: list[Sku] = []
    seen_ids: dict[str, str] = {}
    for key, entry in doc["skus"].items():
        if not isinstance(entry, dict) or not entry.get("name"):
            raise ValueError(f"SKU table: {key}: expected a mapping with a name")
        ids = tuple(str(i).lower() for i in entry.get("pci_device_ids") or [])
        for i in ids:
            if i in seen_ids:
                raise ValueError(f"SKU table: device id {i} in both {seen_ids[i]} and {key}")
            seen_ids[i] = key
        _value(key, "id", {"value": 0, "sources": entry.get("id_sources")}, sources)
        values = {f: _value(key, f, entry[f], sources) for f in _VALUE_KEYS if f in entry}
        unknown = set(entry) - {*_VALUE_KEYS, "name", "pci_device_ids", "product_names", "id_sources"}
        if unknown:
            raise ValueError(f"SKU table: {key}: unknown key {sorted(unknown)[0]!r}")
        names = tuple(str(n) for n in entry.get("product_names") or [])
        skus.append(Sku(str(key), str(entry["name"]), ids, names, values))
    return SkuTable(
        tuple(skus),
        sources,
        float(doc.get("memory_tolerance_pct", 1)),
        float(doc.get("bandwidth_floor", 0.5)),
    )


@cache
def sku_table() -> SkuTable:
    return table_from(yaml.safe_load(SKU_TABLE.read_text()))


# --------------------------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class Judgement:
    check: str  # one of CHECKS
    status: str  # pass | fail | skip (not judged) | error
    detail: str


@dataclass
class GpuJudgement:
    index: int
    name: str
    sku: Sku | None
    judgements: list[Judgement] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _expected(shown: str, sku: Sku, value: Value, table: SkuTable) -> str:
    """What the model should show and where that comes from: the second half of every SKU failure."""
    return f"expected {shown} for {sku.name} (source: {table.cite(value)})"


def _memory(gpu: SmiGpu, sku: Sku | None, table: SkuTable) -> Judgement:
    seen = gpu.memory_total_mib
    if seen is None:
        return Judgement("memory", ERROR, "nvidia-smi reports no memory total")
    if sku is None:
        return Judgement("memory", SKIP, f"{seen} MiB; not judged: model unknown")
    mib, gb = sku.get("memory_mib"), sku.get("memory_gb")
    if mib is not None:
        tol = mib.value * table.memory_tolerance_pct / 100
        shown = f"{mib.value} MiB (±{table.memory_tolerance_pct:g}%)"
        if abs(seen - mib.value) > tol:
            return Judgement("memory", FAIL, f"memory {seen} MiB: " + _expected(shown, sku, mib, table))
        return Judgement("memory", PASS, f"{seen} MiB, as {sku.name} reports")
    if gb is not None:
        if seen * 2**20 < gb.value * 10**9:
            shown = f"at least {gb.value} GB ({int(gb.value * 10**9 / 2**20)} MiB)"
            return Judgement("memory", FAIL, f"memory {seen} MiB: " + _expected(shown, sku, gb, table))
        return Judgement("memory", PASS, f"{seen} MiB, at least the datasheet's {gb.value} GB")
    return Judgement(
        "memory", SKIP, f"{seen} MiB; not judged: the SKU table has no memory size for {sku.name}"
    )


def _pcie(gpu: SmiGpu, sku: Sku | None, table: SkuTable, warnings: list[str]) -> Judgement:
    dev_gen = gpu.link_gen_device_max if gpu.link_gen_device_max is not None else gpu.link_gen_max
    width = gpu.link_width_max
    if dev_gen is None or width is None:
        return Judgement("pcie", ERROR, "nvidia-smi reports no PCIe generation or width")
    seen = f"Gen{dev_gen} x{width}"
    spec = sku.get("pcie") if sku is not None else None
    if sku is None or spec is None:
        why = "model unknown" if sku is None else f"the SKU table has no PCIe link for {sku.name}"
        return Judgement("pcie", SKIP, f"{seen}; not judged: {why}")
    want = f"Gen{spec.value['gen']} x{spec.value['width']}"
    if dev_gen != spec.value["gen"] or width != spec.value["width"]:
        return Judgement("pcie", FAIL, f"PCIe {seen}: " + _expected(want, sku, spec, table))
    if gpu.link_gen_max is not None and gpu.link_gen_max < spec.value["gen"]:
        warnings.append(f"the host limits the PCIe link to Gen{gpu.link_gen_max} (the GPU supports {want})")
    return Judgement("pcie", PASS, f"{seen}, as {sku.name}")


def _nvlink(
    gpu: SmiGpu,
    sku: Sku | None,
    table: SkuTable,
    links: Mapping[int, NvlinkGpu] | str,
    warnings: list[str],
    gpus_on_host: int | None = None,
) -> Judgement:
    spec = sku.get("nvlink_links") if sku is not None else None
    if sku is None or spec is None:
        why = "model unknown" if sku is None else f"{sku.name} has NVLink only where bridges are installed"
        return Judgement("nvlink", SKIP, f"not judged: {why}")
    if isinstance(links, str):
        warnings.append(f"NVLink links not checked: {links}")
        return Judgement("nvlink", SKIP, f"not checked: {links}")
    mine = links.get(gpu.index)
    if mine is None and spec.value == 0:
        return Judgement("nvlink", PASS, "no NVLink, as the model")
    if gpus_on_host == 1 and spec.value and (mine is None or not mine.links):
        # A host given one GPU of a multi-GPU board (a VM with one GPU passed through, as the real H100
        # and H200 hosts gpuprov was run on) shows no NVLink at all: there is no peer to link to.
        warnings.append(
            "no NVLink exposed on this one-GPU host: links not judged"
        )  # the caller names the GPU
        return Judgement("nvlink", SKIP, "not judged: the host has one GPU and shows no NVLink")
    if mine is None:
        return Judgement("nvlink", FAIL, f"nvidia-smi nvlink -s lists no GPU {gpu.index}")
    inactive = sorted(k for k, v in mine.links.items() if v is None)
    want = spec.value
    if mine.active != want:
        down = f" (inactive: {', '.join(map(str, inactive))})" if inactive else ""
        what = f"{mine.active} of {want} NVLink links active{down}"
        return Judgement("nvlink", FAIL, what + ": " + _expected(f"{want}", sku, spec, table))
    return Judgement("nvlink", PASS, f"{want} NVLink links active" if want else "no NVLink, as the model")


def _power(gpu: SmiGpu, sku: Sku | None, table: SkuTable) -> Judgement:
    default = gpu.power_default_w if gpu.power_default_w is not None else gpu.power_max_w
    enforced = gpu.power_limit_w
    if default is None:
        return Judgement("power", ERROR, "nvidia-smi reports no power limit")
    spec = sku.get("power_w") if sku is not None else None
    if sku is not None and spec is not None and not any(abs(default - w) <= w / 100 for w in spec.value):
        want = " or ".join(f"{w:g} W" for w in spec.value)
        return Judgement(
            "power", FAIL, f"default power limit {default:g} W: " + _expected(want, sku, spec, table)
        )
    if enforced is not None and enforced < default * 0.99:
        return Judgement(
            "power", FAIL, f"power capped at {enforced:g} W, below the board's default {default:g} W"
        )
    if sku is None or spec is None:
        why = "model unknown" if sku is None else f"the SKU table has no power limit for {sku.name}"
        return Judgement("power", PASS, f"{default:g} W, not capped (the value itself not judged: {why})")
    return Judgement("power", PASS, f"{default:g} W, as {sku.name}, not capped")


def _temperature(gpu: SmiGpu, sku: Sku | None, table: SkuTable) -> Judgement:
    spec = sku.get("tlimit_c") if sku is not None else None
    margins = {
        "shutdown": gpu.tlimit_shutdown_c,
        "slowdown": gpu.tlimit_slowdown_c,
        "max_operating": gpu.tlimit_max_operating_c,
    }
    if gpu.tlimit_margin_c is not None and margins["slowdown"] is not None:
        if sku is not None and spec is not None and margins != spec.value:
            seen = ", ".join(f"{k} {v}" for k, v in margins.items())
            want = ", ".join(f"{k} {v}" for k, v in spec.value.items())
            return Judgement(
                "temperature",
                FAIL,
                f"T.Limit thresholds {seen} C: " + _expected(want + " C", sku, spec, table),
            )
        margin = gpu.tlimit_margin_c
        worst = max(v for v in (margins["slowdown"], margins["max_operating"]) if v is not None)
        if margin <= worst:
            return Judgement(
                "temperature",
                FAIL,
                f"{margin} C from the T.Limit: at or past the point where clocks drop ({worst} C)",
            )
        return Judgement(
            "temperature", PASS, f"{margin} C below the T.Limit (slowdown at {margins['slowdown']} C)"
        )
    if gpu.temp_c is not None and gpu.temp_slowdown_c is not None:
        limit = min(v for v in (gpu.temp_slowdown_c, gpu.temp_max_operating_c) if v is not None)
        if gpu.temp_c >= limit:
            return Judgement("temperature", FAIL, f"{gpu.temp_c} C: at or above the GPU's limit of {limit} C")
        return Judgement(
            "temperature", PASS, f"{gpu.temp_c} C, below the GPU's slowdown at {gpu.temp_slowdown_c} C"
        )
    return Judgement(
        "temperature", SKIP, "not judged: nvidia-smi reports no temperature thresholds for this GPU"
    )


def judge_gpu(
    gpu: SmiGpu,
    links: Mapping[int, NvlinkGpu] | str,
    table: SkuTable | None = None,
    gpus_on_host: int | None = None,
) -> GpuJudgement:
    """One GPU against its model. `links` is `nvidia-smi nvlink -s` parsed, or why it is not available;
    `gpus_on_host`, how many GPUs the host has (one: a GPU that shows no NVLink has no peer to link to)."""
    table = table or sku_table()
    sku = table.match(gpu)
    out = GpuJudgement(gpu.index, gpu.name, sku)
    if sku is None:
        ident = f"device 0x{gpu.device_id}" if gpu.device_id else "no PCI device id"
        out.warnings.append(
            f"{gpu.name or 'this GPU'} ({ident}) is not in the SKU table: judged on generic checks only "
            "(power not capped, temperature below the driver's thresholds)"
        )
    out.judgements = [
        _memory(gpu, sku, table),
        _pcie(gpu, sku, table, out.warnings),
        _nvlink(gpu, sku, table, links, out.warnings, gpus_on_host),
        _power(gpu, sku, table),
        _temperature(gpu, sku, table),
    ]
    return out


def bandwidth_floors(skus: Sequence[Sku | None], table: SkuTable | None = None) -> dict[str, float | None]:
    """The least GB/s nvbandwidth's measurements must show, per direction: host↔GPU from the PCIe link,
    GPU↔GPU from NVLink; None where the models differ, are unknown, or the table has no such value."""
    table = table or sku_table()
    known = {s.key: s for s in skus if s is not None}
    if len(known) != 1 or None in skus:
        return {"pcie": None, "nvlink": None}
    (sku,) = known.values()
    pcie, nvlink = sku.get("pcie"), sku.get("nvlink_gbs")
    link = pcie_gbs(pcie.value["gen"], pcie.value["width"]) if pcie is not None else None
    return {
        "pcie": None if link is None else round(link * table.bandwidth_floor, 1),
        "nvlink": None
        if nvlink is None or not nvlink.value
        else round(nvlink.value * table.bandwidth_floor, 1),
    }
