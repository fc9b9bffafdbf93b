"""Day-2 checks over recorded probe outputs: the DCGM exporter, GPU tenants, MIG resources, and the
expectations the inventory declares."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import verify_fixtures as vf

from provisioner.checks import HostFacts, evaluate
from provisioner.checks.model import Finding
from provisioner.errors import InputError
from provisioner.inventory_expectations import declared
from provisioner.policy import Expectations, policy_from_mapping
from provisioner.probes.base import ParseError
from provisioner.probes.exporter import (
    _DCGM_EXPORTER_PY,
    DCGM_EXPORTER,
    DCGM_EXPORTER_LABEL,
    parse_dcgm_exporter,
)
from provisioner.probes.kubernetes import KUBE_TENANTS
from provisioner.probes.mig import SMI_LIST
from provisioner.probes.prometheus import parse_prometheus_text
from provisioner.tenants import parse_tenants

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c008796e"  # the real H200's
DEPLOY = {"nvidia.com/gpu.deploy.dcgm-exporter": "true"}


def run(probes: Mapping[str, tuple[int | None, str, str]], exp: Expectations | None = None) -> dict:
    out: dict[str, list[Finding]] = {}
    for f in evaluate(HostFacts("h200", vf.results(probes)), exp or Expectations()):
        out.setdefault(f.id, []).append(f)
    return out


def exp_from(mapping: dict[str, object]) -> Expectations:
    return policy_from_mapping(mapping).expectations_for("h200")


def node(labels: Mapping[str, str] | None = None, allocatable: Mapping[str, str] | None = None) -> str:
    return json.dumps(
        {
            "kind": "Node",
            "metadata": {"name": "h200", "labels": dict(labels or {})},
            "spec": {},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "allocatable": dict(allocatable or {"nvidia.com/gpu": "1"}),
            },
        }
    )


def metrics(uuids: Mapping[int, str], skip: tuple[str, ...] = (), extra: str = "") -> str:
    """A page as dcgm-exporter renders it (internal/pkg/rendermetrics/render_metrics.go)."""
    lines = []
    for metric, help_text, value in (
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "34"),
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "0"),
        ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "0"),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "0"),
    ):
        if metric in skip:
            continue
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for index, uuid in uuids.items():
            lines.append(
                f'{metric}{{gpu="{index}",UUID="{uuid}",pci_bus_id="00000000:00:06.0",device="nvidia{index}",'
                f'modelName="NVIDIA H200",Hostname="h200",DCGM_FI_DRIVER_VERSION="580.159.04"}} {value}'
            )
    return "\n".join(lines) + "\n" + extra


def exporter(
    page: str | None = None, *, phase: str = "Running", error: str | None = None, pods: bool = True
) -> tuple[int, str, str]:
    pod = {
        "namespace": "gpu-operator",
        "name": "nvidia-dcgm-exporter-x7k2p",
        "phase": phase,
        "ready": phase == "Running",
        "reason": None if phase == "Running" else "ContainerCreating",
        "ip": "10.244.1.17",
        "port": 9400,
    }
    scrape = None
    if phase == "Running":
        scrape = {
            "pod": "gpu-operator/nvidia-dcgm-exporter-x7k2p",
            "url": "http://10.244.1.17:9400/metrics",
            "status": None if error else 200,
            "error": error,
            "truncated": False,
        }
    doc = {
        "node": "h200",
        "pods": [pod] if pods else [],
        "scrape": scrape if pods else None,
        "metrics": page or "",
    }
    return (0, json.dumps(doc), "")


def gpu_node(page: str | None = None, labels: Mapping[str, str] = DEPLOY, **kw: object) -> dict:
    probes = vf.h200_probes()
    probes["kube-node.json"] = (0, node(labels), "")
    probes[DCGM_EXPORTER] = exporter(page if page is not None else metrics({0: UUID}), **kw)  # type: ignore[arg-type]
    return probes


def one(findings: dict, check_id: str) -> Finding:
    (only,) = findings[check_id]
    return only


# ------------------------------------------------------------------------------------ DCGM exporter


def test_exporter_serving_every_gpu_passes() -> None:
    f = one(run(gpu_node()), "monitoring.dcgm_exporter")
    assert f.status == "pass" and "4 metrics for each of 1 GPU(s)" in f.detail, f


def test_exporter_connection_refused_fails_naming_it() -> None:
    probes = gpu_node(error="[Errno 111] Connection refused")
    f = one(run(probes), "monitoring.dcgm_exporter")
    assert f.status == "fail" and "Connection refused" in f.detail and "10.244.1.17:9400" in f.detail


def test_no_exporter_pod_and_pod_not_running_fail() -> None:
    wanted = exp_from({"monitoring.dcgm_exporter": True})
    f = one(run(gpu_node(pods=False), wanted), "monitoring.dcgm_exporter")
    assert f.status == "fail" and "no DCGM exporter pod" in f.detail
    f = one(run(gpu_node(phase="Pending")), "monitoring.dcgm_exporter")
    assert f.status == "fail" and "is Pending (ContainerCreating), not Running" in f.detail


def test_one_gpu_without_series_on_an_8_gpu_host_is_named() -> None:
    probes = gpu_node(
        metrics({i: f"GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c00879{i:02x}" for i in range(8) if i != 5})
    )
    probes["pci-devices.txt"] = (0, vf.multi_gpu_pci(8), "")
    probes["nvidia-smi-q.xml"] = (0, vf.multi_gpu_xml(8), "")
    (f,) = run(probes)["monitoring.dcgm_exporter"]
    assert (f.status, f.gpu, f.bus_id) == ("fail", 5, vf.HGX_BUSES[5]), f
    assert "DCGM_FI_DEV_GPU_UTIL" in f.detail


def test_a_metric_missing_and_a_doubled_series_fail() -> None:
    f = one(run(gpu_node(metrics({0: UUID}, skip=("DCGM_FI_DEV_XID_ERRORS",)))), "monitoring.dcgm_exporter")
    assert f.status == "fail" and "serves no DCGM_FI_DEV_XID_ERRORS" in f.detail
    doubled = metrics({0: UUID}) + 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="' + UUID + '"} 35\n'
    f = one(run(gpu_node(doubled)), "monitoring.dcgm_exporter")
    assert f.status == "fail" and "more than one DCGM_FI_DEV_GPU_TEMP" in f.detail


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0",modelName="\x1b]0;pwned\x07\x1b[2J"} 1\n', "control characters"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0",modelName="' + "A" * 70_000 + '"} 1\n', "longer than"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0",modelName="\\e[31m"} 1\n', "unknown escape"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 1; rm -rf /\n', "expected a value"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0",gpu="1"} 1\n', "given twice"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0} 1\n', "not closed"),
    ],
)
def test_malicious_metric_text_is_an_error_shown_safely(extra: str, words: str) -> None:
    f = one(run(gpu_node(metrics({0: UUID}, extra=extra))), "monitoring.dcgm_exporter")
    assert f.status == "error" and words in f.detail, f
    assert "\x1b" not in f.detail and len(f.detail) < 300


def test_exporter_expectation_comes_from_the_operator_label_or_the_policy() -> None:
    f = one(run(gpu_node(labels={})), "monitoring.dcgm_exporter")
    assert f.status == "skip" and "gpu.deploy.dcgm-exporter=true" in f.detail
    # The real operator labels every GPU node for its exporter even when the ClusterPolicy turns it off:
    # the label alone with no exporter pod is no verdict.
    f = one(run(gpu_node(pods=False)), "monitoring.dcgm_exporter")
    assert f.status == "skip" and "not declared" in f.detail, f
    f = one(
        run(gpu_node(pods=False, labels={}), exp_from({"monitoring.dcgm_exporter": True})),
        "monitoring.dcgm_exporter",
    )
    assert f.status == "fail" and "(policy)" in f.detail
    f = one(
        run(gpu_node(pods=False), exp_from({"monitoring.dcgm_exporter": False})), "monitoring.dcgm_exporter"
    )
    assert f.status == "skip"
    probes = gpu_node()
    probes[DCGM_EXPORTER] = (
        1,
        "",
        'Error from server (Forbidden): pods is forbidden: User "system:node:h200"',
    )
    f = one(run(probes), "monitoring.dcgm_exporter")
    assert f.status == "error" and "may list only its own pods" in f.detail


def test_prometheus_parser_reads_the_format_strictly() -> None:
    page = '# HELP x A.\n# TYPE x gauge\nx{a="q\\"\\\\\\n",b="",} 1.5e3 1700000000000\ny NaN\nz -Inf\n'
    samples = parse_prometheus_text(page)
    assert [(s.name, s.labels, s.value) for s in samples[:1]] == [("x", {"a": 'q"\\\n', "b": ""}, 1500.0)]
    assert [s.name for s in samples] == ["x", "y", "z"]
    for bad in ("x 1 2 3\n", "# TYPE x gaug\n", 'x{1a="b"} 1\n', "x 0x10\n", '{a="b"} 1\n'):
        with pytest.raises(ParseError):
            parse_prometheus_text(bad)


class _Exporter(BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: object) -> None:
        pass


def _host_script(tmp_path: Path, port: int) -> dict:
    """The probe's host-side program with a kubectl that answers as the API server would."""
    pods = {
        "items": [
            {
                "metadata": {"namespace": "gpu-operator", "name": "nvidia-dcgm-exporter-abcde"},
                "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": port}]}]},
                "status": {
                    "phase": "Running",
                    "podIP": "127.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        ]
    }
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    kubectl = bindir / "kubectl"
    kubectl.write_text(
        f'#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\ncat <<\'EOF\'\n{json.dumps(pods)}\nEOF\n'
    )
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "http_proxy": "http://192.0.2.1:9"}
    script = textwrap.dedent(_DCGM_EXPORTER_PY)
    done = subprocess.run(
        [sys.executable, "-", "/etc/kubernetes/kubelet.conf", "h200", DCGM_EXPORTER_LABEL, "4096"],
        input=script,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    args = (bindir / "args").read_text()
    assert "--field-selector spec.nodeName=h200" in args and "-l app=nvidia-dcgm-exporter" in args
    return json.loads(done.stdout)


def test_the_probe_program_scrapes_the_pod_and_reports_refusal(tmp_path: Path) -> None:
    _Exporter.page = metrics({0: UUID}).encode()
    server = HTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        doc = _host_script(tmp_path, server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
    probe = parse_dcgm_exporter(json.dumps(doc))
    assert probe.scrape and probe.scrape.status == 200 and "DCGM_FI_DEV_GPU_UTIL" in probe.metrics
    assert parse_dcgm_exporter(base64.b64decode(base64.b64encode(json.dumps(doc).encode())).decode()).pods
    refused = _host_script(tmp_path, server.server_address[1])  # the server is gone now
    assert "refused" in refused["scrape"]["error"].lower() and refused["metrics"] == ""


# ---------------------------------------------------------------------------------------- tenants

TENANTS = [
    {"name": "research", "gpus": 8, "mig": {"1g.18gb": 14}, "max_gpus_per_pod": 2, "node_pool": "h200"}
]


def cluster(
    hard: Mapping[str, str] | None = None, *, limit: str = "2", pool: str = "h200", ns: bool = True
) -> str:
    hard = dict(hard or {"requests.nvidia.com/gpu": "8", "requests.nvidia.com/mig-1g.18gb": "14"})
    items = [
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": "research"},
            "spec": {"hard": hard},
            "status": {"hard": hard, "used": {"requests.nvidia.com/gpu": "3"}},
        },
        {
            "kind": "LimitRange",
            "metadata": {"name": "gpu", "namespace": "research"},
            "spec": {"limits": [{"type": "Container", "max": {"nvidia.com/gpu": limit}}]},
        },
    ]
    if ns:
        annotations = {
            "scheduler.alpha.kubernetes.io/node-selector": f"gpuprov.io/pool={pool}",
            "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(
                [{"key": "gpuprov.io/pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"}]
            ),
        }
        items.insert(0, {"kind": "Namespace", "metadata": {"name": "research", "annotations": annotations}})
    return json.dumps({"kind": "List", "apiVersion": "v1", "items": items})


