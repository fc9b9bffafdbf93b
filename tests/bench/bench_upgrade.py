"""Benchmark: the makespan of `gpuprov upgrade-driver` over N lab hosts in batches of B, against one
host's upgrade time measured in the same command. Prints makespan / (ceil(N/B) × single) (target ≤ 1.2:
hosts of a batch really run in parallel and a batch costs little more than one host).

Run as a script (root, lab engine available), not collected by pytest:

    .venv/bin/python tests/bench/bench_upgrade.py [--hosts 4] [--batch 2] [--profiles h200] [--keep]

It brings up its own lab (cp1 + N GPU hosts, all of one profile by default so that every host has the
same work), bootstraps it with the driver pinned to 570 (not measured), then measures:

1. single: `upgrade-driver --to 580 --limit gpu1` (gpu1 alone), then puts gpu1 back on 570 (not measured);
2. fleet:  `upgrade-driver --to 580 --batch B` over all N hosts.

Both are whole CLI runs (start-up, inventory, probes, cordon/drain, playbook, verify, uncordon), so the
fixed costs count once in each. The rollout's own makespan (first probe to last host done, from the run's
state file) and the time per step are printed too. The lab is taken down at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from labkit import gpuprov, unique_lab_name  # noqa: E402

TARGET_RATIO = 1.2
OLD = "570.195.03"


@dataclass
class Measure:
    wall_s: float
    controller_cpu_s: float  # gpuprov and everything it ran here (ansible-playbook and its workers)
    hosts_cpu_s: float | None  # the lab hosts' containers (cgroup v1 cpuacct); None where unreadable
    summary: dict[str, Any]

    @property
    def cpu_s(self) -> float:
        return self.controller_cpu_s + (self.hosts_cpu_s or 0.0)


def lab_cpu_ns(lab: str) -> int | None:
    """CPU time used so far by the lab's containers (they share this machine's cores with the controller)."""
    ids = subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", "--filter", f"name=gpuprov-{lab}-"],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    total = 0
    for cid in ids:
        path = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
        try:
            total += int(path.read_text())
        except (OSError, ValueError):
            return None
    return total if ids else None


def run(*args: str, home: Path, lab: str, timeout: float = 3600) -> Measure:
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    h0 = lab_cpu_ns(lab)
    t0 = time.monotonic()
    res = gpuprov(*args, "--format", "json", timeout=timeout, env={"GPUPROV_HOME": str(home)})
    elapsed = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    h1 = lab_cpu_ns(lab)
    if res.returncode != 0:
        raise SystemExit(f"gpuprov {' '.join(args)} failed (rc {res.returncode}):\n{res.stderr[-4000:]}")
    controller = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    hosts = (h1 - h0) / 1e9 if h0 is not None and h1 is not None else None
    return Measure(elapsed, controller, hosts, json.loads(res.stdout))


def rollout_stats(summary: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """Makespan (first probe → last host done) and the mean seconds per step, from the state file."""
    state = json.loads((Path(summary["record"]) / "state.json").read_text())
    starts, ends = [], []
    per_step: dict[str, list[float]] = {}
    for host in state["hosts"].values():
        history = host["history"]
        if not history or history[-1][0] != "upgraded":
            continue
        first = max(i for i, h in enumerate(history) if h[0] == "probing")
        span = history[first:]
        starts.append(span[0][1])
        ends.append(span[-1][1])
        for (step, t), (_, t_next) in zip((h[:2] for h in span), (h[:2] for h in span[1:]), strict=False):
            per_step.setdefault(step, []).append(t_next - t)
    if not starts:
        raise SystemExit(f"no host upgraded in {summary['record']}")
    return max(ends) - min(starts), {s: sum(v) / len(v) for s, v in per_step.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4, help="GPU hosts (the lab adds cp1)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--profiles", default="h200", help="profile of every GPU host, or a comma list")
    ap.add_argument("--keep", action="store_true", help="leave the lab (and the run records) in place")
    args = ap.parse_args()
    n, b = args.hosts, args.batch
    profiles = args.profiles.split(",")
    profiles = (profiles * n)[:n] if len(profiles) == 1 else profiles

    lab = unique_lab_name("bu")
    work = Path(tempfile.mkdtemp(prefix="bench-upgrade-"))
    home = work / "home"
    try:
        res = gpuprov("lab", "up", "--lab", lab, "--hosts", str(n + 1), "--profiles", ",".join(profiles))
        if res.returncode != 0:
            raise SystemExit(f"gpuprov lab up failed:\n{res.stderr}")
        lab_inv = Path(gpuprov("lab", "inventory", "--lab", lab).stdout.strip().splitlines()[-1])
        inv_dir = work / "inventory"
        (inv_dir / "group_vars").mkdir(parents=True)
        inventory = inv_dir / "hosts.yml"
        shutil.copyfile(lab_inv, inventory)
        (inv_dir / "group_vars" / "gpu_nodes.yml").write_text(
            f'nvidia_driver_branch: "570"\nnvidia_driver_version: "{OLD}"\ncuda_toolkit_versions: ["12.8"]\n'
        )
        print(
            f"lab {lab}: cp1 + {n} GPU hosts ({', '.join(profiles)}); bootstrapping at {OLD} (not measured)"
        )
        boot = gpuprov("bootstrap", "-i", str(inventory), "--yes", "--skip", "verify", timeout=7200,
                       env={"GPUPROV_HOME": str(home)})  # fmt: skip
        if boot.returncode != 0:
            raise SystemExit(f"bootstrap failed:\n{boot.stderr[-4000:]}")

        inv = str(inventory)
        idle_s = 15.0
        c0 = lab_cpu_ns(lab)
        time.sleep(idle_s)
        c1 = lab_cpu_ns(lab)
        idle_cores = (c1 - c0) / 1e9 / idle_s if c0 is not None and c1 is not None else None
        single = run("upgrade-driver", "-i", inv, "--to", "580", "--limit", "gpu1", home=home, lab=lab)
        print(f"single host (gpu1): {single.wall_s:.1f} s")
        # back to 570, not measured
        run("upgrade-driver", "-i", inv, "--to", OLD, "--limit", "gpu1", home=home, lab=lab)
        fleet = run("upgrade-driver", "-i", inv, "--to", "580", "--batch", str(b), home=home, lab=lab)
        results = {h["result"] for h in fleet.summary["hosts"]}
        if results != {"upgraded"}:
            raise SystemExit(f"the fleet run did not upgrade every host: {fleet.summary['hosts']}")
        waves = math.ceil(n / b)
        one_span, one_steps = rollout_stats(single.summary)
        fleet_span, fleet_steps = rollout_stats(fleet.summary)
        print(f"fleet ({n} hosts, batch {b}, {waves} batches): {fleet.wall_s:.1f} s")
        print()
        print(f"{'':<28}{'single':>10}{'fleet':>10}{'ideal':>10}{'ratio':>8}")
        ratio = fleet.wall_s / (waves * single.wall_s)
        span_ratio = fleet_span / (waves * one_span)
        print(
            f"{'whole CLI run (s)':<28}{single.wall_s:>10.1f}{fleet.wall_s:>10.1f}"
            f"{waves * single.wall_s:>10.1f}{ratio:>8.2f}"
        )
        print(
            f"{'rollout makespan (s)':<28}{one_span:>10.1f}{fleet_span:>10.1f}{waves * one_span:>10.1f}"
            f"{span_ratio:>8.2f}"
        )
        print()
        print("mean seconds per step (single / fleet host):")
        for step in one_steps:
            print(f"  {step:<14}{one_steps[step]:>8.1f}{fleet_steps.get(step, float('nan')):>8.1f}")
        print()
        cores = os.cpu_count() or 1
        hosts_txt = lambda m: "n/a" if m.hosts_cpu_s is None else f"{m.hosts_cpu_s:.1f}"  # noqa: E731
        print(f"CPU seconds (this machine has {cores} cores; the lab hosts run on them too):")
        for name, m in (("single", single), ("fleet", fleet)):
            print(
                f"  {name:<8} controller {m.controller_cpu_s:6.1f}  lab hosts {hosts_txt(m):>6}  "
                f"total {m.cpu_s:6.1f}  = {m.cpu_s / m.wall_s:.2f} cores busy on average"
            )
        if single.hosts_cpu_s is not None and idle_cores is not None:
            # The lab's hosts keep busy when idle too (kubelet, controllers, daemons). What an upgrade
            # itself costs is the rest; B of them in parallel need B times that, on the cores the idle
            # load leaves: a batch cannot be faster than that.
            work = single.cpu_s - idle_cores * single.wall_s
            floor = max(single.wall_s, b * work / max(cores - idle_cores, 0.1)) / single.wall_s
            print(f"  idle lab: {idle_cores:.2f} cores; one host's upgrade: {work:.1f} CPU seconds")
            print(f"  CPU floor for a batch of {b} on {cores} cores: {floor:.2f} x a single host's time")
        print()
        verdict = "within" if ratio <= TARGET_RATIO else "ABOVE"
        print(f"makespan / (ceil(N/B) x single) = {ratio:.2f} ({verdict} the {TARGET_RATIO} target)")
    finally:
        if not args.keep:
            down = gpuprov("lab", "down", "--lab", lab)
            if down.returncode != 0:
                sys.stderr.write(f"gpuprov lab down --lab {lab} failed:\n{down.stderr}\n")
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"lab {lab} kept (gpuprov lab down --lab {lab}); inventory and run records in {work}")


if __name__ == "__main__":
    main()
