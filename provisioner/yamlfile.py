"""YAML from files a user hands gpuprov (policies): parsed strictly, as data.

PyYAML's safe loader builds plain data only, but it keeps the last of two equal keys (a silent typo) and
expands aliases, so a few hundred bytes of anchors make an arbitrarily large document (and error
message). These files need neither: a repeated key and any alias are errors naming the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import InputError


class _StrictLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(
                problem=f"alias *{event.anchor} (aliases are not allowed here)", problem_mark=event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue  # unhashable: the base class reports it
            if key in seen:
                raise yaml.MarkedYAMLError(
                    problem=f"duplicate key {str(key)[:80]!r} (first on line {seen[key] + 1})",
                    problem_mark=key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


class _AnyTagLoader(yaml.SafeLoader):
    """Reads YAML's structure only: Ansible's own tags (!vault, !unsafe) are accepted as opaque values."""


_AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _load(text: str, path: Path | str, loader: type[yaml.SafeLoader], *, column: bool) -> Any:
    """Parse; YAML errors become InputError at `path: line N` (or `path:N:C:`, as compilers write it)."""
    try:
        return yaml.load(text, Loader=loader)  # a SafeLoader: plain data only
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        if mark is None:
            at = " "
        else:
            at = f"{mark.line + 1}:{mark.column + 1}: " if column else f" line {mark.line + 1} "
        raise InputError(f"{path}:{at}not valid YAML: {str(exc.problem)[:200]}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {str(exc)[:200]}") from None


def load_strict(text: str, path: Path | str) -> Any:
    """The document in `text`; InputError naming the file and line for anything that is not plain data."""
    return _load(text, path, _StrictLoader, column=False)


def check_ansible_yaml(path: Path) -> None:
    """An Ansible YAML file (inventory, group_vars) parses as YAML; InputError naming the file, line
    and column when it does not. Ansible's tags are accepted; nothing is evaluated."""
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    _load(text, path, _AnyTagLoader, column=True)
