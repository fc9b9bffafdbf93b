"""The nvidia_driver role's package specs, resolved against NVIDIA's real package names and versions.

lab/gpuprov_lab/sim/vendor-catalog.yaml holds what NVIDIA publishes per repository and branch, each
entry with its public sources. Every spec the role computes (``__nvidia_driver_packages``, rendered by
Ansible's own templar from the role's vars) for every supported distro x branch x release x kernel-module
flavour x fabric manager on/off must name a package the repository has and match one of its versions;
and the role must install every package of the flavour. A wrong name (the branch-suffixed fabric
manager on 580) or a hard-coded revision (-0ubuntu1 on a -1ubuntu1 release) fails here.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_templar import render

ROOT = Path(__file__).resolve().parents[2]
CATALOG = yaml.safe_load((ROOT / "lab" / "gpuprov_lab" / "sim" / "vendor-catalog.yaml").read_text())
ROLE = ROOT / "roles" / "nvidia_driver"
VARS_FILES = {"ubuntu2204": "Ubuntu-22.yml", "ubuntu2404": "Ubuntu-24.yml", "debian12": "Debian-12.yml",
              "debian13": "Debian-13.yml"}  # fmt: skip


def _yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def role_specs(repo: str, branch: str, version: str, flavour: str, fabricmanager: bool) -> list[str]:
    """__nvidia_driver_packages as Ansible renders it for these settings."""
    variables: dict[str, Any] = {
        **_yaml(ROLE / "defaults" / "main.yml"),
        **_yaml(ROLE / "vars" / "main.yml"),
        **_yaml(ROLE / "vars" / VARS_FILES[repo]),
        "nvidia_driver_branch": branch,
        "nvidia_driver_version": version,
        "nvidia_driver_fabricmanager": "enabled" if fabricmanager else "disabled",
        "preflight_nvidia_driver_flavor": flavour,
        "preflight_nvswitch_present": fabricmanager,
        "gpuprov_mirror_url": "",
    }
    return list(render("{{ __nvidia_driver_packages }}", variables))


def cases() -> list[Any]:
    out = []
    for repo, data in CATALOG["repositories"].items():
        for branch, b in data["branches"].items():
            for version in b["releases"]:
                for flavour in ("open", "proprietary"):
                    for fm in (False, True) if b.get("fabricmanager") else (False,):
                        out.append(
                            pytest.param(
                                repo,
                                branch,
                                version,
                                flavour,
                                fm,
                                id=f"{repo}-{version}-{flavour}-fm{int(fm)}",
                            )
                        )
    return out


@pytest.mark.parametrize(("repo", "branch", "version", "flavour", "fm"), cases())
def test_every_spec_the_role_computes_resolves(
    repo: str, branch: str, version: str, flavour: str, fm: bool
) -> None:
    b = CATALOG["repositories"][repo]["branches"][branch]
    published: dict[str, list[str]] = {}
    for name in b["kernel"]["open"] + b["kernel"]["proprietary"] + b["userspace"]:
        published[name] = [f"{v}-{rev}" for v, rev in b["releases"].items()]
    fm_revision = b.get("fabricmanager_revision")
    for name in b.get("fabricmanager") or []:
        # No source gave the revision: any revision of the version may be there ("VERSION-*" matches it).
        published[name] = [f"{v}-{fm_revision or '(revision unknown)'}" for v in b["releases"]]
    specs = role_specs(repo, branch, version, flavour, fm)
    for spec in specs:
        name, _, pattern = spec.partition("=")
        assert name in published, (
            f"{repo} {branch}: the role installs {name}, which NVIDIA does not publish there"
        )
        assert pattern, f"{spec}: not pinned"
        assert any(fnmatch.fnmatchcase(v, pattern) for v in published[name]), (
            f"{repo}: {spec} matches none of {published[name]}"
        )
    wanted = b["kernel"][flavour] + b["userspace"] + ((b.get("fabricmanager") or []) if fm else [])
    assert sorted(s.partition("=")[0] for s in specs) == sorted(wanted)


def test_every_catalog_entry_cites_known_sources() -> None:
    sources = CATALOG["sources"]
    for repo, data in CATALOG["repositories"].items():
        assert set(data["key"]["sources"]) <= set(sources), repo
        for branch, b in data["branches"].items():
            assert b.get("sources"), f"{repo} {branch}: no source"
            assert set(b["sources"]) <= set(sources), f"{repo} {branch}: unknown source"
    for section in ("container_toolkit", "dcgm"):
        assert set(CATALOG[section]["sources"]) <= set(sources)


def test_the_h200_hosts_real_packages_agree_with_the_catalog() -> None:
    """The real Ubuntu 24.04 host's dpkg status (CUDA 13.0 from NVIDIA's ubuntu2404 repository): the
    driver build its cuda-compat package comes from is in the catalog with the same revision."""
    status = (ROOT / "tests" / "fixtures" / "hosts" / "h200-ubuntu2404" / "dpkg-status").read_text()
    stanza = next(s for s in status.split("\n\n") if s.startswith("Package: cuda-compat-13-0\n"))
    version = next(line.split(": ", 1)[1] for line in stanza.splitlines() if line.startswith("Version: "))
    upstream, revision = version.split("-", 1)
    assert CATALOG["repositories"]["ubuntu2404"]["branches"]["580"]["releases"][upstream] == revision
