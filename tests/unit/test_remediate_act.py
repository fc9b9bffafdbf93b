"""`gpuprov remediate` acting: a fake fleet whose GPUs fail as the lab's do (a reset clears what a reset
clears, a reboot what a reboot clears, a failed row remap nothing) and a fake cluster that records every
cordon, drain, taint, annotation and Event."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.errors import InputError
from provisioner.executors import CommandResult
from provisioner.health import repair
from provisioner.health.act import parse_budget
from provisioner.health.decide import NONE, REBOOT, RESET_GPU, SERVICE, GpuPlan, HostPlan
from provisioner.health.fleet import SERVICE_TAINT, HealProbe, ResetOutcome, parse_compute_apps
from provisioner.rollout.model import NodeInfo, StepFailed

# Faults, by what repairs them: the action the evidence asks for, and whether a reset/reboot clears it.
FAULTS = {
    "xid48": (RESET_GPU, True, True),  # DBE: a reset clears it
    "xid13": (NONE, True, True),  # the application's: nothing to do on the node
    "xid79": (REBOOT, False, True),  # fallen off the bus: no reset, a reboot
    "remap-failure": (SERVICE, False, False),  # hardware
    "reset-stuck": (RESET_GPU, False, True),  # the reset itself fails
    "reset-no-help": (RESET_GPU, False, False),  # the reset "works", the fault stays, also after a reboot
}


class Host:
    def __init__(self, name: str, fault: str | None = None, machine_id: str | None = None) -> None:
        self.name = name
        self.fault = fault
        self.machine_id = machine_id or f"{abs(hash(name)):032x}"[:32]
        self.unschedulable = False
        self.taints: dict[str, str] = {}
        self.annotations: dict[str, str] = {}
        self.labels = {"nvidia.com/gpu.deploy.device-plugin": "true"}
        self.boot = 1

    def plan(self) -> HostPlan:
        action = NONE if self.fault is None else FAULTS[self.fault][0]
        gpu = GpuPlan(0, "00000000:19:00.0", action, [f"fault {self.fault}"] if self.fault else [])
        return HostPlan(self.name, action, action != NONE, list(gpu.reasons), [gpu])


class Kube:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def h(self, name: str) -> Host:
        return self.fleet.hosts[name]

    def node(self, name: str) -> NodeInfo | None:
        self.fleet.log("node", name)
        h = self.fleet.hosts.get(name)
        return None if h is None else NodeInfo(name, h.unschedulable, dict(h.labels), machine_id=h.machine_id)

    def cordon(self, name: str) -> None:
        self.fleet.log("cordon", name)
        self.h(name).unschedulable = True

    def uncordon(self, name: str) -> None:
        self.fleet.log("uncordon", name)
        self.h(name).unschedulable = False

    def drain(self, name: str, timeout: float) -> None:
        self.fleet.log("drain", name)

    def evict_gpu_pods(self, name: str, timeout: float) -> None:
        raise AssertionError("remediate drains the node")

    def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        self.fleet.log("label", name)
        for k, v in labels.items():
            if v is None:
                self.h(name).labels.pop(k, None)
            else:
                self.h(name).labels[k] = v

    def wait_operands_gone(self, name: str, timeout: float) -> None:
        self.fleet.log("operands-gone", name)

    def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        for k, v in annotations.items():
            if v is None:
                self.h(name).annotations.pop(k, None)
            else:
                self.h(name).annotations[k] = v

    def annotate(self, name: str, text: str | None) -> None:
        if text is None:
            self.h(name).annotations.pop(SERVICE_TAINT, None)
        else:
            self.h(name).annotations[SERVICE_TAINT] = text

    def taint(self, name: str, key: str, value: str | None, effect: str = "NoSchedule") -> None:
        self.fleet.log("taint", name)
        if value is None:
            self.h(name).taints.pop(key, None)
        else:
            self.h(name).taints[key] = f"{value}:{effect}"

    def event(self, name: str, reason: str, message: str, warning: bool = False) -> None:
        self.fleet.events.append((name, reason, message))

    def kubectl(self, *args: str, timeout: float = 60.0) -> CommandResult:
        assert args[:2] == ("get", "nodes")
        items = [
            {
                "metadata": {"name": h.name, "annotations": dict(h.annotations)},
                "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in h.taints]},
            }
            for h in self.fleet.hosts.values()
        ]
        return CommandResult(0, json.dumps({"items": items}), "", 0.0)

    def close(self) -> None:
        return None


class Fleet:
    def __init__(self, hosts: Sequence[Host]) -> None:
        self.hosts = {h.name: h for h in hosts}
        self.calls: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.kube = Kube(self)
        self.poll_s = 0.0
        self.reset_at: dict[str, Any] = {}

    def log(self, what: str, name: str) -> None:
        self.calls.append((what, name))

    def probe(self, names: Sequence[str]) -> dict[str, HealProbe]:
        out = {}
        for n in names:
            h = self.hosts[n]
            out[n] = HealProbe(n, node=n, machine_id=h.machine_id, address="192.0.2.1", plan=h.plan())
        return out

    def reset_gpus(self, host: str, gpus: Mapping[int, str]) -> ResetOutcome:
        self.log("reset", host)
        h = self.hosts[host]
        if h.fault == "reset-stuck":
            return ResetOutcome(False, "GPU reset failed: GPU 0: Unable to reset this GPU")
        if h.fault and FAULTS[h.fault][1]:
            h.fault = None
        self.reset_at[host] = ("boot-1", {"0000:19:00": 5000.0})  # as the real fleet marks a reset
        return ResetOutcome(True, "GPU reset: GPU 0: GPU 00000000:19:00.0 was successfully reset.")

    def reboot(self, host: str, timeout: float, stop: Any) -> str:
        self.log("reboot", host)
        h = self.hosts[host]
        h.boot += 1
        if h.fault and FAULTS[h.fault][2]:
            h.fault = None
        return f"boot-{h.boot}"

    def wait_advertised(self, node: str, timeout: float, stop: Any) -> bool:
        self.log("advertised", node)
        assert self.hosts[node].labels.get("nvidia.com/gpu.deploy.operands") != "false"  # operands back first
        return True

    def wait_ready(self, node: str, timeout: float, stop: Any, boot_id: str | None = None) -> bool:
        assert boot_id == f"boot-{self.hosts[node].boot}"  # the kubelet of the new boot, not the old
        return True

    def interrupt(self) -> None:
        return None

    def close(self) -> None:
        return None


# cp1 the control plane, gpu1..gpu3 GPU nodes (documentation addresses: nothing is ever reached).
INVENTORY = {
    "all": {
        "children": {
            "kube_control_plane": {"hosts": {"cp1": {"ansible_host": "192.0.2.10"}}},
            "gpu_nodes": {"hosts": {f"gpu{i}": {"ansible_host": f"192.0.2.1{i}"} for i in (1, 2, 3)}},
        }
    }
}


@pytest.fixture
def inv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(INVENTORY))
    return path


class Certifier:
    def __init__(self, fail: Sequence[str] = ()) -> None:
        self.fail = set(fail)
        self.asked: list[tuple[str, str]] = []

    def factory(self, hosts: list[Any], inventory: Path, fleet: Any) -> Any:
        assert isinstance(fleet, Fleet)  # the run's fleet: its reset marks and cluster

        def certify(host: str, level: str, node: str) -> tuple[bool, list[str]]:
            self.asked.append((host, level))
            return (host not in self.fail, [f"{host}: dcgm.diag: fail"] if host in self.fail else [])

        return certify


def run(
    inv: Path,
    fleet: Fleet,
    *,
    allow_reboot: bool = False,
    max_concurrent: int = 3,
    budget: str | None = None,
    cert: Certifier | None = None,
    level: str = "quick",
) -> repair.CycleResult:
    options = repair.check_options(
        inventory=inv, local=False, snapshot=None, certify_level=level, max_concurrent=max_concurrent,
        budget=budget, watch=False, interval=60,
    )  # fmt: skip
    return repair.run_cycle(
        inventory=inv, limit=None, options=options, allow_reboot=allow_reboot,
        fleet_factory=lambda **_: fleet, certifier_factory=(cert or Certifier()).factory,
        progress=lambda host, text: None,
    )  # fmt: skip


def outcomes(result: repair.CycleResult) -> dict[str, str]:
    return {r.plan.host: r.outcome for r in result.rows}


def touched(fleet: Fleet, name: str) -> list[str]:
    return [what for what, host in fleet.calls if host == name and what != "node"]


def test_reset_repairs_certifies_and_puts_the_node_back(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2"), Host("gpu3")])
    cert = Certifier()
    result = run(inv, fleet, cert=cert, level="standard")
    assert outcomes(result) == {"gpu1": "repaired", "gpu2": "none", "gpu3": "none"}
    assert result.exit_code == 0
    steps = touched(fleet, "gpu1")
    assert steps.index("cordon") < steps.index("drain") < steps.index("reset") < steps.index("uncordon")
    assert "reboot" not in steps and "taint" not in steps
    assert cert.asked == [("gpu1", "standard")]
    assert not fleet.hosts["gpu1"].unschedulable
    assert fleet.hosts["gpu1"].labels == {"nvidia.com/gpu.deploy.device-plugin": "true"}  # operands back
    assert [e[1] for e in fleet.events if e[0] == "gpu1"] == [
        "GpuprovRemediate",
        "GpuprovGpuReset",
        "GpuprovRepaired",
    ]
    assert touched(fleet, "gpu2") == [] and touched(fleet, "gpu3") == []
    doc = json.loads(repair.to_json(result))
    row = doc["hosts"][0]
    assert row["host"] == "gpu1" and row["action"] == RESET_GPU and row["drain"] is True
    assert row["outcome"] == "repaired" and row["gpus"][0]["index"] == 0
    assert result.record and (Path(result.record) / "state.json").is_file()


def test_an_application_xid_touches_nothing_and_writes_no_record(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid13"), Host("gpu2"), Host("gpu3")])
    result = run(inv, fleet)
    assert outcomes(result)["gpu1"] == "none" and result.exit_code == 0
    assert touched(fleet, "gpu1") == [] and result.record is None and fleet.events == []


def test_remap_failure_is_left_for_service_and_never_retried(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "remap-failure"), Host("gpu2"), Host("gpu3")])
    fleet.hosts["gpu1"].labels["gpuprov.io/certified"] = "quick"  # from an earlier certification
    cert = Certifier()
    result = run(inv, fleet, cert=cert)
    assert outcomes(result)["gpu1"] == "needs-service" and result.exit_code == 1
    h = fleet.hosts["gpu1"]
    assert "gpuprov.io/certified" not in h.labels  # not fit for work: no longer certified
    assert h.unschedulable and h.taints == {SERVICE_TAINT: "true:NoSchedule"}
    assert "needs service" in h.annotations[SERVICE_TAINT]
    assert "uncordon" not in touched(fleet, "gpu1") and "reset" not in touched(fleet, "gpu1")
    assert cert.asked == []
    assert ("gpu1", "GpuprovNeedsService") in [(e[0], e[1]) for e in fleet.events]
    # the next run holds it: no cordon, drain or repair of a node left for service
    fleet.calls.clear()
    again = run(inv, fleet)
    assert outcomes(again)["gpu1"] == "held" and again.exit_code == 1
    assert touched(fleet, "gpu1") == [] and "taint off" in again.rows[0].detail


def test_a_failing_reset_escalates_to_a_reboot_when_allowed(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "reset-stuck"), Host("gpu2"), Host("gpu3")])
    result = run(inv, fleet, allow_reboot=True)
    assert outcomes(result)["gpu1"] == "repaired"
    steps = touched(fleet, "gpu1")
    assert steps.index("reset") < steps.index("reboot") < steps.index("uncordon")


def test_a_failing_reset_without_reboot_leaves_the_node_for_service(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "reset-stuck"), Host("gpu2"), Host("gpu3")])
    result = run(inv, fleet)
    row = result.rows[0]
    assert (
        row.outcome == "needs-service" and "--allow-reboot" in row.detail and "Unable to reset" in row.detail
    )
    assert "reboot" not in touched(fleet, "gpu1") and fleet.hosts["gpu1"].taints


def test_a_fault_that_survives_reset_and_reboot_ends_in_service(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "reset-no-help"), Host("gpu2"), Host("gpu3")])
    result = run(inv, fleet, allow_reboot=True)
    assert outcomes(result)["gpu1"] == "needs-service"
    assert [s for s in touched(fleet, "gpu1") if s in ("reset", "reboot")] == ["reset", "reboot"]
    assert "after the reboot" in result.rows[0].detail


def test_a_reboot_without_allow_reboot_is_held_and_not_drained(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid79"), Host("gpu2"), Host("gpu3")])
    result = run(inv, fleet)
    assert outcomes(result)["gpu1"] == "held" and "--allow-reboot" in result.rows[0].detail
    assert touched(fleet, "gpu1") == [] and result.exit_code == 1
    result = run(inv, fleet, allow_reboot=True)
    assert outcomes(result)["gpu1"] == "repaired" and "reset" not in touched(fleet, "gpu1")


def test_a_failed_certification_leaves_the_node_for_service(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2"), Host("gpu3")])
    result = run(inv, fleet, cert=Certifier(fail=["gpu1"]))
    assert outcomes(result)["gpu1"] == "needs-service" and "certify quick failed" in result.rows[0].detail
    assert fleet.hosts["gpu1"].unschedulable and fleet.hosts["gpu1"].taints


def test_three_faulty_nodes_one_at_a_time(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2", "xid48"), Host("gpu3", "xid48")])
    result = run(inv, fleet, max_concurrent=1)
    assert set(outcomes(result).values()) == {"repaired"}
    order = [(w, h) for w, h in fleet.calls if w in ("cordon", "uncordon")]
    assert order == [
        ("cordon", "gpu1"), ("uncordon", "gpu1"), ("cordon", "gpu2"), ("uncordon", "gpu2"),
        ("cordon", "gpu3"), ("uncordon", "gpu3"),
    ]  # fmt: skip


def test_nodes_left_for_service_count_against_max_concurrent(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "remap-failure"), Host("gpu2", "xid48"), Host("gpu3", "xid48")])
    result = run(inv, fleet, max_concurrent=1)
    # gpu1 ends out of work: nothing else may be taken out while it is
    assert outcomes(result) == {"gpu1": "needs-service", "gpu2": "not-started", "gpu3": "not-started"}
    assert "circuit breaker" in result.stop_reason
    assert touched(fleet, "gpu2") == [] and touched(fleet, "gpu3") == []


def test_an_exhausted_budget_stops_the_loop_across_runs(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2", "xid48"), Host("gpu3")])
    result = run(inv, fleet, max_concurrent=1, budget="1/1h")
    assert outcomes(result) == {"gpu1": "repaired", "gpu2": "not-started", "gpu3": "none"}
    assert "budget exhausted" in result.stop_reason and result.exit_code == 1
    fleet.calls.clear()
    again = run(inv, fleet, max_concurrent=1, budget="1/1h")  # the earlier run's drain still counts
    assert outcomes(again)["gpu2"] == "not-started" and touched(fleet, "gpu2") == []
    third = run(inv, fleet, max_concurrent=1, budget="2/1h")
    assert outcomes(third)["gpu2"] == "repaired"


def test_a_node_that_is_another_host_is_not_touched(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2"), Host("gpu3")])
    real = fleet.probe

    def lying(names: Sequence[str]) -> dict[str, HealProbe]:
        out = real(names)
        for p in out.values():
            p.machine_id = "f" * 32
            p.address = "198.51.100.9"
        return out

    fleet.probe = lying  # type: ignore[method-assign]
    result = run(inv, fleet)
    assert outcomes(result)["gpu1"] == "failed" and "is not this host" in result.rows[0].detail
    assert "cordon" not in touched(fleet, "gpu1")


def test_watch_runs_cycles_until_interrupted(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2"), Host("gpu3")])
    shown: list[repair.CycleResult] = []
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt
        fleet.hosts["gpu2"].fault = "xid48"  # a new fault between cycles

    options = repair.check_options(
        inventory=inv, local=False, snapshot=None, certify_level="quick", max_concurrent=1, budget=None,
        watch=True, interval=5,
    )  # fmt: skip
    rc = repair.run_remediate_act(
        inventory=inv, limit=None, options=options, allow_reboot=False, watch=True, interval=5,
        show=shown.append, fleet_factory=lambda **_: fleet, certifier_factory=Certifier().factory,
        sleep=sleep,
    )  # fmt: skip
    assert rc == 0 and sleeps == [5, 5] and len(shown) == 2
    assert fleet.reset_at is options.resets  # a reset's marks outlive the cycle that made it
    assert outcomes(shown[0])["gpu1"] == "repaired" and outcomes(shown[1])["gpu2"] == "repaired"


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"certify_level": "thorough"}, "--certify-level"),
        ({"budget": "3/hour"}, "--budget"),
        ({"budget": "0/1h"}, "--budget"),
        ({"max_concurrent": 0}, "--max-concurrent"),
        ({"local": True}, "--inventory"),
        ({"watch": True, "interval": 0.5}, "--interval"),
    ],
)
def test_bad_options_are_input_errors(inv: Path, kwargs: dict[str, Any], names: str) -> None:
    args: dict[str, Any] = {
        "inventory": inv, "local": False, "snapshot": None, "certify_level": "quick", "max_concurrent": 1,
        "budget": None, "watch": False, "interval": 60.0,
    }  # fmt: skip
    args.update(kwargs)
    with pytest.raises(InputError, match=names.replace("-", r"\-")):
        repair.check_options(**args)


def test_budget_syntax() -> None:
    b = parse_budget("3/1h")
    assert b is not None and (b.count, b.period_s) == (3, 3600)
    assert parse_budget("10/2d").period_s == 172800  # type: ignore[union-attr]
    assert parse_budget(None) is None


def test_compute_apps_rows_are_bounded_and_names_made_safe() -> None:
    text = (
        "00000000:19:00.0, 4242, python3\x1b[2J\nNo running processes found\n"
        "00000000:1A:00.0, 99999999999, x\n"
    )
    rows = parse_compute_apps(text)
    assert len(rows) == 1 and rows[0][:2] == ("00000000:19:00.0", 4242)  # an absurd pid is no row
    assert rows[0][2].startswith("python3") and "\x1b" not in rows[0][2]


def test_step_failed_on_the_control_plane_fails_the_host_without_change(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2"), Host("gpu3")])

    def broken(name: str) -> NodeInfo | None:
        raise StepFailed("the API server did not answer")

    fleet.kube.node = broken  # type: ignore[method-assign]
    result = run(inv, fleet)
    assert outcomes(result)["gpu1"] == "failed" and "the API server" in result.rows[0].detail
    assert touched(fleet, "gpu1") == []


def test_a_node_an_interrupted_run_left_cordoned_is_taken_over_and_put_back(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2"), Host("gpu3")])
    real_reset = fleet.reset_gpus

    def crash(host: str, gpus: Mapping[int, str]) -> ResetOutcome:
        raise KeyboardInterrupt  # the controller dies half-way: the node stays cordoned

    fleet.reset_gpus = crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run(inv, fleet)
    assert fleet.hosts["gpu1"].unschedulable
    fleet.reset_gpus = real_reset  # type: ignore[method-assign]
    fleet.hosts["gpu1"].fault = None  # repaired meanwhile (by hand, say)
    result = run(inv, fleet)
    assert outcomes(result)["gpu1"] == "repaired" and not fleet.hosts["gpu1"].unschedulable
    assert fleet.hosts["gpu1"].labels == {"nvidia.com/gpu.deploy.device-plugin": "true"}


class FakeSsh:
    """One host's shell as the real fleet sees it: answers by command, records every command."""

    def __init__(self, answers: dict[str, CommandResult]) -> None:
        self.answers = answers
        self.commands: list[str] = []

    def run(self, command: Sequence[str] | str, timeout: float) -> CommandResult:
        text = command if isinstance(command, str) else " ".join(command)
        self.commands.append(text)
        for key, res in self.answers.items():
            if key in text:
                return res
        return CommandResult(0, "", "", 0.0)


