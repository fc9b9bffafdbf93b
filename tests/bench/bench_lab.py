"""Benchmark of the lab: `gpuprov lab up` of 4 hosts (one per containerd generation) from the cached images,
and (with --scratch) the set-up from empty caches, each printed as a ratio against a baseline measured in
the same run.

Run as a script (root, engine available), not collected by pytest:

    .venv/bin/python tests/bench/bench_lab.py [--repeat 3] [--scratch] [--cluster]

With --cluster it also times what the quick start does: lab up and the first bootstrap of the default
lab onto real Kubernetes (kubeadm, the kubelets, helm and the GPU Operator), from warm caches and, with
--scratch too, from empty ones. Its baseline is the same play run by raw `ansible-playbook` on a fresh
lab of the same hosts (the floor of any tool driving these roles); target: ≤ 6 min from warm caches.

Baselines: for `lab up`, plain `docker run` of as many bare systemd containers from the same image, waited
until systemd is up (what any lab must at least do); for the set-up, one `debootstrap` of each Debian
release the lab's hosts run (the download-and-unpack floor of building those host images here). Targets:
lab up < 30 s, set-up of the mixed lab < 8 min on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from gpuprov_lab import debian, engine, image, keys, paths, state  # noqa: E402
from labkit import gpuprov, unique_lab_name  # noqa: E402

TARGET_UP_S = 30.0
TARGET_SCRATCH_S = 480.0
TARGET_CLUSTER_S = 360.0


def timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def cli(*args: str) -> None:
    res = gpuprov(*args)
    if res.returncode != 0:
        raise SystemExit(f"gpuprov {' '.join(args)} failed (rc {res.returncode}):\n{res.stderr}")


def baseline_docker_run(docker: engine.Docker, host_image: str, n: int) -> float:
    """docker run of n bare systemd containers (same image, privileged), until systemd is up in each."""
    names = [f"gpuprov-bench-{os.getpid()}-{i}" for i in range(n)]

    def run_all() -> None:
        for name in names:
            docker("run", "-d", "--privileged", "--network=none", "--tmpfs=/run", "--name", name, host_image)

        def boot(name: str) -> None:
            while True:
                res = docker("exec", name, "systemctl", "is-system-running", "--wait", check=False)
                if res.stdout.strip() in ("running", "degraded"):
                    return
                time.sleep(0.2)

        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(boot, names))

    try:
        return timed(run_all)
    finally:
        docker("rm", "-f", *names, check=False)


def bench_up(repeat: int, hosts: int) -> None:
    warm = unique_lab_name("bw")
    print(f"warming caches (image, mirror) with lab {warm} ...", flush=True)
    cli("lab", "up", "--lab", warm, "--hosts", "1")
    try:
        docker = engine.Docker()
        key = keys.ensure_archive_key()
        base = image.ensure_base_image(docker, image.ensure_rootfs())
        host_image = image.ensure_host_image(docker, base, key.public)
        ups: list[float] = []
        downs: list[float] = []
        bases: list[float] = []
        for i in range(repeat):
            bases.append(baseline_docker_run(docker, host_image, hosts))
            name = unique_lab_name("b")
            ups.append(timed(lambda name=name: cli("lab", "up", "--lab", name, "--hosts", str(hosts))))
            downs.append(timed(lambda name=name: cli("lab", "down", "--lab", name)))
            print(f"  run {i + 1}: baseline {bases[-1]:.1f} s, up {ups[-1]:.1f} s, down {downs[-1]:.1f} s")
    finally:
        cli("lab", "down", "--lab", warm)
    up, base_s, down = statistics.median(ups), statistics.median(bases), statistics.median(downs)
    print(
        f"lab up ({hosts} hosts, cached image): {up:.1f} s median of {repeat}; "
        f"baseline docker run of {hosts} systemd containers: {base_s:.1f} s; ratio {up / base_s:.2f}x; "
        f"target < {TARGET_UP_S:.0f} s: {'met' if up < TARGET_UP_S else 'NOT met'}"
    )
    print(f"lab down: {down:.1f} s median")


def _inventory(name: str) -> Path:
    res = gpuprov("lab", "inventory", "--lab", name)
    if res.returncode != 0:
        raise SystemExit(f"gpuprov lab inventory failed:\n{res.stderr}")
    return Path(res.stdout.strip().splitlines()[-1])


def raw_site(inventory: Path) -> None:
    """playbooks/site.yml through plain ansible-playbook, with the repository's ansible.cfg."""
    from provisioner.runner import ansible_env, ansible_playbook_binary

    env = {**os.environ, **ansible_env()}
    env["PATH"] = f"{Path(ansible_playbook_binary()).parent}:{env.get('PATH', '')}"
    res = subprocess.run(
        [ansible_playbook_binary(), "-i", str(inventory), str(REPO / "playbooks" / "site.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"ansible-playbook site.yml failed (rc {res.returncode}):\n{res.stdout[-3000:]}")


def cluster_run(hosts: int, raw: bool = False) -> tuple[float, float]:
    """A fresh lab up, then its first bootstrap (gpuprov's, with verification) or the raw play:
    (seconds for lab up, seconds for the bootstrap). The lab is taken down after."""
    name = unique_lab_name("bc")
    try:
        t_up = timed(lambda: cli("lab", "up", "--lab", name, "--hosts", str(hosts)))
        inventory = _inventory(name)
        if raw:
            t_boot = timed(lambda: raw_site(inventory))
        else:
            t_boot = timed(lambda: cli("bootstrap", "-i", str(inventory), "--yes", "--format", "json"))
        return t_up, t_boot
    finally:
        cli("lab", "down", "--lab", name)


def bench_cluster(hosts: int) -> None:
    """Lab up + first bootstrap onto real Kubernetes from warm caches, against the raw play."""
    warm = unique_lab_name("bw")
    print(f"warming caches (image, mirror, registry) with lab {warm} ...", flush=True)
    cli("lab", "up", "--lab", warm, "--hosts", "1")
    cli("lab", "down", "--lab", warm)
    up, boot = cluster_run(hosts)
    print(f"  gpuprov: lab up {up:.1f} s, bootstrap {boot:.1f} s", flush=True)
    raw_up, raw_boot = cluster_run(hosts, raw=True)
    print(f"  baseline: lab up {raw_up:.1f} s, ansible-playbook site.yml {raw_boot:.1f} s", flush=True)
    total, base = up + boot, raw_up + raw_boot
    print(
        f"lab up + bootstrap ({hosts} hosts, real Kubernetes, warm caches): {total:.1f} s "
        f"(up {up:.1f} s, bootstrap {boot:.1f} s); baseline raw play on a fresh lab: {base:.1f} s; "
        f"ratio {total / base:.2f}x; target ≤ {TARGET_CLUSTER_S:.0f} s: "
        f"{'met' if total <= TARGET_CLUSTER_S else 'NOT met'} ({os.cpu_count()} cores)"
    )


def bench_scratch(hosts: int, cluster: bool = False) -> None:
    """Set-up from empty caches: a temporary cache root and no lab images in the engine."""
    if state.all_labs():
        raise SystemExit(f"--scratch needs no lab running (found: {', '.join(state.all_labs())})")
    docker = engine.ensure_engine()
    with tempfile.TemporaryDirectory(prefix="gpuprov-bench-") as tmp:
        env_cache = Path(tmp) / "cache"
        # The floor: one debootstrap of each release's rootfs.
        t_base = 0.0
        for suite in image.SUITES:
            target = Path(tmp) / f"debootstrap-{suite}"
            t_base += timed(
                lambda suite=suite, target=target: subprocess.run(
                    ["debootstrap", "--variant=minbase", f"--include={','.join(image.ROOTFS_PACKAGES)}",
                     suite, str(target), debian.debian_mirror_url()],
                    capture_output=True, check=True,
                )
            )  # fmt: skip
            shutil.rmtree(target, ignore_errors=True)
        for repo in (image.HOST_REPO, image.BASE_REPO):
            for ref in docker.lines("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repo):
                docker("image", "rm", "-f", ref, check=False)
        name = unique_lab_name("s")
        os.environ["GPUPROV_CACHE_DIR"] = str(env_cache)
        t_boot = 0.0
        try:
            t_setup = timed(lambda: cli("lab", "up", "--lab", name, "--hosts", str(hosts)))
            if cluster:
                inventory = _inventory(name)
                t_boot = timed(lambda: cli("bootstrap", "-i", str(inventory), "--yes", "--format", "json"))
        finally:
            cli("lab", "down", "--lab", name)
            os.environ.pop("GPUPROV_CACHE_DIR")
        print(
            f"set-up from scratch (rootfs, image, mirror, {hosts} hosts): {t_setup:.1f} s; "
            f"baseline debootstrap of {', '.join(image.SUITES)}: {t_base:.1f} s; "
            f"ratio {t_setup / t_base:.2f}x; "
            f"target < {TARGET_SCRATCH_S:.0f} s: {'met' if t_setup < TARGET_SCRATCH_S else 'NOT met'} "
            f"({os.cpu_count()} cores)"
        )
        if cluster:
            print(
                f"lab up + bootstrap from empty caches ({hosts} hosts, real Kubernetes): "
                f"{t_setup + t_boot:.1f} s (set-up and up {t_setup:.1f} s, bootstrap {t_boot:.1f} s)"
            )
    print(f"(caches in {paths.cache_root()} were not touched; lab images were rebuilt from the scratch run)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--scratch", action="store_true", help="also time the set-up from empty caches (minutes)")
    ap.add_argument("--cluster", action="store_true", help="also time lab up + first bootstrap (minutes)")
    args = ap.parse_args()
    reason = engine.unavailable_reason()
    if reason:
        raise SystemExit(f"the lab cannot run here: {reason}")
    bench_up(args.repeat, args.hosts)
    if args.cluster:
        bench_cluster(args.hosts)
    if args.scratch:
        bench_scratch(args.hosts, cluster=args.cluster)


if __name__ == "__main__":
    main()
