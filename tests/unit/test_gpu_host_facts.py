"""Pieces of preflight's host probe (roles/preflight/files/gpu_host_facts.py) that read the filesystem."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_probe():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "gpu_host_facts", REPO / "roles" / "preflight" / "files" / "gpu_host_facts.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_boot_kernels_lists_the_kernel_images_only(tmp_path: Path) -> None:
    probe = load_probe()
    for name in ("vmlinuz-6.8.0-90-generic", "vmlinuz-6.8.0-85-generic", "initrd.img-6.8.0-85-generic",
                 "config-6.8.0-85-generic", "vmlinuz", "vmlinuz.old"):  # fmt: skip
        (tmp_path / name).write_text("")
    assert probe.boot_kernels(str(tmp_path)) == [
        str(tmp_path / "vmlinuz-6.8.0-85-generic"),
        str(tmp_path / "vmlinuz-6.8.0-90-generic"),
    ]


def test_boot_kernels_of_a_missing_boot_directory_is_empty(tmp_path: Path) -> None:
    assert load_probe().boot_kernels(str(tmp_path / "nope")) == []
