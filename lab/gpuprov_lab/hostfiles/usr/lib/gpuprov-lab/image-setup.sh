#!/bin/sh
# Part of the gpuprov lab simulation: run once while the lab host image is built (image.py).
# Puts the simulated kernel's tools in place of the real ones (kept as *.distrib through
# dpkg-divert, so package upgrades of kmod and util-linux do not overwrite them) and enables the
# units that set up the simulated hardware at every boot.
set -eu
BIN=/usr/lib/gpuprov-lab/bin

divert() {
  # $1: a file a Debian package owns; $2: the lab's tool that answers in its place.
  if ! dpkg-divert --list "$1" | grep -q .; then
    dpkg-divert --quiet --local --rename --divert "$1.distrib" --add "$1"
  fi
  ln -sf "$2" "$1"
}

# kmod: modprobe/rmmod hand everything that is not nvidia*/nouveau to the real /bin/kmod.
divert /sbin/modprobe "$BIN/modprobe"
divert /sbin/rmmod "$BIN/rmmod"
divert /sbin/lsmod "$BIN/lsmod"
divert /bin/lsmod "$BIN/lsmod"
# util-linux: the machine's kernel log must not show inside a lab host.
divert /bin/dmesg "$BIN/dmesg"
# runc (from Debian, installed by the docker and kubernetes roles): the real one lands at .distrib;
# the lab's wrapper in its place drops the capabilities this machine cannot grant (CAP_SYS_RESOURCE is
# missing from the capability bounding set of the machines the lab runs on) from each container's
# spec, and execs it. A real host needs no wrapper; where nothing is missing it changes nothing.
divert /usr/sbin/runc "$BIN/runc"
# nvidia-mig-manager (NVIDIA's real package, installed by the nvidia_mig_manager role): its real
# nvidia-mig-parted lands at .distrib; the lab's front end answers apply/assert/export from the
# simulated GPUs (lab hosts have no /proc/modules, which the real binary reads first).
divert /usr/bin/nvidia-mig-parted "$BIN/nvidia-mig-parted"

# NVIDIA's mock NVML (in the lab's driver packages) reads its configuration from MOCK_NVML_CONFIG: set
# for SSH sessions (pam_env reads /etc/environment) and for every systemd unit (DefaultEnvironment).
grep -q '^MOCK_NVML_CONFIG=' /etc/environment 2>/dev/null ||
  echo 'MOCK_NVML_CONFIG=/run/gpuprov-lab/nvml.yaml' >> /etc/environment

python3 -c 'import sys; sys.path.insert(0, "/usr/lib/gpuprov-lab"); import gpu.boot'
systemctl enable gpuprov-lab-hardware.service gpuprov-lab-faultwatch.service
