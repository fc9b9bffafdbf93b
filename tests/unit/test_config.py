from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.config import check_host_vars, load_role_specs, validate_inventory_settings
from provisioner.errors import InputError
from provisioner.inventory import load_inventory

SPEC = """
argument_specs:
  main:
    options:
      demo_flavor: {type: str, choices: [open, proprietary, auto]}
      demo_count: {type: int}
      demo_enabled: {type: bool}
      demo_packages: {type: list, elements: str}
      demo_branch: {type: str}
"""


def roles_dir(root: Path, role: str, spec: str) -> Path:
    """A roles directory holding one role with this meta/argument_specs.yml."""
    meta = root / role / "meta"
    meta.mkdir(parents=True)
    (meta / "argument_specs.yml").write_text(spec)
    return root


@pytest.fixture
def roles(tmp_path: Path) -> Path:
    return roles_dir(tmp_path / "roles", "demo", SPEC)


def problems(roles: Path, **hostvars: object) -> list[str]:
    specs = load_role_specs(roles)
    return [f"{p.key}: {p.message}" for p in check_host_vars("h1", dict(hostvars), specs)]


def test_good_values_pass(roles: Path) -> None:
    assert (
        problems(
            roles,
            demo_flavor="open",
            demo_count="3",
            demo_enabled="yes",
            demo_packages=["a"],
            demo_branch=580,
        )
        == []
    )


def test_templated_values_are_left_to_ansible(roles: Path) -> None:
    assert problems(roles, demo_count="{{ other }}") == []


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("demo_flavor", "opne", "'opne' is not one of: open, proprietary, auto"),
        ("demo_count", "many", "expected int"),
        ("demo_enabled", "maybe", "expected a boolean"),
        ("demo_packages", "a,b", "expected list"),
        ("demo_flavour", "open", "unknown setting for role demo; did you mean demo_flavor?"),
        ("gpuprov_mirror", "http://x", "unknown setting"),
        ("gpuprov_reboot_allowed", "perhaps", "expected a boolean"),
    ],
)
def test_bad_values_are_named(roles: Path, key: str, value: object, expect: str) -> None:
    (problem,) = problems(roles, **{key: value})
    assert problem.startswith(f"{key}: ")
    assert expect in problem


def test_unrelated_variables_are_ignored(roles: Path) -> None:
    assert problems(roles, ansible_host="1.2.3.4", my_site_var=1, lab_profile="h200") == []


def test_validate_names_the_file_that_sets_the_key(roles: Path, tmp_path: Path) -> None:
    (tmp_path / "inv" / "group_vars").mkdir(parents=True)
    (tmp_path / "inv" / "group_vars" / "gpu_nodes.yml").write_text("demo_flavor: closed\n")
    hosts_file = tmp_path / "inv" / "hosts.yml"
    hosts_file.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        g1: {}\n        g2: {}\n")
    inv = load_inventory(hosts_file)
    with pytest.raises(InputError) as err:
        validate_inventory_settings(inv, inv.select(None), load_role_specs(roles))
    message = str(err.value)
    assert "group_vars/gpu_nodes.yml: demo_flavor: 'closed' is not one of" in message
    assert "(host g1 (+1 more))" in message


def test_real_roles_specs_load() -> None:
    specs = load_role_specs()
    # every role with a spec claims its own prefix
    for role in specs.prefixes.values():
        assert (Path("roles") / role / "meta" / "argument_specs.yml").is_file()


# ArgumentSpecValidator does the checking; what it converts but the role would never see converted is
# refused (config.YAML_SHAPES), and it is built once per role, not once per host.
TYPED_SPEC = """
argument_specs:
  main:
    options:
      typed_ports: {type: list, elements: int}
      typed_options: {type: dict}
      typed_name: {type: str}
      typed_dir: {type: path}
      typed_any: {type: raw}
  upgrade:
    options:
      typed_extra: {type: bool}
"""


