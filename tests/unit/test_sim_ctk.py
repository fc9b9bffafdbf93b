"""The lab's simulated nvidia-ctk (container toolkit 1.18.0): it must merge the nvidia runtime into Docker's
and containerd's configuration without losing any other setting, and a second run must change nothing,
byte for byte; what it writes must read as configured through the verification probes."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path

import pytest
from sim_host import SimHost, ctk

from provisioner import probes
from provisioner.checks import HostFacts, evaluate
from provisioner.policy import Expectations

CONTAINERD_16 = """\
# containerd 1.6 configuration, as `containerd config default` writes it (abridged) plus edits
disabled_plugins = []
imports = []
oom_score = 0
root = "/var/lib/containerd"
state = "/run/containerd"
version = 2

[grpc]
  address = "/run/containerd/containerd.sock"
  max_recv_message_size = 16777216

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    enable_cdi = false
    sandbox_image = "10.213.0.1:8080/pause:3.10"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      snapshotter = "overlayfs"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "/etc/containerd/certs.d"
  [plugins."io.containerd.gc.v1.scheduler"]
    pause_threshold = 0.02
    schedule_delay = "0s"

[timeouts]
  "io.containerd.timeout.shim.cleanup" = "5s"
"""
CRI = 'plugins."io.containerd.grpc.v1.cri"'


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost(tmp_path, "h200")


def ctk_run(host: SimHost, *args: str) -> tuple[int, str, str]:
    return host.run(ctk.main, "nvidia-ctk", list(args), nct="1.18.0")


def without(doc: dict, *path: str) -> dict:
    out = copy.deepcopy(doc)
    cur = out
    for key in path[:-1]:
        cur = cur[key]
    cur.pop(path[-1], None)
    return out


# -------------------------------------------------------------------------------------------- docker


def test_docker_merge_keeps_every_key_and_is_idempotent(host: SimHost) -> None:
    daemon = host.root / "etc/docker/daemon.json"
    daemon.parent.mkdir(parents=True)
    original = {
        "data-root": "/var/lib/docker",
        "exec-opts": ["native.cgroupdriver=systemd"],
        "ip-forward": False,
        "log-opts": {"max-size": "100m"},
        "runtimes": {"crun": {"path": "/usr/bin/crun"}},
    }
    daemon.write_text(json.dumps(original))
    assert ctk_run(host, "runtime", "configure", "--runtime=docker")[0] == 0
    first = daemon.read_bytes()
    doc = json.loads(first)
    assert doc["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    assert without(doc, "runtimes", "nvidia") == original
    # Go's json.MarshalIndent: 4-space indent, sorted keys, no trailing newline.
    assert first.decode() == json.dumps(doc, indent=4, sort_keys=True)
    assert ctk_run(host, "runtime", "configure", "--runtime=docker")[0] == 0
    assert daemon.read_bytes() == first
    assert (
        ctk_run(host, "runtime", "configure", "--runtime=docker", "--set-as-default", "--cdi.enabled")[0] == 0
    )
    doc = json.loads(daemon.read_text())
    assert doc["default-runtime"] == "nvidia" and doc["features"] == {"cdi": True}


def test_docker_without_a_config_and_dry_run(host: SimHost) -> None:
    rc, out, err = ctk_run(host, "runtime", "configure", "--runtime=docker", "--dry-run")
    assert rc == 0 and json.loads(out) == {
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}
    }
    assert "Config file does not exist; using empty config" in err
    assert not (host.root / "etc/docker/daemon.json").exists()
    custom = host.root / "srv/daemon.json"
    assert (
        ctk_run(
            host, "runtime", "configure", "--runtime=docker", f"--config={custom.relative_to(host.root)}"
        )[0]
        == 0
    )
    assert "nvidia" in json.loads(custom.read_text())["runtimes"]


def test_docker_refuses_a_config_that_is_not_json(host: SimHost) -> None:
    daemon = host.root / "etc/docker/daemon.json"
    daemon.parent.mkdir(parents=True)
    daemon.write_text("{not json")
    rc, _, err = ctk_run(host, "runtime", "configure", "--runtime=docker")
    assert rc == 1 and "unable to load config for runtime docker" in err
    assert daemon.read_text() == "{not json"


# ---------------------------------------------------------------------------------------- containerd


def test_containerd_in_place_merge_keeps_everything_and_is_idempotent(host: SimHost) -> None:
    config = host.root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(CONTAINERD_16)
    original = tomllib.loads(CONTAINERD_16)
    args = ("runtime", "configure", "--runtime=containerd", "--drop-in-config=")
    rc, _, err = ctk_run(host, *args)
    assert rc == 0, err
    assert 'msg="Using config version 2"' in err or "Using config version 2" in err
    first = config.read_bytes()
    doc = tomllib.loads(first.decode())
    runtimes = doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": "/usr/bin/nvidia-container-runtime"},
    }
    assert (
        without(doc, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "nvidia") == original
    )
    assert first.decode().startswith("disabled_plugins = []\nimports = []\noom_score = 0\n")
    assert f"\n  [{CRI}]\n    enable_cdi = false\n" in first.decode()
    assert ctk_run(host, *args)[0] == 0
    assert config.read_bytes() == first
    assert ctk_run(host, *args, "--set-as-default", "--cdi.enabled")[0] == 0
    cri = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "nvidia" and cri["enable_cdi"] is True
    second = config.read_bytes()
    assert ctk_run(host, *args, "--set-as-default", "--cdi.enabled")[0] == 0
    assert config.read_bytes() == second


def test_containerd_default_is_a_drop_in_imported_by_config_toml(host: SimHost) -> None:
    config = host.root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(CONTAINERD_16)
    rc, _, err = ctk_run(host, "runtime", "configure", "--runtime=containerd")
    assert rc == 0, err
    assert "Wrote updated config to /etc/containerd/config.d/99-nvidia.toml" in err
    drop_in = host.root / "etc/containerd/config.d/99-nvidia.toml"
    dropped = tomllib.loads(drop_in.read_text())
    assert dropped["version"] == 2
    nvidia = dropped["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    top = tomllib.loads(config.read_text())
    assert top["imports"] == ["/etc/containerd/config.d/*.toml"]
    assert without(top, "imports") == without(tomllib.loads(CONTAINERD_16), "imports")
    before = (config.read_bytes(), drop_in.read_bytes())
    assert ctk_run(host, "runtime", "configure", "--runtime=containerd")[0] == 0
    assert (config.read_bytes(), drop_in.read_bytes()) == before


def test_containerd_without_runc_gets_the_default_runtime_settings(host: SimHost) -> None:
    rc, out, err = ctk_run(
        host, "runtime", "configure", "--runtime=containerd", "--drop-in-config=", "--dry-run"
    )
    assert rc == 0
    assert "could not infer options from runtimes" in err
    doc = tomllib.loads(out)
    assert doc["version"] == 2
    assert doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"] == {
        "privileged_without_host_devices": False,
        "runtime_engine": "",
        "runtime_root": "",
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": "/usr/bin/nvidia-container-runtime"},
    }
    assert not (host.root / "etc/containerd/config.toml").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runtime=podman"], "unrecognized runtime 'podman'"),
        (["--runtime=containerd", "--nvidia-runtime-path=nvidia-rt"], "is not an absolute path"),
        (["--runtime=docker", "--drop-in-config=/etc/docker/x.json"], "does not support drop-in configs"),
    ],
)
def test_bad_flags_are_refused(host: SimHost, args: list[str], message: str) -> None:
    rc, _, err = ctk_run(host, "runtime", "configure", *args)
    assert rc == 1 and message in err


def test_what_nvidia_ctk_writes_reads_as_configured(host: SimHost) -> None:
    (host.root / "etc/containerd").mkdir(parents=True)
    (host.root / "etc/containerd/config.toml").write_text(CONTAINERD_16)
    (host.root / "etc/docker").mkdir(parents=True)
    (host.root / "etc/docker/daemon.json").write_text("{}")
    assert ctk_run(host, "runtime", "configure", "--runtime=docker")[0] == 0
    assert ctk_run(host, "runtime", "configure", "--runtime=containerd", "--drop-in-config=")[0] == 0
    results = {
        "packages.tsv": probes.ProbeResult(
            "packages.tsv",
            0,
            "nvidia-container-toolkit\t1.18.0-1\tii \ndocker.io\t20.10\tii \n"
            "containerd\t1.6.20\tii \nkubelet\t1.33.5-1.1\tii \n",
        ),
        "docker-daemon.json": probes.ProbeResult(
            "docker-daemon.json", 0, (host.root / "etc/docker/daemon.json").read_text()
        ),
        # config.toml imports nothing here, so it is what `containerd config dump` would show.
        "containerd-config-dump.toml": probes.ProbeResult(
            "containerd-config-dump.toml", 0, (host.root / "etc/containerd/config.toml").read_text()
        ),
    }
    found = evaluate(HostFacts("gpu1", results), Expectations(), ["container_toolkit.runtime"])
    assert [f.status for f in found] == ["pass"], found


# --------------------------------------------------------------------------------------- the rest


def test_version_and_cdi(host: SimHost) -> None:
    rc, out, _ = ctk_run(host, "--version")
    assert rc == 0
    first, second = out.splitlines()
    assert first == "NVIDIA Container Toolkit CLI version 1.18.0"
    assert second.startswith("commit: ") and len(second) == len("commit: ") + 40
    rc, _, err = ctk_run(host, "cdi", "generate", "--output=/etc/cdi/nvidia.yaml")
    assert rc == 1 and "failed to initialize NVML" in err
    host.driver()
    rc, _, err = ctk_run(host, "cdi", "generate", "--output=/etc/cdi/nvidia.yaml")
    assert rc == 0, err
    spec = (host.root / "etc/cdi/nvidia.yaml").read_text()
    assert "kind: nvidia.com/gpu" in spec and "- path: /dev/nvidia0" in spec
    rc, out, _ = ctk_run(host, "cdi", "list")
    uuid = json.loads((host.root / "etc/gpuprov-lab/profile.json").read_text())["gpus"][0]["uuid"]
    assert out.splitlines() == ["nvidia.com/gpu=0", f"nvidia.com/gpu={uuid}", "nvidia.com/gpu=all"]


def test_toml_writer_round_trips() -> None:
    doc = tomllib.loads(CONTAINERD_16)
    text = ctk.toml_dumps(doc)
    assert tomllib.loads(text) == doc
    assert ctk.toml_dumps(tomllib.loads(text)) == text
