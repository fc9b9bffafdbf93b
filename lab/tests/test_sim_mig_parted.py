"""The lab's SIMULATED nvidia-mig-parted front end (gpuprov_lab/gpu/migparted.py) against a fake nvidia-smi
that keeps MIG state in a JSON file, with NVIDIA's real nvidia-mig-parted behind it for parsing."""

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

ROOT = Path(__file__).resolve().parents[2]
H200 = "0x233510DE"

# nvidia-smi's syntax for what the front end uses; one H200-like GPU per entry of $FAKE_SMI_STATE.
FAKE_SMI = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import json, os, sys
    path = os.environ["FAKE_SMI_STATE"]
    st = json.load(open(path))
    with open(path + ".log", "a") as log:
        log.write(" ".join(sys.argv[1:]) + "\\n")
    a = sys.argv[1:]
    def save():
        json.dump(st, open(path, "w"))
    def gpu_ids():
        return [int(a[a.index("-i") + 1])] if "-i" in a else range(len(st["gpus"]))
    if a[0].startswith("--query-gpu="):
        for i, g in enumerate(st["gpus"]):
            mode = ("Enabled" if g["mig"] else "Disabled") if g["capable"] else "[N/A]"
            print(f"{i}, 00000000:{i + 0x18:02X}:00.0, {g['id']}, {mode}, {mode}")
    elif a == ["-L"]:
        for i, g in enumerate(st["gpus"]):
            print(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})")
            for n, p in enumerate(g["gis"]):
                print(f"  MIG {p:<11} Device {n:>2}: (UUID: MIG-{i}-{n})")
    elif "-mig" in a:
        for i in gpu_ids():
            if st["gpus"][i]["gis"] and a[a.index("-mig") + 1] == "0":
                print("Unable to disable MIG Mode: In use by another client"); sys.exit(19)
            st["gpus"][i]["mig"] = a[a.index("-mig") + 1] == "1"
        save(); print("All done.")
    elif a[0] == "mig" and "-cgi" in a:
        for i in gpu_ids():
            g = st["gpus"][i]
            for p in a[a.index("-cgi") + 1].split(","):
                used = sum(int(x.split("g.")[0]) for x in g["gis"])
                if not g["gis"] and p == st.get("refuse_first"):  # a placement the driver refuses
                    save(); print(f"Unable to create a GPU instance on GPU {i} using profile {p}")
                    sys.exit(23)
                if not g["mig"] or used + int(p.split("g.")[0]) > 7 or p not in st["profiles"]:
                    save(); print(f"Unable to create a GPU instance on GPU {i} using profile {p}")
                    sys.exit(23)
                g["gis"].append(p)
        save()
    elif a[0] == "mig" and ("-dci" in a or "-dgi" in a):
        if not any(st["gpus"][i]["gis"] for i in gpu_ids()):
            print("No GPU instances found: Not Found"); sys.exit(6)
        if "-dgi" in a:
            for i in gpu_ids():
                st["gpus"][i]["gis"] = []
        save()
    else:
        print("Invalid combination of input arguments."); sys.exit(2)
    """
)

CONFIG = textwrap.dedent(
    """\
    version: v1
    mig-configs:
      all-disabled:
        - devices: all
          mig-enabled: false
      all-1g.18gb:
        - device-filter: ["0x233510DE"]   # H200
          devices: all
          mig-enabled: true
          mig-devices:
            "1g.18gb": 7
      mixed:
        - devices: [0]
          mig-enabled: true
          mig-devices: {"1g.18gb": 2, "3g.71gb": 1, '2g.35gb': 1}
        - devices: [1]
          mig-enabled: false
    """
)


@pytest.fixture
def fx(tmp_path: Path) -> dict[str, Any]:
    real = vendor.mig_parted()
    sim_root = tmp_path / "root"
    distrib = sim_root / "usr" / "bin" / "nvidia-mig-parted.distrib"
    distrib.parent.mkdir(parents=True)
    distrib.symlink_to(real)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
    smi.chmod(0o755)
    state = tmp_path / "smi.json"
    gpus = [{"id": H200, "capable": True, "mig": False, "gis": []} for _ in range(2)]
    state.write_text(json.dumps({"gpus": gpus, "profiles": ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]}))
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    return {"tmp": tmp_path, "root": sim_root, "bin": bindir, "state": state, "config": config}


def run(
    fx: dict[str, Any], *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess:
    code = (
        "import sys; from gpuprov_lab.gpu import migparted; "
        "sys.exit(migparted.main('nvidia-mig-parted', sys.argv[1:]))"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("MIG_PARTED_")}
    full = {**base, "PATH": f"{fx['bin']}:/usr/bin:/bin", "GPUPROV_SIM_ROOT": str(fx["root"]),
            "FAKE_SMI_STATE": str(fx["state"]), **(env or {})}  # fmt: skip
    return subprocess.run([sys.executable, "-c", code, *args], env=full, input=stdin, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def gpu_state(fx: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(fx["state"].read_text())["gpus"]


def test_apply_then_assert_and_export(fx: dict[str, Any]) -> None:
    res = run(fx, "assert", "-f", str(fx["config"]), "-c", "all-1g.18gb")
    assert res.returncode == 1
    assert 'level=fatal msg="Assertion failure: selected configuration not currently applied"' in res.stderr

    res = run(fx, "apply", "-f", str(fx["config"]), "-c", "all-1g.18gb")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "MIG configuration applied successfully\n"
    assert [g["gis"] for g in gpu_state(fx)] == [["1g.18gb"] * 7, ["1g.18gb"] * 7]

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

    # A second apply finds nothing to change: no mode change, no instance touched.
    log = Path(str(fx["state"]) + ".log")
    log.write_text("")
    assert run(fx, "apply", "-f", str(fx["config"]), "-c", "all-1g.18gb").returncode == 0
    assert not any(" -mig " in f" {line} " or "-cgi" in line for line in log.read_text().splitlines())


def test_mixed_layout_per_gpu_fits_by_trying_orderings_and_export_splits_it(fx: dict[str, Any]) -> None:
    res = run(fx, "apply", "-f", str(fx["config"]), "-c", "mixed")
    assert res.returncode == 0, res.stderr
    first, second = gpu_state(fx)
    assert sorted(first["gis"]) == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"] and first["mig"]
    assert second == {"id": H200, "capable": True, "mig": False, "gis": []}
    exported = yaml.safe_load(run(fx, "export").stdout)["mig-configs"]["current"]
    assert exported == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}},
        {"devices": [1], "mig-enabled": False, "mig-devices": {}},
    ]
    # Back to disabled: instances are cleared before the mode change (apply/mode.go).
    assert run(fx, "apply", "-f", str(fx["config"]), "-c", "all-disabled").returncode == 0
    assert [(g["mig"], g["gis"]) for g in gpu_state(fx)] == [(False, []), (False, [])]


def test_when_one_ordering_does_not_fit_the_next_is_tried(fx: dict[str, Any]) -> None:
    state = json.loads(fx["state"].read_text())
    fx["state"].write_text(json.dumps({**state, "refuse_first": "3g.71gb"}))
    res = run(fx, "apply", "-f", str(fx["config"]), "-c", "mixed")
    assert res.returncode == 0, res.stderr
    assert "level=error" in res.stderr  # the failed ordering is logged, as SetMigConfig does
    first = gpu_state(fx)[0]["gis"]
    assert first[0] != "3g.71gb" and sorted(first) == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]


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
    assert [g["gis"] for g in gpu_state(fx)] == [[], []]  # cleared after the last failure


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
    assert [g["mig"] for g in gpu_state(fx)] == [False, False]


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
    from gpuprov_lab.gpu import migparted

    text = vendor.artifact("mig-parted", "systemd/config-default.yaml").read_text()
    disabled = migparted.selected_specs(text, "all-disabled")
    assert disabled and all(not s.mig_enabled and s.devices == "all" for s in disabled)
    h200 = migparted.selected_specs(text, "all-1g.18gb")
    assert [(s.devices, s.mig_enabled, s.mig_devices) for s in h200] == [("all", True, {"1g.18gb": 7})]
    balanced = migparted.selected_specs(text, "all-balanced")
    assert [s for s in balanced if s.matches(0, H200)] != [s for s in balanced if s.matches(0, "0x20B210DE")]
