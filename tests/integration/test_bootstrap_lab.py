"""`gpuprov bootstrap` of the 3-host lab: every stage, idempotent, a working GPU Kubernetes cluster."""

from __future__ import annotations

import json
import re

import pytest

from provisioner.stages import STAGE_NAMES

pytestmark = pytest.mark.lab
LAB_PHASE = "bootstrapped"  # see tests/conftest.py


def test_first_run_provisions_every_stage_on_every_host(bootstrapped) -> None:
    run = bootstrapped.first
    assert run.rc == 0
    assert run.summary["stages"] == [*STAGE_NAMES, "verify"]
    for name, spec in bootstrapped.lab.hosts.items():
        host = run.host(name)
        assert host["status"] == "done", host
        assert host["failed"] == 0 and host["unreachable"] == 0
        assert host["changed"] > 0, f"{name}: a bare host must change"
        assert host["verify"] in ("pass", "skip"), host.get("verify_failures")
        expected = {"preflight", "docker", "kubernetes"} | (
            {"nvidia_driver", "cuda_toolkit", "nvidia_container_toolkit"} if spec.gpu_count else set()
        )
        assert expected <= set(host["stages"]), (name, host["stages"])


def test_second_run_changes_nothing(bootstrapped) -> None:
    run = bootstrapped.second
    assert run.rc == 0, run.summary
    changed = {h["host"]: h["changed"] for h in run.summary["hosts"]}
    assert changed == dict.fromkeys(bootstrapped.lab.hosts, 0)


def test_run_record_holds_events_stats_summary(bootstrapped) -> None:
    from pathlib import Path

    record = Path(bootstrapped.second.summary["record"])
    assert json.loads((record / "summary.json").read_text())["hosts"]
    assert set(json.loads((record / "stats.json").read_text())) == set(bootstrapped.lab.hosts)
    assert list(record.glob("runner/artifacts/*/job_events/*.json"))


def test_nodes_ready_with_every_gpu_allocatable(bootstrapped) -> None:
    lab = bootstrapped.lab
    res = lab.ssh("cp1", "kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json")
    assert res.returncode == 0, res.stderr
    nodes = {n["metadata"]["name"]: n for n in json.loads(res.stdout)["items"]}
    assert set(nodes) == set(lab.hosts)
    for name, spec in lab.hosts.items():
        node = nodes[name]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", (name, node["status"]["conditions"])
        allocatable = int(node["status"]["allocatable"].get("nvidia.com/gpu", "0"))
        assert allocatable == spec.gpu_count, (name, node["status"]["allocatable"])


def test_settings_another_tool_left_survive(bootstrapped) -> None:
    """daemon.json and config.toml as another tool left them before the first run (tests/integration/
    conftest.py): their keys stay; the nvidia runtime and the systemd cgroup driver are added beside them."""
    lab = bootstrapped.lab
    read_toml = (
        "python3 -c 'import json, sys, tomllib; print(json.dumps(tomllib.load(open(sys.argv[1], \"rb\"))))' "
        "/etc/containerd/config.toml"
    )
    for host in bootstrapped.foreign_hosts:
        docker = json.loads(lab.ssh(host, "cat /etc/docker/daemon.json").stdout)
        assert docker["registry-mirrors"] == ["https://registry-mirror.invalid"], (host, docker)
        res = lab.ssh(host, read_toml)
        assert res.returncode == 0, (host, res.stderr)
        ctd = json.loads(res.stdout)
        cri = ctd["plugins"]["io.containerd.grpc.v1.cri"]
        assert ctd["oom_score"] == -999, (host, ctd)
        assert cri["registry"]["config_path"] == "/etc/containerd/certs.d", (host, cri)
        assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True, (host, cri)
        if lab.hosts[host].gpu_count:
            assert docker["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime", (host, docker)
            assert cri["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True, (host, cri)
        else:
            assert "nvidia" not in docker.get("runtimes", {}), (host, docker)


def test_no_join_token_or_ca_hash_in_what_bootstrap_printed_or_recorded(bootstrapped) -> None:
    """The workers joined with a bootstrap token and the CA's public-key hash: neither appears in what
    either run printed or in anything its run record keeps (every task's events included)."""
    from pathlib import Path

    lab = bootstrapped.lab
    secrets = lab.ssh(
        "cp1",
        "kubeadm token list --kubeconfig /etc/kubernetes/admin.conf -o json; "
        "openssl x509 -in /etc/kubernetes/pki/ca.crt -noout -pubkey | openssl pkey -pubin -outform DER "
        "| sha256sum",
    )
    assert secrets.returncode == 0, secrets.stderr
    tokens = set(re.findall(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b", secrets.stdout))
    ca_hash = secrets.stdout.strip().splitlines()[-1].split()[0]
    assert tokens and re.fullmatch(r"[0-9a-f]{64}", ca_hash), secrets.stdout[-300:]
    for run in (bootstrapped.first, bootstrapped.second):
        texts = [run.stderr, json.dumps(run.summary)]
        record = Path(run.summary["record"])
        files = [p for p in record.rglob("*") if p.is_file()]
        assert files, record
        texts += [p.read_text(errors="replace") for p in files]
        for text in texts:
            assert not any(t in text for t in tokens), "a bootstrap token was printed or recorded"
            assert ca_hash not in text, "the CA hash was printed or recorded"
