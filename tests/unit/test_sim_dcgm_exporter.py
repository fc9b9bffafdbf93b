"""The simulated dcgm-exporter: while its pod runs, its node reaches GET /metrics on the pod's IP, port
9400, in dcgm-exporter's Prometheus text format (one series per GPU, values from the host's GPUs, the
last injected Xid); the port closes when the pod stops. Also the pure pieces: the CSV and the rendering.

One single-node cluster (cp1 with two H200s) off-host, as tests/unit/test_sim_kube_cluster.py builds it."""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from gpuprov_lab import vendor
from gpuprov_lab.sim import kube, kube_exporter
from gpuprov_lab.sim import kube_testing as kt

pytestmark = pytest.mark.slow

NS = "gpu-operator"
LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\} (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, dict[str, Any]]:
    """A strict reader of the Prometheus text exposition format: HELP and TYPE before each family's
    samples, every sample a labelled line with a float value."""
    families: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in families, f"{name} described twice"
            families[name] = {"help": help_text, "type": None, "samples": []}
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert families[name]["type"] is None and kind in ("gauge", "counter", "histogram", "summary")
            families[name]["type"] = kind
        else:
            m = LINE.match(line)
            assert m, f"not a sample line: {line!r}"
            fam = families[m.group(1)]
            assert fam["type"], f"{m.group(1)} sample before its TYPE"
            fam["samples"].append((dict(LABEL.findall(m.group(2))), float(m.group(3))))
    return families


def smi_answer(gpus: int) -> kt.Command:
    """nvidia-smi --query-gpu as the lab host answers it (other invocations: the node's own fake)."""

    def values(i: int) -> dict[str, str]:
        return {
            "index": str(i), "uuid": f"GPU-{i:08d}-1111-2222-3333-444444444444",
            "pci.bus_id": f"00000000:{0x1B + i:02X}:00.0", "name": "NVIDIA H200",
            "driver_version": "580.95.05",
            "utilization.gpu": "0", "utilization.memory": "0", "memory.used": "0", "memory.free": "143190",
            "memory.reserved": "581", "temperature.gpu": str(31 + i), "temperature.memory": "[N/A]",
            "power.draw": f"{74.5 + i:.2f}", "clocks.sm": "345", "clocks.mem": "2619",
            "remapped_rows.uncorrectable": "0", "remapped_rows.correctable": "0",
            "remapped_rows.failure": "No",
        }  # fmt: skip

    def answer(args: list[str]) -> tuple[int, str, str]:
        query = next(a.split("=", 1)[1] for a in args if a.startswith("--query-gpu="))
        rows = [", ".join(values(i)[f] for f in query.split(",")) for i in range(gpus)]
        return 0, "".join(r + "\n" for r in rows), ""

    return answer


