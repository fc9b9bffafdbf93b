"""After bootstrap, on every GPU host of the session lab (one per containerd generation: Debian 12's 1.6,
Debian 13's 1.7, sid's 2.x): what the real components say.

- the real nvidia-ctk 1.20.0 (built from NVIDIA's source) is what the toolkit packages installed;
- the real `containerd config dump` (config.toml with its imports, merged as containerd merges them)
  has the nvidia runtime and the default runtime the role chose for the fleet; CDI is on where
  containerd has it;
- `docker info` lists the nvidia runtime;
- the CDI spec is the one the real nvidia-ctk generated (through NVIDIA's own nvidia-cdi-refresh)
  against NVIDIA's mock NVML: one device per GPU of the host;
- on the containerd 1.7 and 2.x hosts, a real container started by the real containerd through the real
  nvidia-container-runtime in CDI mode (no nvidia-container-cli) sees the GPUs' device nodes;
- in the real cluster, a pod asking for one GPU gets exactly one, through the real device plugin.
"""

from __future__ import annotations

import json
import re
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from labkit import gpuprov

pytestmark = pytest.mark.lab
LAB_PHASE = "bootstrapped"  # see tests/conftest.py

CRI = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
GENERATION = {"bookworm": "1.6.", "trixie": "1.7.", "trixie-containerd2": "2."}


def _dump(lab: Any, host: str) -> dict[str, Any]:
    res = lab.ssh(host, "containerd config dump")
    assert res.returncode == 0, res.stderr
    return tomllib.loads(res.stdout)


def _gpu_hosts(lab: Any) -> list[str]:
    return [n for n, h in lab.hosts.items() if h.gpu_count]


def test_the_real_toolkit_is_installed(bootstrapped: Any) -> None:
    lab = bootstrapped.lab
    for host in _gpu_hosts(lab):
        res = lab.ssh(host, "nvidia-ctk --version; nvidia-container-runtime --version")
        assert res.returncode == 0, (host, res.stderr)
        assert "NVIDIA Container Toolkit CLI version 1.20.0" in res.stdout, res.stdout
        assert "commit: 5505e2f94d9aaa08561490db974ba3cd676af209" in res.stdout, res.stdout


def test_containerd_uses_the_nvidia_runtime_and_the_fleets_default(bootstrapped: Any) -> None:
    lab = bootstrapped.lab
    hosts = _gpu_hosts(lab)
    # The fleet has a containerd without CDI (1.6), so nvidia is every GPU host's default runtime: the
    # one way the device plugin can hand a GPU to a pod without runtimeClassName on all of them.
    assert any(lab.hosts[h].os == "bookworm" for h in hosts)
    for host in hosts:
        version = lab.ssh(host, "containerd --version").stdout.split()[2]
        assert version.startswith(GENERATION[lab.hosts[host].os]), (host, version)
        dump = _dump(lab, host)
        cri = dump["plugins"][CRI[int(dump["version"])]]
        runtimes = cri["containerd"]["runtimes"]
        assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime", host
        assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True, host
        assert cri["containerd"]["default_runtime_name"] == "nvidia", host
        # CDI on wherever containerd has it (1.7: the role turned it on; 2.x: on by default).
        assert cri.get("enable_cdi", False) is (lab.hosts[host].os != "bookworm"), host


def test_docker_lists_the_nvidia_runtime(bootstrapped: Any) -> None:
    lab = bootstrapped.lab
    for host in _gpu_hosts(lab):
        res = lab.ssh(host, "docker info --format '{{json .Runtimes}}'")
        assert res.returncode == 0, res.stderr
        assert "nvidia" in json.loads(res.stdout), (host, res.stdout)


def test_the_cdi_spec_is_the_real_tools_for_each_gpu(bootstrapped: Any) -> None:
    lab = bootstrapped.lab
    for host in _gpu_hosts(lab):
        res = lab.ssh(host, "cat /var/run/cdi/nvidia.yaml")
        assert res.returncode == 0, (host, res.stderr)
        spec = yaml.safe_load(res.stdout)
        assert spec["kind"] == "nvidia.com/gpu"
        names = {d["name"] for d in spec["devices"]}
        gpus = lab.hosts[host].gpu_count
        assert {str(i) for i in range(gpus)} | {"all"} <= names, (host, names)
        # NVIDIA's refresh units keep it current across reboots and driver changes.
        enabled = lab.ssh(host, "systemctl is-enabled nvidia-cdi-refresh.path nvidia-cdi-refresh.service")
        assert enabled.stdout.split() == ["enabled", "enabled"], (host, enabled.stdout)


