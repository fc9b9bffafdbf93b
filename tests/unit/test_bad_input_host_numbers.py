"""Numbers in host output read strictly by the probes' parsers and the checks: nvidia-smi's XML, the
probe script's frame, dcgmi, the cluster's allocatable counts and quotas, and the DCGM exporter's
labels. Other scripts' digits, thousands of digits, non-finite or impossible numbers are an error for
that host (or are no such number), never a crash of the command nor a fact in a report."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import verify_fixtures as vf

from provisioner.checks import HostFacts
from provisioner.checks import cluster as C
from provisioner.checks import monitoring as M
from provisioner.checks.tenants import quantity
from provisioner.expectations import Expectations
from provisioner.probes.base import ParseError, ProbeResult
from provisioner.probes.container import parse_containerd_dump
from provisioner.probes.dcgm import parse_dcgm_diag
from provisioner.probes.prometheus import Sample, parse_prometheus_text
from provisioner.probes.script import parse_script_output
from provisioner.probes.smi import parse_nvidia_smi_xml

NOT_COUNTS = ["1²", "٣", "１６", "9" * 5000, "9" * 17, "16x;rm -rf /", "1 6"]

# ---------------------------------------------------------------------------------- nvidia-smi -q -x


@pytest.mark.parametrize("value", NOT_COUNTS)
def test_an_xml_count_that_is_no_number_makes_the_xml_an_error(value: str) -> None:
    xml = vf.raw("nvidia-smi-q-x.xml").replace("<current_link_width>16x<", f"<current_link_width>{value}<")
    with pytest.raises(ParseError, match="current_link_width"):
        parse_nvidia_smi_xml(xml)


@pytest.mark.parametrize(("value", "read"), [("16x", 16), ("N/A", None), ("[Unknown Error]", None), ("8", 8)])
def test_an_xml_count_as_nvidia_smi_prints_it(value: str, read: int | None) -> None:
    xml = vf.raw("nvidia-smi-q-x.xml").replace("<current_link_width>16x<", f"<current_link_width>{value}<")
    (gpu,) = parse_nvidia_smi_xml(xml).gpus
    assert gpu.link_width_current == read


# -------------------------------------------------------------------------------- the probe frame

TOKEN = "0123456789abcdef"


def framed(end_fields: str) -> dict[str, ProbeResult]:
    # As the script frames it: the end marker on a line of its own, after the output's own newline.
    text = f"@@{TOKEN} B os-release\nID=ubuntu\n\n@@{TOKEN} E os-release {end_fields}\n"
    return parse_script_output(text, TOKEN, ["os-release"])


@pytest.mark.parametrize("stamps", ["0 1e999", "inf 1", "0 nan", "0 " + "9" * 400, "٣ ٤", "0"])
def test_a_probe_duration_from_unreadable_clock_readings_is_zero(stamps: str) -> None:
    result = framed("0 " + stamps)["os-release"]
    assert result.rc == 0 and result.stdout == "ID=ubuntu\n"
    assert math.isfinite(result.duration_s) and result.duration_s == 0.0


@pytest.mark.parametrize("rc", ["٣", "²", "9" * 5000, "256", "-1"])
def test_a_probe_exit_status_that_is_no_exit_status_leaves_it_uncollected(rc: str) -> None:
    assert not framed(f"{rc} 1.0 2.0")["os-release"].collected


def test_a_real_probe_frame_still_reads() -> None:
    result = framed("0 1733150000.123456 1733150000.623456")["os-release"]
    assert (result.rc, result.duration_s) == (0, 0.5)


# ------------------------------------------------------------------------- containerd, /metrics


@pytest.mark.parametrize("version", ["inf", "nan", "1e999", '"٣"', '"0x2"', "2.5", "true", "-2", "[2]"])
def test_a_containerd_config_version_that_is_no_version_is_an_error(version: str) -> None:
    with pytest.raises(ParseError, match="is not a config version"):
        parse_containerd_dump(f"version = {version}\n")


@pytest.mark.parametrize("version", ["2", "3", '"3"'])
def test_containerd_config_versions_as_written(version: str) -> None:
    assert parse_containerd_dump(f"version = {version}\n").version == int(version.strip('"'))


@pytest.mark.parametrize("value", ["٣٤", "３４", "3²", "1e٣"])
def test_a_metric_value_in_other_digits_is_an_error(value: str) -> None:
    with pytest.raises(ParseError, match="not a number"):
        parse_prometheus_text(f'DCGM_FI_DEV_GPU_TEMP{{gpu="0"}} {value}\n')


# ------------------------------------------------------------------------------------------ dcgmi


@pytest.mark.parametrize("gpu_id", ["²", "٣", "9" * 5000, True, -1, "4096"])
def test_a_dcgm_gpu_id_that_is_no_index_names_no_gpu(gpu_id: Any) -> None:
    doc = {"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"name": "Memory", "results": [
        {"gpu_id": gpu_id, "status": "Fail"}]}]}]}}  # fmt: skip
    (result,) = parse_dcgm_diag(json.dumps(doc))
    assert result.gpu is None and result.status == "fail"


# ------------------------------------------------------------------------------------ the cluster


def node_with(allocatable: Any) -> HostFacts:
    probes = vf.h200_probes()
    node = {"kind": "Node", "metadata": {"name": "h200", "labels": {}}, "status": {"allocatable": {}}}
    node["status"]["allocatable"]["nvidia.com/gpu"] = allocatable  # type: ignore[index]
    probes["kube-node.json"] = (0, json.dumps(node), "")
    return HostFacts("h200", vf.results(probes))


@pytest.mark.parametrize("allocatable", ["٣", "-1", "9" * 5000, "1e3", " 1_0 ", True])
def test_an_allocatable_gpu_count_that_is_no_count_is_an_error(allocatable: Any) -> None:
    (finding,) = C.k8s_gpu_allocatable(node_with(allocatable), Expectations())
    assert finding.status == "error" and "is not a GPU count" in finding.detail, finding


def test_a_real_allocatable_gpu_count_is_judged() -> None:
    (finding,) = C.k8s_gpu_allocatable(node_with("1"), Expectations())
    assert finding.status == "pass", finding


@pytest.mark.parametrize("text", ["٣", "１", "9" * 5000, "9" * 400 + ".5", "1e3", "inf"])
def test_a_quota_that_is_no_quantity_is_none(text: str) -> None:
    assert quantity(text) is None


def test_real_quantities_still_read() -> None:
    assert (quantity("2"), quantity("4000m"), quantity("1Ki")) == (2, 4, 1024)


@pytest.mark.parametrize("gpu", ["²", "٣", "9" * 5000])
def test_an_exporter_series_for_a_gpu_label_that_is_no_index_is_a_stranger(gpu: str) -> None:
    facts = HostFacts("h200", vf.results(vf.h200_probes()))
    samples = [Sample(metric, {"gpu": "0"}, 1.0, n) for n, metric in enumerate(M.REQUIRED_METRICS)]
    samples.append(Sample(M.REQUIRED_METRICS[0], {"gpu": gpu}, 1.0, 99))
    (finding,) = M._judge(facts, "h200", "pod", samples, "")
    assert finding.status == "fail" and "GPUs this host does not have" in finding.detail, finding
