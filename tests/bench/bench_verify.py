"""Benchmark: `verify` over N SSH hosts vs Ansible (defaults and tuned) vs the OpenSSH floor.

    .venv/bin/python tests/bench/bench_verify.py --hosts 40          # the figures in docs/verification.md
    .venv/bin/python tests/bench/bench_verify.py --hosts 10 --quick  # a minute; skips Ansible defaults

Every host is a real sshd on its own loopback address (127.0.x.y) with its own host key, recorded
in a known_hosts file; every run checks host keys strictly. All runs probe the same hosts with the
same concurrency (--parallel, default 50) except "Ansible defaults" (forks 5, its default):

- gpuprov: `verify_hosts()` in this process (all probes, one script and one channel per host);
  controller CPU is this process's CPU time during the call. When provisioner.inventory exists, the
  CLI (`gpuprov verify -i`) is measured too, its CPU being the child's (imports included).
- Ansible: ansible-playbook running the same probe commands, one task per probe (the natural way to
  write it), gather_facts off and the interpreter set (both in Ansible's favour). Defaults: forks 5,
  Ansible's default ssh args (ControlMaster auto, ControlPersist 60s), no pipelining. Tuned: forks =
  --parallel, pipelining on, ControlPersist 600s. Each run starts with fresh control sockets.
- Floor: OpenSSH `ssh host true` N times at the same concurrency; and, for reference, OpenSSH
  running the same probe script (the remote work is on this machine too, since hosts are loopback).

Ratios are printed against the gpuprov run of the same invocation; nothing here asserts a time.
The sshd servers and any ControlPersist masters are stopped at the end (by PID / `ssh -O exit`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))

from loopback_sshd import LoopbackFleet, available  # noqa: E402

from provisioner.checks import CHECK_IDS, probes_for  # noqa: E402
from provisioner.probes import PROBES_BY_NAME  # noqa: E402
from provisioner.probes.script import _PRELUDE, build_script, new_token  # noqa: E402
from provisioner.verification import verify_hosts  # noqa: E402

VENV_BIN = Path(sys.executable).parent


@dataclass
class Run:
    name: str
    wall_s: float
    cpu_s: float
    ok: bool
    note: str = ""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def host_specs(fleet: LoopbackFleet) -> list[SimpleNamespace]:
    return [fleet.host_spec(f"h{i:03d}", s.address) for i, s in enumerate(fleet.servers)]


def write_inventory(fleet: LoopbackFleet, path: Path) -> None:
    lines = ["[gpu_nodes]"]
    lines += [f"h{i:03d} ansible_host={s.address}" for i, s in enumerate(fleet.servers)]
    lines += [
        "",
        "[all:vars]",
        f"ansible_port={fleet.port}",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={fleet.client_key}",
        f"ansible_ssh_common_args='-o UserKnownHostsFile={fleet.known_hosts} -o StrictHostKeyChecking=yes'",
        "ansible_python_interpreter=/usr/bin/python3",
    ]
    path.write_text("\n".join(lines) + "\n")


def write_playbook(path: Path, names: list[str]) -> None:
    """The probe set as Ansible tasks: the same prelude and probe body, one shell task per probe."""
    prelude = _PRELUDE.split("run() {")[0]  # PATH, LC_ALL, t(), now(), rd(): what the bodies use
    tasks = []
    for name in names:
        script = f"{prelude}\np() {{\n{PROBES_BY_NAME[name].command}\n}}\np\n"
        tasks.append(
            {
                "name": f"Probe {name}",
                "ansible.builtin.shell": {"cmd": script, "executable": "/bin/sh"},
                "register": "probe_" + name.replace("-", "_").replace(".", "_"),
                "changed_when": False,
                "failed_when": False,
            }
        )
    play = [{"name": "Probe GPU hosts", "hosts": "all", "gather_facts": False, "tasks": tasks}]
    path.write_text(json.dumps(play, indent=1))  # JSON is YAML


def run_gpuprov(fleet: LoopbackFleet, parallel: int) -> Run:
    hosts = host_specs(fleet)
    c0, t0 = _self_cpu(), time.monotonic()
    report = verify_hosts(hosts, parallel=parallel)
    wall, cpu = time.monotonic() - t0, _self_cpu() - c0
    errors = [h.host for h in report.hosts if h.error]
    ok = not errors and all(len(h.findings) >= len(CHECK_IDS) for h in report.hosts)
    return Run("gpuprov verify (library)", wall, cpu, ok, f"{len(errors)} host errors" if errors else "")


def run_gpuprov_cli(inventory: Path, parallel: int, out: Path) -> Run | None:
    try:
        import provisioner.inventory  # noqa: F401
    except ImportError:
        return None
    c0, t0 = _children_cpu(), time.monotonic()
    res = subprocess.run(
        [
            str(VENV_BIN / "gpuprov"),
            "verify",
            "-i",
            str(inventory),
            "--format",
            "json",
            "--parallel",
            str(parallel),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    wall, cpu = time.monotonic() - t0, _children_cpu() - c0
    ok = (
        res.returncode in (0, 1)
        and out.exists()
        and not any(h.get("error") for h in json.loads(out.read_text())["hosts"])
    )
    return Run("gpuprov verify -i (CLI)", wall, cpu, ok, "" if ok else res.stderr.strip()[-200:])


def ssh_base(fleet: LoopbackFleet) -> list[str]:
    return [
        "ssh",
        "-i",
        str(fleet.client_key),
        "-p",
        str(fleet.port),
        "-o",
        f"UserKnownHostsFile={fleet.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ControlMaster=no",
        "-l",
        "root",
    ]


def ssh_each(
    fleet: LoopbackFleet, parallel: int, remote: list[str], **io: Any
) -> tuple[float, float, list[int]]:
    """`ssh HOST REMOTE...` to every host, `parallel` at a time (`io` goes to subprocess.run): the wall and
    children's CPU seconds, and each exit code."""
    base = ssh_base(fleet)

    def one(address: str) -> int:
        return subprocess.run([*base, address, *remote], **io).returncode

    c0, t0 = _children_cpu(), time.monotonic()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        rcs = list(pool.map(one, [s.address for s in fleet.servers]))
    return time.monotonic() - t0, _children_cpu() - c0, rcs


