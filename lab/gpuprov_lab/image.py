"""The lab host image: a debootstrapped Debian rootfs (cached), imported into Docker, then a Dockerfile
that makes it boot systemd as PID 1 with sshd, and bakes in the GPU stand-in (``gpuprov_lab/gpu/``, at
/usr/lib/gpuprov-lab/gpu in the host), the files of ``gpuprov_lab/hostfiles/`` (laid over /) and the lab
archive key.

Each layer is cached and rebuilt only when its inputs change: the rootfs by its package list, the host
image by a hash of the Dockerfile, the files it adds, the archive key and the running kernel (the
containers share it, and ``modules.builtin`` is written for its release).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpuprov_lab import debian, paths, proc
from gpuprov_lab.engine import Docker, Progress, _quiet
from gpuprov_lab.errors import LabError
from gpuprov_lab.sim.debs import SIMULATED

# The lab's default host release (the machine's own apt sources name its archive); hosts may run other
# releases (gpuprov_lab.distros).
SUITE = debian.MACHINE_SUITE
SUITES = ("bookworm", "trixie")
ROOTFS_PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "python3-yaml",  # the GPU stand-in's nvidia-mig-parted front end reads mig-parted's YAML files
    "sudo",
    "iproute2",
    "iputils-ping",
    "ca-certificates",
    "gnupg",
    "curl",
    "procps",
    "kmod",
    "lsb-release",
    "less",
]
BASE_REPO = "gpuprov-lab/base"
HOST_REPO = "gpuprov-lab/host"
# Files laid over the image's root as they are, and the GPU stand-in (see HOST_LIB).
HOSTFILES = Path(__file__).parent / "hostfiles"
GPU = Path(__file__).parent / "gpu"
IMAGE_SETUP = "/usr/lib/gpuprov-lab/image-setup.sh"
ARCHIVE_KEYRING = "/usr/share/keyrings/gpuprov-lab-archive.gpg"
# Modules the roles load with modprobe; the containers share the controller's kernel, so they are
# declared built in for it and modprobe succeeds without module files.
BUILTIN_MODULES = [
    "overlay",
    "br_netfilter",
    "bridge",
    "veth",
    "nf_conntrack",
    "nf_nat",
    "ip_tables",
    "iptable_filter",
    "iptable_nat",
    "iptable_mangle",
    "xt_conntrack",
    "xt_MASQUERADE",
    "xt_mark",
    "vxlan",
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_sh",
]
# Units that must not run in a container that shares the controller's devices and kernel, or that
# would make runs flaky (apt timers taking the dpkg lock under a role).
MASKED_UNITS = [
    "getty@tty1.service",
    "console-getty.service",
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    "systemd-modules-load.service",
    "systemd-remount-fs.service",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "systemd-hwdb-update.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
]

SSHD_CONF = """\
# gpuprov lab host: root by key only, one host key placed by the controller before sshd starts.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""

DOCKERFILE = """\
FROM {base}
ENV container=docker
COPY hostfiles/ /
COPY gpuprov-lab-archive.gpg {keyring}
COPY sshd-gpuprov-lab.conf /etc/ssh/sshd_config.d/gpuprov-lab.conf
RUN set -e; \\
    chmod 0644 {keyring} /etc/ssh/sshd_config.d/gpuprov-lab.conf; \\
    systemctl mask {masked}; \\
    rm -f /etc/ssh/ssh_host_* /etc/apt/sources.list /var/lib/dbus/machine-id; \\
    : > /etc/machine-id; \\
    install -d -m 0700 /root/.ssh; \\
    mkdir -p /lib/modules/{kernel}; \\
    for m in {modules}; do echo "kernel/$m.ko"; done > /lib/modules/{kernel}/modules.builtin; \\
    touch /lib/modules/{kernel}/modules.order; \\
    depmod -a {kernel}; \\
    if [ -x {setup} ]; then {setup}; fi
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/lib/gpuprov-lab/bin/gpuprov-lab-init"]
"""


def _suite(suite: str) -> str:
    if suite not in SUITES:
        raise LabError(f"the lab builds host images of {', '.join(SUITES)}, not {suite!r}")
    return suite