def test_counters_csv_and_rendering() -> None:
    counters = kube_exporter.parse_counters(kube_exporter.BUILTIN_COUNTERS, "default-counters.csv")
    assert ("DCGM_FI_DEV_DEC_UTIL", "gauge") in [(c.name, c.prom_type) for c in counters]
    with pytest.raises(kube_exporter.ExporterError, match="expected 3 fields"):
        kube_exporter.parse_counters("DCGM_FI_DEV_GPU_TEMP, gauge\n", "x.csv")
    with pytest.raises(kube_exporter.ExporterError, match="could not find Prometheus metric type 'gaug'"):
        kube_exporter.parse_counters("DCGM_FI_DEV_GPU_TEMP, gaug, t\n", "x.csv")
    gpu = kube_exporter.Gpu(
        0,
        "GPU-1",
        "00000000:1B:00.0",
        "NVIDIA H200",
        {
            "temperature.gpu": "31",
            "power.draw": "74.50",
            "memory.free": "143190",
            "driver_version": "580.95.05",
        },
    )
    text = kube_exporter.render(counters, [gpu], {"00000000:1B:00.0": 48}, "gpu1")
    names = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")]
    # Field id order (GPU_TEMP 150, POWER_USAGE 155, XID_ERRORS 230, FB_FREE 251), not by name or file.
    assert names == [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_FREE",
    ]
    assert (
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1",pci_bus_id="00000000:1B:00.0",device="nvidia0",'
        'modelName="NVIDIA H200",Hostname="gpu1",DCGM_FI_DRIVER_VERSION="580.95.05"} 74.500000'
    ) in text
    assert 'DCGM_FI_DRIVER_VERSION="580.95.05",err_code="48",err_msg="Double Bit ECC Error"} 48' in text


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kt.SimHost]:
    root = tmp_path_factory.mktemp("dcgm")
    cp = kt.make_node(root / "cp1", "cp1", gpus=2)
    fake = cp.commands["nvidia-smi"]
    query = smi_answer(2)
    cp.commands["nvidia-smi"] = lambda a: query(a) if any("uuid" in x for x in a) else fake(a)
    try:
        port = kt.free_port()
        rc, out, err = kt.Tool(cp).kubeadm(
            "init", "--pod-network-cidr=10.244.0.0/16", f"--apiserver-bind-port={port}",
            "--apiserver-advertise-address=127.0.0.1",
        )  # fmt: skip
        assert rc == 0, err + out
        cp.write("/root/kube-flannel.yml", kube.extra_mirror_files()["flannel/v0.27.4/kube-flannel.yml"])
        rc, out, err = kt.Tool(cp).kubectl("apply", "-f", "/root/kube-flannel.yml")
        assert rc == 0, err
        kt.wait_for(lambda: _node_ready(cp), 60)
        rc, out, err = kt.Tool(cp).kubectl("create", "namespace", NS)
        assert rc == 0, err
        yield cp
    finally:
        cp.services.shutdown()  # type: ignore[union-attr]
        shutil.rmtree(root, ignore_errors=True)


def _node_ready(cp: kt.SimHost) -> bool:
    rc, out, _ = kt.Tool(cp).kubectl("get", "node", "cp1", "-o", "json")
    return rc == 0 and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in json.loads(out)["status"].get("conditions", [])
    )


