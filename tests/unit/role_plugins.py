"""The roles' own filter plugins, loaded as modules for the tests (they live in roles/, not in a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def containerd_config() -> ModuleType:
    """roles/containerd_config/filter_plugins/containerd_config.py."""
    name = "role_filter_containerd_config"
    if name in sys.modules:
        return sys.modules[name]
    path = ROOT / "roles" / "containerd_config" / "filter_plugins" / "containerd_config.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
