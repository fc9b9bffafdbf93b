"""The rolling upgrade's orchestration against a fake fleet: order, batches, canaries, max-fail,
drain timeouts, reboot pending, verification, interruption and resume from the state file."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_upgrade_fakes import FakeFleet, FakeHost, fleet_of

from provisioner.rollout.model import OPERANDS_LABEL as OPERANDS
from provisioner.rollout.plan import parse_batch
from provisioner.rollout.state import RolloutState
from provisioner.upgrade.plan import DriverProbe, build_plan, parse_target
from provisioner.upgrade.rollout import DRIVER, DriverRollout, Options

DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"


def start(
    fleet: FakeFleet, tmp_path: Path, *, to: str = "580.159.04", batch: str = "1", **opts: object
) -> tuple[DriverRollout, RolloutState]:
    options = Options(target=parse_target(to), batch=parse_batch(batch), **opts)  # type: ignore[arg-type]
    names = list(fleet.hosts)
    probes = fleet.probe(names)
    fleet.calls.clear()
    plan = build_plan(
        names, probes, options.target, options.batch, options.canary, kube=fleet.kube is not None
    )
    record = tmp_path / "record"
    record.mkdir(exist_ok=True)
    state = RolloutState.create(
        record, DRIVER, inventory="inv", options=options.to_dict(), plan=plan.to_dict(), hosts=names
    )
    for name in plan.skipped:
        state.start(name)
        state.finish(name, "skipped", plan.hosts[name].reason)
    return DriverRollout(fleet, state, plan, options), state


def run_through(fleet: FakeFleet, tmp_path: Path, **opts: object) -> RolloutState:
    """The rollout of `fleet`, as its hosts are when probed, run to its end: the state it leaves."""
    rollout, state = start(fleet, tmp_path, **opts)  # type: ignore[arg-type]
    rollout.run()
    return state


def results(state: RolloutState) -> dict[str, str | None]:
    return {h: s.result for h, s in state.hosts.items()}


def test_all_hosts_upgrade_in_batches_in_inventory_order(tmp_path: Path) -> None:
    fleet = fleet_of(5)
    rollout, state = start(fleet, tmp_path, batch="2")
    outcome = rollout.run()
    assert outcome.status == "finished"
    assert fleet.upgrade_calls == [["gpu1", "gpu2"], ["gpu3", "gpu4"], ["gpu5"]]
    assert set(results(state).values()) == {"upgraded"}
    for h in fleet.hosts.values():
        assert h.version == "580.159.04"
        assert not h.unschedulable, h.name
        assert h.labels[DEVICE_PLUGIN] == "true"  # operands back
        assert h.labels["nvidia.com/gpu.deploy.driver"] == "pre-installed"
        assert OPERANDS not in h.labels
    s = state.hosts["gpu1"]
    assert (s.before, s.after) == ("570.195.03", "580.159.04")
    steps = [x[0] for x in s.history]
    assert steps == [
        "probing", "cordoning", "draining", "stopping", "installing", "reloading", "verifying", "uncordoning",
        "upgraded",
    ]  # fmt: skip
    # Per host: cordon before drain before operands paused before the install; uncordon last.
    ops = fleet.touched("gpu3")
    assert ops.index("cordon") < ops.index("drain") < ops.index("label") < ops.index("upgrade")
    assert ops[-2:] == ["uncordon", "annotate"]


def test_operands_leave_before_the_install_and_labels_come_back_as_they_were(tmp_path: Path) -> None:
    fleet = fleet_of(1)
    host = fleet.hosts["gpu1"]
    host.labels["nvidia.com/gpu.deploy.dcgm-exporter"] = "false"  # an operator's choice for this node
    before = dict(host.labels)
    seen: dict[str, str] = {}
    fleet.on_install = lambda name: seen.update(fleet.hosts[name].labels)
    rollout, _ = start(fleet, tmp_path)
    rollout.run()
    assert seen == {OPERANDS: "false"}  # operands off while the driver changes
    assert host.labels == before  # the switch removed again, every state label as it was


def test_operands_already_off_or_no_operator_means_no_label_change(tmp_path: Path) -> None:
    fleet = fleet_of(2)
    fleet.hosts["gpu1"].labels = {OPERANDS: "false"}
    fleet.hosts["gpu2"].labels = {"kubernetes.io/hostname": "gpu2"}
    state = run_through(fleet, tmp_path, batch="2")
    assert set(results(state).values()) == {"upgraded"}
    assert [c for c in fleet.calls if c[0] == "label"] == []
    assert fleet.hosts["gpu1"].labels == {OPERANDS: "false"}


def test_percent_batches_and_canary_first(tmp_path: Path) -> None:
    fleet = fleet_of(7)
    rollout, _ = start(fleet, tmp_path, batch="50%", canary=1)
    assert rollout.run().status == "finished"
    # 7 hosts to upgrade: 50% → 4 per batch, after the canary.
    assert fleet.upgrade_calls == [["gpu1"], ["gpu2", "gpu3", "gpu4", "gpu5"], ["gpu6", "gpu7"]]


def test_hosts_at_target_are_skipped_and_never_touched(tmp_path: Path) -> None:
    fleet = FakeFleet([FakeHost("gpu1"), FakeHost("gpu2", version="580.159.04"), FakeHost("gpu3")])
    state = run_through(fleet, tmp_path, to="580", batch="5")
    assert results(state) == {"gpu1": "upgraded", "gpu2": "skipped", "gpu3": "upgraded"}
    assert fleet.touched("gpu2") == []
    assert fleet.upgrade_calls == [["gpu1", "gpu3"]]


def test_install_failure_with_max_fail_0_stops_and_leaves_the_rest_untouched(tmp_path: Path) -> None:
    fleet = fleet_of(4)
    fleet.hosts["gpu2"].faults.add("install-fail")
    rollout, state = start(fleet, tmp_path, batch="2", max_fail=0)
    outcome = rollout.run()
    assert outcome.status == "stopped"
    assert "more than --max-fail 0" in outcome.reason
    assert results(state) == {
        "gpu1": "upgraded",
        "gpu2": "failed",
        "gpu3": "not-started",
        "gpu4": "not-started",
    }
    assert "dpkg: error processing" in state.hosts["gpu2"].reason
    # The failed host stays cordoned, annotated with the reason; its GPU stack stays paused.
    failed = fleet.hosts["gpu2"]
    assert failed.unschedulable
    assert "dpkg: error processing" in failed.annotations["gpuprov.io/driver-upgrade"]
    assert state.hosts["gpu2"].cordoned_by_us
    # Hosts not started: not even cordoned, still on their working driver.
    for name in ("gpu3", "gpu4"):
        assert fleet.touched(name) == []
        assert fleet.hosts[name].version == "570.195.03"
        assert not fleet.hosts[name].unschedulable
    assert not state.finished


def test_max_fail_tolerates_that_many_failures(tmp_path: Path) -> None:
    fleet = fleet_of(5)
    fleet.hosts["gpu1"].faults.add("install-fail")
    fleet.hosts["gpu3"].faults.add("install-fail")
    rollout, state = start(fleet, tmp_path, batch="1", max_fail=1)
    outcome = rollout.run()
    assert outcome.status == "stopped"
    assert results(state) == {
        "gpu1": "failed", "gpu2": "upgraded", "gpu3": "failed", "gpu4": "not-started", "gpu5": "not-started",
    }  # fmt: skip


def test_last_batch_failure_is_not_a_stop(tmp_path: Path) -> None:
    fleet = fleet_of(2)
    fleet.hosts["gpu2"].faults.add("install-fail")
    rollout, state = start(fleet, tmp_path, batch="1")
    outcome = rollout.run()
    assert outcome.status == "finished"  # nothing was left to stop
    assert not state.finished


def test_canary_failure_stops_even_when_max_fail_allows_more(tmp_path: Path) -> None:
    fleet = fleet_of(4)
    fleet.hosts["gpu1"].faults.add("install-fail")
    rollout, state = start(fleet, tmp_path, batch="3", canary=1, max_fail=3)
    outcome = rollout.run()
    assert outcome.status == "stopped"
    assert outcome.reason == "canary failed: gpu1"
    assert fleet.upgrade_calls == [["gpu1"]]
    assert [results(state)[h] for h in ("gpu2", "gpu3", "gpu4")] == ["not-started"] * 3


def test_drain_timeout_leaves_the_host_untouched_and_uncordoned(tmp_path: Path) -> None:
    fleet = fleet_of(3)
    fleet.hosts["gpu2"].faults.add("drain-block")
    state = run_through(fleet, tmp_path, batch="3", max_fail=1)
    assert results(state) == {"gpu1": "upgraded", "gpu2": "failed", "gpu3": "upgraded"}
    s = state.hosts["gpu2"]
    assert s.reason.startswith("drain: drain did not complete within 300s")
    assert "the host was not touched" in s.reason
    host = fleet.hosts["gpu2"]
    assert not host.unschedulable
    assert host.version == "570.195.03"
    assert "upgrade" not in fleet.touched("gpu2")
    assert fleet.upgrade_calls == [["gpu1", "gpu3"]]
    assert host.labels[DEVICE_PLUGIN] == "true"
    assert not s.cordoned_by_us


def test_node_cordoned_before_the_upgrade_stays_cordoned(tmp_path: Path) -> None:
    fleet = fleet_of(2)
    fleet.hosts["gpu1"].unschedulable = True
    fleet.hosts["gpu2"].faults.add("drain-block")
    state = run_through(fleet, tmp_path, batch="2", max_fail=5)
    assert state.hosts["gpu1"].result == "upgraded"
    assert fleet.hosts["gpu1"].unschedulable  # an operator's cordon is not ours to lift
    assert "uncordon" not in fleet.touched("gpu1")


def test_no_drain_evicts_gpu_pods_only(tmp_path: Path) -> None:
    fleet = fleet_of(1)
    rollout, _ = start(fleet, tmp_path, drain=False)
    rollout.run()
    ops = fleet.touched("gpu1")
    assert "evict" in ops and "drain" not in ops


def test_without_control_plane_no_cordon_or_drain(tmp_path: Path) -> None:
    fleet = fleet_of(2, kube=False)
    rollout, state = start(fleet, tmp_path, batch="2")
    assert rollout.run().status == "finished"
    assert set(results(state).values()) == {"upgraded"}
    assert all(c[0] in ("probe", "upgrade") for c in fleet.calls)


def test_host_not_a_node_is_upgraded_without_cordon(tmp_path: Path) -> None:
    fleet = fleet_of(1)
    fleet.hosts["gpu1"].node = False
    state = run_through(fleet, tmp_path)
    assert state.hosts["gpu1"].result == "upgraded"
    assert fleet.touched("gpu1") == ["upgrade"]


def test_a_node_that_is_not_the_host_is_never_touched(tmp_path: Path) -> None:
    """gpu1's hostname names node gpu1, but that node's machine ID is another machine's (a host
    calling itself gpu7 must not get gpu7 drained): gpu1 fails, nothing is cordoned or upgraded."""
    fleet = fleet_of(2)
    fleet.hosts["gpu1"].node_machine_id = "f" * 32
    state = run_through(fleet, tmp_path, batch="2", max_fail=1)
    assert state.hosts["gpu1"].result == "failed"
    assert "is not this host" in (state.hosts["gpu1"].reason or "")
    assert fleet.touched("gpu1") == []
    assert fleet.hosts["gpu1"].unschedulable is False
    assert state.hosts["gpu2"].result == "upgraded"


def test_a_hostname_that_is_no_node_name_fails_the_host_untouched(tmp_path: Path) -> None:
    fleet = fleet_of(1)
    fleet.hosts["gpu1"].node_error = "the host's hostname '-l=x' is not a valid Kubernetes node name"
    state = run_through(fleet, tmp_path)
    assert state.hosts["gpu1"].result == "failed"
    assert "not a valid Kubernetes node name" in (state.hosts["gpu1"].reason or "")
    assert fleet.touched("gpu1") == []
    assert [c for c in fleet.calls if c[0] == "node"] == []


def test_unreachable_host_fails_without_being_touched(tmp_path: Path) -> None:
    fleet = fleet_of(2)
    rollout, state = start(fleet, tmp_path, batch="2", max_fail=1)
    fleet.hosts["gpu1"].faults.add("unreachable")
    rollout.run()
    assert state.hosts["gpu1"].result == "failed"
    assert state.hosts["gpu1"].reason.startswith("probe: connection to")
    assert fleet.touched("gpu1") == []


def test_reboot_pending_host_stays_cordoned_and_is_reported(tmp_path: Path) -> None:
    fleet = fleet_of(2)
    fleet.hosts["gpu1"].faults.add("unload-busy")
    rollout, state = start(fleet, tmp_path, batch="1")
    outcome = rollout.run()
    assert outcome.status == "finished"  # a reboot pending is not a failure: the rollout goes on
    assert results(state) == {"gpu1": "reboot-pending", "gpu2": "upgraded"}
    assert fleet.hosts["gpu1"].unschedulable
    assert fleet.hosts["gpu1"].annotations["gpuprov.io/driver-upgrade"].startswith("reboot-pending")


def test_reboot_when_allowed(tmp_path: Path) -> None:
    fleet = fleet_of(1)
    fleet.hosts["gpu1"].faults.add("unload-busy")
    state = run_through(fleet, tmp_path, reboot_allowed=True)
    assert state.hosts["gpu1"].result == "upgraded"
    assert "rebooting" in [x[0] for x in state.hosts["gpu1"].history]


@pytest.mark.parametrize(
    ("fault", "expected"),
    [("lose-gpu", "gpu.count: the driver sees 0 GPU(s), 1 before"), ("xid-after", "gpu.xid: 1 new Xid")],
)
def test_verification_failure_keeps_the_host_cordoned(tmp_path: Path, fault: str, expected: str) -> None:
    fleet = fleet_of(1)
    rollout, state = start(fleet, tmp_path)
    fleet.hosts["gpu1"].faults.add(fault)
    rollout.run()
    s = state.hosts["gpu1"]
    assert s.result == "failed"
    assert expected in s.reason
    assert fleet.hosts["gpu1"].unschedulable


def test_old_xids_do_not_fail_verification(tmp_path: Path) -> None:
    fleet = fleet_of(1)
    fleet.hosts["gpu1"].xids.append("[ 10.0] NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception")
    state = run_through(fleet, tmp_path)
    assert state.hosts["gpu1"].result == "upgraded"


def test_branch_target_without_a_package_fails_the_canary(tmp_path: Path) -> None:
    fleet = fleet_of(3)
    rollout, state = start(fleet, tmp_path, to="590", canary=1, batch="2")
    assert rollout.run().status == "stopped"
    assert state.hosts["gpu1"].result == "failed"


def test_interrupt_during_install_records_state_and_resume_finishes(tmp_path: Path) -> None:
    fleet = fleet_of(4)
    rollout, state = start(fleet, tmp_path, batch="2")
    fleet.hosts["gpu3"].faults.add("interrupt-here")
    outcome = rollout.run()
    assert outcome.status == "interrupted"
    # gpu4's install went through in the same batch, but nothing starts after Ctrl-C: not verified.
    assert results(state) == {
        "gpu1": "upgraded",
        "gpu2": "upgraded",
        "gpu3": "interrupted",
        "gpu4": "interrupted",
    }
    assert state.hosts["gpu3"].step == "installing"
    assert state.hosts["gpu4"].step == "reloading"
    assert fleet.hosts["gpu3"].unschedulable  # left where it was; resume picks it up

    # A new process reads the state file back and carries on.
    fleet.hosts["gpu3"].faults.discard("interrupt-here")
    fleet.calls.clear()
    fleet.upgrade_calls.clear()
    loaded = RolloutState.load(state.path.parent, DRIVER)
    for name in loaded.hosts:
        loaded.reopen(name)
    from provisioner.rollout.plan import Plan

    again = DriverRollout(fleet, loaded, Plan.from_dict(loaded.doc["plan"]), rollout.opt)
    assert again.run().status == "finished"
    # Finished hosts are not redone; gpu4 already runs the new driver: verified and uncordoned only.
    assert fleet.upgrade_calls == [["gpu3"]]
    assert fleet.touched("gpu4") == ["label", "label", "uncordon", "annotate"]
    assert set(results(loaded).values()) == {"upgraded"}
    assert not fleet.hosts["gpu3"].unschedulable
    assert loaded.hosts["gpu3"].attempts == 2
    assert loaded.finished


def test_rollout_interrupt_stops_new_batches(tmp_path: Path) -> None:
    fleet = fleet_of(3)
    rollout, state = start(fleet, tmp_path, batch="1")
    fleet.on_install = lambda name: rollout.interrupt() if name == "gpu2" else None
    outcome = rollout.run()
    assert outcome.status == "interrupted"
    assert fleet.interrupts == 1
    assert results(state)["gpu3"] == "not-started"
    assert fleet.touched("gpu3") == []


def test_resume_after_a_crash_mid_host(tmp_path: Path) -> None:
    """A process killed mid-step leaves a host in progress (no result): resume redoes that host,
    keeping what the first attempt learnt (the node was cordoned by an operator before)."""
    fleet = fleet_of(2)
    rollout, state = start(fleet, tmp_path, batch="1")
    fleet.hosts["gpu1"].unschedulable = True  # cordoned by someone before we came

    def crash(name: str) -> None:
        raise KeyboardInterrupt  # nothing gets recorded after this point

    fleet.on_install = crash
    with pytest.raises(KeyboardInterrupt):
        rollout.run()
    loaded = RolloutState.load(state.path.parent, DRIVER)
    s = loaded.hosts["gpu1"]
    assert (s.step, s.result, s.was_cordoned) == ("installing", None, True)
    fleet.on_install = None
    for name in loaded.hosts:
        loaded.reopen(name)
    from provisioner.rollout.plan import Plan

    again = DriverRollout(fleet, loaded, Plan.from_dict(loaded.doc["plan"]), rollout.opt)
    assert again.run().status == "finished"
    assert set(results(loaded).values()) == {"upgraded"}
    assert fleet.hosts["gpu1"].unschedulable  # still the operator's cordon
    assert not fleet.hosts["gpu2"].unschedulable


def test_resume_after_reboot_verifies_and_uncordons(tmp_path: Path) -> None:
    fleet = fleet_of(1)
    fleet.hosts["gpu1"].faults.add("unload-busy")
    rollout, state = start(fleet, tmp_path)
    rollout.run()
    assert state.hosts["gpu1"].result == "reboot-pending"
    # The operator reboots the host: the installed driver is now the loaded one.
    host = fleet.hosts["gpu1"]
    host.version, host.installed = host.installed, None
    host.faults.clear()
    fleet.upgrade_calls.clear()
    for name in state.hosts:
        state.reopen(name)
    again = DriverRollout(fleet, state, rollout.plan, rollout.opt)
    again.run()
    assert state.hosts["gpu1"].result == "upgraded"
    assert fleet.upgrade_calls == []  # nothing to install again
    assert not host.unschedulable
    assert host.labels[DEVICE_PLUGIN] == "true"
    assert "gpuprov.io/driver-upgrade" not in host.annotations


def test_pause_asks_between_batches(tmp_path: Path) -> None:
    fleet = fleet_of(3)
    rollout, state = start(fleet, tmp_path, batch="1", pause=True)
    asked: list[str] = []

    def confirm(question: str) -> bool:
        asked.append(question)
        return len(asked) < 2

    rollout.confirm = confirm
    outcome = rollout.run()
    assert outcome.status == "paused"
    assert len(asked) == 2 and "batch 2 of 3 (gpu2)" in asked[0]
    assert results(state) == {"gpu1": "upgraded", "gpu2": "upgraded", "gpu3": "not-started"}


def test_state_is_written_at_every_step(tmp_path: Path) -> None:
    fleet = fleet_of(1)
    rollout, state = start(fleet, tmp_path)
    seen: list[str] = []
    fleet.on_install = lambda name: seen.append(RolloutState.load(state.path.parent, DRIVER).hosts[name].step)
    rollout.run()
    assert seen == ["installing"]
    assert not list(state.path.parent.glob("*.tmp"))


def test_probe_cut_short_by_ctrl_c_is_an_interruption_not_a_failure(tmp_path: Path) -> None:
    fleet = fleet_of(2)
    rollout, state = start(fleet, tmp_path, batch="2")
    real_probe = fleet.probe

    def probe_then_ctrl_c(hosts: list[str]) -> dict[str, DriverProbe]:
        rollout.interrupt()  # the signal arrives while the probes run; their connections get closed
        return {h: DriverProbe(h, error="SSH session lost: Socket is closed") for h in hosts}

    fleet.probe = probe_then_ctrl_c  # type: ignore[method-assign]
    outcome = rollout.run()
    fleet.probe = real_probe  # type: ignore[method-assign]
    assert outcome.status == "interrupted"
    assert results(state) == {"gpu1": "interrupted", "gpu2": "interrupted"}
    assert all(fleet.touched(h) == [] for h in fleet.hosts)


def _mig_host(name: str, *faults: str) -> FakeHost:
    layout = {0: {"1g.18gb": 7}}
    host = FakeHost(name, faults=set(faults), mig_layout=layout, mig_now={0: {"1g.18gb": 7}})
    host.labels["nvidia.com/mig.config"] = "all-1g.18gb"
    host.labels["nvidia.com/mig.config.state"] = "success"
    return host


def test_a_mig_node_is_uncordoned_only_once_its_layout_is_back(tmp_path: Path) -> None:
    """The module unload destroys the GPU instances; the MIG manager (back with the operands) makes them
    again. The node stays cordoned until the MIG devices are those of before the upgrade."""
    fleet = FakeFleet([_mig_host("gpu1")])
    state = run_through(fleet, tmp_path, operand_timeout=2.0)
    assert state.hosts["gpu1"].result == "upgraded", state.hosts["gpu1"].reason
    host = fleet.hosts["gpu1"]
    assert host.mig_now == {0: {"1g.18gb": 7}}
    ops = fleet.touched("gpu1")
    # Operands back (the manager re-applies) before the uncordon.
    assert ops.index("upgrade") < max(i for i, op in enumerate(ops) if op == "label") < ops.index("uncordon")


def test_a_mig_layout_not_restored_keeps_the_node_cordoned(tmp_path: Path) -> None:
    fleet = FakeFleet([_mig_host("gpu1", "mig-reapply-fails")])
    state = run_through(fleet, tmp_path, operand_timeout=2.0)
    s = state.hosts["gpu1"]
    assert s.result == "failed"
    assert "mig.config: all-1g.18gb: the MIG manager reported nvidia.com/mig.config.state=failed" in s.reason
    host = fleet.hosts["gpu1"]
    assert host.unschedulable
    assert host.labels["nvidia.com/gpu.deploy.device-plugin"] == "true"  # operands were put back