def tenants_finding(text: str, tenants: object = TENANTS) -> Finding:
    probes = vf.h200_probes()
    probes[KUBE_TENANTS] = (0, text, "")
    return one(run(probes, exp_from({"tenants.quota": tenants})), "tenants.quota")


def test_quota_as_declared_passes_with_used_and_hard() -> None:
    f = tenants_finding(cluster())
    assert f.status == "pass" and "requests.nvidia.com/gpu 3/8" in f.detail and "mig-1g.18gb 0/14" in f.detail


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            cluster({"requests.nvidia.com/gpu": "4", "requests.nvidia.com/mig-1g.18gb": "14"}),
            "hard 4, declared 8",
        ),
        (cluster({"requests.nvidia.com/gpu": "8"}), "no ResourceQuota sets requests.nvidia.com/mig-1g.18gb"),
        (cluster(limit="4"), "LimitRange max nvidia.com/gpu 4, declared 2"),
        (cluster(pool="a100"), "expected gpuprov.io/pool=h200"),
        (cluster(ns=False), "namespace research does not exist"),
    ],
)
def test_quota_different_from_the_declaration_fails(text: str, words: str) -> None:
    f = tenants_finding(text)
    assert f.status == "fail" and words in f.detail, f


def test_quantities_compare_by_value_and_workers_skip() -> None:
    text = cluster({"requests.nvidia.com/gpu": "8000m", "requests.nvidia.com/mig-1g.18gb": "14"})
    assert tenants_finding(text).status == "pass"
    probes = vf.h200_probes()
    probes[KUBE_TENANTS] = (200, "", "not the control plane: no /etc/kubernetes/admin.conf")
    assert one(run(probes, exp_from({"tenants.quota": TENANTS})), "tenants.quota").status == "skip"
    assert one(run(probes), "tenants.quota").status == "skip"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"name": "a"}, "expected a list of tenants"),
        ([{"name": "Research", "gpus": 1}], "[0].name"),
        ([{"name": "a", "gpus": -1}], "[0].gpus"),
        ([{"name": "a", "gpus": True}], "[0].gpus"),
        ([{"name": "a"}], "declares no quota"),
        ([{"name": "a", "gpus": 1, "quota": 2}], "unknown key 'quota'"),
        ([{"name": "a", "mig": {"1g.18gb+me": 1}}], "not a MIG profile"),
        ([{"name": "a", "gpus": 1, "max_gpus_per_pod": 2}], "more than the tenant's gpus"),
        (
            [{"name": "a", "gpus": 1}, {"name": "b", "namespace": "a", "gpus": 1}],
            "[1].namespace: 'a' is declared twice",
        ),
    ],
)
def test_tenants_shape_is_refused_naming_the_key(value: object, words: str) -> None:
    with pytest.raises(InputError, match=r"^inv/group_vars/all\.yml: gpuprov_tenants") as err:
        parse_tenants(value, "inv/group_vars/all.yml: gpuprov_tenants")
    assert words in str(err.value)


