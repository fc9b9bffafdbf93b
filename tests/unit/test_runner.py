"""ansible-runner integration: typed results from events, on a local-connection playbook."""

from __future__ import annotations

import sys

import pytest

from provisioner.runner import run_playbook

PLAYBOOK = """
- name: preflight
  hosts: all
  gather_facts: false
  tasks:
    - name: Look around
      ansible.builtin.command: "true"
      changed_when: false
- name: nvidia_driver
  hosts: all
  gather_facts: false
  tasks:
    - name: Change something
      ansible.builtin.command: "true"
      changed_when: true
    - name: The new driver needs a reboot
      ansible.builtin.set_fact:
        nvidia_driver_reboot_pending: true
      when: inventory_hostname == 'alpha'
    - name: REBOOT PENDING - a task name alone reports nothing
      ansible.builtin.debug:
        msg: pending
      when: inventory_hostname != 'alpha'
    - name: Break on beta
      ansible.builtin.fail:
        msg: "package install failed on {{ inventory_hostname }}"
      when: inventory_hostname == 'beta'
- name: cuda_toolkit
  hosts: all
  gather_facts: false
  tasks:
    - name: Later stage
      ansible.builtin.command: "true"
      changed_when: false
"""

INVENTORY = """
all:
  vars:
    ansible_python_interpreter: {python}
  hosts:
    alpha: {ansible_connection: local}
    beta: {ansible_connection: local}
    gamma: {ansible_host: 192.0.2.1, ansible_connection: ssh, ansible_ssh_common_args: "-o ConnectTimeout=2"}
"""


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("runner")
    (d / "site.yml").write_text(PLAYBOOK)
    (d / "hosts.yml").write_text(INVENTORY.replace("{python}", sys.executable))
    events = []
    secret = {"GPUPROV_TEST_CLOUD_TOKEN": "s3cret-token-value", "SSH_AUTH_SOCK": "/tmp/agent.sock"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in secret.items():
            mp.setenv(key, value)
        res = run_playbook(
            d / "site.yml", d / "hosts.yml", record_dir=d / "record", forks=3, on_event=events.append
        )
    return res, events, d


def test_stats_per_host(result) -> None:
    res, _, _ = result
    assert res.status == "failed"
    assert res.stats["alpha"].changed == 1 and res.stats["alpha"].failed == 0
    assert res.stats["beta"].failed == 1
    assert res.stats["gamma"].unreachable == 1


def test_stage_outcomes_and_failure_reasons(result) -> None:
    res, _, _ = result
    assert res.stages["alpha"] == {"preflight": "ok", "nvidia_driver": "changed", "cuda_toolkit": "ok"}
    assert res.stages["beta"]["nvidia_driver"] == "failed"
    assert "cuda_toolkit" not in res.stages["beta"]  # a failed host stops
    (beta,) = [f for f in res.failures if f.host == "beta"]
    assert (beta.stage, beta.task) == ("nvidia_driver", "Break on beta")
    assert beta.message == "package install failed on beta"
    (gamma,) = [f for f in res.failures if f.host == "gamma"]
    assert gamma.unreachable and gamma.stage == "preflight"
    assert res.failed_hosts() == ["beta", "gamma"]


def test_reboot_pending_only_where_the_task_ran(result) -> None:
    res, _, _ = result
    assert res.reboot_pending == {"alpha"}


def test_events_stream_and_record(result) -> None:
    _, events, d = result
    assert [e.stage for e in events if e.kind == "play_start"] == [
        "preflight",
        "nvidia_driver",
        "cuda_toolkit",
    ]
    assert (d / "record" / "stats.json").is_file()
    assert list((d / "record" / "runner" / "artifacts").rglob("job_events/*.json"))


def test_the_record_keeps_no_secrets_and_is_private(result) -> None:
    """ansible-runner stores the caller's environment next to the command: only the allow-list stays
    (SSH_AUTH_SOCK, proxies, ANSIBLE_* explain a run; tokens do not), and the record is owner-only."""
    import json
    import os
    import stat

    _, _, d = result
    record = d / "record"
    for command in (record / "runner" / "artifacts").glob("*/command"):
        text = command.read_text()
        assert "s3cret-token-value" not in text and "GPUPROV_TEST_CLOUD_TOKEN" not in text
        env = json.loads(text)["env"]
        assert env["SSH_AUTH_SOCK"] == "/tmp/agent.sock" and "ANSIBLE_CONFIG" in env
    for dirpath, _dirs, files in os.walk(record):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for name in files:
            path = os.path.join(dirpath, name)
            assert os.path.islink(path) or stat.S_IMODE(os.stat(path).st_mode) == 0o600, path


def test_a_failed_commands_reason_is_its_own_last_words() -> None:
    """ansible.builtin.command says only "non-zero return code": the summary shows the command's exit
    status and the last line it wrote to stderr instead (helm names the conflicting field there)."""
    from provisioner.runner import _message

    res = {
        "msg": "non-zero return code",
        "rc": 1,
        "stdout": "",
        "stderr": 'level=WARN msg="upgrade failed"\n'
        'Error: UPGRADE FAILED: conflict with "kubectl-patch": .spec.cdi.enabled',
    }
    assert _message(res) == 'exit 1: Error: UPGRADE FAILED: conflict with "kubectl-patch": .spec.cdi.enabled'
    assert _message({"msg": "non-zero return code", "rc": 2, "stderr": "", "stdout": "only stdout\n"}) == (
        "exit 2: only stdout"
    )
    # Nothing better to say: the module's own message stays; other modules' messages are kept as they are.
    assert (
        _message({"msg": "non-zero return code", "rc": 3, "stderr": "", "stdout": ""})
        == "non-zero return code"
    )
    assert _message({"msg": "Could not find the package", "stderr": "E: x"}) == "Could not find the package"


def test_a_loops_changed_items_each_show_under_their_label() -> None:
    """check mode's list of changes: a loop's result carries its diffs per item, not at the top."""
    from provisioner.runner import _diff_text

    res = {
        "changed": True,
        "results": [
            {
                "changed": True,
                "_ansible_item_label": "/etc/fstab",
                "diff": {"before": "# swap off\n", "after": "/dev/sda2 none swap sw 0 0\n"},
            },
            {"changed": False, "_ansible_item_label": "/etc/hosts", "diff": {"before": "a", "after": "b"}},
            {"changed": True, "item": "containerd"},
        ],
    }
    text = _diff_text(res)
    assert text.splitlines()[0] == "== /etc/fstab"
    assert "-# swap off" in text and "+/dev/sda2 none swap sw 0 0" in text
    assert "/etc/hosts" not in text  # unchanged items are not listed
    assert text.splitlines()[-1] == "== containerd"