@pytest.fixture
def typed_roles(tmp_path: Path) -> Path:
    return roles_dir(tmp_path / "typed_roles", "typed", TYPED_SPEC)


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("typed_ports", [22, "ssh"], "typed_ports: expected a list of int, got [22, 'ssh']"),
        ("typed_ports", "22,23", "typed_ports: expected list, got string '22,23'"),
        ("typed_options", "a=1", "typed_options: expected dict, got string 'a=1'"),
        ("typed_name", ["a"], "typed_name: expected str, got list \"['a']\""),
        ("typed_name", True, "typed_name: expected str, got boolean 'True'"),
        ("typed_dir", 5, "typed_dir: expected path, got integer '5'"),
        ("typed_extra", "maybe", "typed_extra: expected a boolean, got 'maybe'"),
        ("typed_extar", True, "typed_extar: unknown setting for role typed; did you mean typed_extra?"),
    ],
)
def test_types_are_ansibles_but_conversions_the_role_never_sees_are_refused(
    typed_roles: Path, key: str, value: object, expect: str
) -> None:
    assert problems(typed_roles, **{key: value}) == [expect]


def test_every_entry_point_and_template_and_raw_value_passes(typed_roles: Path) -> None:
    assert (
        problems(
            typed_roles,
            typed_ports=[22, "23", "{{ extra_port }}"],
            typed_options={"a": 1},
            typed_name=580,
            typed_dir="/srv",
            typed_any=[{"x": None}],
            typed_extra="yes",  # the upgrade entry point's knob
        )
        == []
    )


def test_a_template_is_not_checked_but_an_unknown_key_still_is(roles: Path) -> None:
    assert problems(roles, demo_packages="{{ pkgs }}", demo_flavor="{{ flavor }}") == []
    assert problems(roles, demo_flavour="{{ flavor }}") == [
        "demo_flavour: unknown setting for role demo; did you mean demo_flavor?"
    ]


def test_one_validator_per_role_for_the_whole_fleet(
    roles: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ansible.module_utils.common import arg_spec

    specs = load_role_specs(roles)
    built: list[object] = []
    validated: list[object] = []
    monkeypatch.setattr(arg_spec.ArgumentSpecValidator, "__init__", lambda *a, **k: built.append(a))
    real_validate = arg_spec.ArgumentSpecValidator.validate
    monkeypatch.setattr(
        arg_spec.ArgumentSpecValidator,
        "validate",
        lambda self, params: validated.append(params) or real_validate(self, params),
    )
    (tmp_path / "fleet" / "group_vars").mkdir(parents=True)
    (tmp_path / "fleet" / "group_vars" / "all.yml").write_text("demo_flavor: open\ndemo_count: 3\n")
    hosts = "\n".join(f"        g{i}: {{demo_enabled: {'true' if i % 2 else 'false'}}}" for i in range(200))
    hosts_file = tmp_path / "fleet" / "hosts.yml"
    hosts_file.write_text(f"all:\n  children:\n    gpu_nodes:\n      hosts:\n{hosts}\n")
    inv = load_inventory(hosts_file)
    validate_inventory_settings(inv, inv.select(None), specs)
    assert built == []  # built by load_role_specs, once
    assert len(validated) <= 2  # hosts that set the same values are checked once


# ---- GPU sharing, MIG and tenant knobs (gpuprov_*: provisioner.config _gpu_setting_problems) --------
TS4 = {
    "version": "v1",
    "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
}
MPS2 = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}


def test_good_gpu_settings_pass(roles: Path) -> None:
    custom = {"version": "v1", "mig-configs": {"whole": [{"devices": "all", "mig-enabled": False}]}}
    tenants = [
        {"name": "team-a", "gpus": 8, "mig": {"1g.18gb": 4}, "max_gpus_per_pod": 2, "node_pool": "train"},
        {"name": "team-b", "namespace": "research-b", "gpus": 0},
    ]
    assert (
        problems(
            roles,
            gpuprov_gpu_sharing_profiles={"ts4": TS4, "mps2": MPS2},
            gpuprov_gpu_sharing="mps2",  # MPS on a host whose MIG config keeps MIG off
            gpuprov_mig_config="whole",
            gpuprov_mig_custom_configs=custom,
            gpuprov_mig_strategy="mixed",
            gpuprov_tenants=tenants,
            gpuprov_node_pool="train",
        )
        == []
    )