def real_fleet(fake: FakeSsh) -> Any:
    import contextlib

    from provisioner.health.fleet import HealFleet

    fleet = HealFleet(hosts=[], control_plane=None)

    @contextlib.contextmanager
    def session(name: str) -> Any:
        yield fake, []

    fleet._session = session  # type: ignore[method-assign]
    return fleet


def ok(stdout: str = "") -> CommandResult:
    return CommandResult(0, stdout, "", 0.0)


def test_reset_stops_the_holder_services_around_it_and_starts_them_again() -> None:
    fake = FakeSsh({
        "is-active -- nvidia-persistenced.service": ok(),
        "is-active -- nvidia-dcgm.service": CommandResult(3, "", "", 0.0),
        "is-active -- dcgm.service": CommandResult(4, "", "", 0.0),
        "/proc/uptime": ok("5000.12 9000.00\n"),
        "boot_id": ok("0b1c2d3e-0000-4000-8000-000000000001\n"),
        "nvidia-smi -r -i 0": ok("GPU 00000000:19:00.0 was successfully reset.\nAll done.\n"),
    })  # fmt: skip
    fleet = real_fleet(fake)
    done = fleet.reset_gpus("gpu1", {0: "00000000:19:00.0"})
    assert done.ok and done.services == ["nvidia-persistenced.service"], done
    order = [c for c in fake.commands if "systemctl stop" in c or "-r -i" in c or "systemctl start" in c]
    assert order == [
        "systemctl stop -- nvidia-persistenced.service", "nvidia-smi -r -i 0",
        "systemctl start -- nvidia-persistenced.service",
    ]  # fmt: skip
    # the Xids logged before the reset are answered by it (provisioner.health.decide.gather)
    assert fleet.reset_at["gpu1"][1] == {"0000:19:00": 5000.12}


