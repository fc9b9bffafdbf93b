"""Part of the gpuprov lab simulation: the "hardware and kernel" of a lab host, and the NVIDIA tools.

Everything here runs inside a lab host with its python3 (Debian 12: 3.11, standard library only). It
answers from /etc/gpuprov-lab/profile.json (the host's simulated GPUs) and /etc/gpuprov-lab/faults.json
(faults injected by the controller, read live). Run-time state (loaded modules, this boot's kernel log,
persistence mode) lives under /run/gpuprov-lab, so a container restart is a reboot.

Set GPUPROV_SIM_ROOT to run the same code against a directory tree instead of / (unit tests).
"""
