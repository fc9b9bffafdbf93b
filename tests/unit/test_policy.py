"""Policy files: validation that names file and key, and the top < groups < hosts precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.policy import Expectations, load_policy, with_overrides

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "policy.yml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yml"
    path.write_text(text)
    return path


def refusal(tmp_path: Path, text: str) -> InputError:
    """What loading a policy file of `text` raises."""
    with pytest.raises(InputError) as exc:
        load_policy(write(tmp_path, text))
    return exc.value


def test_example_policy_loads_and_layers() -> None:
    policy = load_policy(EXAMPLE)
    gpu = policy.expectations_for("gpu-003", ["gpu_nodes", "k8s_cluster"])
    assert gpu.driver_version == "580" and gpu.cuda_version == "13.0" and gpu.gpu_count == 8
    assert gpu.packages_held is not None and "nvidia-driver-*" in gpu.packages_held
    assert gpu.source("gpu.count") == "policy.yml groups.gpu_nodes"
    assert gpu.source("driver.version") == "policy.yml"
    rma = policy.expectations_for("gpu-017", ["gpu_nodes"])
    assert (rma.gpu_count, rma.source("gpu.count")) == (7, "policy.yml hosts.gpu-017")
    cp = policy.expectations_for("cp1", ["kube_control_plane", "k8s_cluster"])
    assert (cp.gpu_present, cp.gpu_count, cp.container_toolkit_runtime) == (False, 0, ())
    assert cp.cuda_version is None and cp.source("cuda.version") == "default"  # null unsets it
    assert cp.services_active == ("containerd", "kubelet")


def test_group_order_is_the_policy_order(tmp_path: Path) -> None:
    path = write(tmp_path, "groups:\n  a: {gpu.count: 2}\n  b: {gpu.count: 4}\n")
    policy = load_policy(path)
    assert policy.expectations_for("h", ["b", "a"]).gpu_count == 4
    assert policy.expectations_for("h", ["a"]).gpu_count == 2
    assert policy.expectations_for("h", ["other"]).gpu_count is None


def test_empty_policy_is_defaults(tmp_path: Path) -> None:
    assert load_policy(write(tmp_path, "")).expectations_for("h") == Expectations()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu.cnt: 8\n", "fleet.yml: gpu.cnt: unknown key (did you mean 'gpu.count'?)"),
        ("gpu.count: eight\n", "fleet.yml: gpu.count: expected a whole number of GPUs"),
        ("gpu.count: true\n", "fleet.yml: gpu.count: expected a whole number"),
        ("driver.version: 580.159\n", "fleet.yml: driver.version: quote the version"),
        ("driver.version: latest\n", "fleet.yml: driver.version: expected a driver branch"),
        ("cuda.version: 12.10\n", "fleet.yml: cuda.version: quote the version"),
        ("gpu.persistence: 'yes'\n", "fleet.yml: gpu.persistence: expected true or false"),
        ("services.active: [dockerd]\n", "fleet.yml: services.active: 'dockerd' is not one of"),
        ("container_toolkit.runtime: [podman]\n", "container_toolkit.runtime: 'podman' is not one of"),
        ("checks.skip: [gpu.xyz]\n", "fleet.yml: checks.skip: 'gpu.xyz' is not one of"),
        ("packages.held: [Bad Name]\n", "packages.held: 'Bad Name' is not a valid"),
        ("gpu.xid.ignore: [thirteen]\n", "gpu.xid.ignore: expected a list of Xid numbers"),
        ("groups:\n  gpu_nodes:\n    gpu.count: -1\n", "fleet.yml: groups.gpu_nodes.gpu.count: expected"),
        ("groups:\n  gpu_nodes:\n    driver.versoin: '580'\n", "groups.gpu_nodes.driver.versoin: unknown"),
        ("hosts:\n  gpu1: [1, 2]\n", "fleet.yml: hosts.gpu1: expected a mapping"),
        ("groups: [gpu_nodes]\n", "fleet.yml: groups: expected a mapping"),
        ("- driver.version\n", "fleet.yml: a policy is a mapping"),
        ("driver.version: '580\n", "fleet.yml: line"),
    ],
)
def test_bad_policies_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    refused = refusal(tmp_path, text)
    assert message in str(refused)
    assert str(refused).startswith(str(tmp_path / "fleet.yml"))
    assert refused.exit_code == 2


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="policy file not found"):
        load_policy(tmp_path / "nope.yml")


def test_driver_version_int_accepted_and_overrides() -> None:
    from provisioner.policy import policy_from_mapping

    exp = policy_from_mapping({"driver.version": 580}).expectations_for("h")
    assert exp.driver_version == "580"
    changed = with_overrides(exp, gpu_count=4)
    assert (changed.gpu_count, exp.gpu_count) == (4, None)
    with pytest.raises(InputError):
        with_overrides(exp, gpu_cnt=4)


# The schema is pydantic models; what a user reads is still one problem, file first, in reading order.
@pytest.mark.parametrize(
    ("text", "message"),
    [
        # top-level keys come before groups: and hosts:, whatever the order in the file
        ("groups:\n  a: {gpu.count: -1}\ngpu.cnt: 8\n", "fleet.yml: gpu.cnt: unknown key"),
        ("hosts: {h: {gpu.ecc: 1}}\ngroups: {a: {gpu.ecc: 2}}\n", "fleet.yml: groups.a.gpu.ecc: expected"),
        # within a block, the file's order
        ("driver.version: latest\ngpu.count: x\n", "fleet.yml: driver.version: expected a driver branch"),
        ("gpu.count: x\ndriver.version: latest\n", "fleet.yml: gpu.count: expected a whole number"),
        # keys that are no strings are named as YAML wrote them
        ("true: 1\n", "fleet.yml: True: unknown key"),
        ("groups:\n  a:\n    7: 1\n", "fleet.yml: groups.a.7: unknown key"),
        ("gpu.count: 65\n", "fleet.yml: gpu.count: expected a whole number of GPUs (0-64), got 65"),
        ("gpu.xid.ignore: [13, 0]\n", "fleet.yml: gpu.xid.ignore: 0 is not an Xid (Xids are 1-999)"),
        ("container.smoke_image: '-x'\n", "fleet.yml: container.smoke_image: expected a container image"),
        ("os.supported: [windows]\n", "fleet.yml: os.supported: 'windows' is not a valid OS names"),
        ("gpu_count: 8\n", "fleet.yml: gpu_count: unknown key (did you mean 'gpu.count'?)"),
    ],
)
def test_the_first_problem_in_reading_order_is_named(tmp_path: Path, text: str, message: str) -> None:
    refused = str(refusal(tmp_path, text))
    assert refused.startswith(f"{tmp_path}/{message}"), refused
    assert refused.count("fleet.yml") == 1  # one problem, not pydantic's list of them


def test_values_come_back_as_the_checks_want_them(tmp_path: Path) -> None:
    text = (
        "os.supported: ['Ubuntu 24.04']\ndriver.version: ' 580.159.04 '\ngpu.xid.ignore: [13]\n"
        "services.active: containerd\nhosts:\n  h1:\n    checks.skip: []\n    gpu.ecc: null\n"
    )
    policy = load_policy(write(tmp_path, text))
    assert policy.base == {
        "os.supported": ("ubuntu 24.04",),
        "driver.version": "580.159.04",
        "gpu.xid.ignore": (13,),
        "services.active": ("containerd",),
    }
    assert policy.hosts == {"h1": {"checks.skip": (), "gpu.ecc": None}}


def test_a_block_checked_on_its_own_names_its_place() -> None:
    from provisioner.policy import validate_expectations

    assert validate_expectations({"gpu.count": 4, "k8s.node": None}, "") == {"gpu.count": 4, "k8s.node": None}
    with pytest.raises(InputError, match=r"^groups\.a\.gpu\.count: expected a whole number"):
        validate_expectations({"gpu.count": "4"}, "groups.a")
    with pytest.raises(InputError, match=r"^policy: expected a mapping of policy keys, got list"):
        validate_expectations([1], "")


def test_pydantic_is_imported_only_to_read_a_policy() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import provisioner.policy, provisioner.verification; "
        "assert 'pydantic' not in sys.modules, 'imported early'; "
        "provisioner.policy.policy_from_mapping({'gpu.count': 1}); assert 'pydantic' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