def exporter_pod(
    name: str, extra_env: list[dict[str, Any]], mounts: dict[str, str] | None = None
) -> dict[str, Any]:
    """The operator's exporter container (its real DaemonSet manifest) in a pod that tolerates the
    control plane's taint."""
    ds = yaml.safe_load(
        (vendor.artifact("gpu-operator", "assets") / "state-dcgm-exporter/0800_daemonset.yaml").read_text()
    )
    ctr = ds["spec"]["template"]["spec"]["containers"][0]
    ctr["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-distroless"
    ctr["env"] += extra_env
    spec: dict[str, Any] = {
        "containers": [ctr],
        "tolerations": [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
        ],
    }
    if mounts:
        ctr["volumeMounts"] = [
            {"name": "metrics-config", "mountPath": mounts["path"], "subPath": mounts["key"]}
        ]
        spec["volumes"] = [{"name": "metrics-config", "configMap": {"name": mounts["configmap"]}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def run_pod(cp: kt.SimHost, pod: dict[str, Any]) -> str:
    cp.write(f"/root/{pod['metadata']['name']}.json", json.dumps(pod))
    rc, _, err = kt.Tool(cp).kubectl("apply", "-f", f"/root/{pod['metadata']['name']}.json")
    assert rc == 0, err

    def running() -> str | None:
        rc, out, _ = kt.Tool(cp).kubectl("get", "pod", "-n", NS, pod["metadata"]["name"], "-o", "json")
        st = json.loads(out)["status"] if rc == 0 else {}
        return (
            st.get("podIP")
            if st.get("phase") == "Running" and all(c.get("ready") for c in st.get("containerStatuses", []))
            else None
        )

    return str(kt.wait_for(running, 40))


def scrape(cp: kt.SimHost, pod_ip: str) -> str:
    """GET /metrics on the pod's IP:9400 from its node (off-host the node's addresses are loopback)."""
    url = f"http://{cp.bind_address(pod_ip)}:{cp.port(9400)}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return resp.read().decode()


def test_metrics_per_gpu_with_the_injected_xid_and_the_port_closes_on_stop(node: kt.SimHost) -> None:
    ip = run_pod(node, exporter_pod("exporter", [{"name": "DCGM_EXPORTER_INTERVAL", "value": "200"}]))
    assert ip.startswith("10.244.")
    fams = parse_prometheus(scrape(node, ip))
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
                 "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"):  # fmt: skip
        samples = fams[name]["samples"]
        assert [s[0]["gpu"] for s in samples] == ["0", "1"], name
        for labels, _ in samples:
            assert labels["device"] == f"nvidia{labels['gpu']}" and labels["modelName"] == "NVIDIA H200"
            assert labels["Hostname"] == "cp1" and labels["DCGM_FI_DRIVER_VERSION"] == "580.95.05"
            assert labels["UUID"].startswith("GPU-") and labels["pci_bus_id"].startswith("00000000:")
    assert fams["DCGM_FI_DEV_GPU_TEMP"]["type"] == "gauge"
    assert fams["DCGM_FI_DEV_GPU_TEMP"]["help"] == "GPU temperature (in C)."
    assert [v for _, v in fams["DCGM_FI_DEV_GPU_TEMP"]["samples"]] == [31.0, 32.0]
    assert [v for _, v in fams["DCGM_FI_DEV_POWER_USAGE"]["samples"]] == [74.5, 75.5]
    assert [v for _, v in fams["DCGM_FI_DEV_FB_FREE"]["samples"]] == [143190.0, 143190.0]
    assert [v for _, v in fams["DCGM_FI_DEV_XID_ERRORS"]["samples"]] == [0.0, 0.0]
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in fams  # nvidia-smi has no value: left out, as DCGM blanks are

    node.write("/etc/gpuprov-lab/faults.json", json.dumps({"faults": [{"kind": "xid", "gpu": 1, "xid": 79}]}))

    def xid_of_gpu1() -> float:
        samples = parse_prometheus(scrape(node, ip))["DCGM_FI_DEV_XID_ERRORS"]["samples"]
        return samples[1][1] if samples[1][0]["err_msg"] == "GPU has fallen off the bus" else 0.0

    assert kt.wait_for(xid_of_gpu1, 10) == 79.0

    rc, _, err = kt.Tool(node).kubectl("delete", "pod", "-n", NS, "exporter", "--wait=false")
    assert rc == 0, err

    def closed() -> bool:
        try:
            scrape(node, ip)
        except (urllib.error.URLError, ConnectionError):
            return True
        return False

    kt.wait_for(closed, 20)


def test_counters_from_the_mounted_configmap(node: kt.SimHost) -> None:
    csv = (
        "# ours\nDCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
        "DCGM_FI_DRIVER_VERSION, label, Driver Version\n"
    )
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "metrics", "namespace": NS},
          "data": {"dcgm-metrics.csv": csv}}  # fmt: skip
    node.write("/root/cm.json", json.dumps(cm))
    assert kt.Tool(node).kubectl("apply", "-f", "/root/cm.json")[0] == 0
    path = "/etc/dcgm-exporter/dcgm-metrics.csv"
    pod = exporter_pod(
        "custom",
        [{"name": "DCGM_EXPORTER_COLLECTORS", "value": path}],
        {"path": path, "key": "dcgm-metrics.csv", "configmap": "metrics"},
    )
    pod["spec"]["containers"][0]["env"] = [
        e
        for e in pod["spec"]["containers"][0]["env"]
        if e.get("value") != "/etc/dcgm-exporter/dcp-metrics-included.csv"
    ]
    ip = run_pod(node, pod)
    assert list(parse_prometheus(scrape(node, ip))) == ["DCGM_FI_DEV_GPU_TEMP"]
    assert kt.Tool(node).kubectl("delete", "pod", "-n", NS, "custom", "--wait=false")[0] == 0
