"""Files an operator hands gpuprov (policies, inventories, group_vars/host_vars): read bounded, parsed
strictly, as data.

Reading: a path may name anything (a FIFO blocks the reader forever, /dev/zero never ends), so only a
regular file of at most MAX_FILE_BYTES is read, and only UTF-8 text without NUL bytes.

Parsing: PyYAML's safe loader builds plain data only, but it keeps the last of two equal keys (a silent
typo: Ansible only warns, then uses the last value), expands aliases (a few hundred bytes of anchors make
an arbitrarily large document, which every later walk of the value pays for) and composes nested nodes
recursively (a deep enough nesting ends in RecursionError). These files need none of that: a repeated
key, any alias and nesting deeper than MAX_DEPTH are errors naming the file and line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import InputError

# The largest inventory, group_vars file or policy a site writes is far below this (a thousand hosts
# fit in a few hundred KiB); a file above it is a mistake (a log, an image, /dev/zero behind a link).
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_FILE_SIZE_TEXT = "4 MiB"
# Mappings and lists nested in one another, counted from the document's top. Chart values and the
# Kubernetes objects inside them (gpu_operator_values.extraObjects) nest about a dozen deep.
MAX_DEPTH = 32

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_operator_file(path: Path | str, what: str = "file") -> str:
    """The text of a file an operator named; InputError naming the file when it is no regular file, is
    larger than MAX_FILE_BYTES, or is not UTF-8 text. Nothing is read from anything but a regular file:
    a FIFO is opened without waiting for a writer and refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: {what}: {_kind(info.st_mode)}, not a regular file")
        cap = f"gpuprov reads at most {MAX_FILE_SIZE_TEXT} of one file"
        if info.st_size > MAX_FILE_BYTES:
            raise InputError(f"{path}: {what} of {info.st_size} bytes: {cap}")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)  # the file may have grown since fstat
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{path}: {what} of more than {MAX_FILE_BYTES} bytes: {cap}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    if "\x00" in text:
        raise InputError(f"{path}: not a text file (byte {data.index(0)} is NUL)")
    return text


def yaml_kind(value: Any) -> str:
    """What a value is, in YAML's words (Ansible wraps values in its own classes, whose names mean
    nothing to a user: _AnsibleTaggedStr is a string)."""
    for kind, types in (("boolean", bool), ("string", str), ("integer", int), ("number", float)):
        if isinstance(value, types):
            return kind
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    return "null" if value is None else "value"


def described(value: Any) -> str:
    """A value as an error message quotes what it got: its YAML kind and the start of its text."""
    if value is None:
        return "null"
    text = repr(str(value)) if isinstance(value, str) else str(value)
    return f"{yaml_kind(value)} {text[:60]}" + ("…" if len(text) > 60 else "")


class _Refused(yaml.MarkedYAMLError):
    """Well-formed YAML that gpuprov does not take: an alias, a repeated key, too deep a nesting."""


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                problem=f"alias *{str(event.anchor)[:80]} (aliases are not allowed here)",
                problem_mark=event.start_mark,
            )
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    problem=f"nested deeper than {MAX_DEPTH} levels of mappings and lists",
                    problem_mark=self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue  # unhashable: the base class reports it
            if key in seen:
                raise _Refused(
                    problem=f"duplicate key {str(key)[:80]!r} (first on line {seen[key] + 1})",
                    problem_mark=key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


class _AnsibleLoader(_StrictLoader):
    """An Ansible YAML file's structure, as strictly: Ansible's own tags (!vault, !unsafe) are accepted
    as opaque values (None here: nothing is decrypted or evaluated)."""


_AnsibleLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


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
        said = "" if isinstance(exc, _Refused) else "not valid YAML: "
        raise InputError(f"{path}:{at}{said}{str(exc.problem)[:200]}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {str(exc)[:200]}") from None
    except ValueError as exc:
        # A scalar YAML resolves but Python cannot build: a date such as 2026-13-45, an integer of
        # thousands of digits.
        raise InputError(f"{path}: not valid YAML: {str(exc)[:200]}") from None


def load_strict(text: str, path: Path | str) -> Any:
    """The document in `text`; InputError naming the file and line for anything that is not plain data."""
    return _load(text, path, _StrictLoader, column=False)


def load_strict_file(path: Path, what: str = "file") -> Any:
    """The document in the file at `path`, read bounded (read_operator_file) and parsed strictly."""
    return load_strict(read_operator_file(path, what), path)


def is_yaml(text: str) -> bool:
    """Whether `text` is well-formed YAML at all (events only: nothing is composed or built)."""
    try:
        for _event in yaml.parse(text, Loader=yaml.SafeLoader):
            pass
    except yaml.YAMLError:
        return False
    return True


def load_ansible_yaml(text: str, path: Path) -> Any:
    """An Ansible YAML document (inventory, group_vars), parsed without aliases, repeated keys or too
    deep a nesting; InputError naming the file, line and column when not. Ansible's tags are accepted
    as opaque values; nothing is evaluated."""
    return _load(text, path, _AnsibleLoader, column=True)