@pytest.mark.parametrize("flavour", ["trixie", "trixie-containerd2"])
def test_a_real_container_sees_the_gpus_through_cdi(bootstrapped: Any, flavour: str) -> None:
    """containerd's own ctr starts a container with the real nvidia-container-runtime as its runc binary;
    NVIDIA_VISIBLE_DEVICES names CDI devices, so the runtime works in CDI mode (nvidia-container-cli is
    never called) and edits the OCI spec from /var/run/cdi/nvidia.yaml."""
    lab = bootstrapped.lab
    (host,) = lab.hosts_on(flavour)
    gpus = lab.hosts[host].gpu_count
    script = r"""
set -e
export DEBIAN_FRONTEND=noninteractive
# busybox for the container's rootfs, installed only for this and purged after: the host is left as
# it was (gpuprov reset's round trip holds the host to its packages).
own=0
command -v busybox >/dev/null || { apt-get install -y -q busybox-static >/dev/null; own=1; }
r=$(mktemp -d /tmp/cdi-rootfs.XXXXXX)
trap 'ctr -n gpuprov-test task kill -s KILL cdi-test >/dev/null 2>&1 || true;
      ctr -n gpuprov-test container rm cdi-test >/dev/null 2>&1 || true; rm -rf "$r";
      [ "$own" = 0 ] || apt-get purge -y -q busybox-static >/dev/null' EXIT
mkdir -p "$r/bin" "$r/dev" "$r/proc" "$r/sys" "$r/etc" "$r/tmp"
cp "$(command -v busybox)" "$r/bin/busybox"
for t in sh ls; do ln -s busybox "$r/bin/$t"; done
ctr -n gpuprov-test run --rm \
  --runtime io.containerd.runc.v2 --runc-binary /usr/bin/nvidia-container-runtime \
  --env NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all --rootfs "$r" cdi-test /bin/ls -1 /dev
"""
    res = lab.ssh(host, script, timeout=300)
    assert res.returncode == 0, (host, res.stdout[-2000:], res.stderr[-2000:])
    devices = set(res.stdout.split())
    want = {f"nvidia{i}" for i in range(gpus)} | {"nvidiactl", "nvidia-uvm"}
    assert want <= devices, (host, sorted(devices))
    # Without the CDI request the same container gets no GPU.
    plain = script.replace("--env NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all ", "")
    res = lab.ssh(host, plain, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not [d for d in res.stdout.split() if re.match(r"nvidia\d", d)], res.stdout


KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
# NVIDIA's mock NVML reads the host's GPUs from MOCK_NVML_CONFIG, which a container gets from its pod:
# the lab's GPU pods mount the simulated module's sysfs directory, where the lab keeps that file.
MOCK_DIR = "/sys/module/nvidia/gpuprov-lab"


def _run_gpu_pod(lab: Any, host: str) -> tuple[bool, str]:
    """A pod on ``host`` that requests one nvidia.com/gpu, without runtimeClassName, and lists its
    /dev/nvidia* and, with NVIDIA's own nvidia-smi, its GPUs: (whether it succeeded, its log or why
    it did not)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"gpu-check-{host}", "namespace": "default"},
        "spec": {
            "nodeName": host,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "smi",
                    "image": lab.tools_image,
                    "command": ["sh", "-c", "ls /dev/nvidia*; nvidia-smi -L"],
                    "env": [{"name": "MOCK_NVML_CONFIG", "value": "/lab/nvml.yaml"}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                    "volumeMounts": [{"name": "lab", "mountPath": "/lab", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "lab", "hostPath": {"path": MOCK_DIR}}],
        },
    }
    name = pod["metadata"]["name"]
    try:
        res = lab.ssh("cp1", f"{KUBECTL} apply -f - <<'EOF'\n{json.dumps(pod)}\nEOF")
        assert res.returncode == 0, res.stderr
        phase = ""
        for _ in range(60):
            phase = lab.ssh("cp1", f"{KUBECTL} get pod {name} -o jsonpath='{{.status.phase}}'").stdout
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(2)
        logs = lab.ssh("cp1", f"{KUBECTL} logs {name}").stdout
        return phase == "Succeeded", f"{phase}: {logs}"
    finally:
        lab.ssh("cp1", f"{KUBECTL} delete pod {name} --ignore-not-found --wait=false")


def _host_gpus(lab: Any, host: str) -> dict[str, str]:
    """UUID → model of the host's GPUs, as nvidia-smi -L lists them on the host."""
    out = lab.ssh(host, "nvidia-smi -L").stdout
    return {m[3]: m[2] for m in re.finditer(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-f-]+)\)", out, re.M)}


