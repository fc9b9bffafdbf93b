"""host-facts.json: the preflight role's host probe, which verification runs too, read by the checks.

The values are the real H200 host's (tests/fixtures/hosts/h200-ubuntu2404: sysfs, /proc/driver/nvidia/
version), in the shape gpu_host_facts.py prints them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.checks import HostFacts, evaluate
from provisioner.expectations import Expectations
from provisioner.probes import PROBES_BY_NAME, host
from provisioner.probes.base import ProbeResult
from provisioner.probes.host import HOST_FACTS, HOST_FACTS_SECTIONS, parse_host_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h200-ubuntu2404"
SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "files" / "gpu_host_facts.py"


def h200_doc() -> dict:
    sysfs = (FIXTURES / "sysfs-pci-nvidia.txt").read_text().split()
    fields = dict(f.split("=", 1) for f in sysfs if "=" in f)
    proc = (FIXTURES / "proc-driver-nvidia-version.txt").read_text().splitlines()[0]
    return {
        "pci": [
            {"address": "0000:00:00.0", "vendor": "0x8086", "device": "0x1237", "class": "0x060000",
             "revision": "0x02", "driver": ""},
            {"address": sysfs[0], "vendor": fields["vendor"], "device": fields["device"],
             "class": fields["class"], "revision": "0xa1", "driver": fields["driver"]},
        ],
        "modules": {"nvidia": {"refcount": 50, "used_by": ["nvidia_uvm", "nvidia_modeset"]}},
        "driver": {"loaded": True, "flavor": "open", "proc_version": proc,
                   "version": (FIXTURES / "sys-module-nvidia-version.txt").read_text().strip()},
        "secure_boot": {"state": "not_applicable", "source": "no /sys/firmware/efi (legacy BIOS boot)"},
    }  # fmt: skip


def facts_from(doc: dict, rc: int = 0) -> HostFacts:
    return HostFacts(
        "h200",
        {
            HOST_FACTS: ProbeResult(HOST_FACTS, rc, json.dumps(doc)),
            "nvidia-smi-q.xml": ProbeResult("nvidia-smi-q.xml", 127, "", "nvidia-smi: not found"),
        },
    )


def test_the_real_h200s_facts_read_as_the_checks_need_them() -> None:
    facts = facts_from(h200_doc())
    gpus = host.pci_gpus(facts)
    assert [(g.address, g.vendor, g.device, g.class_code) for g in gpus] == [
        ("0000:00:06.0", "10de", "2335", "0302")
    ]
    assert len(host.pci(facts)) == 2
    driver = host.kernel_driver(facts)
    assert (driver.version, driver.open_modules) == ("580.159.04", True)
    assert host.module_version(facts) == "580.159.04"
    assert host.nouveau_loaded(facts) is False
    findings = {f.id: f for f in evaluate(facts, Expectations(), ["gpu.present"])}
    assert findings["gpu.present"].status == "pass" and "10de:2335 ×1" in findings["gpu.present"].detail


def test_no_module_loaded_skips_the_driver_facts_and_nouveau_is_seen() -> None:
    doc = h200_doc()
    doc["driver"] = {"loaded": False, "version": "", "flavor": "", "proc_version": ""}
    doc["modules"] = {"nouveau": {"refcount": 0, "used_by": []}}
    facts = facts_from(doc)
    findings = {f.id: f for f in evaluate(facts, Expectations(), ["driver.loaded"])}
    assert findings["driver.loaded"].status == "fail"
    assert "nouveau is loaded" in findings["driver.loaded"].detail


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["pci"][1].update(vendor="0x10de; rm -rf /"),
        lambda d: d["pci"][1].update(address="../../etc"),
        lambda d: d["pci"].append("not an object"),
        lambda d: d["driver"].update(version="580.159.04\x1b[2J"),
        lambda d: d.update(modules=["nvidia"]),
    ],
)
def test_hostile_or_garbled_host_facts_are_an_error_never_a_pass(mutate) -> None:
    doc = h200_doc()
    mutate(doc)
    findings = evaluate(facts_from(doc), Expectations(), ["gpu.present", "driver.loaded"])
    assert {f.status for f in findings} == {"error"}, [(f.id, f.status, f.detail) for f in findings]


def test_verification_runs_the_roles_own_probe_file() -> None:
    """One reader: the probe verification sends is the role's file, byte for byte."""
    import base64
    import re

    body = PROBES_BY_NAME[HOST_FACTS].body
    encoded = re.search(r"printf '%s' '([A-Za-z0-9+/=]+)'", body).group(1)
    assert base64.b64decode(encoded) == SCRIPT.read_bytes()
    assert "--sections pci,modules,driver,secure_boot --all-pci" in body


def test_the_probe_file_reads_this_machine_with_the_sections_asked(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--sections", HOST_FACTS_SECTIONS, "--all-pci"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    doc = json.loads(out.stdout)
    assert sorted(doc) == ["driver", "modules", "pci", "secure_boot"]
    parse_host_facts(out.stdout)  # this machine's own sysfs parses
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--sections", "pci,nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown section(s): nope" in bad.stderr


def test_pci_devices_reads_sysfs_like_lspci(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gpu_host_facts", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for addr, vendor in (("0000:00:06.0", "0x10de"), ("0000:00:01.0", "0x1af4")):
        d = tmp_path / addr
        d.mkdir()
        for name, value in (
            ("vendor", vendor),
            ("device", "0x2335"),
            ("class", "0x030200"),
            ("revision", "0xa1"),
        ):
            (d / name).write_text(value + "\n")
    assert [d["address"] for d in mod.pci_devices(False, str(tmp_path))] == ["0000:00:06.0"]
    assert [d["vendor"] for d in mod.pci_devices(True, str(tmp_path))] == ["0x1af4", "0x10de"]
