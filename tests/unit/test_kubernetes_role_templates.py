"""What the kubernetes role writes, rendered by Ansible itself from the role's own defaults, vars and
templates: kubeadm's init configuration with the site's kubelet, kube-proxy and etcd settings, the
registry mirrors containerd reads (hosts.toml), and the bridge CNI's pod network unit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "kubernetes"


def render(tmp_path: Path, template: str, settings: dict[str, Any], **facts: Any) -> str:
    """One of the role's templates, rendered by ansible-playbook on this machine with the role's
    defaults and vars, the given inventory settings and per-task facts. The settings are passed as extra
    variables: here the role's defaults are a play's vars_files, which outrank inventory variables."""
    out = tmp_path / "out"
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
            "tasks": [
                {"ansible.builtin.set_fact": facts},
                {"ansible.builtin.template": {"src": str(ROLE / "templates" / template), "dest": str(out)}},
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    inventory = {
        "all": {
            "hosts": {"localhost": {"ansible_python_interpreter": sys.executable}},
            "children": {"kube_control_plane": {"hosts": {"localhost": {}}}},
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    res = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.yml"),
         "-e", f"@{tmp_path / 'settings.json'}", str(tmp_path / "play.yml")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    return out.read_text()


NODE = {"__kubernetes_node": {"name": "cp1", "address": "10.0.0.10", "control_plane": True, "gpu": False}}


def _docs(text: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(text) if d}


def test_kubeadm_init_takes_the_sites_kubelet_kube_proxy_and_etcd_settings(tmp_path: Path) -> None:
    settings = {
        "kubernetes_kubelet_config": {"failCgroupV1": False, "maxPods": 250},
        "kubernetes_kube_proxy_config": {"conntrack": {"maxPerCore": 0}},
        "kubernetes_etcd_image_tag": "3.6.13-0",
        "kubernetes_node_address": "10.0.0.10",
    }
    docs = _docs(render(tmp_path, "kubeadm-init.yaml.j2", settings, **NODE))
    assert docs["ClusterConfiguration"]["etcd"] == {"local": {"imageTag": "3.6.13-0"}}
    assert docs["ClusterConfiguration"]["kubernetesVersion"] == "v1.36.3"
    kubelet = docs["KubeletConfiguration"]
    assert kubelet["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    # The role's hardening stays, the site's keys are added.
    assert kubelet["authentication"]["anonymous"] == {"enabled": False} and kubelet["readOnlyPort"] == 0
    assert kubelet["cgroupDriver"] == "systemd"
    assert (kubelet["failCgroupV1"], kubelet["maxPods"]) == (False, 250)
    assert docs["KubeProxyConfiguration"]["conntrack"] == {"maxPerCore": 0}


def test_kubeadm_init_without_them_is_kubeadms_defaults(tmp_path: Path) -> None:
    docs = _docs(render(tmp_path, "kubeadm-init.yaml.j2", {"kubernetes_node_address": "10.0.0.10"}, **NODE))
    assert "etcd" not in docs["ClusterConfiguration"]
    assert "KubeProxyConfiguration" not in docs
    assert "failCgroupV1" not in docs["KubeletConfiguration"]


def _hosts_toml(tmp_path: Path, settings: dict[str, Any], registry: str) -> dict[str, Any]:
    """hosts.toml of one registry, as the role's loop gives it: item is the registry and the endpoints
    the role computes for it (__kubernetes_registry_hosts)."""
    text = render(
        tmp_path,
        "hosts.toml.j2",
        settings,
        item={"key": registry, "value": "{{ __kubernetes_registry_hosts[" + json.dumps(registry) + "] }}"},
    )
    return tomllib.loads(text)


def test_one_mirror_for_every_registry_keeps_each_under_its_name(tmp_path: Path) -> None:
    settings = {"gpuprov_registry_mirror_url": "http://mirror.example:5000/"}
    doc = _hosts_toml(tmp_path, settings, "registry.k8s.io")
    assert doc["server"] == "https://registry.k8s.io"
    assert doc["host"] == {
        "http://mirror.example:5000/v2/registry.k8s.io": {
            "capabilities": ["pull", "resolve"],
            "override_path": True,
        }
    }
    docker = _hosts_toml(tmp_path, settings, "docker.io")
    assert docker["server"] == "https://registry-1.docker.io"


def test_a_registrys_own_mirrors_come_first_and_a_host_mirror_keeps_the_api_path(tmp_path: Path) -> None:
    settings = {
        "gpuprov_registry_mirror_url": "http://mirror.example:5000",
        "kubernetes_registry_mirrors": {"nvcr.io": ["https://nvcr-cache.example"]},
    }
    doc = _hosts_toml(tmp_path, settings, "nvcr.io")
    assert list(doc["host"]) == ["https://nvcr-cache.example", "http://mirror.example:5000/v2/nvcr.io"]
    assert "override_path" not in doc["host"]["https://nvcr-cache.example"]


def test_the_pod_network_unit_routes_the_other_nodes_pods_and_forwards_them(tmp_path: Path) -> None:
    cidrs = {
        "cp1": {"cidr": "10.244.0.0/24", "address": "10.0.0.10"},
        "gpu1": {"cidr": "10.244.1.0/24", "address": "10.0.0.11"},
        "gpu2": {"cidr": "10.244.2.0/24", "address": "10.0.0.12"},
    }
    text = render(tmp_path, "gpuprov-pod-network.service.j2", {}, __kubernetes_pod_cidrs=cidrs, **NODE)
    starts = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert starts[:2] == [
        "/usr/sbin/ip route replace 10.244.1.0/24 via 10.0.0.11",
        "/usr/sbin/ip route replace 10.244.2.0/24 via 10.0.0.12",
    ]
    assert not any("10.244.0.0/24" in s for s in starts)  # not to itself
    rules = " ".join(starts[2:])
    assert "-A FORWARD -s 10.244.0.0/16" in rules and "-A FORWARD -d 10.244.0.0/16" in rules
    assert "-t nat -A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16" in rules


@pytest.mark.parametrize(
    "bad",
    [
        {"kubernetes_registry_mirrors": {"nvcr.io": ["ftp://x"]}},
        {"kubernetes_registry_mirror_url": "mirror:5000"},
    ],
)
def test_mirrors_that_are_no_http_urls_fail_the_roles_check(bad: dict[str, Any]) -> None:
    """The role's first assert (tasks/main.yml) rejects them; the same expression here."""
    pattern = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__kubernetes_endpoint_re"]
    import re

    values = [v for vs in bad.get("kubernetes_registry_mirrors", {}).values() for v in vs]
    values += [bad["kubernetes_registry_mirror_url"]] if "kubernetes_registry_mirror_url" in bad else []
    assert not all(re.match(pattern, v) for v in values)
