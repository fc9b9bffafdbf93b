"""Bad operator files through the real CLI, for every verb that reads them: each exits 2 naming the file
(and key), prints no traceback, does not hang, and contacts nothing.

The inventories name hosts in TEST-NET-1 (192.0.2.0/24) with a one-second ConnectTimeout: a verb that
tried to reach one would say so (unreachable, could not be probed) and exit otherwise, and a verb that
starts work writes a run record under GPUPROV_HOME, which stays empty. Every case runs in its own
process with a timeout, so a hang fails the case instead of the suite. A bad inventory goes to every
verb for the two classic cases (an alias bomb, a repeated key in group_vars) and to one verb in turn
otherwise, since every verb reads its inventory through the same loader; the settings inside it go to
the verb that applies them or, for some, to another verb that reads them too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 60

HOSTS = """\
all:
  vars:
    ansible_user: ubuntu
    ansible_ssh_common_args: "-o ConnectTimeout=1"
  children:
    kube_control_plane:
      hosts:
        cp1: {ansible_host: 192.0.2.10}
    gpu_nodes:
      hosts:
        gpu1: {ansible_host: 192.0.2.21}
    k8s_cluster:
      children:
        kube_control_plane: {}
        gpu_nodes: {}
"""
GPU_NODES = "gpuprov_mig_strategy: mixed\ngpuprov_mig_config: all-1g.18gb\n"
ALIAS_BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True))
    + "nvidia_driver_bomb: [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n"
)

VERBS: dict[str, tuple[str, ...]] = {
    "verify": ("verify",),
    "check": ("check", "--policy", "{policy}"),
    "bootstrap": ("bootstrap", "--check"),
    "upgrade-driver": ("upgrade-driver", "--to", "580", "--dry-run"),
    "mig-apply": ("mig", "apply", "--dry-run"),
    "sharing-apply": ("sharing", "apply", "--check"),
    "tenants-apply": ("tenants", "apply", "--check"),
    "top": ("top", "--once"),
}


def base_inventory(root: Path) -> Path:
    """A good inventory: every verb would go on to contact its hosts."""
    (root / "group_vars").mkdir(parents=True)
    (root / "group_vars" / "gpu_nodes.yml").write_text(GPU_NODES)
    (root / "policy.yml").write_text("gpu.count: 8\n")
    path = root / "hosts.yml"
    path.write_text(HOSTS)
    return path


def run(
    tmp_path: Path, verb: str, inventory: Path | str, *, policy: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`gpuprov VERB ... -i INVENTORY` in its own process (GPUPROV_HOME under tmp_path)."""
    args = [a.format(policy=policy or tmp_path / "inv" / "policy.yml") for a in VERBS[verb]]
    if verb == "verify" and policy is not None:
        args += ["--policy", str(policy)]
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args, "-i", str(inventory)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={**os.environ, "GPUPROV_HOME": str(tmp_path / "home"), "COLUMNS": "200"},
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


def refused_untouched(tmp_path: Path, res: subprocess.CompletedProcess[str], *named: str) -> None:
    out = res.stdout + res.stderr
    assert "Traceback" not in out, res.stderr[-2000:]
    assert res.returncode == 2, out[-2000:]
    for words in named:
        assert words in res.stderr, (words, res.stderr[-2000:])
    assert len(res.stderr) < 2000  # one line, not a dump of what was read
    for sign in ("unreachable", "cannot connect", "could not be probed", "No route", "UNREACHABLE"):
        assert sign not in out, out[-2000:]
    runs = tmp_path / "home" / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a run record: work on hosts had started"


# --------------------------------------------------------------------------------------- inventories
# Each case writes its bad file into a copy of the good inventory and returns what -i gets and the words
# the error must hold (the file, and the key or line where there is one).
Case = Callable[[Path, Path], tuple[Path | str, list[str]]]


