"""gpuprov: provision, verify and upgrade NVIDIA GPU servers with Ansible roles."""

from __future__ import annotations

__version__ = "0.1.0"
