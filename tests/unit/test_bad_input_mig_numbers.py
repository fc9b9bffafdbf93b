"""Numbers in MIG output read strictly: `nvidia-smi -L`, `nvidia-smi mig -lgip`/`-lgipp` and the MIG
fleet's query. Other scripts' digits and thousands of digits are an error for that host (its probe's
error, or the check's), never a crash of `mig apply`, `upgrade-driver` or verification, and never a
MIG device counted on the wrong GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import verify_fixtures as vf

from provisioner.checks import HostFacts
from provisioner.checks import cluster as C
from provisioner.errors import InputError
from provisioner.executors import CommandResult
from provisioner.inventory import HostSpec
from provisioner.mig import parse_mig_devices, parse_profiles
from provisioner.migapply import fleet as F
from provisioner.migapply import verb
from provisioner.probes.mig import SMI_LIST, mig_devices
from provisioner.rollout import hosts as H
from provisioner.upgrade import adapters as A

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h200-ubuntu2404"


# ----------------------------------------------------------------------- nvidia-smi -L, mig -lgip


@pytest.mark.parametrize("index", ["٠", "²", "9" * 5000, "-1", "x"])
def test_a_gpu_line_without_a_gpu_index_makes_the_listing_an_error(index: str) -> None:
    listing = f"GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU {index}: NVIDIA H200 (UUID: GPU-2)\n"
    listing += "  MIG 1g.18gb     Device  0: (UUID: MIG-a)\n"
    with pytest.raises(ValueError, match="not a GPU index"):
        parse_mig_devices(listing)


@pytest.mark.parametrize("memory", ["9" * 400, "inf", "1e999", "٣٢.٥٠", "-16.00"])
def test_a_profile_row_with_memory_no_gpu_has_is_refused(memory: str) -> None:
    lgip = (HOSTS / "nvidia-smi-mig-lgip.txt").read_text().replace("16.00", memory, 1)
    with pytest.raises(ValueError, match="a profile row that is not one"):
        parse_profiles(lgip, (HOSTS / "nvidia-smi-mig-lgipp.txt").read_text())


@pytest.mark.parametrize("starts", ["{0,1,٢}", "{" + "9" * 5000 + "}"])
def test_a_placement_row_with_other_digits_is_refused(starts: str) -> None:
    lgipp = (HOSTS / "nvidia-smi-mig-lgipp.txt").read_text().replace("{0,1,2,3,4,5,6}", starts, 1)
    with pytest.raises(ValueError, match="a placement row that is not one"):
        parse_profiles((HOSTS / "nvidia-smi-mig-lgip.txt").read_text(), lgipp)


# -------------------------------------------------------------------------------- the MIG fleet


@pytest.mark.parametrize(
    "row", ["٠, 0x233510DE, 580.159.04, Disabled", "0, 0x233510DE, " + "5" * 5000 + ".1, Disabled"]
)
def test_a_mig_query_row_with_other_digits_is_refused(row: str) -> None:
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        F.parse_gpu_rows(row + "\n")


def test_allocatable_counts_that_are_no_counts_are_left_out() -> None:
    node = {"status": {"allocatable": {"nvidia.com/gpu": "٣", "nvidia.com/mig-1g.18gb": "7"}}}
    node["status"]["allocatable"] |= {"nvidia.com/mig-2g.35gb": "-1", "nvidia.com/mig-3g.71gb": "9" * 5000}
    assert F.allocatable(node) == {"nvidia.com/mig-1g.18gb": 7}


class ScriptedSsh:
    """An SSH connection whose commands answer as a GPU host would, with `listing` for nvidia-smi -L."""

    listing = ""

    def __init__(self, target: Any, connect_timeout: float = 10.0) -> None:
        self.target = target
        self.name = target.name

    def run(self, argv: list[str], timeout: float) -> CommandResult:
        command = " ".join(argv)
        if "hostname" in command:
            out = "gpu1\n"
        elif "machine-id" in command:
            out = "0" * 32 + "\n"
        elif "--query-gpu" in command:
            out = "0, 0x233510DE, 580.159.04, Disabled\n"
        else:
            out = self.listing
        return CommandResult(0, out, "", 0.01)

    def close(self) -> None:
        pass


@pytest.fixture
def scripted_ssh(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedSsh]:
    stub = SimpleNamespace(from_host=lambda spec: SimpleNamespace(name=spec.name, address=spec.address))
    # Every rolling change's fleet opens its SSH sessions in provisioner.rollout.hosts.
    monkeypatch.setattr(H, "SshExecutor", ScriptedSsh)
    monkeypatch.setattr(H, "SshTarget", stub)
    monkeypatch.setattr("provisioner.verification.collect", lambda *a, **k: vf.results(vf.h200_probes()))
    return ScriptedSsh


BAD_LISTINGS = ["GPU ٠: NVIDIA H200 (UUID: GPU-1)\n", "GPU " + "9" * 5000 + ": NVIDIA H200 (UUID: GPU-1)\n"]


def mig_apply_fleet(spec: HostSpec) -> F.MigFleet:
    return F.MigFleet(hosts=[spec], control_plane=spec, namespace="gpu-operator")


def upgrade_fleet(spec: HostSpec) -> A.RealFleet:
    return A.RealFleet(
        hosts=[spec],
        control_plane=None,
        inventory_path=Path("hosts.yml"),
        record=None,
        install_version="580.159.04",
        progress=lambda host, text: None,
    )


@pytest.mark.parametrize("listing", BAD_LISTINGS)
@pytest.mark.parametrize("fleet", [mig_apply_fleet, upgrade_fleet], ids=["mig-apply", "upgrade-driver"])
def test_a_probe_of_an_unreadable_listing_is_that_hosts_error(
    scripted_ssh: type[ScriptedSsh], fleet: Callable[[HostSpec], Any], listing: str
) -> None:
    scripted_ssh.listing = listing
    probe = fleet(HostSpec("gpu1", "192.0.2.21")).probe(["gpu1"])["gpu1"]
    assert probe.error and "not a GPU index" in probe.error


def test_mig_apply_refuses_a_host_whose_driver_version_is_no_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MIG apply tests' fake fleet and cluster, with a host whose driver version is no version."""
    import test_mig_apply as mig_apply_tests

    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(verb.MIG_PARTED_ENV, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(mig_apply_tests.INVENTORY)
    cluster = mig_apply_tests.FakeCluster()
    probe = mig_apply_tests.FakeMigFleet.probe

    def unreadable_driver(self: Any, hosts: list[str]) -> dict[str, Any]:
        return {h: dataclasses.replace(p, loaded="²80.159.04") for h, p in probe(self, hosts).items()}

    monkeypatch.setattr(mig_apply_tests.FakeMigFleet, "probe", unreadable_driver)
    with pytest.raises(InputError, match=r"gpu1: cannot check all-1g\.18gb: driver version '²80"):
        mig_apply_tests.apply(inventory, cluster)
    assert cluster.log == []


def test_an_unreadable_mig_listing_is_an_error_of_the_check_not_an_internal_one() -> None:
    probes = vf.h200_probes()
    probes[SMI_LIST] = (0, "GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU ٠: NVIDIA H200 (UUID: GPU-2)\n", "")
    with pytest.raises(C.Unavailable) as exc:
        mig_devices(HostFacts("h200", vf.results(probes)))
    assert exc.value.status == "error" and "not a GPU index" in exc.value.reason
