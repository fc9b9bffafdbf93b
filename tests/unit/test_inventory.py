from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.inventory import _ssh_options, load_inventory

YAML_INV = """
all:
  vars:
    ansible_user: admin
    lab_dir: /srv/lab
    ansible_ssh_common_args: "-o UserKnownHostsFile={{ lab_dir }}/known_hosts -o StrictHostKeyChecking=yes"
  children:
    k8s_cluster:
      children:
        kube_control_plane:
          hosts:
            cp1: {ansible_host: 10.9.0.2}
        gpu_nodes:
          hosts:
            gpu1: {ansible_host: 10.9.0.3, ansible_port: 2222, ansible_ssh_private_key_file: ~/.ssh/k}
"""


@pytest.fixture
def yaml_inventory(tmp_path: Path) -> Path:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu_nodes.yml").write_text("nvidia_driver_branch: '580'\n")
    inv = tmp_path / "hosts.yml"
    inv.write_text(YAML_INV)
    return inv


def test_yaml_inventory_hosts_groups_and_connection(yaml_inventory: Path) -> None:
    inv = load_inventory(yaml_inventory)
    hosts = {h.name: h for h in inv.select(None)}
    assert set(hosts) == {"cp1", "gpu1"}
    gpu1 = hosts["gpu1"]
    assert (gpu1.address, gpu1.port, gpu1.user) == ("10.9.0.3", 2222, "admin")
    assert gpu1.private_key_file == Path("~/.ssh/k").expanduser()
    # templated ssh args are rendered like Ansible would
    assert gpu1.known_hosts_file == Path("/srv/lab/known_hosts")
    assert gpu1.strict_host_key_checking is True
    assert gpu1.groups == ["gpu_nodes", "k8s_cluster"]
    assert gpu1.vars["nvidia_driver_branch"] == "580"  # group_vars next to the inventory
    assert "nvidia_driver_branch" not in hosts["cp1"].vars


def test_limit_patterns(yaml_inventory: Path) -> None:
    inv = load_inventory(yaml_inventory)
    assert [h.name for h in inv.select("gpu_nodes")] == ["gpu1"]
    assert [h.name for h in inv.select("k8s_cluster:!gpu1")] == ["cp1"]
    assert inv.select("nosuchhost") == []


def test_ini_inventory(tmp_path: Path) -> None:
    ini = tmp_path / "hosts.ini"
    ini.write_text(
        "[gpu_nodes]\nnode-a ansible_host=192.0.2.10 ansible_ssh_common_args='-o StrictHostKeyChecking=no'\n"
    )
    (host,) = load_inventory(ini).select(None)
    assert (host.name, host.address, host.strict_host_key_checking) == ("node-a", "192.0.2.10", False)
    assert host.known_hosts_file is None


@pytest.mark.parametrize(
    "content",
    ["[gpu]\nh1 ansible_host=1.2.3.4\n[[broken\n", "all:\n  hosts: [unclosed\n"],
)
def test_unparsable_inventory_is_input_error_naming_file(tmp_path: Path, content: str) -> None:
    bad = tmp_path / ("bad.ini" if content.startswith("[") else "bad.yml")
    bad.write_text(content)
    with pytest.raises(InputError, match=str(bad)):
        load_inventory(bad)


def test_missing_inventory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="inventory not found"):
        load_inventory(tmp_path / "nope.yml")


def test_bad_port_names_host(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    h1: {ansible_port: twenty}\n")
    with pytest.raises(InputError, match="h1: ansible_port 'twenty'"):
        load_inventory(inv).select(None)


def test_ssh_option_forms() -> None:
    opts = _ssh_options("-o UserKnownHostsFile=/a -oStrictHostKeyChecking=no -o ConnectTimeout 5")
    assert opts == {"userknownhostsfile": "/a", "stricthostkeychecking": "no", "connecttimeout": "5"}


@pytest.mark.parametrize("name", ["x,gpu2", "gpu*", "a:b", "!gpu1", "&gpu1", "~gpu.*", "gpu 1", "-l=x"])
def test_a_host_name_that_is_an_ansible_pattern_is_refused(tmp_path: Path, name: str) -> None:
    """Host names reach Ansible as --limit patterns: a name that is itself a pattern would select
    other hosts (a batch that did not cordon gpu2 would upgrade it)."""
    inv = tmp_path / "hosts.yml"
    hosts = f'    gpu2: {{ansible_host: 10.9.0.4}}\n    "{name}": {{ansible_host: 10.9.0.3}}\n'
    inv.write_text("all:\n  hosts:\n" + hosts)
    with pytest.raises(InputError) as exc:
        load_inventory(inv)
    assert str(inv) in str(exc.value) and "may hold only letters, digits" in str(exc.value)


def test_a_playbook_limited_to_hosts_runs_on_exactly_those(tmp_path: Path) -> None:
    """The hosts of a batch go to Ansible as a limit file, one name per line."""
    from provisioner.runner import run_playbook

    inv = tmp_path / "hosts.yml"
    names = ["gpu1", "gpu2", "gpu10", "gpu1.example"]
    inv.write_text("all:\n  hosts:\n" + "".join(f"    {n}: {{ansible_connection: local}}\n" for n in names))
    play = tmp_path / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n")
    record = tmp_path / "record"
    record.mkdir()
    result = run_playbook(play, inv, record_dir=record, hosts=["gpu1", "gpu1.example"])
    assert sorted(result.stats) == ["gpu1", "gpu1.example"]
    assert (record / "limit-hosts.txt").read_text() == "gpu1\ngpu1.example\n"


def test_a_broken_yaml_inventory_names_its_line_not_the_ini_fallback(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 1.2.3.4\n    gpu2:\n")
    with pytest.raises(InputError, match=rf"^{inv}:4:9: not valid YAML"):
        load_inventory(inv)


def test_a_broken_group_vars_file_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    bad = tmp_path / "group_vars" / "all.yml"
    bad.write_text('nvidia_driver_branch: "580"\n  bad: [\n')
    vault = tmp_path / "group_vars" / "gpu_nodes.yml"
    vault.write_text("secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 192.0.2.1}\n")
    with pytest.raises(InputError, match=rf"^{bad}:2:3: not valid YAML"):
        load_inventory(inv)
    bad.write_text('nvidia_driver_branch: "580"\n')
    assert [h.name for h in load_inventory(inv).select(None)] == ["gpu1"]
