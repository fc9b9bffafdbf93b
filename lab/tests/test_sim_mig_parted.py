"""The lab's SIMULATED nvidia-mig-parted front end (gpuprov_lab/gpu/migparted.py) on a simulated host with two
H200s, with NVIDIA's real nvidia-mig-parted behind it for parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuprov_lab import vendor
from gpuprov_lab.gpu import core, mig, migparted
from sim_host import SimHost

ROOT = Path(__file__).resolve().parents[2]
H200 = "0x233510DE"

CONFIG = (ROOT / "tests" / "fixtures" / "mig" / "layouts.yaml").read_text()


@pytest.fixture
def fx(tmp_path: Path) -> dict[str, Any]:
    """A lab host with two H200s (the h200 profile's GPU twice), the driver loaded, NVIDIA's binary where
    the nvidia-mig-manager package puts it."""
    host = SimHost(tmp_path / "root", "h200")
    profile = host.root / "etc/gpuprov-lab/profile.json"
    doc = json.loads(profile.read_text())
    address, uuid = "0000:00:07.0", "GPU-00000000-0000-0000-0000-000000000007"
    doc["gpus"].append({**doc["gpus"][0], "index": 1, "minor_number": 1, "pci_address": address,
                        "bus_id": "00000000:00:07.0", "uuid": uuid, "serial": "1650000000007"})  # fmt: skip
    profile.write_text(json.dumps(doc))
    host.host = core.Host(host.root)
    host.driver()
    distrib = host.root / "usr" / "bin" / "nvidia-mig-parted.distrib"
    distrib.parent.mkdir(parents=True, exist_ok=True)
    distrib.symlink_to(vendor.mig_parted())
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    return {"tmp": tmp_path, "host": host, "config": config}


def run(
    fx: dict[str, Any], *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess:
    code = (
        "import sys; from gpuprov_lab.gpu import migparted; "
        "sys.exit(migparted.main('nvidia-mig-parted', sys.argv[1:]))"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("MIG_PARTED_")}
    full = {**base, "GPUPROV_SIM_ROOT": str(fx["host"].root), **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], env=full, input=stdin, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def gpu_state(fx: dict[str, Any]) -> list[tuple[bool, list[str]]]:
    """(MIG mode on, its MIG devices' profiles) of each GPU."""
    host = fx["host"].host
    st = host.state()
    return [
        (mig.gpu_state(st, g)["current"], sorted(name for name, _ in mig.mig_devices(st, g)))
        for g in host.gpus()
    ]


def test_apply_then_assert_and_export(fx: dict[str, Any]) -> None:
    res = run(fx, "assert", "-f", str(fx["config"]), "-c", "all-1g.18gb")
    assert res.returncode == 1
    assert 'level=fatal msg="Assertion failure: selected configuration not currently applied"' in res.stderr

    res = run(fx, "apply", "-f", str(fx["config"]), "-c", "all-1g.18gb")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "MIG configuration applied successfully\n"
    assert gpu_state(fx) == [(True, ["1g.18gb"] * 7), (True, ["1g.18gb"] * 7)]

    res = run(fx, "assert", env={"MIG_PARTED_CONFIG_FILE": str(fx["config"]),
                                  "MIG_PARTED_SELECTED_CONFIG": "all-1g.18gb"})  # fmt: skip
    assert (res.returncode, res.stdout) == (0, "Selected MIG configuration currently applied\n"), res.stderr

    res = run(fx, "export")
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(res.stdout) == {
        "version": "v1",
        "mig-configs": {"current": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 7}}]},
    }
    as_json = json.loads(run(fx, "export", "-o", "json", "-l", "now").stdout)
    assert as_json["mig-configs"]["now"][0]["mig-devices"] == {"1g.18gb": 7}
    # A second apply finds nothing to change (the hooks test shows no change is attempted).
    assert run(fx, "apply", "-f", str(fx["config"]), "-c", "all-1g.18gb").returncode == 0
    assert gpu_state(fx) == [(True, ["1g.18gb"] * 7), (True, ["1g.18gb"] * 7)]


def test_mixed_layout_per_gpu_fits_by_trying_orderings_and_export_splits_it(fx: dict[str, Any]) -> None:
    res = run(fx, "apply", "-f", str(fx["config"]), "-c", "mixed")
    assert res.returncode == 0, res.stderr
    assert gpu_state(fx) == [(True, ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]), (False, [])]
    exported = yaml.safe_load(run(fx, "export").stdout)["mig-configs"]["current"]
    assert exported == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}},
        {"devices": [1], "mig-enabled": False, "mig-devices": {}},
    ]
    # Back to disabled: instances are cleared before the mode change (apply/mode.go).
    assert run(fx, "apply", "-f", str(fx["config"]), "-c", "all-disabled").returncode == 0
    assert gpu_state(fx) == [(False, []), (False, [])]


