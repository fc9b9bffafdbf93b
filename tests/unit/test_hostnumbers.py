"""Strict numbers from host text: what str.isdigit()/int()/float() would let through is refused."""

from __future__ import annotations

import pytest

from provisioner.hostnumbers import HostNumberError, is_index, parse_decimal, parse_int


@pytest.mark.parametrize("text", ["²", "٣", "１", "9" * 5000, "-1", "1e3", "", " ", "0x10", "1_000", "+1"])
def test_integers_refused(text: str) -> None:
    with pytest.raises(HostNumberError):
        parse_int(text)


def test_integer_range_and_sign() -> None:
    assert parse_int(" 42 ") == 42
    assert parse_int("-273", lo=-300, hi=0) == -273
    with pytest.raises(HostNumberError, match="outside"):
        parse_int("9", lo=0, hi=8)


@pytest.mark.parametrize("text", ["inf", "nan", "Infinity", "9" * 400, "1e400", "1.5.2", "—3", "²"])
def test_decimals_refused(text: str) -> None:
    with pytest.raises(HostNumberError):
        parse_decimal(text, lo=0, hi=1e12)


def test_decimal_physical_range() -> None:
    assert parse_decimal("37.5", lo=-40, hi=150) == 37.5
    with pytest.raises(HostNumberError, match="outside"):
        parse_decimal("-273", lo=-40, hi=150)


def test_index() -> None:
    assert is_index("7")
    assert not is_index("²") and not is_index("4096") and not is_index("-0")