def run_ssh(fleet: LoopbackFleet, parallel: int, remote: list[str], name: str) -> Run:
    quiet = subprocess.DEVNULL
    wall, cpu, rcs = ssh_each(fleet, parallel, remote, stdin=quiet, stdout=quiet, stderr=quiet)
    return Run(
        name,
        wall,
        cpu,
        all(rc == 0 for rc in rcs),
        f"{sum(rc != 0 for rc in rcs)} failed" if any(rcs) else "",
    )


def run_ansible(
    fleet: LoopbackFleet, inventory: Path, playbook: Path, work: Path, *, forks: int, tuned: bool, name: str
) -> Run:
    control = work / f"cp-{'tuned' if tuned else 'default'}"
    control.mkdir()
    env = {
        **os.environ,
        "ANSIBLE_FORKS": str(forks),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-local"),
        "ANSIBLE_HOME": str(work / "ansible-home"),
        "ANSIBLE_NOCOLOR": "1",
    }
    if tuned:
        env["ANSIBLE_PIPELINING"] = "True"
        env["ANSIBLE_SSH_ARGS"] = "-C -o ControlMaster=auto -o ControlPersist=600s"
    c0, t0 = _children_cpu(), time.monotonic()
    res = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)],
        capture_output=True,
        text=True,
        env=env,
    )
    wall, cpu = time.monotonic() - t0, _children_cpu() - c0
    recap = [line for line in res.stdout.splitlines() if " : ok=" in line]
    ok = (
        res.returncode == 0
        and len(recap) == len(fleet.servers)
        and all("unreachable=0" in line and "failed=0" in line for line in recap)
    )
    _stop_control_masters(fleet, control)
    return Run(name, wall, cpu, ok, "" if ok else (res.stdout + res.stderr).strip()[-300:])


def _stop_control_masters(fleet: LoopbackFleet, control: Path) -> None:
    """ControlPersist masters outlive ansible-playbook: ask each to exit through its own socket."""
    for sock in control.iterdir():
        subprocess.run(
            ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "-p", str(fleet.port), "dummy"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
        )


