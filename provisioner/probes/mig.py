"""The GPUs' MIG devices as the driver lists them: `nvidia-smi -L`."""

from __future__ import annotations

import re

from provisioner.hosttext import first_line
from provisioner.probes.base import HostFacts, ParseError, Probe
from provisioner.probes.smi import HAVE_SMI

# `nvidia-smi -L`: one line per GPU, then one indented line per MIG device under its GPU ("  MIG 1g.18gb
# Device  0: (UUID: MIG-...)"), the listing of NVIDIA's Multi-Instance GPU User Guide (Getting Started:
# listing the MIG devices after creating them).
SMI_LIST = "nvidia-smi-L.txt"

PROBES: tuple[Probe, ...] = (
    Probe(SMI_LIST, f"{HAVE_SMI}\nt 20 nvidia-smi -L", 25, "nvidia-smi -L: GPUs and their MIG devices"),
)


def parse_smi_list(text: str) -> str:
    """`nvidia-smi -L` as printed, checked to be that listing (a line "GPU <n>: ..." first)."""
    if not re.match(r"GPU \d+: ", text.lstrip("\n")):
        raise ParseError(f"{SMI_LIST}: not nvidia-smi -L output: {first_line(text, 80)!r}")
    return text


def mig_devices(facts: HostFacts) -> dict[int, dict[str, int]]:
    """GPU index → MIG profile → devices, from `nvidia-smi -L` (provisioner.mig.parse_mig_devices)."""
    from provisioner.mig import parse_mig_devices

    def read() -> dict[int, dict[str, int]]:
        listing = parse_smi_list(facts.ok_text(SMI_LIST))
        try:
            return parse_mig_devices(listing)
        except ValueError as exc:
            raise ParseError(f"{SMI_LIST}: {exc}") from None

    return facts.parsed("mig-devices", read)