@pytest.mark.parametrize(
    ("hostvars", "key", "expect"),
    [
        ({"gpuprov_mig_strategy": "both"}, "gpuprov_mig_strategy", "'both' is not one of: single, mixed"),
        (
            {"gpuprov_gpu_sharing_profiles": {"ts": {"sharing": {"timeslicing": {}}}}},
            "gpuprov_gpu_sharing_profiles",
            "gpuprov_gpu_sharing_profiles.ts: sharing: unknown key 'timeslicing' (did you mean timeSlicing?)",
        ),
        (
            {"gpuprov_gpu_sharing_profiles": {"ts": TS4}, "gpuprov_gpu_sharing": "ts8"},
            "gpuprov_gpu_sharing",
            "'ts8' is no profile of gpuprov_gpu_sharing_profiles (none, ts)",
        ),
        (
            {"gpuprov_gpu_sharing_profiles": {"mps2": MPS2}, "gpuprov_gpu_sharing": "mps2",
             "gpuprov_mig_config": "all-1g.18gb"},
            "gpuprov_gpu_sharing",
            "MPS cannot share MIG-enabled GPUs",
        ),
        ({"gpuprov_gpu_sharing_profiles": {"none": TS4}}, "gpuprov_gpu_sharing_profiles", "own profile"),
        ({"gpuprov_mig_config": "all 1g"}, "gpuprov_mig_config", "is no Kubernetes label value"),
        (
            {"gpuprov_mig_custom_configs": {"version": "v1", "mig-configs": {"x": [{"devices": "all"}]}}},
            "gpuprov_mig_custom_configs",
            "mig-configs.x[0].mig-enabled: expected true or false",
        ),
        ({"gpuprov_tenants": [{"name": "Team A", "gpus": 1}]}, "gpuprov_tenants", "[0].name: expected"),
        ({"gpuprov_tenants": [{"name": "a", "gpus": -1}]}, "gpuprov_tenants", "[0].gpus: expected"),
        ({"gpuprov_tenants": [{"name": "a", "gpu": 1}]}, "gpuprov_tenants", "unknown key 'gpu'"),
        (
            {"gpuprov_tenants": [{"name": "a", "gpus": 1, "mig": {"1g.18gb": 1}}]},
            "gpuprov_tenants",
            "exist only under gpuprov_mig_strategy: mixed",
        ),
        (
            {"gpuprov_tenants": [{"name": "a", "gpus": 1}, {"name": "b", "namespace": "a", "gpus": 1}]},
            "gpuprov_tenants",
            "[1].namespace: 'a' is declared twice",
        ),
        ({"gpuprov_tenants": {"name": "a"}}, "gpuprov_tenants", "expected list, got mapping"),
    ],
)  # fmt: skip
def test_bad_gpu_settings_are_named(roles: Path, hostvars: dict[str, object], key: str, expect: str) -> None:
    found = problems(roles, **hostvars)
    assert len(found) == 1, found
    assert found[0].startswith(f"{key}: ") and expect in found[0], found[0]


def test_mps_on_a_mig_host_names_the_file_and_host(roles: Path, tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "group_vars" / "all.yml").write_text(
        "gpuprov_gpu_sharing_profiles:\n  mps2:\n    sharing:\n      mps:\n        resources:\n"
        "          - {name: gpu, replicas: 2}\n"
    )
    (inv / "host_vars" / "g2.yml").write_text("gpuprov_gpu_sharing: mps2\ngpuprov_mig_config: all-balanced\n")
    hosts_file = inv / "hosts.yml"
    hosts_file.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        g1: {}\n        g2: {}\n")
    inventory = load_inventory(hosts_file)
    with pytest.raises(InputError) as err:
        validate_inventory_settings(inventory, inventory.select(None), load_role_specs(roles))
    message = str(err.value)
    assert str(inv / "host_vars" / "g2.yml") in message and "(host g2)" in message
    assert (
        "gpuprov_gpu_sharing: gpuprov_gpu_sharing_profiles.mps2: MPS cannot share MIG-enabled GPUs" in message
    )
