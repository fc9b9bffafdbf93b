"""apt_signed_repo treats an expired key with the pinned fingerprint as not installed.

A vendor that extends its key's expiry (pkgs.k8s.io did) keeps the fingerprint, so a host whose
keyring holds the old copy has the right fingerprint and an expired key: apt refuses the repository
(EXPKEYSIG). The role's expressions are rendered by Ansible's templar over what the real gpg prints
(`gpg --show-keys --with-colons`) for a key made to expire in the past and for the same key extended.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VARS = yaml.safe_load((ROOT / "roles" / "apt_signed_repo" / "vars" / "main.yml").read_text())


def gpg(home: Path, *args: str) -> str:
    res = subprocess.run(
        ["gpg", "--batch", "--homedir", str(home), "--pinentry-mode", "loopback", "--passphrase", "", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The same key twice: as made in 2020 with a one-year expiry, and after its expiry was extended."""
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    gpg(home, "--faked-system-time", "20200101T000000", "--quick-gen-key", "Test Repo <repo@example.invalid>",
        "ed25519", "sign", "1y")  # fmt: skip
    fpr = next(
        ln.split(":")[9]
        for ln in gpg(home, "--with-colons", "--list-keys").splitlines()
        if ln.startswith("fpr:")
    )
    expired = home / "expired.asc"
    expired.write_text(gpg(home, "--armor", "--export", fpr))
    gpg(home, "--quick-set-expire", fpr, "0")
    extended = home / "extended.asc"
    extended.write_text(gpg(home, "--armor", "--export", fpr))
    show = {}
    for name, f in (("expired", expired), ("extended", extended)):
        scratch = tmp_path_factory.mktemp(f"show-{name}")
        scratch.chmod(0o700)
        show[name] = gpg(scratch, "--show-keys", "--with-colons", str(f)).splitlines()
    yield {"fpr": fpr, "show": show}
    # Making the key started a gpg-agent for that home: stop it with the test.
    subprocess.run(
        ["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True
    )


def render(expr: str, variables: dict[str, Any]) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in {**VARS, **variables}.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template(expr))


@pytest.mark.parametrize(("copy", "expired"), [("expired", True), ("extended", False)])
def test_an_installed_keyring_past_its_expiry_is_replaced(
    keys: dict[str, Any], copy: str, expired: bool
) -> None:
    lines = [f"now:{int(time.time())}", *keys["show"][copy]]
    variables = {"__apt_signed_repo_installed_keys": {"stdout_lines": lines, "rc": 0}}
    # Both copies carry the pinned fingerprint: the fingerprint alone cannot tell them apart.
    assert render("{{ __apt_signed_repo_installed_fprs }}", variables) == [keys["fpr"]]
    assert render("{{ __apt_signed_repo_installed_expired | bool }}", variables) is expired


@pytest.mark.parametrize(("copy", "expired"), [("expired", True), ("extended", False)])
def test_a_downloaded_key_past_its_expiry_is_refused(keys: dict[str, Any], copy: str, expired: bool) -> None:
    variables = {
        "__apt_signed_repo_installed_keys": {"stdout_lines": [f"now:{int(time.time())}"], "rc": 0},
        "__apt_signed_repo_downloaded_keys": {"stdout_lines": keys["show"][copy], "rc": 0},
    }
    assert render("{{ __apt_signed_repo_downloaded_fprs }}", variables) == [keys["fpr"]]
    assert render("{{ __apt_signed_repo_downloaded_expired | bool }}", variables) is expired


def test_the_role_asks_for_the_hosts_clock_and_uses_the_expiry() -> None:
    main = (ROOT / "roles" / "apt_signed_repo" / "tasks" / "main.yml").read_text()
    assert 'echo "now:$(date +%s)"' in main
    assert "__apt_signed_repo_installed_expired | bool" in main
    assert (
        "__apt_signed_repo_downloaded_expired | bool"
        in (ROOT / "roles" / "apt_signed_repo" / "tasks" / "key.yml").read_text()
    )