def test_a_refused_reset_still_starts_the_services_and_says_why() -> None:
    fake = FakeSsh({
        "is-active -- nvidia-persistenced.service": ok(),
        "is-active -- nvidia-dcgm.service": CommandResult(3, "", "", 0.0),
        "is-active -- dcgm.service": CommandResult(3, "", "", 0.0),
        "nvidia-smi -r -i 0": CommandResult(
            255, "The following GPUs could not be reset:\n  GPU 00000000:19:00.0: In use by another client\n",
            "", 0.0,
        ),
    })  # fmt: skip
    done = real_fleet(fake).reset_gpus("gpu1", {0: "00000000:19:00.0"})
    assert not done.ok and "GPU 00000000:19:00.0: In use by another client" in done.reason
    assert fake.commands[-1] == "systemctl start -- nvidia-persistenced.service"


def test_a_compute_process_on_the_gpu_means_no_reset() -> None:
    fake = FakeSsh({"query-compute-apps": ok("00000000:19:00.0, 4242, python3\n")})
    done = real_fleet(fake).reset_gpus("gpu1", {0: "00000000:19:00.0"})
    assert not done.ok and "pid 4242 (python3)" in done.reason
    assert not any("-r -i" in c or "systemctl stop" in c for c in fake.commands)


def test_the_node_certifier_runs_certify_and_records_its_result_on_the_node(
    inv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.health import certify_run
    from provisioner.health.certify import CertResult
    from provisioner.inventory import load_inventory

    results = {"gpu1": CertResult("gpu1", "quick", "quick"), "gpu2": CertResult("gpu2", "quick", None)}
    results["gpu2"].missing.append("dcgmi is not installed: DCGM's level-1 diagnostic did not run")
    monkeypatch.setattr(certify_run, "certify_target", lambda target, level, reset_at: results[target.name])
    fleet = Fleet([Host("gpu1"), Host("gpu2"), Host("gpu3")])
    hosts = load_inventory(inv).select("gpu_nodes")
    fleet.reset_marks = lambda host: {}  # type: ignore[attr-defined]
    certify = repair.node_certifier(hosts, inv, fleet)  # type: ignore[arg-type]
    ok, reasons = certify("gpu1", "quick", "gpu1")
    assert ok and fleet.hosts["gpu1"].labels["gpuprov.io/certified"] == "quick"
    fleet.hosts["gpu2"].labels["gpuprov.io/certified"] = "quick"
    ok, reasons = certify("gpu2", "quick", "gpu2")
    assert not ok and "dcgmi is not installed" in reasons[0]
    assert "gpuprov.io/certified" not in fleet.hosts["gpu2"].labels


def test_a_later_run_knows_the_gpu_resets_an_earlier_run_made(inv: Path) -> None:
    """The resets of a run go to its record; the next invocation reads them back (the fleet uses a mark
    only while its host is still in that boot)."""
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2"), Host("gpu3")])
    first = run(inv, fleet)
    assert outcomes(first)["gpu1"] == "repaired"
    marks = {"gpu1": ("boot-1", {"0000:19:00": 5000.0})}
    assert repair.earlier_resets(str(inv.resolve())) == marks
    fleet.reset_at = {}
    run(inv, fleet)  # a new invocation: its options start empty
    assert fleet.reset_at == marks


def test_resets_read_back_from_a_record_are_bounded_and_checked(inv: Path) -> None:
    fleet = Fleet([Host("gpu1", "xid48"), Host("gpu2"), Host("gpu3")])
    record = Path(run(inv, fleet).record or "")
    (record / repair.RESETS_FILE).write_text(
        json.dumps({"gpu1": ["b" * 500, {"0000:19:00": -1, "x": "y", "0000:1a:00": 7.5}], "gpu2": "junk"})
    )
    assert repair.earlier_resets(str(inv.resolve())) == {"gpu1": ("b" * 64, {"0000:1a:00": 7.5})}
    (record / repair.RESETS_FILE).write_text("[not json")
    assert repair.earlier_resets(str(inv.resolve())) == {}