def test_bad_tenants_in_the_inventory_is_exit_2_naming_file_and_key(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_nodes:\n      hosts:\n        gpu1:\n          ansible_host: 192.0.2.1\n"
    )
    (inv / "group_vars" / "all.yml").write_text("gpuprov_tenants:\n  - name: research\n    gpus: many\n")
    done = subprocess.run(
        [sys.executable, "-m", "provisioner", "verify", "-i", str(inv)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"{inv}/group_vars/all.yml: gpuprov_tenants[0].gpus" in done.stderr


# ----------------------------------------------------------------------- declared in the inventory

SHARING_PROFILES = {
    "ts4": {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    }
}


def test_inventory_declarations_name_their_file_and_the_policy_wins(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  vars:\n    gpuprov_mig_strategy: mixed\n")
    (inv / "host_vars" / "gpu1.yml").write_text("gpuprov_mig_config: all-1g.18gb\ngpuprov_gpu_sharing: ts4\n")
    hostvars = {
        "gpuprov_mig_config": "all-1g.18gb",
        "gpuprov_mig_strategy": "mixed",
        "gpuprov_gpu_sharing": "ts4",
        "gpuprov_gpu_sharing_profiles": SHARING_PROFILES,
        "gpuprov_tenants": TENANTS,
    }
    found = declared(hostvars, host="gpu1", groups=["gpu_nodes"], inventory=inv)
    assert found["mig.config"] == ("all-1g.18gb", "inventory host_vars gpu1")
    assert found["gpu.sharing.strategy"] == ("time-slicing", "inventory host_vars gpu1")
    assert found["gpu.sharing.replicas"][0] == 4
    assert found["mig.strategy"] == ("mixed", "inventory hosts.yml")
    assert found["tenants.quota"][0][0].quota() == {
        "requests.nvidia.com/gpu": 8,
        "requests.nvidia.com/mig-1g.18gb": 14,
    }
    assert "monitoring.dcgm_exporter" not in found  # the chart's default: nothing declared
    off = {"gpu_operator_values": {"dcgmExporter": {"enabled": False}}}
    assert (
        declared(off, host="gpu1", groups=["gpu_nodes"], inventory=inv)["monitoring.dcgm_exporter"][0]
        is False
    )
    assert "monitoring.dcgm_exporter" not in declared(off, host="cp1", groups=["kube_control_plane"])
    from provisioner.verification import Target, _expectations

    target = Target("gpu1", open=lambda: None, groups=("gpu_nodes",), vars=hostvars, inventory=inv)  # type: ignore[arg-type, return-value]
    exp = _expectations(policy_from_mapping({"mig.config": "all-disabled"}), target, True, None)
    assert (exp.mig_config, exp.source("mig.config")) == ("all-disabled", "policy")
    assert (exp.sharing_strategy, exp.sharing_replicas) == ("time-slicing", 4)
    assert exp.source("gpu.sharing.replicas") == "inventory host_vars gpu1"
    with pytest.raises(InputError, match=r"host_vars/gpu1.yml: gpuprov_gpu_sharing: no profile 'ts8'"):
        declared({**hostvars, "gpuprov_gpu_sharing": "ts8"}, host="gpu1", groups=[], inventory=inv)
    with pytest.raises(InputError, match=r"gpuprov_mig_config: expected a MIG configuration name"):
        declared({"gpuprov_mig_config": "all 1g"}, host="gpu1", groups=[], inventory=inv)


def test_bootstrap_promises_what_the_operator_stage_set_up() -> None:
    from types import SimpleNamespace

    from provisioner.playbookverb.run import expectations_for

    host = SimpleNamespace(
        name="gpu1", groups=["gpu_nodes", "k8s_cluster"], vars={"gpuprov_mig_config": "all-1g.18gb"}
    )
    exp = expectations_for(host, ["gpu_operator"])
    assert exp["monitoring.dcgm_exporter"] is True and exp["mig.config"] == "all-1g.18gb"
    host.vars["gpu_operator_values"] = {"dcgmExporter": {"enabled": False}}
    assert expectations_for(host, ["gpu_operator"])["monitoring.dcgm_exporter"] is False
    assert "monitoring.dcgm_exporter" not in expectations_for(host, ["kubernetes"])


# -------------------------------------------------------------------------------- MIG resources

MIG_LISTING = (
    f"GPU 0: NVIDIA H200 (UUID: {UUID})\n"
    + "".join(
        f"  MIG 1g.18gb     Device  {i}: (UUID: MIG-4c5b1c3e-8a1f-5b7e-9d2a-3f6e7a8b9c{i:02d})\n"
        for i in range(4)
    )
    + "  MIG 3g.71gb     Device  4: (UUID: MIG-4c5b1c3e-8a1f-5b7e-9d2a-3f6e7a8b9c99)\n"
)


def mig_host(allocatable: Mapping[str, str], labels: Mapping[str, str] | None = None) -> dict:
    probes = vf.h200_probes()
    probes["nvidia-smi-q.xml"] = (
        0,
        vf.set_gpu(vf.raw("nvidia-smi-q-x.xml"), "mig_mode/current_mig", "Enabled"),
        "",
    )
    probes[SMI_LIST] = (0, MIG_LISTING, "")
    probes["kube-node.json"] = (0, node(labels, allocatable), "")
    return probes


def test_mixed_strategy_advertises_each_profile() -> None:
    good = {"nvidia.com/mig-1g.18gb": "4", "nvidia.com/mig-3g.71gb": "1", "nvidia.com/gpu": "0"}
    f = one(run(mig_host(good), exp_from({"mig.strategy": "mixed"})), "k8s.gpu_allocatable")
    assert f.status == "pass" and "nvidia.com/mig-1g.18gb=4, nvidia.com/mig-3g.71gb=1" in f.detail, f
    bad = {"nvidia.com/mig-1g.18gb": "3", "nvidia.com/mig-3g.71gb": "1"}
    f = one(run(mig_host(bad, {"nvidia.com/mig.strategy": "mixed"})), "k8s.gpu_allocatable")
    assert (
        f.status == "fail" and "nvidia.com/mig-1g.18gb=3, expected 4" in f.detail and "node label" in f.detail
    )


def test_single_strategy_advertises_mig_devices_as_gpus() -> None:
    f = one(
        run(mig_host({"nvidia.com/gpu": "5"}), exp_from({"mig.strategy": "single"})), "k8s.gpu_allocatable"
    )
    assert f.status == "pass", f
    f = one(
        run(mig_host({"nvidia.com/gpu": "1"}), exp_from({"mig.strategy": "single"})), "k8s.gpu_allocatable"
    )
    assert f.status == "fail" and "nvidia.com/gpu=1, expected 5" in f.detail


def test_mig_config_counts_the_devices_it_can() -> None:
    labels = {"nvidia.com/mig.config": "all-balanced", "nvidia.com/mig.config.state": "success"}
    probes = mig_host({}, labels)
    f = one(run(probes, exp_from({"mig.config": "all-balanced"})), "mig.config")
    assert f.status == "pass" and "4 × 1g.18gb, 1 × 3g.71gb" in f.detail and "not compared" in f.detail
    probes[SMI_LIST] = (0, f"GPU 0: NVIDIA H200 (UUID: {UUID})\n", "")
    f = one(run(probes, exp_from({"mig.config": "all-balanced"})), "mig.config")
    assert f.status == "fail" and "no MIG device" in f.detail


def test_mixed_strategy_sums_each_profile_over_the_gpus() -> None:
    xml = vf.multi_gpu_xml(2)
    for gpu in (0, 1):
        xml = vf.set_gpu(xml, "mig_mode/current_mig", "Enabled", gpu=gpu)
    listing = "".join(
        f"GPU {g}: NVIDIA H200 (UUID: GPU-04f02a4e-4e65-fbbe-b1b3-dbc3c00879{g:02x})\n"
        + "".join(f"  MIG 1g.18gb     Device  {i}: (UUID: MIG-{g}{i})\n" for i in range(4))
        for g in (0, 1)
    )
    probes = vf.h200_probes()
    probes["pci-devices.txt"] = (0, vf.multi_gpu_pci(2), "")
    probes["nvidia-smi-q.xml"] = (0, xml, "")
    probes[SMI_LIST] = (0, listing, "")
    probes["kube-node.json"] = (0, node(None, {"nvidia.com/mig-1g.18gb": "8"}), "")
    f = one(run(probes, exp_from({"mig.strategy": "mixed"})), "k8s.gpu_allocatable")
    assert f.status == "pass" and "nvidia.com/mig-1g.18gb=8" in f.detail, f