def _check_one_gpu(lab: Any, host: str, logs: str) -> None:
    """The pod saw one GPU device node and nvidia-smi listed one GPU: one of its host's."""
    nodes = re.findall(r"/dev/nvidia\d+$", logs, re.M)
    listed = re.findall(r"^GPU 0: (.+?) \(UUID: (GPU-[0-9a-f-]+)\)", logs, re.M)
    assert len(nodes) == 1 and "/dev/nvidiactl" in logs, (host, logs)
    assert len(listed) == 1 and "GPU 1:" not in logs, (host, logs)
    model, uuid = listed[0]
    assert _host_gpus(lab, host).get(uuid) == model, (host, logs)


def test_a_pod_that_asks_for_one_gpu_sees_exactly_one_of_its_hosts(bootstrapped: Any) -> None:
    """The real device plugin allocates a GPU; the host's real nvidia-container-runtime (containerd's
    default runtime on this fleet) injects it; inside, NVIDIA's nvidia-smi over the mock NVML lists
    exactly that GPU, because the container has just its device node."""
    lab = bootstrapped.lab
    for host in _gpu_hosts(lab):
        ok, logs = _run_gpu_pod(lab, host)
        assert ok, (host, logs)
        _check_one_gpu(lab, host, logs)


def _bootstrap_operator(inventory: Path) -> None:
    res = gpuprov("bootstrap", "-i", str(inventory), "--only", "gpu_operator", "--yes", timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_with_cdi_only_hosts_whose_containerd_has_cdi_give_pods_their_gpu(
    bootstrapped: Any, tmp_path: Path
) -> None:
    """Why the role chooses cdi.enabled for the whole fleet: with it on, the real device plugin hands
    GPUs out as CDI devices (its own spec, written with NVIDIA's CDI library), which containerd 1.7 and
    2.x inject and containerd 1.6 cannot: that host's pods get no GPU device.

    Then the inventory takes the field back: the next values change upgrades the release with helm 4's
    server-side apply, which refuses a field another manager (kubectl patch) changed unless the role
    forces it (gpu_operator_helm_force_conflicts)."""
    lab = bootstrapped.lab

    def patch(on: bool) -> str:
        body = json.dumps({"spec": {"cdi": {"enabled": on}}})
        return f"{KUBECTL} patch clusterpolicies.nvidia.com cluster-policy --type merge -p '{body}'"

    def cdi_enabled() -> bool:
        policy = lab.ssh("cp1", f"{KUBECTL} get clusterpolicies.nvidia.com cluster-policy -o json")
        assert policy.returncode == 0, policy.stderr
        return json.loads(policy.stdout)["spec"]["cdi"]["enabled"]

    assert cdi_enabled() is False  # the fleet has a 1.6 host
    wait_rollout = (
        f"{KUBECTL} -n gpu-operator rollout status ds/nvidia-device-plugin-daemonset --timeout=180s"
    )
    taken_back = False
    try:
        res = lab.ssh("cp1", patch(True))
        assert res.returncode == 0, res.stderr
        env = ""
        for _ in range(60):
            env = lab.ssh(
                "cp1",
                f"{KUBECTL} -n gpu-operator get ds nvidia-device-plugin-daemonset "
                "-o jsonpath='{.spec.template.spec.containers[0].env}'",
            ).stdout
            if "cdi-annotations,cdi-cri" in env:
                break
            time.sleep(2)
        assert {"name": "DEVICE_LIST_STRATEGY", "value": "cdi-annotations,cdi-cri"} in json.loads(env)
        assert lab.ssh("cp1", wait_rollout, timeout=240).returncode == 0
        for host in _gpu_hosts(lab):
            ok, logs = _run_gpu_pod(lab, host)
            if lab.hosts[host].os == "bookworm":
                assert not re.search(r"/dev/nvidia\d+$", logs, re.M), (host, logs)
                continue
            assert ok, (host, logs)
            _check_one_gpu(lab, host, logs)
            spec = lab.ssh(host, "cat /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json")
            assert json.loads(spec.stdout)["kind"] == "k8s.device-plugin.nvidia.com/gpu", host

        # A values change (an annotation on the operator's pods) upgrades the release: cdi.enabled is
        # the inventory's again. Then the lab's own inventory puts the release back as it was.
        doc = yaml.safe_load(lab.inventory.read_text())
        values = doc["all"]["vars"]["gpu_operator_values"]
        values.setdefault("operator", {})["annotations"] = {"gpuprov.io/test": "take-back"}
        changed = tmp_path / "inventory.yml"
        changed.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
        _bootstrap_operator(changed)
        assert cdi_enabled() is False
        taken_back = True
        _bootstrap_operator(lab.inventory)
    finally:
        if not taken_back:
            lab.ssh("cp1", patch(False))
        time.sleep(5)
        lab.ssh("cp1", wait_rollout, timeout=240)


# A host provisioned the old way: containerd's own default configuration with the nvidia runtime
# written inline by an older tool (no SystemdCgroup, no CDI, the stock sandbox image), and a site's
# own setting and comment.
OLD_LAYOUT = r"""
import subprocess
text = subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, check=True).stdout
v3 = text.lstrip().startswith("version = 3")
cri = "plugins.'io.containerd.cri.v1.runtime'" if v3 else 'plugins."io.containerd.grpc.v1.cri"'
assert "oom_score = 0" in text
site = "oom_score = -999  # site: keep containerd away from the OOM killer"
text = text.replace("oom_score = 0", site, 1)
text += "\n# nvidia runtime, written inline by an older tool\n"
text += f"[{cri}.containerd.runtimes.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n"
text += f"  [{cri}.containerd.runtimes.nvidia.options]\n"
text += "    BinaryName = '/usr/bin/nvidia-container-runtime'\n"
open("/etc/containerd/config.toml", "w").write(text)
"""


def test_a_rerun_keeps_the_sites_settings_and_converges_an_old_layout(bootstrapped: Any) -> None:
    """config.toml is edited as TOML: a site's own settings and comments stay through re-runs, and a host
    provisioned the old way (containerd's default file with the nvidia runtime inline) converges to the
    role's layout without losing a key, with a backup of the file it replaced. A file changed after
    containerd started gets containerd restarted, and only that."""
    from labkit import gpuprov

    lab = bootstrapped.lab
    hosts = _gpu_hosts(lab)
    site = "oom_score = -999  # site: keep containerd itself away from the OOM killer"
    before = {}
    for host in hosts:
        # The site edits config.toml and forgets to restart containerd.
        res = lab.ssh(
            host,
            f"sed -i '/^oom_score *=/d; /^version *=/a {site}' /etc/containerd/config.toml && "
            "grep -c 'site: keep' /etc/containerd/config.toml",
        )
        assert res.stdout.strip() == "1", (host, res.stdout, res.stderr)
        before[host] = lab.ssh(host, "sha256sum /etc/containerd/config.toml").stdout
    rerun = gpuprov("bootstrap", "-i", str(lab.inventory), "--only", "nvidia_container_toolkit,kubernetes",
                    "--yes", "--skip", "verify", "--format", "json", timeout=1800)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads(rerun.stdout)
    # The file already has every setting, so it is not rewritten; containerd started before it last
    # changed, so it is restarted (the notice and the handler: two changed tasks, nothing else).
    assert {h["host"]: h["changed"] for h in summary["hosts"] if h["host"] in hosts} == dict.fromkeys(
        hosts, 2
    )
    for host in hosts:
        assert lab.ssh(host, "sha256sum /etc/containerd/config.toml").stdout == before[host], host
        started_after = lab.ssh(
            host,
            "pid=$(systemctl show --property=MainPID --value containerd); "
            'started=$(( $(date +%s) - $(ps -o etimes= -p "$pid") )); '
            'test "$(stat -c %Y /etc/containerd/config.toml)" -le "$started"',
        )
        assert started_after.returncode == 0, (host, "containerd still runs the older file")
    for host in hosts:
        assert "site: keep" in lab.ssh(host, "cat /etc/containerd/config.toml").stdout, host
        res = lab.ssh(host, f"python3 - <<'EOF'\n{OLD_LAYOUT}\nEOF\nsystemctl restart containerd")
        assert res.returncode == 0, res.stderr
        dump = _dump(lab, host)
        old_runc = dump["plugins"][CRI[int(dump["version"])]]["containerd"]["runtimes"]["runc"]
        assert not old_runc["options"].get("SystemdCgroup"), host
    again = gpuprov("bootstrap", "-i", str(lab.inventory), "--only", "nvidia_container_toolkit,kubernetes",
                    "--yes", "--skip", "verify", "--format", "json", timeout=1800)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    for host in hosts:
        dump = _dump(lab, host)
        cri = dump["plugins"][CRI[int(dump["version"])]]
        assert (
            cri["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"]
            == "/usr/bin/nvidia-container-runtime"
        )
        assert cri["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
        assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
        assert cri.get("enable_cdi", False) is (lab.hosts[host].os != "bookworm"), host
        assert int(dump["oom_score"]) == -999, host
        text = lab.ssh(host, "cat /etc/containerd/config.toml; ls /etc/containerd/").stdout
        assert "site: keep" in text, host
        assert re.search(r"config\.toml\.\d+\.\S+~", text), (host, "no backup of the replaced file")
