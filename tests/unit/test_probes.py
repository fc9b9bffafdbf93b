"""Probe parsers over the real H200 capture, the probe script's framing, and garbled input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import verify_fixtures as vf

from provisioner.executors import LocalExecutor
from provisioner.probes.base import ParseError
from provisioner.probes.container import ContainerdRuntime, parse_containerd_dump
from provisioner.probes.cuda import parse_nvcc
from provisioner.probes.dcgm import parse_dcgm_diag
from provisioner.probes.host import (
    normalize_bus_id,
    nvidia_gpus,
    parse_driver_proc,
    parse_module_version,
    parse_modules,
    parse_pci_devices,
    parse_secureboot,
)
from provisioner.probes.kernel_log import parse_kernel_log
from provisioner.probes.packages import Package, parse_holds, parse_packages
from provisioner.probes.script import build_script, new_token, parse_script_output
from provisioner.probes.smi import parse_nvidia_smi_xml, parse_smi_version
from provisioner.probes.system import SERVICE_UNITS, parse_os_release, parse_tsv_states

FIXTURES_ROOT = Path(__file__).resolve().parents[1] / "fixtures"

# ----------------------------------------------------------------------------- real capture parsers


def test_nvidia_smi_xml_real_h200() -> None:
    log = parse_nvidia_smi_xml(vf.raw("nvidia-smi-q-x.xml"))
    assert log.driver_version == "580.159.04"
    assert log.cuda_version == "13.0"
    assert log.attached_gpus == 1
    (gpu,) = log.gpus
    assert gpu.index == 0
    assert gpu.bus_id == "0000:00:06.0"
    assert gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c008796e"
    assert gpu.persistence == "Enabled"
    assert (gpu.ecc_current, gpu.ecc_pending) == ("Enabled", "Enabled")
    assert gpu.ecc_volatile_uncorrectable == 0
    assert gpu.ecc_volatile_correctable == 0
    assert gpu.retired_pending is None  # N/A on Hopper: row remapping instead
    assert (gpu.remap_pending, gpu.remap_failure, gpu.unrepairable_memory) == (False, False, False)
    assert (gpu.link_gen_current, gpu.link_gen_max, gpu.link_width_current, gpu.link_width_max) == (
        5,
        5,
        16,
        16,
    )
    assert gpu.performance_state == "P0"
    assert gpu.event_reasons["gpu_idle"] is True
    assert gpu.event_reasons["hw_slowdown"] is False
    assert gpu.mig_mode == "Disabled"


def test_nvidia_smi_xml_older_throttle_and_ecc_layout() -> None:
    """Drivers before clocks_event_reasons used clocks_throttle_reasons and single/double_bit totals."""
    xml = vf.raw("nvidia-smi-q-x.xml").replace("clocks_event_reason", "clocks_throttle_reason")
    xml = xml.replace(
        "<clocks_throttle_reason_hw_slowdown>Not Active", "<clocks_throttle_reason_hw_slowdown>Active"
    )
    root = vf.xml_root(xml)
    volatile = root.find("gpu/ecc_errors/volatile")
    assert volatile is not None
    for child in list(volatile):
        volatile.remove(child)
    for kind, total in (("single_bit", "5"), ("double_bit", "2")):
        el = vf.ET.SubElement(volatile, kind)
        vf.ET.SubElement(el, "device_memory").text = total
        vf.ET.SubElement(el, "total").text = total
    (gpu,) = parse_nvidia_smi_xml(vf.xml_text(root)).gpus
    assert gpu.event_reasons["hw_slowdown"] is True
    assert gpu.ecc_volatile_uncorrectable == 2
    assert gpu.ecc_volatile_correctable == 5


@pytest.mark.parametrize("cut", [100, 5000, 20000, -20])
def test_truncated_xml_is_a_parse_error(cut: int) -> None:
    with pytest.raises(ParseError, match="not well-formed"):
        parse_nvidia_smi_xml(vf.raw("nvidia-smi-q-x.xml")[:cut])


def test_garbled_xml_inputs() -> None:
    with pytest.raises(ParseError, match="printed nothing"):
        parse_nvidia_smi_xml("  \n")
    with pytest.raises(ParseError, match="unexpected root"):
        parse_nvidia_smi_xml("<html><body>oops</body></html>")
    with pytest.raises(ParseError, match="no PCI bus id"):
        parse_nvidia_smi_xml("<nvidia_smi_log><gpu><uuid>x</uuid></gpu></nvidia_smi_log>")


def test_xml_entities_from_a_host_are_refused_and_the_real_doctype_is_not() -> None:
    """The real capture carries a DOCTYPE naming NVIDIA's DTD, which is allowed; entity declarations
    (an expansion bomb, an external file) are refused before anything is expanded or read."""
    real = vf.raw("nvidia-smi-q-x.xml")
    assert '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">' in real
    assert parse_nvidia_smi_xml(real).attached_gpus == 1
    laughs = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    bomb = f'<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [<!ENTITY l0 "lol">{laughs}]>'
    bomb += "<nvidia_smi_log><driver_version>&l9;</driver_version></nvidia_smi_log>"
    with pytest.raises(ParseError, match="declares XML entities"):
        parse_nvidia_smi_xml(bomb)
    external = '<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [<!ENTITY x SYSTEM "file:///etc/shadow">]>'
    external += "<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>"
    with pytest.raises(ParseError, match="declares XML entities"):
        parse_nvidia_smi_xml(external)


def test_driver_proc_and_module_and_smi_version_real() -> None:
    kd = parse_driver_proc(vf.raw("proc-driver-nvidia-version.txt"))
    assert kd.version == "580.159.04"
    assert kd.open_modules is True
    assert parse_module_version(vf.raw("sys-module-nvidia-version.txt")) == "580.159.04"
    versions = parse_smi_version(vf.raw("nvidia-smi-version.txt"))
    assert versions["nvidia-smi version"] == "580.159.04"
    assert versions["nvml version"] == "580.159"
    proprietary = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.195.03  Release Build  (dvs-builder@U22)\n"
    )
    kd2 = parse_driver_proc(proprietary)
    assert (kd2.version, kd2.open_modules) == ("570.195.03", False)
    with pytest.raises(ParseError):
        parse_driver_proc("cat: /proc/driver/nvidia/version: No such file or directory")
    with pytest.raises(ParseError):
        parse_module_version("garbage\x00")
    with pytest.raises(ParseError):
        parse_smi_version("Failed to initialize NVML")


def test_nvcc_real_and_garbled() -> None:
    cuda = parse_nvcc(vf.raw("nvcc-version.txt"))
    assert (cuda.release, cuda.version) == ("13.0", "13.0.88")
    with pytest.raises(ParseError):
        parse_nvcc("nvcc: NVIDIA (R) Cuda compiler dri")


def test_os_release_real() -> None:
    osr = parse_os_release(vf.raw("os-release"))
    assert (osr["ID"], osr["VERSION_ID"], osr["VERSION_CODENAME"]) == ("ubuntu", "24.04", "noble")
    with pytest.raises(ParseError):
        parse_os_release('NAME="unterminated\n')


def test_packages_and_holds_from_real_dpkg_list() -> None:
    tsv, holds = vf.packages_from_dpkg_l()
    pkgs = parse_packages(tsv)
    assert pkgs["cuda-nvcc-13-0"].version == "13.0.88-1"
    assert pkgs["cuda-nvcc-13-0"].installed and not pkgs["cuda-nvcc-13-0"].held
    assert pkgs["libnccl2"].held and pkgs["libnccl2"].installed
    assert parse_holds(holds) == {
        "libcublas-13-0",
        "libcublas-dev-13-0",
        "libcudnn9-cuda-13",
        "libnccl-dev",
        "libnccl2",
    }
    assert not Package("foo", "1", "rc ").installed
    with pytest.raises(ParseError, match="line 2"):
        parse_packages("a\t1\tii \nbroken line without tabs\n")
    with pytest.raises(ParseError):
        parse_holds("two words\n")


def test_pci_lines_real_lspci_and_sysfs_forms() -> None:
    text = (
        "0000:00:00.0 Host bridge [0600]: Intel Corporation 440FX - 82441FX PMC [Natoma] [8086:1237]"
        " (rev 02)\n"
        "0000:18:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)\n"
        "0000:05:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)\n"
        + vf.pci_from_sysfs_capture()
    )
    devices = parse_pci_devices(text)
    gpus = nvidia_gpus(devices)
    assert [(d.address, d.device) for d in gpus] == [("0000:00:06.0", "2335"), ("0000:18:00.0", "2330")]
    assert [d.address for d in devices if d.is_nvswitch] == ["0000:05:00.0"]
    with pytest.raises(ParseError, match="line 2"):
        parse_pci_devices("0000:00:00.0 Host bridge [0600]: Intel [8086:1237]\nnot a pci line\n")


def test_bus_id_forms_are_normalised() -> None:
    assert normalize_bus_id("00000000:00:06.0") == "0000:00:06.0"
    assert normalize_bus_id("0000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("0000:3b:00") == "0000:3b:00"


def test_kernel_log_xids_dmesg_and_journal_forms() -> None:
    log = vf.kernel_log(
        vf.xid_line(79, text="GPU has fallen off the bus."),
        "Dec 02 15:10:01 h200 kernel: NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on "
        "(GPC 0, TPC 0)",
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
        "[ 1900.1] NVRM: GPU at PCI:0000:00:06: GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c008796e",
    )
    events = parse_kernel_log(log)
    assert [(e.xid, e.pci) for e in events] == [(79, "0000:00:06"), (13, "0000:3b:00"), (79, "0000:b3:00.0")]
    assert events[0].message.startswith("pid=41223")
    assert parse_kernel_log(vf.kernel_log()) == []


@pytest.mark.parametrize("xid", ["9" * 5000, "10000", "4294967296"])
def test_an_xid_number_no_driver_prints_makes_the_kernel_log_an_error(xid: str) -> None:
    with pytest.raises(ParseError, match="kernel log line 5: Xid"):
        parse_kernel_log(vf.kernel_log(f"[ 9.0] NVRM: Xid (PCI:0000:00:06): {xid}, pid=1, x"))


@pytest.mark.parametrize("xid", ["٧٩", "7²9", "７９", "79x"])
def test_other_scripts_digits_are_no_xid(xid: str) -> None:
    assert parse_kernel_log(vf.kernel_log(f"[ 9.0] NVRM: Xid (PCI:0000:00:06): {xid}, pid=1, x")) == []


def test_services_modules_secureboot_dropins() -> None:
    assert parse_tsv_states("docker\tactive\nkubelet\tinactive\n", "services.tsv") == {
        "docker": "active",
        "kubelet": "inactive",
    }
    with pytest.raises(ParseError):
        parse_tsv_states("docker active\n", "services.tsv")
    mods = parse_modules(
        "nvidia_uvm 2076672 0 - Live 0x0000000000000000 (POE)\n"
        "nvidia 14376960 9 nvidia_uvm, Live 0x0000000000000000 (POE)\n"
    )
    assert mods == {"nvidia_uvm": "Live", "nvidia": "Live"}
    with pytest.raises(ParseError):
        parse_modules("nvidia\n")
    assert parse_secureboot("SecureBoot enabled\n") == "enabled"
    assert parse_secureboot("SecureBoot disabled\nPlatform is in Setup Mode\n") == "disabled"
    assert parse_secureboot("EFI variables are not supported on this system\n") == "not-applicable"
    assert parse_secureboot("SecureBoot not applicable (legacy BIOS boot: no /sys/firmware/efi)") == (
        "not-applicable"
    )
    v3 = parse_containerd_dump((FIXTURES_ROOT / "containerd" / "config-default-2.1.toml").read_text())
    assert v3.version == 3 and v3.enable_cdi and v3.default_runtime == "runc"
    assert v3.runtimes["runc"] == ContainerdRuntime("io.containerd.runc.v2", "")
    v2 = parse_containerd_dump((FIXTURES_ROOT / "containerd" / "config-default-1.6.toml").read_text())
    assert v2.version == 2 and not v2.enable_cdi and set(v2.runtimes) == {"runc"}
    with pytest.raises(ParseError, match="TOML"):
        parse_containerd_dump("[unclosed\n")


def test_dcgm_diag_json_forms() -> None:
    doc = """{"DCGM GPU Diagnostic": {"test_categories": [
      {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
      {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [
         {"gpu_id": "0", "status": "Pass"}, {"gpu_id": "3", "status": "Fail", "info": "DBE detected"}]}]}],
      "version": "4.4.1"}}"""
    res = parse_dcgm_diag(doc)
    assert [(r.test, r.status, r.gpu) for r in res] == [
        ("Denylist", "pass", None),
        ("GPU Memory", "pass", 0),
        ("GPU Memory", "fail", 3),
    ]
    with pytest.raises(ParseError):
        parse_dcgm_diag('{"DCGM Diagnostic": {"test_categ')
    with pytest.raises(ParseError):
        parse_dcgm_diag("Error: unable to connect to host engine")


# ------------------------------------------------------------------------------ script framing


def test_script_output_framing_round_trip() -> None:
    token = "0123456789abcdef"
    out = (
        f"@@{token} B os-release\nID=ubuntu\n\n@@{token} E os-release 0 10.00 10.02\n"
        f"@@{token} B nvidia-smi-q.xml\n\n@@{token} E nvidia-smi-q.xml 9 10.02 10.50\n"
        f"@@{token} B kube-node.json\n\n@@{token} E kube-node.json 200 10.5 10.5\n"
        f"@@{token} B kernel-log.txt\n[ 1.0] partial"
    )
    err = (
        f"@@{token} B os-release\n"
        f"@@{token} B nvidia-smi-q.xml\nNVIDIA-SMI has failed\nline two\n"
        f"@@{token} B kube-node.json\nnot a Kubernetes node\n"
        f"@@{token} B kernel-log.txt\n"
    )
    names = ["os-release", "nvidia-smi-q.xml", "kube-node.json", "kernel-log.txt", "packages.tsv"]
    res = parse_script_output(out, token, names, err)
    assert (res["os-release"].stdout, res["os-release"].stderr) == ("ID=ubuntu\n", "")
    assert res["os-release"].duration_s == pytest.approx(0.02)
    assert (res["nvidia-smi-q.xml"].rc, res["nvidia-smi-q.xml"].stderr) == (
        9,
        "NVIDIA-SMI has failed\nline two",
    )
    assert res["nvidia-smi-q.xml"].reason() == "exit 9: NVIDIA-SMI has failed"
    assert res["kube-node.json"].not_applicable
    assert res["kube-node.json"].reason() == "not a Kubernetes node"
    assert not res["kernel-log.txt"].collected and "cut short" in res["kernel-log.txt"].note
    assert not res["packages.tsv"].collected and "ended early" in res["packages.tsv"].note


def test_marker_lookalikes_in_output_do_not_split_sections() -> None:
    token = "feedfacecafebeef"
    body = "@@0000000000000000 E os-release 0 1 2\nkeep me\n"
    text = f"@@{token} B os-release\n{body}\n@@{token} E os-release 0 1 1\n"
    assert parse_script_output(text, token, ["os-release"])["os-release"].stdout == body


def test_real_script_runs_under_sh_and_frames_each_probe(tmp_path: Path) -> None:
    """The generated POSIX script, run by /bin/sh here: every probe framed, rc and stderr kept."""
    names = [
        "os-release",
        "uname-r",
        "pci-devices.txt",
        "proc-driver-nvidia-version",
        "apt-holds.txt",
        "service-processes.tsv",
        "kube-node.json",
    ]
    token = new_token()
    out = LocalExecutor("here").run(["sh", "-c", build_script(names, token)], 30)
    assert out.rc == 0
    res = parse_script_output(out.stdout, token, names, out.stderr)
    assert all(r.collected for r in res.values()), {n: r.note for n, r in res.items()}
    assert parse_os_release(res["os-release"].stdout)["ID"]
    assert res["uname-r"].stdout.strip()
    parse_pci_devices(res["pci-devices.txt"].stdout)  # sysfs (or lspci) lines parse
    if not Path("/proc/driver/nvidia/version").exists():
        assert res["proc-driver-nvidia-version"].rc == 1
        assert "No such file" in res["proc-driver-nvidia-version"].stderr
    states = parse_tsv_states(res["service-processes.tsv"].stdout, "service-processes.tsv")
    assert set(states) == set(SERVICE_UNITS)
    if not Path("/etc/kubernetes/admin.conf").exists() and not Path("/etc/kubernetes/kubelet.conf").exists():
        assert res["kube-node.json"].not_applicable


def test_sysfs_pci_builder_matches_devices_here() -> None:
    """Without lspci the probe builds lspci -Dnn lines from sysfs; they must name every device."""
    devs = (
        sorted(p.name for p in Path("/sys/bus/pci/devices").glob("*"))
        if Path("/sys/bus/pci").exists()
        else []
    )
    if shutil.which("lspci"):
        pytest.skip("lspci present: the sysfs builder is not used here")
    token = new_token()
    out = LocalExecutor("here").run(["sh", "-c", build_script(["pci-devices.txt"], token)], 30)
    parsed = parse_pci_devices(
        parse_script_output(out.stdout, token, ["pci-devices.txt"])["pci-devices.txt"].stdout
    )
    assert [d.address for d in parsed] == devs
    for d in parsed:
        vendor = Path(f"/sys/bus/pci/devices/{d.address}/vendor").read_text().strip()
        assert d.vendor == vendor.removeprefix("0x")


def test_build_script_refuses_a_bad_token_and_quotes_the_image() -> None:
    with pytest.raises(ValueError):
        build_script(["os-release"], "x; rm -rf /")
    script = build_script(["container-smoke.txt"], "00aa00aa00aa00aa", smoke_image="nvcr.io/x:1'$(id)")
    assert "SMOKE_IMAGE='nvcr.io/x:1'\"'\"'$(id)'" in script


def test_xid_79_with_its_fallen_off_the_bus_report_is_one_event() -> None:
    # Real drivers print the Xid line and then the multi-line "fallen off the bus" report for the same GPU.
    log = vf.kernel_log(
        "[ 1843.300000] NVRM: Xid (PCI:0000:b3:00): 79, pid=0, name=, GPU has fallen off the bus.",
        "[ 1843.308145] NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.",
        "[ 1843.308146] NVRM: The NVIDIA GPU 0000:3b:00.0",
        "               NVRM: fallen off the bus and is not responding to commands.",
    )
    events = parse_kernel_log(log)
    assert [(e.xid, e.pci) for e in events] == [(79, "0000:b3:00"), (79, "0000:3b:00.0")]
