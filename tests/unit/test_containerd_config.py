"""containerd's config.toml edited as TOML (roles/containerd_config/filter_plugins/containerd_config.py).

The inputs are the files the real packages write (tests/fixtures/containerd/); the tests marked ``real``
also hand every result to the real containerd of each generation (Debian's 1.6, 1.7 and 2.x, fetched
once into the cache) and compare the nvidia runtime with what the real nvidia-ctk 1.20.0 writes.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import role_plugins

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "containerd"


cc = role_plugins.containerd_config()

VERSIONS = {"1.6": "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3",
            "1.7": "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1",
            "2.1": "containerd github.com/containerd/containerd/v2 2.1.9+unknown "}  # fmt: skip
# What the kubernetes role asks for, and what the nvidia_container_toolkit role asks for.
KUBELET = {
    "cri_enabled": True,
    "systemd_cgroup": True,
    "cni_bin_dir": "/opt/cni/bin",
    "sandbox_image": "registry.k8s.io/pause:3.10",
}
NVIDIA = {"runtimes": {"nvidia": {"binary": "/usr/bin/nvidia-container-runtime"}}}


def default_config(generation: str) -> str:
    return (FIXTURES / f"config-default-{generation}.toml").read_text()


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"plugins.x.y": value} for every leaf of a parsed TOML document."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flat(value, f"{prefix}{key}."))
    else:
        out[prefix.rstrip(".")] = data
    return out


@pytest.mark.parametrize("generation", sorted(VERSIONS))
def test_nothing_asked_gives_the_same_bytes(generation: str) -> None:
    text = default_config(generation)
    assert cc.edit(text, VERSIONS[generation], {}) == text


@pytest.mark.parametrize("generation", sorted(VERSIONS))
def test_kubelet_then_nvidia_settings_keep_every_other_key(generation: str) -> None:
    text = default_config(generation)
    after = cc.edit(cc.edit(text, VERSIONS[generation], KUBELET), VERSIONS[generation], NVIDIA)
    old, new = flat(tomllib.loads(text)), flat(tomllib.loads(after))
    changed = {k for k in old if new.get(k) != old[k]}
    # Only the asked-for keys change (SystemdCgroup, sandbox image, CNI directory).
    assert all(
        k.endswith(("SystemdCgroup", "sandbox_image", "sandbox", "bin_dir", "bin_dirs")) for k in changed
    ), changed
    assert set(old) <= set(new)
    # A second run with the same settings changes nothing at all.
    assert cc.edit(after, VERSIONS[generation], {**KUBELET, **NVIDIA}) == after


@pytest.mark.parametrize("generation", sorted(VERSIONS))
def test_the_nvidia_runtime_is_a_copy_of_runc_with_the_nvidia_binary(generation: str) -> None:
    after = cc.edit(
        cc.edit(default_config(generation), VERSIONS[generation], KUBELET), VERSIONS[generation], NVIDIA
    )
    eff = cc.effective(after)
    assert eff["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "binary": "/usr/bin/nvidia-container-runtime",
        "systemd_cgroup": True,
    }
    assert cc.unmet(eff, {**KUBELET, **NVIDIA}) == []


def test_version_3_tables_are_edited_where_containerd_2_keeps_them() -> None:
    """containerd 2.x's single-quoted plugin names are the same TOML keys: no second runc table.

    The regular-expression template this replaces looked for double-quoted names, appended
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc] again, and containerd 2.1 refused
    the file ("toml: table runc already exists").
    """
    text = default_config("2.1")
    after = cc.edit(text, VERSIONS["2.1"], {**KUBELET, "sandbox_image": "registry.k8s.io/pause:3.10.1"})
    data = tomllib.loads(after)  # a duplicate table would raise here
    runtime = data["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert (
        data["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"]
        == "registry.k8s.io/pause:3.10.1"
    )
    assert "/opt/cni/bin" in runtime["cni"]["bin_dirs"]
    assert after.count(".containerd.runtimes.runc]") == 1
    # The file's own quoting stays.
    assert "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]" in after


def test_containerd_io_config_gets_a_version_line_and_the_cri_plugin() -> None:
    text = (FIXTURES / "config-containerd.io.toml").read_text()
    for generation, version in (("1.6", 2), ("2.1", 3)):
        after = cc.edit(text, VERSIONS[generation], KUBELET)
        data = tomllib.loads(after)
        assert data["version"] == version
        assert data["disabled_plugins"] == []
        assert after.startswith("#   Copyright 2018-2022 Docker Inc.")  # the comments stay where they were
        eff = cc.effective(after)
        assert eff["cri_enabled"] and eff["runtimes"]["runc"]["systemd_cgroup"]


def test_version_1_plugin_tables_are_refused() -> None:
    text = 'disabled_plugins = []\n[plugins.cri.containerd]\n  snapshotter = "overlayfs"\n'
    with pytest.raises(cc.ConfigError, match="no version line"):
        cc.edit(text, VERSIONS["1.6"], KUBELET)


def test_version_3_on_containerd_1_is_refused() -> None:
    with pytest.raises(cc.ConfigError, match="cannot read"):
        cc.edit(default_config("2.1"), VERSIONS["1.7"], KUBELET)


def test_cdi_needs_containerd_1_7() -> None:
    with pytest.raises(cc.ConfigError, match="no CDI support"):
        cc.edit(default_config("1.6"), VERSIONS["1.6"], {"enable_cdi": True})
    after = cc.edit(default_config("1.7"), VERSIONS["1.7"], {"enable_cdi": True})
    assert tomllib.loads(after)["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"] is True
    # containerd 2.x has CDI on by default: nothing to change.
    text = default_config("2.1")
    assert cc.edit(text, VERSIONS["2.1"], {"enable_cdi": True}) == text


def test_default_runtime_is_set_and_given_back() -> None:
    text = cc.edit(default_config("1.6"), VERSIONS["1.6"], {**NVIDIA, "default_runtime": "nvidia"})
    assert cc.effective(text)["default_runtime"] == "nvidia"
    back = cc.edit(text, VERSIONS["1.6"], {**NVIDIA, "not_default_runtime": "nvidia"})
    assert cc.effective(back)["default_runtime"] == "runc"
    with pytest.raises(cc.ConfigError, match="no runtime 'gvisor'"):
        cc.edit(default_config("1.6"), VERSIONS["1.6"], {"default_runtime": "gvisor"})


def test_comments_and_user_keys_survive() -> None:
    text = default_config("1.7").replace(
        "version = 2\n",
        "version = 2\n# site policy: keep this\n[proxy_plugins.stargz]\n"
        '  type = "snapshot"\n  address = "/run/stargz.sock"\n',
        1,
    )
    after = cc.edit(text, VERSIONS["1.7"], {**KUBELET, **NVIDIA})
    assert "# site policy: keep this" in after
    assert tomllib.loads(after)["proxy_plugins"]["stargz"]["address"] == "/run/stargz.sock"


def test_bad_input_is_named() -> None:
    with pytest.raises(cc.ConfigError, match="not valid TOML"):
        cc.edit("[plugins\n", VERSIONS["1.6"], KUBELET)
    with pytest.raises(cc.ConfigError, match="unknown containerd settings: bogus"):
        cc.edit("", VERSIONS["1.6"], {"bogus": 1})
    with pytest.raises(cc.ConfigError, match="absolute path"):
        cc.edit("", VERSIONS["1.6"], {"runtimes": {"nvidia": {"binary": "nvidia-container-runtime"}}})
    with pytest.raises(cc.ConfigError, match="cannot read a containerd version"):
        cc.edit("", "garbage", {})


def test_unmet_names_what_is_missing() -> None:
    eff = cc.effective(default_config("1.6"))
    missing = cc.unmet(eff, {**KUBELET, **NVIDIA, "default_runtime": "nvidia"})
    assert "no runtime nvidia in plugins.io.containerd.grpc.v1.cri.containerd.runtimes" in missing
    assert "runtime runc has SystemdCgroup = false" in missing
    assert any(m.startswith("the default runtime is 'runc'") for m in missing)


# ------------------------------------------------------------------------------ with the real binaries


@pytest.fixture(scope="module")
def real_containerd() -> dict[str, Path]:
    """Debian's containerd of each generation (downloaded once into the cache)."""
    from gpuprov_lab import vendor

    return {gen: vendor.containerd(gen) for gen in vendor.CONTAINERD_SUITES}


