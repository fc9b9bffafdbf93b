"""The SKU table and one GPU judged against its model, on the real H200 and H100 captures (one element
changed per fault): recognised with their real values, a changed value fails naming what was expected,
what was seen and the source; a model the table does not know is a warning, never a silent pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from verify_fixtures import raw, set_gpu

from provisioner.health.skus import (
    PASS,
    bandwidth_floors,
    judge_gpu,
    pcie_gbs,
    sku_table,
    table_from,
)
from provisioner.probes.smi import SmiGpu, parse_nvidia_smi_xml, parse_nvlink_status

H100_XML = (
    Path(__file__).resolve().parents[1] / "fixtures" / "snapshots" / "h100-device" / "vm" / "nvidia-smi-q.xml"
)
NOT_COLLECTED = "nvidia-smi-nvlink.txt was not collected"


def h200(xml: str | None = None) -> SmiGpu:
    return parse_nvidia_smi_xml(xml or raw("nvidia-smi-q-x.xml")).gpus[0]


def links(n: int, inactive: tuple[int, ...] = (), gpu: str = "NVIDIA H200") -> dict:
    lines = [f"GPU 0: {gpu} (UUID: GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c008796e)"]
    lines += [f"\t Link {i}: {'<inactive>' if i in inactive else '26.562 GB/s'}" for i in range(n)]
    return parse_nvlink_status("\n".join(lines) + "\n")


def statuses(judged) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {j.check: j.status for j in judged.judgements}


def detail(judged, check: str) -> str:  # type: ignore[no-untyped-def]
    return next(j.detail for j in judged.judgements if j.check == check)


def test_the_real_h200_is_recognised_with_its_real_values_and_passes() -> None:
    judged = judge_gpu(h200(), links(18))
    assert judged.sku is not None and judged.sku.key == "h200-sxm-141gb"
    assert statuses(judged) == dict.fromkeys(("memory", "pcie", "nvlink", "power", "temperature"), PASS)
    assert judged.warnings == []
    assert "143771 MiB" in detail(judged, "memory") and "Gen5 x16" in detail(judged, "pcie")


def test_the_real_h100_is_recognised_as_the_sxm5_80gb() -> None:
    judged = judge_gpu(
        parse_nvidia_smi_xml(H100_XML.read_text()).gpus[0], links(18, gpu="NVIDIA H100 80GB HBM3")
    )
    assert judged.sku is not None and judged.sku.key == "h100-sxm5-80gb"
    assert set(statuses(judged).values()) == {PASS}


@pytest.mark.parametrize(
    ("path", "value", "check", "seen", "expected", "source"),
    [
        ("fb_memory_usage/total", "71885 MiB", "memory", "71885 MiB", "143771 MiB", "real H200 host"),
        ("pci/pci_gpu_link_info/pcie_gen/max_device_link_gen", "4", "pcie", "Gen4 x16", "Gen5 x16", "H200"),
        (
            "pci/pci_gpu_link_info/link_widths/max_link_width",
            "8x",
            "pcie",
            "Gen5 x8",
            "Gen5 x16",
            "datasheet",
        ),
        ("gpu_power_readings/default_power_limit", "600.00 W", "power", "600 W", "700 W", "H200 Tensor Core"),
        (
            "temperature/gpu_temp_slow_tlimit_threshold",
            "-5 C",
            "temperature",
            "shutdown -8, slowdown -5",
            "shutdown -8, slowdown -2",
            "real",
        ),
    ],
)
def test_a_changed_value_fails_naming_expected_seen_and_source(
    path: str, value: str, check: str, seen: str, expected: str, source: str
) -> None:
    judged = judge_gpu(h200(set_gpu(raw("nvidia-smi-q-x.xml"), path, value)), links(18))
    assert statuses(judged)[check] == "fail"
    text = detail(judged, check)
    assert seen in text and f"expected {expected}" in text and "NVIDIA H200 SXM 141GB" in text
    assert "source: " in text and source in text
    others = {k: v for k, v in statuses(judged).items() if k != check}
    assert set(others.values()) == {PASS}


def test_inactive_nvlink_links_fail_naming_them() -> None:
    judged = judge_gpu(h200(), links(18, inactive=(3, 11)))
    assert statuses(judged)["nvlink"] == "fail"
    assert detail(judged, "nvlink").startswith("16 of 18 NVLink links active (inactive: 3, 11)")


def test_nvlink_not_collected_is_not_judged_and_said() -> None:
    judged = judge_gpu(h200(), NOT_COLLECTED)
    assert statuses(judged)["nvlink"] == "skip"
    assert judged.warnings == [f"NVLink links not checked: {NOT_COLLECTED}"]


def test_a_power_cap_below_the_default_fails() -> None:
    judged = judge_gpu(
        h200(set_gpu(raw("nvidia-smi-q-x.xml"), "gpu_power_readings/current_power_limit", "500.00 W")),
        links(18),
    )
    assert statuses(judged)["power"] == "fail"
    assert "capped at 500 W" in detail(judged, "power")


def test_a_gpu_past_its_slowdown_margin_fails() -> None:
    judged = judge_gpu(
        h200(set_gpu(raw("nvidia-smi-q-x.xml"), "temperature/gpu_temp_tlimit", "-3 C")), links(18)
    )
    assert statuses(judged)["temperature"] == "fail"


def test_an_unknown_model_is_a_warning_and_generic_checks_not_a_silent_pass() -> None:
    xml = set_gpu(raw("nvidia-smi-q-x.xml"), "pci/pci_device_id", "29FF10DE")
    xml = set_gpu(xml, "product_name", "NVIDIA Future GPU")
    judged = judge_gpu(h200(xml), links(18))
    assert judged.sku is None
    assert (
        judged.warnings and "NVIDIA Future GPU (device 0x29ff) is not in the SKU table" in judged.warnings[0]
    )
    s = statuses(judged)
    assert (s["memory"], s["pcie"], s["nvlink"]) == ("skip", "skip", "skip")
    assert (s["power"], s["temperature"]) == (PASS, PASS)  # the generic checks still ran
    capped = set_gpu(xml, "gpu_power_readings/current_power_limit", "300.00 W")
    assert statuses(judge_gpu(h200(capped), links(18)))["power"] == "fail"


def test_every_sku_value_names_an_existing_source_and_the_table_refuses_one_without() -> None:
    table = sku_table()
    keys = {s.key for s in table.skus}
    assert {"a100-sxm4-80gb", "h100-sxm5-80gb", "h100-pcie", "h200-sxm-141gb", "b200", "l40s"} <= keys
    for sku in table.skus:
        for value in sku.values.values():
            assert value.sources and all(s in table.sources for s in value.sources)
    with pytest.raises(ValueError, match="no sources"):
        table_from(
            {"sources": {}, "skus": {"x": {"name": "X", "id_sources": [], "memory_mib": {"value": 1}}}}
        )
    with pytest.raises(ValueError, match="unknown source"):
        table_from({"sources": {"a": "A"}, "skus": {"x": {"name": "X", "id_sources": ["b"]}}})


def test_bandwidth_floors_come_from_the_pcie_link_and_nvlink() -> None:
    table = sku_table()
    h200_sku = table.match(h200())
    assert pcie_gbs(5, 16) == pytest.approx(63.0, rel=0.01)
    floors = bandwidth_floors([h200_sku, h200_sku])
    assert floors == {"pcie": pytest.approx(31.5, rel=0.01), "nvlink": 225.0}
    assert bandwidth_floors([h200_sku, None]) == {"pcie": None, "nvlink": None}


def test_a_one_gpu_host_that_shows_no_nvlink_is_not_judged_on_it() -> None:
    """As the real H100 and H200 hosts (one GPU passed through to a VM): `nvidia-smi nvlink -s` lists the
    GPU and no link. On a host with more GPUs the same output fails the GPU."""
    bare = parse_nvlink_status("GPU 0: NVIDIA H200 (UUID: GPU-5b1e0c7d-0000-0000-0000-000000000000)\n")
    judged = judge_gpu(h200(), bare, gpus_on_host=1)
    nvlink = next(j for j in judged.judgements if j.check == "nvlink")
    assert nvlink.status == "skip" and any("no NVLink exposed" in w for w in judged.warnings)
    judged = judge_gpu(h200(), bare, gpus_on_host=8)
    assert next(j for j in judged.judgements if j.check == "nvlink").status == "fail"
    # links that are listed are judged, one GPU or not
    judged = judge_gpu(h200(), links(18, inactive=(3,)), gpus_on_host=1)
    assert next(j for j in judged.judgements if j.check == "nvlink").status == "fail"
