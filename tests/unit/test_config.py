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


@pytest.fixture
def roles(tmp_path: Path) -> Path:
    meta = tmp_path / "roles" / "demo" / "meta"
    meta.mkdir(parents=True)
    (meta / "argument_specs.yml").write_text(SPEC)
    return tmp_path / "roles"


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