def test_when_one_ordering_does_not_fit_the_next_is_tried(
    fx: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver refuses the first ordering (as it may, where Go's map order tries another first)."""
    monkeypatch.setenv("GPUPROV_SIM_ROOT", str(fx["host"].root))
    tried: list[list[str]] = []
    create = mig.create_gpu_instances

    def refuse_the_first(host: core.Host, gpus: Any, tokens: list[str], with_ci: bool) -> str:
        tried.append(list(tokens))
        if len(tried) == 1:
            raise mig.MigError("Failed to create GPU instances: Insufficient Resources\n", 23)
        return create(host, gpus, tokens, with_ci)

    monkeypatch.setattr(mig, "create_gpu_instances", refuse_the_first)
    assert fx["host"].smi("-i", "0", "-mig", "1")[0] == 0
    migparted.set_config(migparted.gpus()[0], {"1g.18gb": 2, "3g.71gb": 1, "2g.35gb": 1})
    assert "level=error" in capsys.readouterr().err  # the failed ordering is logged, as SetMigConfig does
    assert len(tried) == 2 and tried[0] != tried[1]
    assert gpu_state(fx)[0] == (True, ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"])


def test_a_layout_that_never_fits_fails_like_mig_parted(fx: dict[str, Any]) -> None:
    fx["config"].write_text("version: v1\nmig-configs:\n  too-big:\n    - devices: all\n"
                            "      mig-enabled: true\n"
                             "      mig-devices:\n        7g.141gb: 1\n        1g.18gb: 1\n")  # fmt: skip
    res = run(fx, "apply", "-f", str(fx["config"]), "-c", "too-big")
    assert res.returncode == 1
    assert (
        "Error applying MIG configuration with hooks: "
        "error attempting multiple config orderings: all orderings failed" in res.stderr
    )
    assert gpu_state(fx) == [(True, []), (True, [])]  # cleared after the last failure


def test_hooks_run_at_their_points_with_only_the_flag_environment(fx: dict[str, Any]) -> None:
    record = fx["tmp"] / "hooks.log"
    hooks = fx["tmp"] / "hooks.yaml"
    lines = ["version: v1", "hooks:"]
    for point in ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"):
        values = "$MIG_PARTED_SELECTED_CONFIG $MIG_PARTED_SKIP_RESET ${HOME:-nohome} $EXTRA"
        script = f'echo "{point} {values}" >> {record}'
        lines += [f"  {point}:", f'    - workdir: "{fx["tmp"]}"', '      command: "/bin/bash"',
                  f"      args: [\"-c\", {json.dumps(script)}]", "      envs: {EXTRA: x}"]  # fmt: skip
    hooks.write_text("\n".join(lines) + "\n")
    env = {"MIG_PARTED_HOOKS_FILE": str(hooks)}
    assert run(fx, "apply", "-f", str(fx["config"]), "-c", "all-1g.18gb", env=env).returncode == 0
    assert record.read_text().splitlines() == [
        f"{p} all-1g.18gb false nohome x"
        for p in ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
    ]
    record.write_text("")
    # Applied already: only apply-start and apply-exit run.
    assert run(fx, "apply", "-f", str(fx["config"]), "-c", "all-1g.18gb", env=env).returncode == 0
    assert [ln.split()[0] for ln in record.read_text().splitlines()] == ["apply-start", "apply-exit"]
    # --mode-only with the mode already right: no pre-apply hook at all.
    record.write_text("")
    assert (
        run(fx, "apply", "--mode-only", "-f", str(fx["config"]), "-c", "all-1g.18gb", env=env).returncode == 0
    )
    assert [ln.split()[0] for ln in record.read_text().splitlines()] == ["apply-start", "apply-exit"]


def test_a_failing_hook_stops_apply_but_apply_exit_still_runs(fx: dict[str, Any]) -> None:
    record = fx["tmp"] / "exit.log"
    hooks = fx["tmp"] / "hooks.yaml"
    hooks.write_text(textwrap.dedent(f"""\
        version: v1
        hooks:
          pre-apply-mode:
            - command: /bin/false
          apply-exit:
            - command: /bin/bash
              args: ["-c", "echo ran > {record}"]
        """))  # fmt: skip
    res = run(fx, "apply", "-f", str(fx["config"]), "-c", "all-1g.18gb", "-k", str(hooks))
    assert res.returncode == 1
    assert (
        "Error applying MIG configuration with hooks: error running pre-apply-mode hook: exit status 1"
        in res.stderr
    )
    assert record.read_text() == "ran\n"
    assert [on for on, _ in gpu_state(fx)] == [False, False]


def test_parsing_is_the_real_binarys(fx: dict[str, Any]) -> None:
    fx["config"].write_text(
        "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n      migdevices: {}\n"
    )
    res = run(fx, "apply", "-f", str(fx["config"]), "-c", "x")
    assert res.returncode == 1 and "unexpected field" in res.stderr and "migdevices" in res.stderr
    res = run(fx, "assert", "--valid-config", "-f", "-", "-c", "nope", stdin=CONFIG)
    assert res.returncode == 1 and "selected mig-config not present: nope" in res.stderr
    res = run(fx, "assert", "--valid-config", "-f", "-", "-c", "mixed", stdin=CONFIG)
    assert (res.returncode, res.stdout) == (0, "Selected MIG configuration is valid\n")
    assert "nvidia-mig-parted" in run(fx, "--help").stdout


def test_nvidias_default_configs_select_as_mig_parted_selects_them() -> None:
    text = vendor.artifact("mig-parted", "systemd/config-default.yaml").read_text()
    disabled = migparted.selected_specs(text, "all-disabled")
    assert disabled and all(not s.mig_enabled and s.devices == "all" for s in disabled)
    h200 = migparted.selected_specs(text, "all-1g.18gb")
    assert [(s.devices, s.mig_enabled, s.mig_devices) for s in h200] == [("all", True, {"1g.18gb": 7})]
    balanced = migparted.selected_specs(text, "all-balanced")
    assert [s for s in balanced if s.matches(0, H200)] != [s for s in balanced if s.matches(0, "0x20B210DE")]
