"""Files an operator hands gpuprov (inventories, group_vars/host_vars, policies, ssh_config) and the
settings inside them: bounded, parsed strictly, typed, and judged before any host is contacted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from provisioner import sharing, tenants
from provisioner.config import _gpu_setting_problems, load_role_specs, validate_inventory_settings
from provisioner.content import role_default
from provisioner.errors import InputError
from provisioner.inventory import load_inventory
from provisioner.policy import load_policy
from provisioner.yamlfile import MAX_DEPTH, MAX_FILE_BYTES, read_operator_file

HOSTS = "all:\n  hosts:\n    gpu1: {ansible_host: 192.0.2.1}\n"
# 10^7 list elements from seven short lines: every walk of the value pays for all of them.
ALIAS_BOMB = (
    "".join(
        f"{name}: &{name} [{', '.join([f'*{prev}'] * 10) if prev else ', '.join(['x'] * 10)}]\n"
        for prev, name in zip(["", "a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e", "f"], strict=True)
    )
    + "nvidia_driver_bomb: [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
)


def inventory(tmp_path: Path, hosts: str = HOSTS, **group_vars: str) -> Path:
    """An inventory directory: hosts.yml and group_vars/<name>.yml for each keyword."""
    (tmp_path / "group_vars").mkdir(exist_ok=True)
    for name, text in group_vars.items():
        (tmp_path / "group_vars" / f"{name}.yml").write_text(text)
    path = tmp_path / "hosts.yml"
    path.write_text(hosts)
    return path


# ----------------------------------------------------------------------------------- reading a file


def test_a_fifo_a_device_and_a_directory_are_refused_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "policy.yml"
    os.mkfifo(fifo)
    for path, kind in (
        (fifo, "a FIFO"),
        (Path("/dev/zero"), "a character device"),
        (tmp_path, "a directory"),
    ):
        with pytest.raises(InputError, match=f"^{path}: policy file: {kind}, not a regular file$"):
            read_operator_file(path, "policy file")


def test_a_file_over_the_cap_is_refused_saying_the_cap(tmp_path: Path) -> None:
    big = tmp_path / "hosts.yml"
    big.write_text("# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    with pytest.raises(
        InputError, match=r"inventory file of \d+ bytes: gpuprov reads at most 4 MiB of one file"
    ):
        load_inventory(big)
    assert MAX_FILE_BYTES == 4 * 1024 * 1024


def test_nul_bytes_and_other_encodings_are_no_text(tmp_path: Path) -> None:
    path = tmp_path / "policy.yml"
    path.write_bytes(b"gpu.count: 8\n\x00")
    with pytest.raises(InputError, match=r"not a text file \(byte 13 is NUL\)"):
        load_policy(path)
    path.write_bytes("gpu.count: 8 # é\n".encode("latin-1"))
    with pytest.raises(InputError, match="not a text file"):
        load_policy(path)


def test_a_deeply_nested_policy_is_refused_before_the_parser_recurses(tmp_path: Path) -> None:
    path = tmp_path / "policy.yml"
    path.write_text("gpu.xid.ignore: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(InputError) as exc:
        load_policy(path)
    assert str(exc.value) == f"{path}: line 1 nested deeper than {MAX_DEPTH} levels of mappings and lists"


def test_nesting_up_to_the_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    deep = "[" * (MAX_DEPTH - 4) + "]" * (MAX_DEPTH - 4)
    path.write_text(f"all:\n  hosts:\n    gpu1: {{ansible_host: 192.0.2.1, nested: {deep}}}\n")
    assert [h.name for h in load_inventory(path).select(None)] == ["gpu1"]


@pytest.mark.parametrize(
    ("text", "why"),
    [("when: 2026-13-45\n", "month must be in 1..12"), ("big: " + "9" * 5000 + "\n", "integer string")],
)
def test_a_scalar_python_cannot_build_is_bad_input(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "policy.yml"
    path.write_text(text)
    with pytest.raises(InputError, match=f"^{path}: not valid YAML: .*{why}"):
        load_policy(path)


def test_an_ssh_config_that_is_a_fifo_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.executors import load_ssh_config

    config = tmp_path / "ssh_config"
    os.mkfifo(config)
    monkeypatch.setenv("GPUPROV_SSH_CONFIG", str(config))
    with pytest.raises(InputError, match="ssh config: a FIFO, not a regular file"):
        load_ssh_config()
    monkeypatch.setenv("GPUPROV_SSH_CONFIG", os.devnull)
    assert load_ssh_config() is not None  # the usual "no config" stays allowed


# ------------------------------------------------------------------------------------- inventories


@pytest.mark.parametrize("where", ["group_vars", "hosts"])
def test_aliases_are_refused_in_an_inventory_and_its_group_vars(tmp_path: Path, where: str) -> None:
    if where == "hosts":
        path = inventory(
            tmp_path,
            hosts="all:\n  vars:\n"
            + "".join("    " + ln + "\n" for ln in ALIAS_BOMB.splitlines())
            + HOSTS[5:],
        )
    else:
        path = inventory(tmp_path, all=ALIAS_BOMB)
    bad = path if where == "hosts" else tmp_path / "group_vars" / "all.yml"
    with pytest.raises(InputError, match=rf"^{bad}:\d+:\d+: alias \*a \(aliases are not allowed here\)$"):
        load_inventory(path)


def test_repeated_keys_are_refused_with_both_lines(tmp_path: Path) -> None:
    hosts = "all:\n  hosts:\n    gpu1:\n      ansible_host: 192.0.2.1\n      ansible_host: 192.0.2.99\n"
    with pytest.raises(InputError, match=r"hosts.yml:5:7: duplicate key 'ansible_host' \(first on line 4\)$"):
        load_inventory(inventory(tmp_path, hosts=hosts))
    path = inventory(tmp_path, gpu_nodes="nvidia_driver_branch: '580'\ngpus: 4\ngpus: 400\n")
    with pytest.raises(
        InputError, match=r"group_vars/gpu_nodes.yml:3:1: duplicate key 'gpus' \(first on line 2\)"
    ):
        load_inventory(path)


def test_repeated_keys_in_host_vars_directories_are_refused(tmp_path: Path) -> None:
    path = inventory(tmp_path)
    (tmp_path / "host_vars" / "gpu1").mkdir(parents=True)
    (tmp_path / "host_vars" / "gpu1" / "gpus").write_text("gpus: 4\ngpus: 400\n")
    with pytest.raises(InputError, match=r"host_vars/gpu1/gpus:2:1: duplicate key 'gpus'"):
        load_inventory(path)


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        (
            "[gpu_nodes]\ngpu1 ansible_host=192.0.2.1 gpus=4 gpus=400\n",
            2,
            "'gpus' for host gpu1 (first on line 2)",
        ),
        (
            "[gpu_nodes]\ngpu1 gpus=4\n[gpu_nodes:vars]\nx=1\n[gpu_nodes]\ngpu1 gpus=400\n",
            6,
            "'gpus' for host gpu1",
        ),
        (
            "[gpu_nodes]\ngpu1\n[gpu_nodes:vars]\nx = 1\ny=2\nx=3\n",
            6,
            "'x' for [gpu_nodes:vars] (first on line 4)",
        ),
    ],
)
def test_repeated_keys_in_an_ini_inventory_are_refused(
    tmp_path: Path, text: str, line: int, why: str
) -> None:
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        load_inventory(path)
    assert str(exc.value).startswith(f"{path}:{line}: duplicate key {why}"), exc.value


def test_an_ini_inventory_that_sets_each_key_once_is_read(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("[gpu_nodes]\ngpu1 ansible_host=192.0.2.1 gpus=4\ngpu2 gpus=4\n[all:vars]\ngpus=8\n")
    inv = load_inventory(path)
    assert inv.host_vars("gpu1")["gpus"] == 4


def test_ansible_tags_and_vaulted_files_stay_opaque(tmp_path: Path) -> None:
    vault = "$ANSIBLE_VAULT;1.1;AES256\n  6162\n"
    path = inventory(
        tmp_path,
        all=f"secret: !vault |\n  {vault}plain: !unsafe '{{{{ not templated }}}}'\n",
        gpu_nodes=vault.replace("  ", ""),
    )
    assert [h.name for h in load_inventory(path).select(None)] == ["gpu1"]


@pytest.mark.parametrize(
    ("hosts", "why"),
    [
        ("- gpu1\n", "a YAML inventory is a mapping of groups (all: ...), got list ['gpu1']"),
        ("all: [gpu1]\n", "all: expected a group (hosts, vars, children), got list ['gpu1']"),
        ("all:\n  hosts: [gpu1]\n", "all.hosts: expected a mapping, got list ['gpu1']"),
        ("all:\n  host:\n    gpu1: {}\n", "all.host: unknown key; a group has hosts, vars, children"),
        (
            "all:\n  children:\n    gpu_nodes:\n      hosts:\n        gpu1: 4\n",
            "all.children.gpu_nodes.hosts.gpu1: expected the host's variables (a mapping), got integer 4",
        ),
    ],
)
def test_a_misshapen_yaml_inventory_names_the_group_and_key(tmp_path: Path, hosts: str, why: str) -> None:
    path = inventory(tmp_path, hosts=hosts)
    with pytest.raises(InputError) as exc:
        load_inventory(path)
    assert str(exc.value) == f"{path}: {why}"


def test_group_vars_that_are_not_variables_are_refused(tmp_path: Path) -> None:
    path = inventory(tmp_path, gpu_nodes="- gpus: 4\n")
    with pytest.raises(
        InputError, match=r"gpu_nodes.yml: expected variables \(a mapping of names to values\)"
    ):
        load_inventory(path)


def test_a_connection_variable_must_be_one_value(tmp_path: Path) -> None:
    path = inventory(tmp_path, all="ansible_ssh_common_args: ['-o', 'ConnectTimeout=1']\n")
    with pytest.raises(InputError) as exc:
        load_inventory(path).select(None)
    where = tmp_path / "group_vars" / "all.yml"
    assert str(exc.value).startswith(f"{where}: ansible_ssh_common_args: expected a single value, got list")


def test_unsafe_files_anywhere_ansible_reads_are_refused(tmp_path: Path) -> None:
    path = inventory(tmp_path)
    (tmp_path / "group_vars" / "gpu_nodes.yml").symlink_to("/dev/zero")
    with pytest.raises(InputError, match=r"gpu_nodes\.yml: inventory file: a character device"):
        load_inventory(path)
    (tmp_path / "group_vars" / "gpu_nodes.yml").unlink()
    os.mkfifo(tmp_path / "host_vars")  # not a directory: Ansible does not look into it
    os.mkfifo(tmp_path / "extra.yml")
    with pytest.raises(InputError, match=r"extra\.yml: inventory file: a FIFO"):
        load_inventory(tmp_path)  # the directory itself as the inventory
    (tmp_path / "extra.yml").unlink()
    (tmp_path / "notes.md").write_bytes(b"\x00")  # ignored by Ansible in an inventory directory
    (tmp_path / "group_vars" / "loop").symlink_to(tmp_path / "group_vars")
    assert [h.name for h in load_inventory(tmp_path).select(None)] == ["gpu1"]


# ------------------------------------------------------------------------------- sharing profiles


def ts(**resource: Any) -> dict[str, Any]:
    return {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "gpu", **resource}]}}}


@pytest.mark.parametrize("replicas", [1025, 10**9])
def test_replicas_are_bounded_as_the_policy_bounds_them(replicas: int) -> None:
    with pytest.raises(InputError, match=rf"replicas: {replicas} is more than 1024 replicas per GPU"):
        sharing.parse_document(ts(replicas=replicas), "p")
    assert sharing.parse_document(ts(replicas=1024), "p").resources[0].replicas == 1024


@pytest.mark.parametrize("index", ["٣", "²", "3:٣", "99999", "1:99999"])
def test_device_indices_are_ascii_digits_nvidia_smi_could_print(index: str) -> None:
    with pytest.raises(InputError, match=r"devices\[0\]: .* is no GPU index"):
        sharing.parse_document(ts(replicas=2, devices=[index]), "p")


def test_shared_devices_count_only_ascii_indices() -> None:
    config = sharing.SharingConfig(
        "time-slicing", (sharing.SharedResource("nvidia.com/gpu", "", ("1", "²"), 2),)
    )
    assert config.allocatable(2) == {"nvidia.com/gpu": 4}


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ({"sharing": ["timeSlicing"]}, "sharing: expected a mapping with timeSlicing or mps, got list"),
        (
            {"sharing": {"timeSlicing": {"resources": "gpu"}}},
            "resources: expected a list of resources, got string",
        ),
        ({"sharing": {"timeSlicing": [1]}}, "sharing.timeSlicing: expected a mapping, got list [1]"),
        (ts(replicas=[4]), "replicas: expected a whole number of replicas (2-1024), got list [4]"),
        (
            ts(replicas=2, devices=True),
            "devices: expected all, a count or a list of devices, got boolean True",
        ),
        (ts(replicas=2, devices=10**6), "a count of devices must be more than 0 and at most 4096"),
        (
            ts(replicas=2, name=["gpu"]),
            "name: expected a resource name such as gpu or nvidia.com/gpu, got list",
        ),
    ],
)
def test_sharing_types_are_named_with_what_was_given(doc: dict[str, Any], why: str) -> None:
    with pytest.raises(InputError) as exc:
        sharing.parse_document(doc, "gpuprov_gpu_sharing_profiles.p")
    assert why in str(exc.value) and str(exc.value).startswith("gpuprov_gpu_sharing_profiles.p: ")


@pytest.mark.parametrize(
    ("hostvars", "key", "why"),
    [
        (
            {"gpuprov_gpu_sharing": ["ts4"]},
            "gpuprov_gpu_sharing",
            "expected a profile name, got list ['ts4']",
        ),
        ({"gpuprov_gpu_sharing": {"ts4": 1}}, "gpuprov_gpu_sharing", "expected a profile name, got mapping"),
        (
            {"gpuprov_gpu_sharing_profiles": {"ts4": [ts(replicas=4)]}, "gpuprov_gpu_sharing": "ts4"},
            "gpuprov_gpu_sharing_profiles",
            "ts4: a device plugin config is a mapping",
        ),
    ],
)
def test_a_sharing_setting_of_the_wrong_type_is_a_problem_not_a_crash(
    hostvars: dict[str, Any], key: str, why: str
) -> None:
    problems = _gpu_setting_problems(hostvars)
    assert any(k == key and why in text for k, text in problems), problems


# ----------------------------------------------------------------------------------------- tenants


@pytest.mark.parametrize("namespace", [*tenants.SYSTEM_NAMESPACES, "gpu-operator"])
def test_a_tenant_in_the_clusters_own_namespace_is_refused(namespace: str) -> None:
    with pytest.raises(InputError, match=rf"gpuprov_tenants\[0\]\.name: '{namespace}' is "):
        tenants.parse_tenants([{"name": namespace, "gpus": 1}], "gpuprov_tenants")
    with pytest.raises(InputError, match=rf"gpuprov_tenants\[0\]\.namespace: '{namespace}' is "):
        tenants.parse_tenants([{"name": "team-a", "namespace": namespace, "gpus": 1}], "gpuprov_tenants")


def test_the_operators_namespace_is_the_inventorys_or_the_roles_default() -> None:
    assert role_default("gpu_operator", "gpu_operator_namespace") == tenants.DEFAULT_OPERATOR_NAMESPACE
    moved = {"gpu_operator_namespace": "nvidia", "gpuprov_tenants": [{"name": "nvidia", "gpus": 2}]}
    assert any("GPU Operator's namespace" in why for _, why in _gpu_setting_problems(moved))
    moved["gpuprov_tenants"] = [{"name": "gpu-operator", "gpus": 2}]  # free once the operator moved
    assert _gpu_setting_problems(moved) == []


def test_the_roles_own_tenant_list_is_checked_too() -> None:
    problems = _gpu_setting_problems({"gpu_tenants_list": [{"name": "kube-system", "gpus": 1}]})
    assert problems and problems[0][0] == "gpu_tenants_list" and "Kubernetes' own namespace" in problems[0][1]


@pytest.mark.parametrize(
    ("tenant", "why"),
    [
        (
            {"name": ["a"], "gpus": 1},
            ".name: expected a namespace-style name (a-z, 0-9, '-'), got list ['a']",
        ),
        ({"name": "a", "mig": [1]}, ".mig: expected a mapping of MIG profile → count, got list [1]"),
        (
            {"name": "a", "mig": {"1g.18gb": "2"}},
            ".mig.1g.18gb: expected a whole number from 0 to 100000, got string '2'",
        ),
        ("team-a", ": expected a mapping (keys: name, namespace"),
    ],
)
def test_tenant_types_are_named_with_what_was_given(tenant: Any, why: str) -> None:
    with pytest.raises(InputError) as exc:
        tenants.parse_tenants([tenant], "gpuprov_tenants")
    assert str(exc.value).startswith("gpuprov_tenants[0]") and why in str(exc.value)


# --------------------------------------------------------------------------------------- MIG layouts


def custom(entry: dict[str, Any]) -> dict[str, Any]:
    return {"gpuprov_mig_custom_configs": {"version": "v1", "mig-configs": {"mine": [entry]}}}


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (
            {"mig-devices": {"3g.99gb": 1}},
            "mig-configs.mine[0]: no GPU gpuprov knows (NVIDIA A100-SXM4-40GB, ",
        ),
        ({"mig-devices": {"9g.99gb": 1}}, "has MIG profile '9g.99gb'"),
        ({"mig-devices": {"1g.18gb": 100}}, "NVIDIA H200 141GB holds at most 7 × 1g.18gb, not 100"),
        ({"mig-devices": {"3g.71gb": 2, "2g.35gb": 1}}, "need 8 compute and 10 memory slices"),
        ({"mig-devices": {"3g.71gb": 1, "3g.40gb": 1}}, "no GPU has every profile of 3g.40gb, 3g.71gb"),
        (
            {"device-filter": "0x20B010DE", "mig-devices": {"1g.18gb": 1}},
            "(NVIDIA A100-SXM4-40GB) has MIG profile",
        ),
        ({"mig-devices": {"1g.18gb": 10**9}}, "mig-devices.1g.18gb: expected a count from 0 to 4095"),
        ({"mig-devices": {"1g.18gb": True}}, "expected a count from 0 to 4095, got boolean True"),
        ({"mig-devices": [{"1g.18gb": 1}]}, "mig-devices: expected profile name → count, got list"),
        ({"mig-devices": {"big": 1}}, "mig-devices: string 'big' is no MIG profile"),
        ({"devices": [True], "mig-devices": {}}, "devices: expected `all` or a list of GPU indices (0-4095)"),
    ],
)
def test_a_layout_no_gpu_can_hold_is_judged_offline(entry: dict[str, Any], why: str) -> None:
    problems = _gpu_setting_problems(custom({"devices": "all", "mig-enabled": True, **entry}))
    assert [k for k, _ in problems] == ["gpuprov_mig_custom_configs"] and why in problems[0][1], problems


@pytest.mark.parametrize(
    "entry",
    [
        {"mig-devices": {"3g.71gb": 2}},  # an H200's
        {"mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},  # an H100's or an A100 80GB's
        {"device-filter": "0x2B8510DE", "mig-devices": {"1g.23gb": 7}},  # a GPU without a table here
        {"mig-enabled": False, "mig-devices": {}},
    ],
)
def test_layouts_some_gpu_holds_pass(entry: dict[str, Any]) -> None:
    assert _gpu_setting_problems(custom({"devices": "all", "mig-enabled": True, **entry})) == []


def test_mig_apply_judges_layouts_before_contacting_anything(tmp_path: Path) -> None:
    from provisioner.migapply.verb import run_mig_apply

    hosts = (
        "all:\n  children:\n    kube_control_plane:\n      hosts: {cp1: {ansible_host: 192.0.2.10}}\n"
        "    gpu_nodes:\n      vars: {gpuprov_mig_strategy: mixed, gpuprov_mig_config: mine}\n"
        "      hosts: {gpu1: {ansible_host: 192.0.2.11}}\n"
    )
    layout = "gpuprov_mig_custom_configs:\n  version: v1\n  mig-configs:\n    mine:\n      - devices: all\n"
    layout += "        mig-enabled: true\n        mig-devices: {'1g.18gb': 9}\n"
    path = inventory(tmp_path, hosts=hosts, all=layout)

    def no_fleet(**kw: Any) -> Any:
        raise AssertionError("a fleet was made: hosts would be contacted")

    with pytest.raises(InputError, match=r"holds at most 7 × 1g\.18gb, not 9"):
        run_mig_apply(inventory=path, dry_run=True, fleet_factory=no_fleet)


def test_validation_names_the_file_of_a_bad_layout(tmp_path: Path) -> None:
    layout = "gpuprov_mig_custom_configs:\n  version: v1\n  mig-configs:\n    mine:\n      - devices: all\n"
    layout += "        mig-enabled: true\n        mig-devices: {'3g.99gb': 1}\n"
    path = inventory(tmp_path, all=layout)
    inv = load_inventory(path)
    with pytest.raises(InputError, match=rf"{tmp_path}/group_vars/all.yml: gpuprov_mig_custom_configs: "):
        validate_inventory_settings(inv, inv.select(None), load_role_specs())


# --------------------------------------------------------------------------------- check mode's words


def test_check_mode_never_says_nothing_would_change_of_a_host_it_could_not_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.playbookverb.day2 import run_day2
    from provisioner.playbookverb.render import change_lines
    from provisioner.playbookverb.run import RunControls
    from provisioner.runner import Failure, HostStats, PlaybookResult

    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    hosts = "all:\n  children:\n    kube_control_plane:\n      hosts: {cp1: {ansible_host: 192.0.2.10}}\n"

    def unreachable(*args: Any, **kw: Any) -> PlaybookResult:
        why = "ssh: connect to host 192.0.2.10 port 22: No route to host"
        return PlaybookResult(
            "failed",
            4,
            stats={"cp1": HostStats("cp1", unreachable=1)},
            failures=[Failure("cp1", "Facts", "Gathering Facts", why, unreachable=True)],
        )

    monkeypatch.setattr("provisioner.runner.run_playbook", unreachable)
    controls = RunControls(check=True, assume_yes=False, forks=1)
    result = run_day2("tenants", inventory=inventory(tmp_path, hosts=hosts), controls=controls)
    assert result.exit_code != 0 and result.summary is not None
    assert result.summary["hosts"][0]["status"] == "unreachable"
    assert result.summary["changes"] == {}  # no empty list that reads as "no change"
    lines = change_lines(result.summary["changes"], result.summary["hosts"])
    assert lines == ["cp1: could not be reached: what would change there is unknown"]
