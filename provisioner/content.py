"""Where the Ansible content (roles, playbooks, ansible.cfg) is: inside the installed package, else the
source tree.

A wheel carries the content as provisioner/content/ (setup.py copies it at build time); an editable
install or a source checkout runs the top-level roles/ and playbooks/ directly.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

_PACKAGED = Path(__file__).resolve().parent / "content"
_SOURCE_TREE = Path(__file__).resolve().parent.parent

CONTENT_ROOT = _PACKAGED if (_PACKAGED / "roles").is_dir() else _SOURCE_TREE
ROLES_DIR = CONTENT_ROOT / "roles"
PLAYBOOKS_DIR = CONTENT_ROOT / "playbooks"
ANSIBLE_CFG = CONTENT_ROOT / "ansible.cfg"


@cache
def _role_defaults(role: str) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load((ROLES_DIR / role / "defaults" / "main.yml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return doc if isinstance(doc, dict) else {}


def role_default(role: str, knob: str) -> Any:
    """A role's default for `knob` when it is a plain value; None when unset or a Jinja template (its
    value depends on the host, so only Ansible can tell)."""
    value = _role_defaults(role).get(knob)
    return None if isinstance(value, str) and "{{" in value else value
