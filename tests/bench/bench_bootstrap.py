"""Benchmark: an idempotent (second) bootstrap through gpuprov against raw `ansible-playbook` of the same
play and inventory, run alternately in the same command. Prints the ratio (target ≤ 1.1).

Both use the repository's ansible.cfg (same forks, pipelining, ControlPersist), so the ratio is gpuprov's
own cost: validation, ansible-runner's event stream, progress, run record and summary. Verification
after the play is left out of the comparison (`--skip verify`): raw ansible-playbook does not verify.

Run as a script (root, lab engine available), not collected by pytest:

    .venv/bin/python tests/bench/bench_bootstrap.py [--inventory INV] [--repeat 3]

Without --inventory it brings up its own 3-host lab, bootstraps it once, measures, and takes it down.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from labkit import gpuprov, unique_lab_name  # noqa: E402

from provisioner.runner import ansible_env, ansible_playbook_binary  # noqa: E402

TARGET_RATIO = 1.1


def raw_playbook(inventory: Path) -> float:
    env = {**os.environ, **ansible_env()}
    env["PATH"] = f"{Path(ansible_playbook_binary()).parent}:{env.get('PATH', '')}"
    t0 = time.monotonic()
    res = subprocess.run(
        [ansible_playbook_binary(), "-i", str(inventory), str(REPO / "playbooks" / "site.yml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"ansible-playbook failed (rc {res.returncode}):\n{res.stdout[-3000:]}")
    recap = [line for line in res.stdout.splitlines() if " ok=" in line and " changed=" in line]
    if not recap or any(" changed=0 " not in line for line in recap):
        raise SystemExit("raw run changed something (lab not converged):\n" + "\n".join(recap))
    return elapsed


def via_gpuprov(inventory: Path) -> float:
    t0 = time.monotonic()
    res = gpuprov("bootstrap", "-i", str(inventory), "--yes", "--skip", "verify", "--format", "json")
    elapsed = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"gpuprov bootstrap failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", type=Path, help="an already bootstrapped inventory")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    lab = None
    inventory = args.inventory
    try:
        if inventory is None:
            lab = unique_lab_name("bb")
            res = gpuprov("lab", "up", "--lab", lab, "--hosts", "3")
            if res.returncode != 0:
                raise SystemExit(f"gpuprov lab up failed:\n{res.stderr}")
            inventory = Path(gpuprov("lab", "inventory", "--lab", lab).stdout.strip().splitlines()[-1])
            print(f"converging lab {lab} once (not measured)...", flush=True)
            via_gpuprov(inventory)
        raw, ours = [], []
        for i in range(args.repeat):
            raw.append(raw_playbook(inventory))
            ours.append(via_gpuprov(inventory))
            print(f"run {i + 1}: ansible-playbook {raw[-1]:.1f} s, gpuprov {ours[-1]:.1f} s", flush=True)
        r, o = statistics.median(raw), statistics.median(ours)
        ratio = o / r
        verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
        print(f"idempotent bootstrap, median of {args.repeat}: ansible-playbook {r:.1f} s, gpuprov {o:.1f} s")
        print(f"ratio gpuprov / ansible-playbook = {ratio:.3f} ({verdict} target ≤ {TARGET_RATIO})")
    finally:
        if lab is not None:
            gpuprov("lab", "down", "--lab", lab)


if __name__ == "__main__":
    main()
