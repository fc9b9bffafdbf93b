"""Benchmark: `gpuprov top --once` over N SSH hosts vs Ansible and OpenSSH running the same query, and
the controller CPU per host per refresh once connections are open.

    .venv/bin/python tests/bench/bench_top.py --hosts 200
    .venv/bin/python tests/bench/bench_top.py --hosts 40 --refreshes 5 --no-ansible

Hosts are real sshd servers on loopback addresses (tests/fixtures/loopback_sshd.py, host keys checked).
gpuprov streams: one long-lived shell per host (provisioner.top.stream_script) answers each refresh with
nvidia-smi's query and passes on new Xid lines as the kernel logs them. OpenSSH and Ansible run the same
refresh as a one-shot script (provisioner.top.SCRIPT: the query, then this boot's Xid lines). This
machine has no nvidia-smi, so each host answers "nvidia-smi not found" (exit 127): the figures are the
cost of reaching the hosts and getting a refresh's answer, which is what `top` adds on top of
nvidia-smi itself. A run counts as good when every host answered.

- gpuprov first sample: `top.Fleet.refresh()` in this process, connections and streams included;
- gpuprov steady refreshes: further refreshes over the open streams (what `top` does every few
  seconds); CPU per host per refresh is this process's CPU time (all its threads, paramiko's
  transport threads included) / hosts / refreshes;
- OpenSSH: `ssh host sh -s` with the script, at the same concurrency;
- Ansible tuned: `ansible all -m ansible.builtin.shell` with the script (forks = concurrency, pipelining,
  ControlPersist).
Ratios are against gpuprov's first sample; nothing here asserts a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
sys.path.insert(0, str(REPO / "tests" / "bench"))

from bench_verify import (  # noqa: E402
    VENV_BIN,
    Run,
    _children_cpu,
    _self_cpu,
    _stop_control_masters,
    bench_arguments,
    host_specs,
    loopback_fleet,
    parse_bench_arguments,
    ssh_each,
    write_inventory,
)
from loopback_sshd import LoopbackFleet  # noqa: E402

from provisioner import top as T  # noqa: E402
from provisioner.verification import ssh_targets  # noqa: E402


def answered(samples: list[T.HostSample]) -> bool:
    return all(s.gpus or s.error == "nvidia-smi not found" for s in samples)


def run_top(fleet: LoopbackFleet, parallel: int, refreshes: int) -> tuple[Run, Run]:
    targets = [(t.name, t.open) for t in ssh_targets(host_specs(fleet))]
    top = T.Fleet(targets, parallel, timeout=60)
    try:
        c0, t0 = _self_cpu(), time.monotonic()
        first = top.refresh()
        wall, cpu = time.monotonic() - t0, _self_cpu() - c0
        first_run = Run("gpuprov top --once (connections included)", wall, cpu, answered(first))
        c0, t0 = _self_cpu(), time.monotonic()
        ok = True
        for _ in range(refreshes):
            ok = answered(top.refresh()) and ok
        wall, cpu = time.monotonic() - t0, _self_cpu() - c0
        n = len(targets) * max(1, refreshes)
        steady = Run(
            f"gpuprov top, {refreshes} refreshes over open connections",
            wall / max(1, refreshes),
            cpu / max(1, refreshes),
            ok,
            f"{1000 * cpu / n:.2f} ms controller CPU per host per refresh",
        )
    finally:
        top.close()
    return first_run, steady


def run_openssh(fleet: LoopbackFleet, parallel: int) -> Run:
    wall, cpu, rcs = ssh_each(fleet, parallel, ["sh -s"], input=T.SCRIPT, text=True, capture_output=True)
    return Run("OpenSSH running the same script", wall, cpu, all(rc in (0, 127) for rc in rcs))


def run_ansible(fleet: LoopbackFleet, inventory: Path, work: Path, forks: int) -> Run:
    control = work / "cp"
    control.mkdir()
    env = {
        **os.environ,
        "ANSIBLE_FORKS": str(forks),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-local"),
        "ANSIBLE_HOME": str(work / "ansible-home"),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_ARGS": "-C -o ControlMaster=auto -o ControlPersist=600s",
        "ANSIBLE_NOCOLOR": "1",
    }
    c0, t0 = _children_cpu(), time.monotonic()
    res = subprocess.run(
        [str(VENV_BIN / "ansible"), "all", "-i", str(inventory), "-m", "ansible.builtin.shell",
         "-a", T.SCRIPT],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    wall, cpu = time.monotonic() - t0, _children_cpu() - c0
    import re

    states = re.findall(r"^h\d{3} \| ([A-Z]+)", res.stdout, re.M)
    ok = len(states) == len(fleet.servers) and "UNREACHABLE" not in states
    _stop_control_masters(fleet, control)
    note = "" if ok else (res.stdout + res.stderr).strip()[-300:]
    return Run(f"Ansible tuned (forks {forks}, pipelining, ControlPersist)", wall, cpu, ok, note)


def main() -> int:
    ap = bench_arguments(__doc__)
    ap.add_argument("--refreshes", type=int, default=3, help="steady refreshes after the first sample")
    ap.add_argument("--no-ansible", action="store_true")
    args = parse_bench_arguments(ap, "bench_top")
    runs: list[Run] = []
    with loopback_fleet("gpuprov-bench-top-", args.hosts) as (fleet, work):
        inventory = work / "inventory.ini"
        write_inventory(fleet, inventory)
        runs.extend(run_top(fleet, args.parallel, args.refreshes))
        runs.append(run_openssh(fleet, args.parallel))
        if not args.no_ansible:
            runs.append(run_ansible(fleet, inventory, work, args.parallel))
    base = runs[0]
    print(f"\n{args.hosts} hosts, concurrency {args.parallel}")
    print(f"{'run':<58} {'wall s':>8} {'cpu s':>8} {'× gpuprov wall':>15}  ok")
    for r in runs:
        ratio = r.wall_s / base.wall_s if base.wall_s else 0.0
        print(
            f"{r.name:<58} {r.wall_s:8.2f} {r.cpu_s:8.2f} {ratio:15.2f}  {'yes' if r.ok else 'NO'} {r.note}"
        )
    print(f"controller CPU per host, first sample: {1000 * base.cpu_s / args.hosts:.1f} ms")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