def rootfs_stamp(suite: str = SUITE) -> str:
    return paths.digest(_suite(suite), "minbase", *ROOTFS_PACKAGES)[:12]


def rootfs_dir(suite: str = SUITE) -> Path:
    return paths.cache_root() / "rootfs" / f"{suite}-{rootfs_stamp(suite)}"


def ensure_rootfs(progress: Progress = _quiet, suite: str = SUITE) -> Path:
    """Debootstrap the host rootfs of a Debian release once (minbase + what sshd/systemd/Ansible need)."""
    target = rootfs_dir(suite)
    if (target / "sbin" / "init").exists():
        return target
    if not shutil.which("debootstrap"):
        raise LabError("debootstrap is not installed (./scripts/setup.sh installs it)")
    mirror = debian.debian_mirror_url()
    target.parent.mkdir(parents=True, exist_ok=True)
    for old in target.parent.iterdir():
        if old.name.startswith(f"{suite}-") and old != target:
            shutil.rmtree(old, ignore_errors=True)
    tmp = target.parent / f"{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    progress(f"image: debootstrap {suite} (minbase) into {target} (once; takes a minute or two)")
    include = f"--include={','.join(ROOTFS_PACKAGES)}"
    argv = ["debootstrap", "--variant=minbase", include, suite, str(tmp), mirror]
    proc.run(argv, timeout=1200, what="debootstrap")
    shutil.rmtree(tmp / "var" / "lib" / "apt" / "lists", ignore_errors=True)
    (tmp / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    for deb in (tmp / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        deb.unlink()
    os.replace(tmp, target)
    return target


def _image_exists(docker: Docker, tag: str) -> bool:
    return docker.ok("image", "inspect", "--format", "{{.Id}}", tag)


def ensure_base_image(docker: Docker, rootfs: Path, progress: Progress = _quiet, suite: str = SUITE) -> str:
    tag = f"{BASE_REPO}:{suite}-{rootfs_stamp(suite)}"
    if _image_exists(docker, tag):
        return tag
    progress(f"image: importing the rootfs as {tag}")
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", "-", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        imp = subprocess.run(
            [docker.cli, "import", "--message", "gpuprov lab rootfs", "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        if tar.stdout:
            tar.stdout.close()
        tar.wait()
    if tar.returncode != 0 or imp.returncode != 0:
        raise LabError(f"docker import of {rootfs} failed: {proc.tail(imp.stderr)}")
    return tag


def dockerfile_text(base: str) -> str:
    return DOCKERFILE.format(
        base=base,
        keyring=ARCHIVE_KEYRING,
        masked=" ".join(MASKED_UNITS),
        kernel=os.uname().release,
        modules=" ".join(BUILTIN_MODULES),
        setup=IMAGE_SETUP,
    )


# In a host: the lab's tools (bin/) and the GPU stand-in, the package gpu (gpuprov_lab/gpu/, run with the
# host's python3: it imports nothing of the lab or of gpuprov).
HOST_LIB = "/usr/lib/gpuprov-lab"
# The lab's tools in a host that run one entry point of the GPU stand-in: program → its module of gpu.
# image-setup.sh puts the kmod and util-linux ones in place of Debian's (dpkg-divert).
HOST_TOOLS = {
    "modprobe": "kmod",
    "rmmod": "kmod",
    "lsmod": "kmod",
    "dmesg": "dmesg",
    "gpuprov-lab-boot": "boot",
    "gpuprov-lab-faultwatch": "watch",
    "nvidia-mig-parted": "migparted",
}
# NVIDIA's nvidia-mig-parted in every host, for the lab's MIG front end to parse configs with (the
# nvidia-mig-manager package brings its own copy to hosts outside Kubernetes).
HOST_MIG_PARTED = f"{HOST_LIB}/bin/nvidia-mig-parted.real"


def launcher(module: str, prog: str, **constants: str) -> str:
    """A python3 program of a lab host that runs ``gpu.<module>.main(prog, argv, **constants)``."""
    args = "".join(f", {k}={v!r}" for k, v in sorted(constants.items()))
    return f"""#!/usr/bin/python3
# {prog}: {SIMULATED}. Part of the gpuprov lab: it answers from this lab host's simulated hardware
# ({HOST_LIB}/gpu/{module}.py says what and why) and is not the vendor's program.
import sys

sys.path.insert(0, {HOST_LIB!r})
from gpu import {module}  # noqa: E402

sys.exit({module}.main({prog!r}, sys.argv[1:]{args}))
"""


def host_runc_wrapper() -> str:
    """The runc wrapper (gpuprov_lab.runc_capfilter) as lab hosts run it, in front of Debian's runc
    (image-setup.sh diverts it to .distrib)."""
    source = (Path(__file__).parent / "runc_capfilter.py").read_text()
    return source.replace('REAL_RUNC = "/usr/sbin/runc"', 'REAL_RUNC = "/usr/sbin/runc.distrib"', 1)


def generated_files() -> dict[str, tuple[bytes, int]]:
    """What the build adds to hostfiles/ (path in the host → content, mode): the GPU stand-in's package,
    its tools' launchers and the runc wrapper."""
    files = {
        f"{HOST_LIB}/gpu/{p.name}": (p.read_bytes(), 0o644)
        for p in sorted(GPU.iterdir())
        if p.is_file() and p.suffix in (".py", ".xml")
    }
    for prog, module in HOST_TOOLS.items():
        files[f"{HOST_LIB}/bin/{prog}"] = (launcher(module, prog).encode(), 0o755)
    files[f"{HOST_LIB}/bin/runc"] = (host_runc_wrapper().encode(), 0o755)
    return files


def host_image_tag(base: str, archive_key: bytes) -> str:
    from gpuprov_lab import vendor

    digest = paths.digest(
        dockerfile_text(base),
        SSHD_CONF,
        archive_key,
        hashlib.sha256(vendor.mig_parted().read_bytes()).hexdigest(),
        *paths.tree_manifest(HOSTFILES),
        *(f"{p} {m:o} {hashlib.sha256(data).hexdigest()}" for p, (data, m) in generated_files().items()),
    )
    return f"{HOST_REPO}:{digest[:16]}"


def ensure_host_image(docker: Docker, base: str, archive_key: bytes, progress: Progress = _quiet) -> str:
    """Build the host image when its inputs changed; return its tag."""
    from gpuprov_lab import vendor

    tag = host_image_tag(base, archive_key)
    if _image_exists(docker, tag):
        return tag
    progress(f"image: building {tag}")
    build_root = paths.cache_root() / "tmp"
    build_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=build_root, prefix="image-") as ctx_name:
        ctx = Path(ctx_name)
        tree = ctx / "hostfiles"
        shutil.copytree(HOSTFILES, tree, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        extra = {**generated_files(), HOST_MIG_PARTED: (vendor.mig_parted().read_bytes(), 0o755)}
        for path, (data, mode) in extra.items():
            target = tree / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(mode)
        (ctx / "gpuprov-lab-archive.gpg").write_bytes(archive_key)
        (ctx / "sshd-gpuprov-lab.conf").write_text(SSHD_CONF)
        (ctx / "Dockerfile").write_text(dockerfile_text(base))
        argv = ["build", "-q", "--label", "gpuprov.lab.image=host", "-t", tag, str(ctx)]
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        res = docker(*argv, timeout=900, check=False, env=env)
        if res.returncode != 0 and "layer does not exist" in res.stderr:
            # The legacy builder of Docker 20.10 sometimes loses a fresh layer right after an engine
            # reload; the same build then succeeds.
            res = docker(*argv, timeout=900, check=False, env=env)
        if res.returncode != 0:
            raise LabError(f"docker build of the lab host image failed: {proc.tail(res.stderr)}")
    return tag


def prune_host_images(docker: Docker, keep: set[str]) -> None:
    """Remove older host images (one per Debian release is current; ones still used by a container stay)."""
    for ref in docker.lines("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", HOST_REPO):
        if ref not in keep:
            docker("image", "rm", ref, check=False)
