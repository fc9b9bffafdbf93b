"""Rolling upgrade planning: target and batch syntax, batches by count and share, canaries, order,
hosts at the target skipped, the post-upgrade judgement, and the dry-run text."""

from __future__ import annotations

import pytest

from provisioner.errors import InputError
from provisioner.rollout.plan import BatchSize, Plan, check_limit_names, parse_batch
from provisioner.upgrade.plan import DriverProbe, build_plan, judge, parse_target, render_plan


@pytest.mark.parametrize("text", ["580", "580.159", "580.159.04", " 570.195.03 "])
def test_target_accepts_branch_and_versions(text: str) -> None:
    assert parse_target(text).text == text.strip()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("58", "expected a driver branch like 580"),
        ("latest", "expected a driver branch"),
        ("580.x", "expected a driver branch"),
        ("580.159.04.1", "expected a driver branch"),
        ("580.159.04-1", "without the package revision: 580.159.04"),
        ("", "--to is required"),
        (None, "--to is required"),
    ],
)
def test_target_rejects_bad_syntax(text: str | None, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_target(text)


def test_target_matching_compares_components() -> None:
    assert parse_target("580").matches("580.95.05")
    assert parse_target("580.159").matches("580.159.04")
    assert not parse_target("580.15").matches("580.159.04")
    assert not parse_target("580").matches("570.195.03")
    assert not parse_target("580.159.04").matches(None)


@pytest.mark.parametrize(
    ("text", "value", "percent"), [("1", 1, False), ("12", 12, False), ("25%", 25, True), ("100%", 100, True)]
)
def test_batch_syntax(text: str, value: int, percent: bool) -> None:
    assert parse_batch(text) == BatchSize(value, percent)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "at least 1 host"),
        ("0%", "between 1% and 100%"),
        ("150%", "between 1% and 100%"),
        ("-1", "expected a number of hosts"),
        ("two", "expected a number of hosts"),
        ("2.5", "expected a number of hosts"),
    ],
)
def test_batch_rejects(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_batch(text)


@pytest.mark.parametrize(("percent", "hosts", "size"), [(25, 10, 3), (50, 7, 4), (1, 5, 1), (100, 9, 9)])
def test_percent_rounds_up_and_never_below_one(percent: int, hosts: int, size: int) -> None:
    assert BatchSize(percent, True).size_for(hosts) == size


def probes(versions: dict[str, str | None]) -> dict[str, DriverProbe]:
    return {
        h: DriverProbe(h, loaded=v, gpus_pci=1, gpus_driver=1 if v else None) for h, v in versions.items()
    }


HOSTS = [f"gpu{i}" for i in range(1, 8)]


def test_batches_of_n_in_inventory_order() -> None:
    plan = build_plan(HOSTS, probes(dict.fromkeys(HOSTS, "570.195.03")), parse_target("580"), BatchSize(3))
    assert plan.canary == []
    assert plan.batches == [["gpu1", "gpu2", "gpu3"], ["gpu4", "gpu5", "gpu6"], ["gpu7"]]
    assert plan.to_change == HOSTS


def test_canary_first_then_share_of_hosts_to_upgrade() -> None:
    versions = dict.fromkeys(HOSTS, "570.195.03")
    versions["gpu2"] = "580.159.04"  # at target: skipped, and not counted for the share
    plan = build_plan(HOSTS, probes(versions), parse_target("580.159.04"), BatchSize(50, True), canary=2)
    assert plan.canary == ["gpu1", "gpu3"]
    # 6 hosts to upgrade → 3 per batch; the 4 after the canaries make a batch of 3 and one of 1.
    assert plan.batches == [["gpu4", "gpu5", "gpu6"], ["gpu7"]]
    assert plan.waves[0] == ["gpu1", "gpu3"]
    assert plan.skipped == ["gpu2"]
    assert plan.hosts["gpu2"].reason == "already at 580.159.04: 580.159.04 loaded"


def test_branch_target_skips_any_version_of_that_branch() -> None:
    plan = build_plan(
        ["a", "b", "c"],
        probes({"a": "580.95.05", "b": "570.195.03", "c": None}),
        parse_target("580"),
        BatchSize(5),
    )
    assert plan.skipped == ["a"]
    assert plan.batches == [["b", "c"]]
    exact = build_plan(["a"], probes({"a": "580.95.05"}), parse_target("580.159.04"), BatchSize(1))
    assert exact.skipped == [] and exact.batches == [["a"]]


def test_unprobed_host_stays_in_the_plan_with_its_reason() -> None:
    p = probes({"a": "570.195.03"})
    p["b"] = DriverProbe("b", error="connection refused by 192.0.2.2:22")
    plan = build_plan(["a", "b"], p, parse_target("580"), BatchSize(1))
    assert plan.batches == [["a"], ["b"]]
    assert plan.hosts["b"].probe_error == "connection refused by 192.0.2.2:22"


def test_canary_larger_than_the_fleet() -> None:
    plan = build_plan(
        ["a", "b"], probes({"a": "570.1", "b": "570.1"}), parse_target("580"), BatchSize(1), canary=5
    )
    assert plan.canary == ["a", "b"] and plan.batches == []


def test_plan_round_trips_through_the_state_file_form() -> None:
    plan = build_plan(
        HOSTS,
        probes(dict.fromkeys(HOSTS, "570.195.03")),
        parse_target("580"),
        BatchSize(2),
        canary=1,
        kube=True,
    )
    again = Plan.from_dict(plan.to_dict())
    assert again.waves == plan.waves
    assert again.hosts == plan.hosts
    assert again.target == plan.target


def test_dry_run_text_lists_batches_from_to_and_needs() -> None:
    p = probes({"gpu1": "570.195.03", "gpu2": "580.159.04", "gpu3": "570.195.03"})
    plan = build_plan(
        ["gpu1", "gpu2", "gpu3"], p, parse_target("580.159.04"), BatchSize(2), canary=1, kube=True
    )
    text = render_plan(plan, drain=True, reboot_allowed=False, max_fail=0)
    assert "canary (1 host, in parallel):" in text
    assert "gpu1                 570.195.03 → 580.159.04" in text
    assert "batch 1 (1 host, in parallel):" in text
    assert (
        "cordon, drain, stop GPU services, unload modules, unhold, install, hold, reload modules, verify, "
        "uncordon" in text
    )
    assert "skip   gpu2" in text
    no_kube = build_plan(["gpu1"], p, parse_target("580"), BatchSize(1))
    text = render_plan(no_kube, drain=False, reboot_allowed=True, max_fail=2)
    assert "not cordoned or drained" in text
    assert "reboot if reload is impossible" in text
    assert "more than 2 failure(s)" in text


def test_limit_names_must_exist() -> None:
    check_limit_names("gpu1,gpu_nodes,gpu*,~gp.*,!gpu2", ["gpu1", "gpu2"], ["gpu_nodes"])
    with pytest.raises(InputError, match="no host or group named 'gpu9'"):
        check_limit_names("gpu1,gpu9", ["gpu1"], ["gpu_nodes"])
    with pytest.raises(InputError, match="'gpux'"):
        check_limit_names("gpu_nodes:&gpux", ["gpu1"], ["gpu_nodes"])


BEFORE = DriverProbe(
    "h",
    loaded="570.195.03",
    gpus_pci=8,
    gpus_driver=8,
    xids=("[1.0] NVRM: Xid (PCI:0000:18:00): 13, x",),
    driver_ok=True,
)


def test_judge_passes_a_good_upgrade() -> None:
    after = DriverProbe("h", loaded="580.159.04", gpus_pci=8, gpus_driver=8, xids=BEFORE.xids, driver_ok=True)
    assert judge(BEFORE, after, parse_target("580.159.04")) == []
    assert judge(BEFORE, after, parse_target("580")) == []


def test_judge_names_each_problem() -> None:
    after = DriverProbe(
        "h", loaded="570.195.03", gpus_pci=8, gpus_driver=7,
        xids=(*BEFORE.xids, "[9.0] NVRM: Xid (PCI:0000:18:00): 79, fallen off the bus"),
        driver_ok=False, driver_detail="nvidia-smi failed",
    )  # fmt: skip
    problems = judge(BEFORE, after, parse_target("580.159.04"))
    assert problems == [
        "driver.loaded: nvidia-smi failed",
        "driver.version: 570.195.03 loaded, expected 580.159.04",
        "gpu.count: the driver sees 7 GPU(s), 8 before the upgrade",
        "gpu.xid: 1 new Xid event(s) since the upgrade began: "
        "[9.0] NVRM: Xid (PCI:0000:18:00): 79, fallen off the bus",
    ]
    assert judge(BEFORE, DriverProbe("h", error="timed out"), parse_target("580")) == [
        "not reachable after the upgrade: timed out"
    ]


def test_judge_without_a_driver_before_compares_with_the_pci_count() -> None:
    before = DriverProbe("h", loaded=None, gpus_pci=4, gpus_driver=None)
    after = DriverProbe("h", loaded="580.159.04", gpus_pci=4, gpus_driver=4, driver_ok=True)
    assert judge(before, after, parse_target("580")) == []
    short = DriverProbe("h", loaded="580.159.04", gpus_pci=4, gpus_driver=3, driver_ok=True)
    assert judge(before, short, parse_target("580")) == [
        "gpu.count: the driver sees 3 GPU(s), 4 before the upgrade"
    ]
