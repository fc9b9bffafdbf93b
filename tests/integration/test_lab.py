"""The lab end to end: hosts over SSH with host key checking, the signed mirror, the simulated driver,
faults, idempotent `lab up`, several labs at once, and a `lab down` that leaves nothing behind.

The first tests need no engine (they check the pieces the lab is built from); the rest use the
session lab from tests/conftest.py or bring up a small lab of their own.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from gpuprov_lab import debian, faults, fleet, mirror, plan, runc_capfilter, vendor
from gpuprov_lab.engine import docker_cli
from gpuprov_lab.sim import profiles as sim_profiles
from gpuprov_lab.state import LabState
from labkit import LAB_HOSTS, Lab, gpuprov, lab_from_inventory, require_lab, unique_lab_name

from provisioner.errors import InputError

LAB_PHASE = "fresh"  # see tests/conftest.py

# ----------------------------------------------------------------------------- pieces (no engine needed)


def test_capfilter_drops_only_capabilities_missing_from_the_bounding_set() -> None:
    # This VM's bounding set: everything up to bit 40 except CAP_SYS_RESOURCE (bit 24).
    status = "Name:\tx\nCapBnd:\t000001fffeffffff\n"
    missing = runc_capfilter.missing_caps(runc_capfilter.bounding_set(status))
    assert missing == {"CAP_SYS_RESOURCE"}
    spec = {
        "process": {
            "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_RESOURCE"], "effective": ["CAP_KILL"]}
        }
    }
    assert runc_capfilter.filter_caps(spec, missing)
    assert spec["process"]["capabilities"] == {"bounding": ["CAP_CHOWN"], "effective": ["CAP_KILL"]}
    exec_process = {"capabilities": {"permitted": ["CAP_SYS_RESOURCE"]}}
    assert runc_capfilter.filter_caps(exec_process, missing)
    assert exec_process["capabilities"]["permitted"] == []
    assert not runc_capfilter.filter_caps({"process": {"capabilities": {"bounding": ["CAP_KILL"]}}}, missing)


def test_capfilter_finds_the_spec_runc_reads() -> None:
    assert runc_capfilter.spec_path(["--root", "/r", "create", "--bundle", "/b", "id"]) == "/b/config.json"
    assert runc_capfilter.spec_path(["run", "--bundle=/c", "id"]) == "/c/config.json"
    assert runc_capfilter.spec_path(["exec", "--process", "/tmp/p.json", "--detach", "id"]) == "/tmp/p.json"
    assert runc_capfilter.spec_path(["delete", "id"]) is None


def test_debian_mirror_is_read_from_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://archive.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n"
    )
    assert debian._mirror_from_sources(tmp_path) == "http://archive.example/debian"
    other = tmp_path / "other"
    other.mkdir()
    (other / "sources.list").write_text(
        "# c\ndeb [arch=amd64] http://one.example/debian/ bookworm main contrib\n"
    )
    assert debian._mirror_from_sources(other) == "http://one.example/debian"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert debian._mirror_from_sources(empty) is None


def test_dependency_relations_are_split_into_alternatives() -> None:
    rel = "libc6 (>= 2.34), dkms | nvidia-kernel-open-dkms (= 580.159.04-1), python3:any, foo [amd64]"
    assert mirror._split_relations(rel) == [
        ["libc6"],
        ["dkms", "nvidia-kernel-open-dkms"],
        ["python3"],
        ["foo"],
    ]
    assert mirror._split_relations("") == []


def _state(hosts: list[tuple[str, str, int]]) -> LabState:
    net = ipaddress.IPv4Network("10.213.99.0/24")
    specs = [plan.PlannedHost(n, i, plan.host_ip(net, i), p, g) for i, (n, p, g) in enumerate(hosts)]
    return LabState(name="unit", subnet=str(net), gateway=plan.gateway(net), mirror_port=8080, hosts=specs)


@pytest.mark.parametrize(
    ("host", "kind", "gpu", "xid", "names"),
    [
        ("gpu7", "ecc", None, None, "gpu7"),
        ("gpu1", "smoke", None, None, "smoke"),
        ("gpu1", "ecc", 1, None, "--gpu 1"),
        ("gpu2", "ecc", 8, None, "--gpu 8"),
        ("cp1", "xid", None, None, "cp1"),
        ("gpu1", "unreachable", 0, None, "--gpu"),
        ("gpu1", "ecc", None, 79, "--xid"),
        ("gpu1", "xid", None, 0, "--xid 0"),
    ],
)
def test_fault_requests_are_validated(
    host: str, kind: str, gpu: int | None, xid: int | None, names: str
) -> None:
    st = _state([("cp1", "cpu", 0), ("gpu1", "h200", 1), ("gpu2", "h100-sxm-8", 8)])
    with pytest.raises(InputError, match=re.escape(names)):
        faults.build_fault(st, host, kind, gpu, xid)


def test_fault_entries_follow_the_faults_json_contract() -> None:
    st = _state([("cp1", "cpu", 0), ("gpu1", "h100-sxm-8", 8)])
    assert faults.build_fault(st, "gpu1", "xid", 3, 48) == {"kind": "xid", "gpu": 3, "xid": 48}
    assert faults.build_fault(st, "gpu1", "xid", None, None) == {
        "kind": "xid",
        "gpu": 0,
        "xid": faults.DEFAULT_XID,
    }
    assert faults.build_fault(st, "gpu1", "pcie", 7, None) == {"kind": "pcie", "gpu": 7}
    assert faults.build_fault(st, "cp1", "unreachable", None, None) == {"kind": "unreachable"}
    assert faults.build_fault(st, "gpu1", "clear", None, None) is None


def test_up_requests_are_validated_before_anything_is_touched() -> None:
    for req, names in [
        (fleet.UpRequest(lab="Bad_Name"), "--lab"),
        (fleet.UpRequest(lab="ok", hosts=0), "--hosts 0"),
        (fleet.UpRequest(lab="ok", hosts=plan.MAX_HOSTS + 1), f"--hosts {plan.MAX_HOSTS + 1}"),
        (fleet.UpRequest(lab="ok", subnet="8.8.8.0/24"), "--subnet"),
        (fleet.UpRequest(lab="ok", subnet="10.0.0.0/29"), "--subnet"),
        (fleet.UpRequest(lab="ok", mirror_port=80), "--mirror-port 80"),
    ]:
        with pytest.raises(InputError, match=re.escape(names)):
            fleet.validate(req)


# ----------------------------------------------------------------------------------------- the lab


@pytest.mark.lab
def test_every_host_answers_ssh_with_host_key_checking(lab: Lab) -> None:
    assert sorted(lab.hosts) == ["cp1", "gpu1", "gpu2", "gpu3"]
    release = {"bookworm": "12.", "trixie": "13.", "trixie-containerd2": "13."}
    for name, host in lab.hosts.items():
        res = lab.ssh(name, "hostname; systemctl is-system-running; cat /etc/debian_version")
        assert res.returncode == 0, res.stderr
        hostname, system, version = res.stdout.split()
        assert hostname == name
        assert system == "running"
        assert version.startswith(release[host.os]), (name, host.os, version)
    # One GPU host of each containerd generation, from Debian's own packages.
    oses = sorted(h.os for h in lab.hosts.values() if h.gpu_count)
    assert oses == ["bookworm", "trixie", "trixie-containerd2"]
    for name in lab.hosts_on("trixie-containerd2"):
        res = lab.ssh(name, "apt-get update -qq && apt-cache policy containerd | sed -n 's/ *Candidate: //p'")
        assert res.stdout.startswith("2."), res.stdout


@pytest.mark.lab
def test_ssh_refuses_a_host_whose_key_is_not_the_recorded_one(lab: Lab, tmp_path: Path) -> None:
    ip = lab.hosts["gpu1"].ip
    # Unknown host: StrictHostKeyChecking=yes refuses it.
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    res = lab.ssh("gpu1", "true", known_hosts=empty)
    assert res.returncode == 255
    assert "Host key verification failed" in res.stderr
    # Known, but with another host's key: refused as a changed identity.
    other_key = next(
        line.split(None, 1)[1] for line in lab.known_hosts.read_text().splitlines() if line.split()[0] != ip
    )
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"{ip} {other_key}\n")
    res = lab.ssh("gpu1", "true", known_hosts=wrong)
    assert res.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr
    # The lab's own known_hosts works.
    assert lab.ssh("gpu1", "true").returncode == 0


@pytest.mark.lab
def test_status_reports_every_host_running_with_ssh(lab: Lab) -> None:
    res = lab.cli("lab", "status", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["mirror_ok"] is True
    rows = {r["host"]: r for r in doc["hosts"]}
    assert set(rows) == set(lab.hosts)
    for name, h in lab.hosts.items():
        assert rows[name]["address"] == h.ip
        assert rows[name]["profile"] == h.profile
        assert rows[name]["state"] == "running (running)"
        assert rows[name]["ssh"] == "ok"


@pytest.mark.lab
def test_inventory_groups_hosts_and_points_at_the_lab_mirror(lab: Lab) -> None:
    doc = yaml.safe_load(lab.inventory.read_text())["all"]
    children = doc["children"]
    assert list(children["kube_control_plane"]["hosts"]) == ["cp1"]
    assert list(children["gpu_nodes"]["hosts"]) == ["gpu1", "gpu2", "gpu3"]
    assert set(children["k8s_cluster"]["children"]) == {"kube_control_plane", "gpu_nodes"}
    v = doc["vars"]
    assert v["ansible_user"] == "root"
    assert "StrictHostKeyChecking=yes" in v["ansible_ssh_common_args"]
    assert lab.hosts["cp1"].gpu_count == 0
    profiles = sim_profiles.PROFILES
    for name in ("gpu1", "gpu2", "gpu3"):
        h = lab.hosts[name]
        assert h.profile == plan.DEFAULT_WORKER_PROFILES[int(name[3:]) - 1]
        assert h.gpu_count == profiles[h.profile].gpu_count
    # The key published at the key URL is the one whose fingerprint the inventory pins.
    with urllib.request.urlopen(v["gpuprov_mirror_key_url"], timeout=10) as r:
        armored = r.read()
    shown = subprocess.run(
        ["gpg", "--batch", "--with-colons", "--show-keys"], input=armored, capture_output=True, check=True
    ).stdout.decode()
    assert re.search(rf"^fpr:+{v['gpuprov_mirror_key_fingerprint']}:", shown, re.M)
    # `lab inventory` prints the path as its last line and rewrites the same file.
    res = lab.cli("lab", "inventory")
    assert res.returncode == 0
    assert Path(res.stdout.strip().splitlines()[-1]) == lab.inventory


@pytest.mark.lab
def test_hosts_install_debian_packages_from_the_signed_mirror(lab: Lab) -> None:
    src = lab.ssh("cp1", "cat /etc/apt/sources.list.d/debian.sources; ls /etc/apt/sources.list 2>&1")
    assert f"URIs: {lab.mirror_url}/debian" in src.stdout
    assert "Signed-By: /usr/share/keyrings/gpuprov-lab-archive.gpg" in src.stdout
    res = lab.ssh(
        "cp1", "apt-get update 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y socat 2>&1"
    )
    assert res.returncode == 0, res.stdout[-2000:]
    assert not re.search(r"^(W|E):", res.stdout, re.M), res.stdout[-2000:]
    assert lab.ssh("cp1", "socat -V").stdout.startswith("socat by Gerhard Rieger")
    # Every package the roles need from the distro resolves from the lab archive.
    sim = lab.ssh("cp1", f"apt-get install -s -y {' '.join(mirror.DISTRO_PACKAGES)}")
    assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr


@pytest.mark.lab
def test_a_wrong_key_is_refused_with_no_pubkey(lab: Lab) -> None:
    keyid = lab.mirror_key_fingerprint[-16:]
    cmd = (
        "d=$(mktemp -d) && mkdir $d/partial && "
        "echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        f"{lab.mirror_url}/debian bookworm main'"
        " > $d/wrong.list && "
        "apt-get -o Dir::Etc::SourceList=$d/wrong.list -o Dir::Etc::SourceParts=/nonexistent "
        "-o Dir::State::Lists=$d update 2>&1; echo rc=$?; rm -rf $d"
    )
    res = lab.ssh("gpu2", cmd)
    assert f"NO_PUBKEY {keyid}" in res.stdout, res.stdout
    assert "is not signed" in res.stdout
    assert res.stdout.strip().endswith("rc=100")


@pytest.mark.lab
def test_vendor_repositories_follow_the_mirror_layout_and_are_signed(lab: Lab, tmp_path: Path) -> None:
    catalog = pytest.importorskip("gpuprov_lab.sim.catalog")
    key = urllib.request.urlopen(f"{lab.mirror_url}/{mirror.KEY_NAME}.gpg", timeout=10).read()
    keyring = tmp_path / "lab.gpg"
    keyring.write_bytes(key)
    armored = urllib.request.urlopen(f"{lab.mirror_url}/{mirror.KEY_NAME}.asc", timeout=10).read()
    for repo in mirror.sim_repos(catalog):
        base = f"{lab.mirror_url}/{repo.path}"
        release = f"{base}/" if repo.layout == "flat" else f"{base}/dists/{repo.layout[1]}/"
        inrelease = tmp_path / "InRelease"
        inrelease.write_bytes(urllib.request.urlopen(release + "InRelease", timeout=10).read())
        ok = subprocess.run(
            ["gpgv", "--keyring", str(keyring), str(inrelease)], capture_output=True, check=False
        )
        assert ok.returncode == 0, (repo.key, ok.stderr.decode())
        for rel in mirror.vendor_key_paths(repo):
            assert urllib.request.urlopen(f"{lab.mirror_url}/{rel}", timeout=10).read() == armored, rel
        packages = [p for p in catalog.all_packages() if repo.key in mirror._package_repos(p)]
        wanted = {p.name for p in packages}
        index = "Packages" if repo.layout == "flat" else f"{repo.layout[2]}/binary-amd64/Packages"
        text = urllib.request.urlopen(release + index, timeout=10).read().decode()
        published = set(re.findall(r"^Package: (\S+)$", text, re.M))
        assert wanted <= published, (repo.key, wanted - published)
        # Every package says what it is: simulated, or built by the lab from the vendor's real software
        # (helm, the Kubernetes binaries).
        if any(not p.real for p in packages):
            assert "SIMULATED (gpuprov lab)" in text, repo.key
        if any(p.real for p in packages):
            assert "gpuprov lab build" in text, repo.key


@pytest.mark.lab
def test_simulated_driver_from_the_mirror_answers_nvidia_smi(lab: Lab) -> None:
    name = lab.hosts_on("bookworm")[0]
    host = lab.hosts[name]
    model = {"h200": "H200", "h100-sxm-8": "H100", "a100-4": "A100", "l40s": "L40S"}[host.profile]
    repo = f"{lab.mirror_url}/cuda/repos/debian12/x86_64/"
    cmd = (
        "set -e; "
        "printf 'Types: deb\\nURIs: %s\\nSuites: /\\n"
        "Signed-By: /usr/share/keyrings/gpuprov-lab-archive.gpg\\n' "
        f"'{repo}' > /etc/apt/sources.list.d/cuda-lab-test.sources; "
        "apt-get update >/dev/null 2>&1; "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
        "nvidia-kernel-open-dkms nvidia-driver-cuda nvidia-smi "
        ">/tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }; "
        "nvidia-smi -L; nvidia-smi | grep -F 'NVIDIA-SMI'"
    )
    # -L and the table are NVIDIA's real binary (its own version in the header) on the mock NVML.
    real = debian.unpacked(vendor.NVIDIA_SMI_SUITE, "nvidia-smi").version.split(":")[-1].split("-")[0]
    try:
        res = lab.ssh(name, cmd)
        assert res.returncode == 0, res.stdout + res.stderr
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("GPU ")]
        assert len(lines) == host.gpu_count
        assert all(model in ln for ln in lines), lines
        assert lines[0].startswith(f"GPU 0: NVIDIA {model}")
        header = rf"NVIDIA-SMI {re.escape(real)} +Driver Version: \d+\.\d+\.\d+"
        assert re.search(header, res.stdout), res.stdout
    finally:
        lab.ssh(name, "rm -f /etc/apt/sources.list.d/cuda-lab-test.sources")


@pytest.mark.lab
def test_faults_reach_the_host_and_clear(lab: Lab) -> None:
    before = lab.ssh("gpu2", "cat /etc/gpuprov-lab/faults.json").stdout
    assert json.loads(before) == {"faults": []}
    try:
        assert lab.cli("lab", "fault", "gpu2", "xid", "--gpu", "1", "--xid", "48").returncode == 0
        assert lab.cli("lab", "fault", "gpu2", "ecc", "--gpu", "2").returncode == 0
        seen = json.loads(lab.ssh("gpu2", "cat /etc/gpuprov-lab/faults.json").stdout)
        # Each injected GPU fault is an event with an id of its own (a reset or reboot clears events).
        assert all(f.pop("id") for f in seen["faults"])
        assert seen == {"faults": [{"kind": "xid", "gpu": 1, "xid": 48}, {"kind": "ecc", "gpu": 2}]}
        # The host cannot change what the controller injected.
        ro = lab.ssh("gpu2", "echo '{}' > /etc/gpuprov-lab/faults.json")
        assert ro.returncode != 0
        assert "Read-only file system" in ro.stderr
    finally:
        assert lab.cli("lab", "fault", "gpu2", "clear").returncode == 0
    assert json.loads(lab.ssh("gpu2", "cat /etc/gpuprov-lab/faults.json").stdout) == {"faults": []}


@pytest.mark.lab
@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["gpu9", "ecc"], "gpu9"),
        (["gpu1", "melt"], "melt"),
        (["gpu1", "ecc", "--gpu", "1"], "--gpu 1"),
        (["cp1", "pcie"], "cp1"),
        (["gpu1", "install-fail", "--xid", "13"], "--xid"),
    ],
)
def test_bad_fault_input_exits_2_and_touches_nothing(lab: Lab, args: list[str], names: str) -> None:
    host = args[0] if args[0] in lab.hosts else "gpu1"
    before = lab.ssh(host, "cat /etc/gpuprov-lab/faults.json").stdout
    res = lab.cli("lab", "fault", *args)
    assert res.returncode == 2, res.stderr
    assert names in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert lab.ssh(host, "cat /etc/gpuprov-lab/faults.json").stdout == before


@pytest.mark.lab
def test_unreachable_host_drops_off_and_comes_back_with_its_address(lab: Lab) -> None:
    try:
        assert lab.cli("lab", "fault", "gpu1", "unreachable").returncode == 0
        res = lab.ssh("gpu1", "true", connect=3, timeout=30)
        assert res.returncode == 255
        assert re.search(r"timed out|No route to host|unreachable", res.stderr), res.stderr
        assert lab.ssh("gpu2", "true").returncode == 0
    finally:
        assert lab.cli("lab", "fault", "gpu1", "clear").returncode == 0
    res = lab.ssh("gpu1", "hostname -I; ip -4 route show default")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[0] == lab.hosts["gpu1"].ip
    assert "default via" in res.stdout


@pytest.mark.lab
def test_second_up_keeps_the_hosts(lab: Lab) -> None:
    def ids() -> dict[str, str]:
        flt = f"label=gpuprov.lab={lab.name}"
        argv = [docker_cli(), "ps", "--filter", flt, "--format", "{{.Names}} {{.ID}}"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        return dict(line.split() for line in out.splitlines())

    before = ids()
    assert len(before) == LAB_HOSTS
    res = lab.cli("lab", "up", "--hosts", str(LAB_HOSTS))
    assert res.returncode == 0, res.stderr
    assert ids() == before
    assert "creating" not in res.stderr
    assert lab.ssh("gpu2", "true").returncode == 0


@pytest.mark.lab
def test_lab_network_is_internal_without_forwarding_or_masquerade(lab: Lab) -> None:
    net = json.loads(
        subprocess.run(
            [docker_cli(), "network", "inspect", f"gpuprov-{lab.name}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )[0]
    assert net["Internal"] is True
    assert net["Options"].get("com.docker.network.bridge.enable_ip_masquerade") == "false"
    subnet = net["IPAM"]["Config"][0]["Subnet"]
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"
    nat = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=False).stdout
    assert not [ln for ln in nat.splitlines() if "MASQUERADE" in ln and subnet in ln]
    daemon = json.loads(Path("/etc/docker/daemon.json").read_text())
    assert daemon["ip-forward"] is False
    assert daemon["ip-masq"] is False


@pytest.mark.lab
def test_bad_up_input_exits_2_and_creates_nothing(lab: Lab) -> None:
    for args, names in [
        (["--lab", "Bad_Name"], "--lab"),
        (["--lab", "never-made", "--hosts", "0"], "--hosts 0"),
        (["--lab", "never-made", "--profiles", "h200,tpu-v9"], "tpu-v9"),
        (["--lab", "never-made", "--hosts", "2", "--profiles", "h200,l40s"], "--profiles"),
    ]:
        res = gpuprov("lab", "up", *args)
        assert res.returncode == 2, (args, res.stderr)
        assert names in res.stderr
    assert not Path("/var/lib/gpuprov/labs/never-made").exists()
    res = gpuprov("lab", "status", "--lab", "never-made")
    assert res.returncode == 2
    assert "never-made" in res.stderr


# ------------------------------------------------------------------- a second lab, then its removal


def _labelled(kind: str, name: str) -> list[str]:
    """Names of the containers, networks or volumes that carry the lab's label."""
    flt = ["--filter", f"label=gpuprov.lab={name}"]
    args = {
        "container": ["ps", "-a", *flt, "--format", "{{.Names}}"],
        "network": ["network", "ls", *flt, "--format", "{{.Name}}"],
        "volume": ["volume", "ls", *flt, "--format", "{{.Name}}"],
    }[kind]
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.lab
def test_a_second_lab_runs_beside_the_first_and_down_removes_all_of_it(lab: Lab) -> None:
    require_lab()
    name = unique_lab_name("u")
    try:
        up = gpuprov("lab", "up", "--lab", name, "--hosts", "2", "--profiles", "l40s")
        assert up.returncode == 0, up.stderr
        inv = gpuprov("lab", "inventory", "--lab", name)
        other = lab_from_inventory(name, Path(inv.stdout.strip().splitlines()[-1]))
        first_net = ipaddress.IPv4Network(f"{lab.hosts['cp1'].ip}/24", strict=False)
        assert ipaddress.IPv4Address(other.hosts["cp1"].ip) not in first_net
        assert other.hosts["gpu1"].profile == "l40s"
        assert other.ssh("gpu1", "hostname").stdout.strip() == "gpu1"
        assert lab.ssh("gpu1", "hostname").stdout.strip() == "gpu1"
        # `lab up` reconciles the host count: one more host (next default profile), then one fewer.
        assert gpuprov("lab", "up", "--lab", name, "--hosts", "3").returncode == 0
        grown = lab_from_inventory(name, other.inventory)
        assert grown.hosts["gpu1"].profile == "l40s"
        assert grown.hosts["gpu2"].profile == plan.DEFAULT_WORKER_PROFILES[1]
        assert grown.ssh("gpu2", "cat /etc/gpuprov-lab/profile.json").returncode == 0
        assert gpuprov("lab", "up", "--lab", name, "--hosts", "2").returncode == 0
        assert sorted(lab_from_inventory(name, other.inventory).hosts) == ["cp1", "gpu1"]
        assert grown.hosts["gpu2"].ip not in other.known_hosts.read_text()
        assert sorted(_labelled("container", name)) == [f"gpuprov-{name}-cp1", f"gpuprov-{name}-gpu1"]
        assert not [v for v in _labelled("volume", name) if "-gpu2-" in v]
        # Hosts of one lab cannot reach the other lab.
        cross = other.ssh(
            "gpu1", f"timeout 3 bash -c 'echo > /dev/tcp/{lab.hosts['gpu1'].ip}/22' 2>&1; echo rc=$?"
        )
        assert "rc=0" not in cross.stdout
        state_dir = Path("/var/lib/gpuprov/labs") / name
        pid = int((state_dir / "mirror.pid").read_text())
        assert Path(f"/proc/{pid}").exists()
        assert _labelled("container", name) and _labelled("network", name) and _labelled("volume", name)
    finally:
        down = gpuprov("lab", "down", "--lab", name)
    assert down.returncode == 0, down.stderr
    assert _labelled("container", name) == []
    assert _labelled("network", name) == []
    assert _labelled("volume", name) == []
    assert not state_dir.exists()
    assert not Path(f"/proc/{pid}").exists() or "httpserve" not in Path(f"/proc/{pid}/cmdline").read_text()
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"
    # The first lab is untouched.
    assert lab.ssh("cp1", "true").returncode == 0
    assert gpuprov("lab", "down", "--lab", name).returncode == 0  # down is idempotent


@pytest.mark.lab
def test_down_of_a_lab_that_never_existed_is_a_no_op() -> None:
    require_lab()
    res = gpuprov("lab", "down", "--lab", unique_lab_name("n"))
    assert res.returncode == 0, res.stderr
    assert "0 container(s)" in res.stdout
