"""Where the Ansible content (roles, playbooks, ansible.cfg) is: inside the installed package, else the
source tree.

A wheel carries the content as provisioner/content/ (setup.py copies it at build time); an editable
install or a source checkout runs the top-level roles/ and playbooks/ directly.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGED = Path(__file__).resolve().parent / "content"
_SOURCE_TREE = Path(__file__).resolve().parent.parent

CONTENT_ROOT = _PACKAGED if (_PACKAGED / "roles").is_dir() else _SOURCE_TREE
ROLES_DIR = CONTENT_ROOT / "roles"
PLAYBOOKS_DIR = CONTENT_ROOT / "playbooks"
ANSIBLE_CFG = CONTENT_ROOT / "ansible.cfg"
