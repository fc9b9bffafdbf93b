"""Part of the gpuprov lab simulation: ``nvidia-container-cli`` (libnvidia-container-tools).

libnvidia-container is the one part of the NVIDIA Container Toolkit the lab cannot have for real (it
needs NVIDIA's driver libraries), so its CLI is SIMULATED: ``--version`` and ``info`` answer from the
host's simulated GPUs as nvidia-container-cli 1.18.0 prints them (libnvidia-container's src/cli/info.c);
anything else (``configure``, which the legacy injection path runs) says it is not provided. CDI, the
path the lab's containers take, does not use it.
"""

from __future__ import annotations

import sys

from . import core, kmod, smi


def info(host: core.Host) -> int:
    try:
        st, _nvml = smi.driver_state(host, smi.nvml_version(host, "") or "")
    except core.SimError:
        sys.stderr.write("nvidia-container-cli: initialization error: nvml error: driver not loaded\n")
        return 1
    out = [f"NVRM version:   {kmod.driver_version(st)}", "CUDA version:   13.0", ""]
    for i, g in enumerate(smi.visible(host, st)):
        out += [
            f"Device Index:   {i}",
            f"Device Minor:   {g['minor_number']}",
            f"Model:          {g['name']}",
            "Brand:          NVIDIA",
            f"GPU UUID:       {g['uuid']}",
            f"Bus Location:   {g['bus_id']}",
            f"Architecture:   {g['compute_cap']}",
            "",
        ]
    sys.stdout.write("\n".join(out))
    return 0


def main(prog: str, argv: list[str], nct: str = "", **_: str) -> int:
    if argv[:1] in (["--version"], ["-V"]):
        sys.stdout.write(f"cli-version: {nct}\nlib-version: {nct}\nbuild date: 2025-10-07T00:00+00:00\n")
        return 0
    if argv[:1] == ["info"]:
        return info(core.Host())
    sys.stderr.write(f"{prog}: {' '.join(argv[:1])}: not provided by the gpuprov lab ({core.SIMULATED})\n")
    return 1
