"""`gpuprov top`: nvidia-smi's query CSV (values from a real H200), Xids by GPU, the outputs, and
connections kept open between refreshes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from provisioner import top as T
from provisioner.executors import CommandResult, ExecutorError, HostUnreachable

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h200-ubuntu2404"


def real_h200_line(units: bool) -> str:
    """Our field order, filled with what the real H200 printed (nvidia-smi-query-gpu.csv and
    nvidia-smi-telemetry.csv, driver 580.159.04; captured with units)."""
    q = [c.strip() for c in (HOSTS / "nvidia-smi-query-gpu.csv").read_text().splitlines()[1].split(",")]
    tel = [c.strip() for c in (HOSTS / "nvidia-smi-telemetry.csv").read_text().splitlines()[1].split(",")]
    index, uuid, name, bus = q[0], q[1], q[2], q[3]
    util, utilm, used, total, temp, power = tel[0], tel[1], tel[2], tel[3], tel[4], tel[5]
    limit, reasons = q[18], tel[6]
    cells = [index, uuid, name, bus, util, utilm, used, total, temp, power, limit, reasons]
    if not units:
        cells = [re.sub(r" (%|MiB|W)$", "", c) for c in cells]
    return ", ".join(cells)


@pytest.mark.parametrize("units", [True, False])
def test_the_real_h200s_numbers(units: bool) -> None:
    (g,) = T.parse_query(real_h200_line(units))
    assert (g.index, g.name, g.bus_id) == (0, "NVIDIA H200", "0000:00:06.0")
    assert g.uuid == "GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c008796e"
    assert (g.util_gpu, g.util_mem, g.mem_used_mib, g.mem_total_mib) == (0, 0, 0, 143771)
    assert (g.temp_c, g.power_w, g.power_limit_w) == (35, 77.83, 700)
    assert g.event_reasons == 0x1 and g.slowdowns == []  # idle is no slowdown


def test_not_available_values_and_slowdown_bits() -> None:
    line = (
        "1, GPU-x, NVIDIA H100 80GB HBM3, 00000000:1B:00.0, [N/A], [N/A], 1024, 81559, 88, [N/A], 700, 0x48"
    )
    (g,) = T.parse_query(line)
    assert g.util_gpu is None and g.power_w is None and g.mem_used_mib == 1024
    assert g.slowdowns == ["hw-slowdown", "hw-thermal"]


@pytest.mark.parametrize(
    "text,why",
    [
        ("", "listed no GPU"),
        ("0, GPU-x, H200", "3 fields, 12 expected"),
        ("0, GPU-x, H200, 0000:00:06.0, 12;rm, 0, 0, 1, 30, 70, 700, 0x1", "utilization.gpu: not a number"),
        ("x, GPU-x, H200, 0000:00:06.0, 1, 0, 0, 1, 30, 70, 700, 0x1", "index: not a number"),
        ("0, GPU-x, H200, 0000:00:06.0, 1, 0, 0, 1, 30, 70, 700, busy", "not a bit mask"),
    ],
)
def test_other_output_is_refused(text: str, why: str) -> None:
    with pytest.raises(T.TopParseError, match=why):
        T.parse_query(text)


def test_xids_go_to_the_gpu_whose_pci_device_reported_them() -> None:
    query = (
        "0, GPU-a, H100, 00000000:1B:00.0, 1, 0, 0, 1, 30, 70, 700, 0x1\n"
        "1, GPU-b, H100, 00000000:2A:00.0, 1, 0, 0, 1, 30, 70, 700, 0x1\n"
    )
    log = (
        "[ 812.5] NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
        "[ 900.1] NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE\n"
    )
    a, b = T.parse_sample(query + T.XID_MARK + "\n" + log)
    assert (a.xids, b.xids) == ([], [79, 48])


def test_json_and_prometheus_for_scripts() -> None:
    s = T.HostSample("gpu1", T.parse_query(real_h200_line(False)))
    bad = T.HostSample('evil"\nhost', [], "nvidia-smi not found")
    doc = json.loads(json.dumps(T.to_json([s, bad])))
    assert doc["hosts"][0]["gpus"][0]["memory_total_mib"] == 143771
    assert doc["hosts"][1]["error"] == "nvidia-smi not found"
    prom = T.to_prometheus([s, bad])
    sample = re.compile(r'^[a-z_]+\{(?:[a-z_]+="(?:[^"\\\n]|\\.)*",?)+\} -?[0-9.e+]+$')
    for line in prom.splitlines():
        assert line.startswith("# ") or sample.match(line), line
    assert 'gpuprov_gpu_memory_total_bytes{host="gpu1",gpu="0"' in prom
    assert f'",name="NVIDIA H200"}} {143771 * 1024 * 1024}\n' in prom  # exact, not 1.5e+11
    assert 'gpuprov_top_host_up{host="evil\\"\\nhost"} 0' in prom


class FakeExecutor:
    def __init__(self, answers: list[CommandResult | Exception]) -> None:
        self.answers = answers
        self.closed = False

    def run(self, command, timeout):  # type: ignore[no-untyped-def]
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    def close(self) -> None:
        self.closed = True


def test_connections_stay_open_between_refreshes_and_a_broken_one_is_opened_again() -> None:
    ok = CommandResult(0, real_h200_line(False) + "\n" + T.XID_MARK + "\n", "", 0.01)
    first = FakeExecutor([ok, ok, ExecutorError("gpu1", "connection lost")])
    second = FakeExecutor([ok])
    opened: list[FakeExecutor] = []

    def opener() -> FakeExecutor:
        ex = [first, second][len(opened)]
        opened.append(ex)
        return ex

    fleet = T.Fleet([("gpu1", opener)], parallel=4, timeout=5)
    try:
        assert fleet.refresh()[0].gpus and fleet.refresh()[0].gpus
        assert len(opened) == 1  # one connection for two refreshes
        lost = fleet.refresh()[0]
        assert lost.error == "connection lost" and first.closed
        assert fleet.refresh()[0].gpus and len(opened) == 2
    finally:
        fleet.close()


def test_a_host_that_cannot_be_reached_or_has_no_nvidia_smi_is_reported_not_raised() -> None:
    def unreachable() -> FakeExecutor:
        raise HostUnreachable("gpu9", "connection refused")

    fleet = T.Fleet(
        [("gpu9", unreachable), ("gpu2", lambda: FakeExecutor([CommandResult(127, "", "", 0.0)]))], 2, 5
    )
    try:
        a, b = fleet.refresh()
    finally:
        fleet.close()
    assert (a.error, b.error) == ("connection refused", "nvidia-smi not found")


def test_interval_and_targets_are_checked_first() -> None:
    from provisioner.errors import InputError

    with pytest.raises(InputError, match=r"--interval 0\.1"):
        T.run_top(inventory=None, local=True, limit=None, once=True, interval=0.1, parallel=1, timeout=5,
                  show=lambda s: None)  # fmt: skip
    with pytest.raises(InputError, match="exactly one of"):
        T.targets_for(None, False, None)