def _dump(binary: Path, config: Path) -> str:
    res = subprocess.run(
        [str(binary), "--config", str(config), "config", "dump"], capture_output=True, text=True
    )
    assert res.returncode == 0, f"{binary} refused {config}: {res.stderr[-600:]}"
    return res.stdout


@pytest.mark.parametrize("generation", ["1.6", "1.7", "2"])
def test_real_containerd_uses_every_setting(
    generation: str, real_containerd: dict[str, Path], tmp_path: Path
) -> None:
    binary = real_containerd[generation]
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    settings = {**KUBELET, **NVIDIA, "default_runtime": "nvidia"}
    if cc.parse_version(version) >= (1, 7):
        settings["enable_cdi"] = True
    default = subprocess.run(
        [str(binary), "config", "default"], capture_output=True, text=True, check=True
    ).stdout
    for name, text in (
        ("default", default),
        ("containerd.io", (FIXTURES / "config-containerd.io.toml").read_text()),
    ):
        config = tmp_path / f"{name}.toml"
        config.write_text(cc.edit(cc.edit(text, version, KUBELET), version, settings))
        eff = cc.effective(_dump(binary, config))
        assert cc.unmet(eff, settings) == [], (generation, name)


@pytest.mark.parametrize("generation", ["1.6", "1.7"])
def test_real_containerd_1_lets_a_drop_in_hide_config_toml(
    generation: str, real_containerd: dict[str, Path], tmp_path: Path
) -> None:
    """Why the nvidia runtime goes into config.toml: containerd 1.x replaces the whole CRI table with an
    imported file's, so SystemdCgroup of config.toml is gone once a drop-in adds a runtime."""
    binary = real_containerd[generation]
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    config = tmp_path / "config.toml"
    text = cc.edit(default_config(generation), version, KUBELET)
    config.write_text(text.replace("imports = []", f'imports = ["{tmp_path}/conf.d/*.toml"]', 1))
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "99-nvidia.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        '  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
    )
    eff = cc.effective(_dump(binary, config))
    assert "nvidia" in eff["runtimes"]
    assert "runtime runc has SystemdCgroup = false" in cc.unmet(eff, KUBELET) or "runc" not in eff["runtimes"]