def bench_arguments(doc: str, parallel_help: str | None = None) -> argparse.ArgumentParser:
    """The arguments of every loopback benchmark: --hosts and --parallel; the benchmark adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=40, help="sshd endpoints (1-500)")
    ap.add_argument("--parallel", type=int, default=50, help=parallel_help)
    return ap


def parse_bench_arguments(ap: argparse.ArgumentParser, bench: str) -> argparse.Namespace:
    """The arguments, --hosts within 1-500; exit 2 when loopback sshd cannot run here."""
    args = ap.parse_args()
    if not 1 <= args.hosts <= 500:
        ap.error("--hosts must be 1-500")
    why = available()
    if why:
        print(f"{bench}: cannot run: {why}", file=sys.stderr)
        raise SystemExit(2)
    return args


@contextlib.contextmanager
def loopback_fleet(prefix: str, hosts: int) -> Iterator[tuple[LoopbackFleet, Path]]:
    """`hosts` sshd endpoints, started, and a work directory; both gone afterwards, also on failure."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    fleet = LoopbackFleet(work / "sshd", count=hosts, first=2)
    try:
        fleet.start()
        yield fleet, work
    finally:
        fleet.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = bench_arguments(__doc__, "concurrency for gpuprov, tuned Ansible, floor")
    ap.add_argument("--quick", action="store_true", help="skip Ansible at defaults (the slowest run)")
    ap.add_argument("--no-ansible", action="store_true", help="skip both Ansible runs")
    args = parse_bench_arguments(ap, "bench_verify")
    runs: list[Run] = []
    t0 = time.monotonic()
    with loopback_fleet("gpuprov-bench-", args.hosts) as (fleet, work):
        print(
            f"{args.hosts} sshd endpoints on {fleet.servers[0].address}-{fleet.servers[-1].address}:"
            f"{fleet.port} up in "
            f"{time.monotonic() - t0:.1f} s; concurrency {args.parallel}",
            flush=True,
        )
        inventory = work / "inventory.ini"
        write_inventory(fleet, inventory)
        names = probes_for(CHECK_IDS)
        playbook = work / "probes.yml"
        write_playbook(playbook, names)
        script = build_script(names, new_token())

        runs.append(run_ssh(fleet, args.parallel, ["true"], "OpenSSH floor: ssh host true"))
        runs.append(run_gpuprov(fleet, args.parallel))
        cli = run_gpuprov_cli(inventory, args.parallel, work / "report.json")
        if cli:
            runs.append(cli)
        runs.append(_ssh_script(fleet, args.parallel, script))
        # Ansible tuned, then (unless --quick) at its defaults, the slowest run: (forks, tuned, name).
        ansible = [
            (args.parallel, True, f"Ansible tuned (forks {args.parallel}, pipelining, ControlPersist)")
        ]
        if not args.quick:
            ansible.append((5, False, "Ansible defaults (forks 5)"))
        for forks, tuned, name in [] if args.no_ansible else ansible:
            runs.append(run_ansible(fleet, inventory, playbook, work, forks=forks, tuned=tuned, name=name))
    report(runs, args.hosts, len(names))
    return 0 if all(r.ok for r in runs) else 1


def _ssh_script(fleet: LoopbackFleet, parallel: int, script: str) -> Run:
    """OpenSSH running the probe script, fed on stdin (the script contains quotes)."""
    quiet = subprocess.DEVNULL
    wall, cpu, rcs = ssh_each(fleet, parallel, ["sh -s"], input=script.encode(), stdout=quiet, stderr=quiet)
    return Run("OpenSSH + same probe script", wall, cpu, all(rc == 0 for rc in rcs))


def report(runs: list[Run], hosts: int, probes: int) -> None:
    base = next(r for r in runs if r.name.startswith("gpuprov verify (library)"))
    print(f"\n{hosts} hosts, {probes} probes per host\n")
    print(f"{'run':<58} {'wall s':>8} {'vs gpuprov':>10} {'ctl CPU s':>10} {'CPU/host ms':>12}  ok")
    for r in runs:
        ratio = r.wall_s / base.wall_s if base.wall_s else float("nan")
        print(
            f"{r.name:<58} {r.wall_s:8.2f} {ratio:9.1f}× {r.cpu_s:10.2f} {1000 * r.cpu_s / hosts:12.1f}  "
            f"{'yes' if r.ok else 'NO ' + r.note}"
        )
    floor = next(r for r in runs if r.name.startswith("OpenSSH floor"))
    print()
    for r in runs:
        if r.name.startswith("Ansible"):
            print(f"gpuprov is {r.wall_s / base.wall_s:.1f}× faster than {r.name}")
    print(
        f"gpuprov wall / OpenSSH floor wall: {base.wall_s / floor.wall_s:.2f} "
        f"({'no slower' if base.wall_s <= floor.wall_s else 'slower'} than the floor)"
    )
    print(f"gpuprov controller CPU: {1000 * base.cpu_s / hosts:.1f} ms per host")


if __name__ == "__main__":
    sys.exit(main())
