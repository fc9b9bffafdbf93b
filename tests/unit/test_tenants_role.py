"""The gpu_tenants role's manifests and node pool changes, rendered with Ansible's own templar from the
role's files (the way tests/unit/test_gpu_operator_values.py renders the gpu_operator role)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "gpu_tenants"


def _render(expr: str, variables: dict[str, Any]) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template(expr))


def role_env(pools: dict[str, str], **extra: Any) -> dict[str, Any]:
    hosts = ["cp1", "gpu1", "gpu2"]
    hostvars = {h: {"inventory_hostname": h, "ansible_facts": {"nodename": h.upper()}} for h in hosts}
    for host, pool in pools.items():
        hostvars[host]["gpuprov_node_pool"] = pool
    return {
        **yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
        **yaml.safe_load((ROLE / "vars" / "main.yml").read_text()),
        "groups": {"kube_control_plane": ["cp1"], "gpu_nodes": hosts[1:], "k8s_cluster": hosts},
        "hostvars": hostvars,
        **extra,
    }


def tenant_objects(tenant: dict[str, Any]) -> dict[str, dict[str, Any]]:
    env = role_env({"gpu1": "train"}, tenant=tenant)
    doc = yaml.safe_load(json.dumps(_render((ROLE / "templates" / "tenant.yaml.j2").read_text(), env)))
    if isinstance(doc, str):
        doc = yaml.safe_load(doc)
    assert doc["kind"] == "List"
    return {o["kind"]: o for o in doc["items"]}


def test_a_pool_tenant_gets_quota_limits_node_selector_and_tolerations() -> None:
    objs = tenant_objects(
        {"name": "team-a", "gpus": 8, "mig": {"1g.18gb": 4}, "max_gpus_per_pod": 2, "node_pool": "train"}
    )
    ns = objs["Namespace"]
    assert ns["metadata"]["name"] == "team-a"
    notes = ns["metadata"]["annotations"]
    assert notes["scheduler.alpha.kubernetes.io/node-selector"] == "gpuprov.io/pool=train"
    pool = {"key": "gpuprov.io/pool", "operator": "Equal", "value": "train", "effect": "NoSchedule"}
    assert json.loads(notes["scheduler.alpha.kubernetes.io/defaultTolerations"]) == [pool]
    allowed = json.loads(notes["scheduler.alpha.kubernetes.io/tolerationsWhitelist"])
    assert (
        pool in allowed
        and {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"} in allowed
    )
    quota = objs["ResourceQuota"]
    assert quota["metadata"]["namespace"] == "team-a"
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": "8", "requests.nvidia.com/mig-1g.18gb": "4"}
    (limit,) = objs["LimitRange"]["spec"]["limits"]
    assert limit == {"type": "Container", "max": {"nvidia.com/gpu": "2"}}


def test_a_plain_tenant_gets_its_namespace_and_quota_only() -> None:
    objs = tenant_objects({"name": "team-b", "namespace": "research-b", "gpus": 0})
    assert sorted(objs) == ["Namespace", "ResourceQuota"]
    assert objs["Namespace"]["metadata"]["name"] == "research-b"
    assert "annotations" not in objs["Namespace"]["metadata"]
    assert objs["ResourceQuota"]["spec"]["hard"] == {"requests.nvidia.com/gpu": "0"}


def pool_todo(pools: dict[str, str], nodes: list[dict[str, Any]]) -> list[str]:
    tasks = yaml.safe_load((ROLE / "tasks" / "tenants.yml").read_text())
    task = next(t for t in tasks if t["name"].startswith("Work out the pool labels"))
    env = role_env(pools, **task["vars"])
    env["__gpu_tenants_nodes"] = {"stdout": json.dumps({"items": nodes})}
    return [" ".join(c) for c in _render(task["ansible.builtin.set_fact"]["__gpu_tenants_pool_todo"], env)]


def node(name: str, pool: str | None = None, taint: str | None = None) -> dict[str, Any]:
    labels = {"gpuprov.io/pool": pool} if pool else {}
    taints = [{"key": "gpuprov.io/pool", "value": taint, "effect": "NoSchedule"}] if taint else []
    return {"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}


def test_pool_nodes_are_labelled_and_tainted_and_leavers_cleared() -> None:
    nodes = [node("cp1"), node("gpu1"), node("gpu2", pool="old", taint="old")]
    assert pool_todo({"gpu1": "train"}, nodes) == [
        "label node gpu1 gpuprov.io/pool=train --overwrite",
        "taint node gpu1 gpuprov.io/pool=train:NoSchedule",
        "label node gpu2 gpuprov.io/pool-",
        "taint node gpu2 gpuprov.io/pool-",
    ]
    # A node whose taint has another pool's value: the old taint goes, the new one comes.
    assert pool_todo({"gpu2": "train"}, [node("gpu2", pool="train", taint="old")]) == [
        "taint node gpu2 gpuprov.io/pool-",
        "taint node gpu2 gpuprov.io/pool=train:NoSchedule",
    ]


def test_pools_in_place_change_nothing() -> None:
    nodes = [node("cp1"), node("gpu1", pool="train", taint="train"), node("gpu2")]
    assert pool_todo({"gpu1": "train"}, nodes) == []