@pytest.mark.parametrize("generation", ["1.6", "1.7", "2.1"])
def test_nvidia_runtime_matches_what_the_real_nvidia_ctk_writes(generation: str, tmp_path: Path) -> None:
    from gpuprov_lab import vendor

    ctk = vendor.nvidia_ctk()
    config = tmp_path / "config.toml"
    config.write_text(default_config(generation))
    dropin = tmp_path / "conf.d" / "99-nvidia.toml"
    res = subprocess.run(
        [
            str(ctk),
            "runtime",
            "configure",
            "--runtime=containerd",
            f"--config={config}",
            f"--drop-in-config={dropin}",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    theirs = tomllib.loads(dropin.read_text())
    ours = tomllib.loads(cc.edit(default_config(generation), VERSIONS[generation], NVIDIA))
    plugin = "io.containerd.cri.v1.runtime" if generation == "2.1" else "io.containerd.grpc.v1.cri"
    want = theirs["plugins"][plugin]["containerd"]["runtimes"]["nvidia"]
    got = ours["plugins"][plugin]["containerd"]["runtimes"]["nvidia"]
    assert got == want


def test_real_nvidia_ctk_with_an_empty_drop_in_flag_writes_the_runtime_nowhere(tmp_path: Path) -> None:
    """Why the role does not run nvidia-ctk for containerd with `--drop-in-config=` (empty, one
    argument): 1.20.0 exits 0, points config.toml's imports at its own directory, and writes the nvidia
    runtime into no file at all."""
    from gpuprov_lab import vendor

    config = tmp_path / "config.toml"
    config.write_text(default_config("1.6"))
    res = subprocess.run(
        [
            str(vendor.nvidia_ctk()),
            "runtime",
            "configure",
            "--runtime=containerd",
            f"--config={config}",
            "--drop-in-config=",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    written = tomllib.loads(config.read_text())
    assert written["imports"] == [f"{tmp_path}/*.toml"]
    runtimes = written["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert "nvidia" not in runtimes
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]
    # The role never runs nvidia-ctk for containerd any more.
    tasks = (ROOT / "roles" / "nvidia_container_toolkit" / "tasks" / "containerd.yml").read_text()
    assert "nvidia-ctk" not in tasks.split("\n- name:", 1)[1]
