"""The CUDA toolkit at /usr/local/cuda, as its nvcc reports it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioner.hosttext import first_line
from provisioner.probes.base import ERROR, HostFacts, ParseError, Probe, Unavailable

NVCC_VERSION = "nvcc-version.txt"

PROBES: tuple[Probe, ...] = (
    Probe(NVCC_VERSION, "/usr/local/cuda/bin/nvcc --version", 25, "nvcc of /usr/local/cuda"),
)


@dataclass(frozen=True)
class CudaToolkit:
    release: str  # 13.0
    version: str  # 13.0.88


_NVCC = re.compile(r"release (?P<rel>\d+\.\d+), V(?P<ver>\d+\.\d+(?:\.\d+)?)")


def parse_nvcc(text: str) -> CudaToolkit:
    m = _NVCC.search(text)
    if not m:
        raise ParseError(f"nvcc --version: no 'release X.Y, VX.Y.Z': {first_line(text)!r}")
    return CudaToolkit(m.group("rel"), m.group("ver"))


def toolkit(facts: HostFacts) -> CudaToolkit | None:
    """The toolkit at /usr/local/cuda, or None when there is none."""

    def load() -> CudaToolkit | None:
        res = facts.result(NVCC_VERSION)
        if res.rc == 127 or (not res.ok and "No such file" in res.stderr):
            return None
        if not res.ok:
            raise Unavailable(ERROR, f"{NVCC_VERSION}: {res.reason()}")
        return parse_nvcc(res.stdout)

    return facts.parsed("cuda", load)
