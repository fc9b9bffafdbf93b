"""The lab's host operating systems: one containerd generation each, chosen per host, checked before
anything is touched; and the lab's refusal to run where a real NVIDIA driver is loaded."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from gpuprov_lab import distros, fleet, inventory, plan
from gpuprov_lab.errors import LabError
from gpuprov_lab.state import LabState

from provisioner.errors import InputError

NET = ipaddress.IPv4Network("10.213.9.0/24")


def test_the_default_lab_has_one_host_of_each_containerd_generation() -> None:
    specs = plan.plan(plan.DEFAULT_HOSTS, NET, None, {})
    assert [(h.name, h.os) for h in specs] == [
        ("cp1", "bookworm"),
        ("gpu1", "trixie"),
        ("gpu2", "bookworm"),
        ("gpu3", "trixie-containerd2"),
    ]
    # The NVSwitch host (fabric manager) runs Debian 12, where NVIDIA publishes branches 570 and 580.
    assert {h.name: h.profile for h in specs}["gpu2"] == "h100-sxm-8"


def test_os_is_chosen_per_host_and_kept_on_reconcile() -> None:
    specs = plan.plan(3, NET, None, {}, ["trixie-containerd2"])
    assert [h.os for h in specs] == ["bookworm", "trixie-containerd2", "trixie-containerd2"]
    again = plan.plan(3, NET, None, {h.name: h for h in specs})
    assert [h.os for h in again] == [h.os for h in specs]


def test_an_unknown_os_or_too_many_are_input_errors() -> None:
    with pytest.raises(InputError, match="'buster' is not one of"):
        fleet.validate(fleet.UpRequest(lab="never-made", os=["buster"]))
    with pytest.raises(InputError, match="--os: 3 systems for 1 GPU host"):
        fleet.validate(fleet.UpRequest(lab="never-made", hosts=2, os=["bookworm", "trixie", "trixie"]))


def test_containerd2_flavour_takes_docker_containerd_and_runc_from_sid() -> None:
    f = distros.get("trixie-containerd2")
    assert f.suite == "trixie" and f.archive_suite == "trixie-containerd2"
    assert dict(f.from_suite) == {"containerd": "sid", "runc": "sid", "docker.io": "sid", "docker-cli": "sid"}


def test_debian_13_hosts_get_the_settings_nvidias_debian13_repository_needs(tmp_path: Path) -> None:
    st = LabState(name="t", subnet=str(NET), gateway="10.213.9.1", mirror_port=8080)
    st.hosts = plan.plan(4, NET, None, {})
    doc = inventory.document(st)
    gpus = doc["all"]["children"]["gpu_nodes"]["hosts"]
    assert gpus["gpu1"]["nvidia_driver_branch"] == "590" and gpus["gpu1"]["cuda_toolkit_versions"] == ["13.1"]
    assert gpus["gpu3"]["nvidia_driver_version"] == "590.48.01"
    assert "nvidia_driver_branch" not in gpus["gpu2"]  # Debian 12: the roles' defaults
    assert gpus["gpu3"]["lab_os"] == "trixie-containerd2"


def test_the_written_inventory_has_no_aliases_gpuprov_would_refuse(tmp_path: Path) -> None:
    """Both Debian 13 hosts share their distribution's settings: written out twice, never aliased."""
    from provisioner.inventory import load_inventory

    st = LabState(name="t", subnet=str(NET), gateway="10.213.9.1", mirror_port=8080)
    st.hosts = plan.plan(4, NET, None, {})
    text = inventory.dump(inventory.document(st))
    assert "&id" not in text and "*id" not in text
    (tmp_path / "hosts.yml").write_text(text)
    assert load_inventory(tmp_path / "hosts.yml").host_vars("gpu3")["cuda_toolkit_versions"] == ["13.1"]


def test_standalone_gpu_hosts_stay_out_of_the_kubernetes_groups() -> None:
    st = LabState(name="t", subnet=str(NET), gateway="10.213.9.1", mirror_port=8080)
    st.hosts = plan.plan(3, NET, None, {})
    joined = inventory.document(st)["all"]["children"]
    assert joined["k8s_cluster"]["children"] == {"kube_control_plane": {}, "gpu_nodes": {}}
    alone = inventory.document(st, kubernetes=False)["all"]["children"]
    assert alone["k8s_cluster"]["children"] == {"kube_control_plane": {}}
    assert sorted(alone["gpu_nodes"]["hosts"]) == ["gpu1", "gpu2"]
    assert sorted(alone["kube_control_plane"]["hosts"]) == ["cp1"]


def test_the_lab_refuses_a_machine_with_a_real_nvidia_driver(tmp_path: Path) -> None:
    marker = tmp_path / "nvidia"
    fleet.refuse_real_nvidia_driver(marker)  # absent: fine
    marker.mkdir()
    with pytest.raises(LabError, match="real NVIDIA driver loaded"):
        fleet.refuse_real_nvidia_driver(marker)