def alias_bomb_in_group_vars(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    bad = inv.parent / "group_vars" / "gpu_nodes.yml"
    bad.write_text(GPU_NODES + ALIAS_BOMB)
    return inv, [f"{bad}:4:", "alias *a"]


def fifo_as_group_vars(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    bad = inv.parent / "group_vars" / "gpu_nodes.yml"
    bad.unlink()
    os.mkfifo(bad)
    return inv, [str(bad), "a FIFO, not a regular file"]


def duplicate_key_in_group_vars(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    bad = inv.parent / "group_vars" / "gpu_nodes.yml"
    bad.write_text(GPU_NODES + "nvidia_driver_branch: '580'\nnvidia_driver_branch: '570'\n")
    return inv, [f"{bad}:4:1:", "duplicate key 'nvidia_driver_branch' (first on line 3)"]


def duplicate_key_in_hosts(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    twice = "cp1: {ansible_host: 192.0.2.10, ansible_host: 192.0.2.99}"
    inv.write_text(HOSTS.replace("cp1: {ansible_host: 192.0.2.10}", twice))
    return inv, [f"{inv}:8:", "duplicate key 'ansible_host'"]


def duplicate_key_in_ini(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    ini = inv.parent / "hosts"
    ini.write_text(
        "[kube_control_plane]\ncp1 ansible_host=192.0.2.10\n"
        "[gpu_nodes]\ngpu1 ansible_host=192.0.2.21 gpus=4 gpus=400\n"
    )
    return ini, [f"{ini}:4:", "duplicate key 'gpus' for host gpu1"]


def alias_bomb_in_hosts(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    indented = "".join(f"    {line}\n" for line in ALIAS_BOMB.splitlines())
    inv.write_text(HOSTS.replace("  vars:\n", "  vars:\n" + indented))
    return inv, [f"{inv}:4:", "alias *a"]


def dev_zero_as_inventory(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    return "/dev/zero", ["/dev/zero", "a character device, not a regular file"]


def dev_zero_as_host_vars(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    (inv.parent / "host_vars").mkdir()
    bad = inv.parent / "host_vars" / "gpu1.yml"
    bad.symlink_to("/dev/zero")
    return inv, [str(bad), "a character device"]


def fifo_as_inventory(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    fifo = tmp / "hosts.yml"
    os.mkfifo(fifo)
    return fifo, [str(fifo), "a FIFO"]


def huge_group_vars(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    bad = inv.parent / "group_vars" / "all.yml"
    bad.write_text("# a log pasted by mistake\n" * 200_000)
    return inv, [str(bad), "gpuprov reads at most 4 MiB of one file"]


def deep_group_vars(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    bad = inv.parent / "group_vars" / "all.yml"
    bad.write_text("nvidia_driver_modules: " + "[" * 50_000 + "]" * 50_000 + "\n")
    return inv, [f"{bad}:1:", "nested deeper than 32 levels"]


def binary_hosts(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    inv.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    return inv, [str(inv), "not a text file"]


def hosts_as_a_list(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    inv.write_text(HOSTS.replace("hosts:\n        gpu1: {ansible_host: 192.0.2.21}", "hosts: [gpu1]"))
    return inv, [str(inv), "all.children.gpu_nodes.hosts: expected a mapping, got list ['gpu1']"]


def group_vars_as_a_list(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    bad = inv.parent / "group_vars" / "all.yml"
    bad.write_text("- nvidia_driver_branch: '580'\n")
    return inv, [str(bad), "expected variables (a mapping of names to values), got list"]


def address_as_a_list(inv: Path, tmp: Path) -> tuple[Path | str, list[str]]:
    bad = inv.parent / "group_vars" / "all.yml"
    bad.write_text("ansible_ssh_common_args: ['-o', 'ConnectTimeout=1']\n")
    return inv, [str(bad), "ansible_ssh_common_args: expected a single value, got list"]


EVERY_VERB: list[Case] = [alias_bomb_in_group_vars, duplicate_key_in_group_vars]
ONE_VERB: list[Case] = [
    fifo_as_group_vars,
    duplicate_key_in_hosts,
    duplicate_key_in_ini,
    alias_bomb_in_hosts,
    dev_zero_as_inventory,
    dev_zero_as_host_vars,
    fifo_as_inventory,
    huge_group_vars,
    deep_group_vars,
    binary_hosts,
    hosts_as_a_list,
    group_vars_as_a_list,
    address_as_a_list,
]
NAMES = list(VERBS)
INVENTORY_CASES = [pytest.param(c, v, id=f"{c.__name__}-{v}") for c in EVERY_VERB for v in NAMES] + [
    pytest.param(c, NAMES[i % len(NAMES)], id=f"{c.__name__}-{NAMES[i % len(NAMES)]}")
    for i, c in enumerate(ONE_VERB)
]


@pytest.mark.parametrize(("case", "verb"), INVENTORY_CASES)
def test_a_bad_inventory_file_is_refused_before_any_host(tmp_path: Path, case: Case, verb: str) -> None:
    inv = base_inventory(tmp_path / "inv")
    given, named = case(inv, tmp_path)
    refused_untouched(tmp_path, run(tmp_path, verb, given), *named)


def test_the_good_inventory_would_reach_its_hosts(tmp_path: Path) -> None:
    """The corpus's baseline: unchanged, the same inventory gets past every check and a verb goes on to
    its hosts, which is what each refusal above must never show."""
    res = run(tmp_path, "upgrade-driver", base_inventory(tmp_path / "inv"))
    assert "Traceback" not in res.stderr and res.returncode == 1, res.stderr[-2000:]
    assert "could not be probed" in res.stdout + res.stderr


# ------------------------------------------------------------------------------------------ policies

POLICY_CASES: list[tuple[str, str | bytes | None, list[str]]] = [
    (
        "alias-bomb",
        "gpu.xid.ignore: &a [1, 2]\nhosts:\n  gpu1:\n    gpu.xid.ignore: *a\n",
        ["line 4", "alias *a"],
    ),
    (
        "duplicate-key",
        "gpu.count: 8\ngpu.count: 80\n",
        ["line 2", "duplicate key 'gpu.count' (first on line 1)"],
    ),
    ("dev-zero", None, ["/dev/zero", "policy file: a character device"]),
    ("fifo", "fifo", ["policy file: a FIFO"]),
    ("directory", "directory", ["policy file: a directory"]),
    ("huge", "# padding\n" * 500_000, ["gpuprov reads at most 4 MiB of one file"]),
    ("deep", "gpu.xid.ignore: " + "[" * 50_000 + "]" * 50_000 + "\n", ["line 1", "nested deeper than 32"]),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00", ["not a text file"]),
    ("wrong-type", "gpu.sharing.replicas: [4]\n", ["gpu.sharing.replicas"]),
]


@pytest.mark.parametrize(
    ("text", "named", "verb"),
    [pytest.param(t, n, ("verify", "check")[i % 2], id=f"{c}-{('verify', 'check')[i % 2]}")
     for i, (c, t, n) in enumerate(POLICY_CASES)],
)  # fmt: skip
def test_a_bad_policy_file_is_refused_before_any_host(
    tmp_path: Path, text: str | bytes | None, named: list[str], verb: str
) -> None:
    inv = base_inventory(tmp_path / "inv")
    policy: Path = Path("/dev/zero")
    if text == "fifo":
        policy = tmp_path / "policy.yml"
        os.mkfifo(policy)
    elif text == "directory":
        policy = tmp_path
    elif text is not None:
        policy = tmp_path / "policy.yml"
        policy.write_bytes(text) if isinstance(text, bytes) else policy.write_text(text)
    refused_untouched(tmp_path, run(tmp_path, verb, inv, policy=policy), str(policy), *named)


# ------------------------------------------------------------------- sharing, tenants and MIG settings
# (file under group_vars/, its text, the verbs that read it, the words the error must hold)

SETTINGS_CASES: list[tuple[str, str, str, tuple[str, ...], list[str]]] = [
    ("sharing-profile-as-list", "all.yml",
     "gpuprov_gpu_sharing_profiles:\n  ts4:\n    - {version: v1}\n",
     ("bootstrap",), ["gpuprov_gpu_sharing_profiles", "ts4: a device plugin config is"]),
    ("sharing-choice-as-list", "gpu_nodes.yml", GPU_NODES + "gpuprov_gpu_sharing: [ts4]\n",
     ("sharing-apply", "verify"), ["gpuprov_gpu_sharing", "got list"]),
    ("sharing-replicas-unbounded", "all.yml",
     "gpuprov_gpu_sharing_profiles:\n  ts:\n    sharing:\n      timeSlicing:\n        resources:\n"
     "          - {name: gpu, replicas: 100000}\n",
     ("sharing-apply",), ["gpuprov_gpu_sharing_profiles", "100000 is more than 1024"]),
    ("sharing-non-ascii-index", "all.yml",
     "gpuprov_gpu_sharing_profiles:\n  ts:\n    sharing:\n      timeSlicing:\n        resources:\n"
     "          - {name: gpu, replicas: 2, devices: ['٣']}\n",
     ("sharing-apply",), ["gpuprov_gpu_sharing_profiles", "devices[0]", "is no GPU index"]),
    ("sharing-superscript-index", "all.yml",
     "gpuprov_gpu_sharing_profiles:\n  ts:\n    sharing:\n      timeSlicing:\n        resources:\n"
     "          - {name: gpu, replicas: 2, devices: ['1:²']}\n",
     ("bootstrap",), ["gpuprov_gpu_sharing_profiles", "is no GPU index"]),
    ("tenant-in-kube-system", "all.yml", "gpuprov_tenants:\n  - {name: kube-system, gpus: 4}\n",
     ("tenants-apply", "verify"), ["gpuprov_tenants[0].name", "Kubernetes' own namespace"]),
    ("tenant-in-default", "all.yml", "gpuprov_tenants:\n  - {name: team-a, namespace: default, gpus: 4}\n",
     ("tenants-apply",), ["gpuprov_tenants[0].namespace", "Kubernetes' own namespace"]),
    ("tenant-in-operator-namespace", "all.yml", "gpuprov_tenants:\n  - {name: gpu-operator, gpus: 4}\n",
     ("bootstrap",), ["gpuprov_tenants[0].name", "GPU Operator's namespace"]),
    ("tenant-name-as-list", "all.yml", "gpuprov_tenants:\n  - {name: [team-a], gpus: 4}\n",
     ("tenants-apply",), ["gpuprov_tenants[0].name", "got list"]),
    ("mig-unknown-profile", "all.yml",
     "gpuprov_mig_custom_configs:\n  version: v1\n  mig-configs:\n    all-1g.18gb:\n      - devices: all\n"
     "        mig-enabled: true\n        mig-devices: {'3g.99gb': 1}\n",
     ("mig-apply", "bootstrap"), ["gpuprov_mig_custom_configs", "has MIG profile '3g.99gb'"]),
    ("mig-absurd-count", "all.yml",
     "gpuprov_mig_custom_configs:\n  version: v1\n  mig-configs:\n    all-1g.18gb:\n      - devices: all\n"
     "        mig-enabled: true\n        mig-devices: {'1g.18gb': 70}\n",
     ("upgrade-driver",), ["gpuprov_mig_custom_configs", "at most 7 × 1g.18gb, not 70"]),
    ("mig-too-many-slices", "all.yml",
     "gpuprov_mig_custom_configs:\n  version: v1\n  mig-configs:\n    all-1g.18gb:\n      - devices: all\n"
     "        mig-enabled: true\n        mig-devices: {'4g.71gb': 1, '3g.71gb': 1, '1g.18gb': 1}\n",
     ("mig-apply",), ["gpuprov_mig_custom_configs", "8 compute and 9 memory slices"]),
    ("mig-devices-as-list", "all.yml",
     "gpuprov_mig_custom_configs:\n  version: v1\n  mig-configs:\n    all-1g.18gb:\n      - devices: all\n"
     "        mig-enabled: true\n        mig-devices: ['1g.18gb']\n",
     ("mig-apply",), ["gpuprov_mig_custom_configs", "mig-devices: expected profile name → count, got list"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("file", "text", "verb", "named"),
    [pytest.param(f, t, v, n, id=f"{c}-{v}") for c, f, t, verbs, n in SETTINGS_CASES for v in verbs],
)
def test_bad_gpu_settings_are_refused_before_any_host(
    tmp_path: Path, file: str, text: str, verb: str, named: list[str]
) -> None:
    inv = base_inventory(tmp_path / "inv")
    where = inv.parent / "group_vars" / file
    where.write_text(text)
    refused_untouched(tmp_path, run(tmp_path, verb, inv), str(where), *named)


# ------------------------------------------------------------------------------- unreachable hosts


def test_check_mode_says_an_unreachable_host_could_not_be_reached(tmp_path: Path) -> None:
    """Ansible really tries the TEST-NET hosts here: check mode must report them as not reached."""
    inv = base_inventory(tmp_path / "inv")
    res = run(tmp_path, "tenants-apply", inv)
    assert "Traceback" not in res.stderr and res.returncode == 1, res.stderr[-2000:]
    assert "nothing would change" not in res.stdout
    for host in ("cp1", "gpu1"):
        assert f"{host}: could not be reached: what would change there is unknown" in res.stdout, res.stdout
