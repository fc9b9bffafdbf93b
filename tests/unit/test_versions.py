"""The version matrix (provisioner/versions.yaml): its docs page, its agreement with the roles' pins,
and the refusal of combinations its sources call unsupported, before any host is touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisioner import versions
from provisioner.content import role_default

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventory" / "sample" / "hosts.yml"


def test_the_docs_page_shows_the_matrix_as_the_data_says() -> None:
    page = (REPO / "docs" / "versions.md").read_text()
    begin, end = "<!-- versions:begin -->\n", "<!-- versions:end -->"
    shown = page[page.index(begin) + len(begin) : page.index(end)]
    assert shown == versions.markdown_tables(), "docs/versions.md is stale: regenerate its tables"


def test_every_cell_cites_a_source_the_file_defines(tmp_path: Path) -> None:
    doc = yaml.safe_load(versions.MATRIX_FILE.read_text())
    doc["gpu_operator"]["v26.7.0"]["sources"] = ["nowhere"]
    broken = tmp_path / "versions.yaml"
    broken.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="nowhere"):
        versions.load.__wrapped__(broken)


def test_the_kubernetes_roles_pins_are_the_matrixs() -> None:
    pins = yaml.safe_load((REPO / "roles/kubernetes/vars/main.yml").read_text())["__kubernetes_minors"]
    matrix = versions.load().kubernetes
    assert set(pins) == set(matrix)
    for minor, pin in pins.items():
        want = matrix[minor]
        assert pin["package_version"] == want["packages"]
        assert pin["cni_version"] == want["kubernetes_cni"]
        assert pin["cri_tools_version"] == want["cri_tools"]
        assert pin["pause_image"] == f"registry.k8s.io/pause:{want['pause']}"
        assert pin["containerd_min"] == want["containerd_min"]


def test_the_defaults_are_a_supported_combination() -> None:
    matrix = versions.load()
    minor = role_default("kubernetes", "kubernetes_minor")
    chart = role_default("gpu_operator", "gpu_operator_chart_version")
    assert minor == max(matrix.kubernetes, key=lambda m: tuple(map(int, m.split("."))))
    release = matrix.gpu_operator[chart]
    assert release.supports(minor)
    assert chart == next(iter(matrix.gpu_operator)), "the default chart is the matrix's newest"
    toolkit = role_default("nvidia_container_toolkit", "nvidia_container_toolkit_version")
    assert toolkit.removesuffix("-1") == release.container_toolkit
    assert role_default("nvidia_driver", "nvidia_driver_branch") in release.driver_branches
    assert versions.problems({}) == []


@pytest.mark.parametrize(
    ("chart", "why"),
    [
        ("v26.3.1", "GPU Operator v26.3.1 supports Kubernetes 1.32 to 1.35, not kubernetes_minor 1.36"),
        ("v25.10.0", "supports Kubernetes 1.30 to 1.34"),
        ("v27.1.0", "v27.1.0 is not in gpuprov's version matrix"),
    ],
)
def test_an_operator_that_does_not_support_the_kubernetes_minor_is_refused(chart: str, why: str) -> None:
    found = versions.problems({"gpu_operator_chart_version": chart})
    assert [k for k, _ in found] == ["gpu_operator_chart_version"]
    assert why in found[0][1]
    if chart.startswith("v26.3"):
        assert "for 1.36: v26.7.0, v26.3.3, v26.3.2" in found[0][1]


def test_bootstrap_refuses_an_unsupported_combination_before_connecting(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(SAMPLE.parent, inv)
    (inv / "group_vars" / "all" / "zz-versions.yml").write_text("gpu_operator_chart_version: v26.3.1\n")
    res = subprocess.run(
        [sys.executable, "-m", "provisioner", "bootstrap", "-i", str(inv / "hosts.yml"), "--yes"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert str(inv / "group_vars" / "all" / "zz-versions.yml") in res.stderr
    assert "gpu_operator_chart_version" in res.stderr and "not kubernetes_minor 1.36" in res.stderr
    assert not (tmp_path / ".gpuprov").exists()
