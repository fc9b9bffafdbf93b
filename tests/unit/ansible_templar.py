"""Role variables rendered by Ansible's own templar, as a play renders them, for the tests of what a
role computes."""

from __future__ import annotations

from typing import Any


def _trusted(value: Any) -> Any:
    """`value` with every string in it marked as a template Ansible may render (as a role's files are)."""
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    return value


def render(expr: Any, variables: dict[str, Any]) -> Any:
    """`expr` rendered with `variables`, both trusted as a role's files are."""
    # Imported here: ansible reads its configuration once, when first imported (tests share a process).
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    return Templar(loader=DataLoader(), variables=_trusted(variables)).template(_trusted(expr))
