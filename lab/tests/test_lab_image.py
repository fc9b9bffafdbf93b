"""What the host image build lays into a lab host (no Docker here: the files, not the image): the GPU
stand-in at /usr/lib/gpuprov-lab/gpu, which runs with nothing of the lab or gpuprov importable, and the
launchers of its tools."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gpuprov_lab import image
from gpuprov_lab.sim import nvidia


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    """hostfiles/ and the generated files under a directory, as the Dockerfile's COPY lays them over /."""
    root = tmp_path / "root"
    subprocess.run(["cp", "-a", f"{image.HOSTFILES}/.", str(root)], check=True)
    for path, (data, mode) in image.generated_files().items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
    return root


def _host_python(root: Path, code: str) -> subprocess.CompletedProcess[str]:
    """python3 as a lab host runs it: nothing of this machine's Python environment but PyYAML (the host
    image's python3-yaml), and the lab's library directory where the launchers put it."""
    lib = root / image.HOST_LIB.lstrip("/")
    pyyaml = Path(yaml.__file__).parent.parent
    path = f"sys.path[:0] = [{str(lib)!r}, {str(pyyaml)!r}]"
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; {path}; {code}"],
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_module_of_the_gpu_stand_in_is_in_the_host(host_root: Path) -> None:
    lib = host_root / image.HOST_LIB.lstrip("/") / "gpu"
    for source in image.GPU.glob("*.py"):
        assert (lib / source.name).read_bytes() == source.read_bytes()
    assert (lib / "h200-nvidia-smi-q-x.xml").is_file()


def test_the_gpu_stand_in_imports_alone_in_a_host(host_root: Path) -> None:
    modules = sorted(p.stem for p in image.GPU.glob("*.py") if p.stem != "__init__")
    res = _host_python(
        host_root, f"import importlib; [importlib.import_module('gpu.' + m) for m in {modules}]"
    )
    assert res.returncode == 0, res.stderr
    res = _host_python(host_root, "import gpuprov_lab")
    assert "No module named 'gpuprov_lab'" in res.stderr


def test_each_launcher_runs_an_entry_point_that_exists(host_root: Path) -> None:
    bin_dir = host_root / image.HOST_LIB.lstrip("/") / "bin"
    for prog, module in image.HOST_TOOLS.items():
        text = (bin_dir / prog).read_text()
        assert (bin_dir / prog).stat().st_mode & 0o111
        assert f"from gpu import {module}" in text and f"{module}.main({prog!r}" in text
        res = _host_python(host_root, f"from gpu import {module}; assert callable({module}.main)")
        assert res.returncode == 0, res.stderr
    # The packages' tools run the same way (nvidia-modprobe, persistenced, DCGM, ...).
    tool = nvidia.tool("kmod", "nvidia-modprobe", driver="580.159.04").data().decode()
    assert "from gpu import kmod" in tool and "driver='580.159.04'" in tool


def test_the_dkms_build_check_runs_as_the_makefile_calls_it(host_root: Path) -> None:
    lib = host_root / image.HOST_LIB.lstrip("/")
    res = subprocess.run(
        [sys.executable, "-S", "-m", "gpu.dkmsbuild"],
        env={"PYTHONPATH": f"{lib}:{Path(yaml.__file__).parent.parent}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 2 and "usage:" in res.stderr


def test_the_image_tag_follows_what_the_build_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov_lab import vendor

    monkeypatch.setattr(vendor, "mig_parted", lambda: Path(sys.executable))
    before = image.host_image_tag("base:1", b"key")
    files = image.generated_files()
    changed = {**files, "/usr/lib/gpuprov-lab/gpu/smi.py": (b"changed", 0o644)}
    monkeypatch.setattr(image, "generated_files", lambda: changed)
    assert image.host_image_tag("base:1", b"key") != before
