"""Part of the gpuprov lab simulation: the checks of an NVIDIA kernel-module build under DKMS.

Called by the simulated DKMS source's Makefile once per module, before the compiler "builds" it. It
fails the build the way a real one fails when the lab injects ``install-fail`` (a compile error in the
driver source, so dkms reports "Bad return status for module build" and dpkg leaves the package
half-configured), and when the kernel headers are not there.
"""

from __future__ import annotations

import os
import sys

from . import core


def check(host: core.Host, module: str, kernel: str, flavour: str, version: str) -> int:
    build = host.p(f"/lib/modules/{kernel}/build")
    if build.is_symlink() and os.readlink(build).startswith("/"):
        build = host.p(os.readlink(build))  # the headers' absolute link, inside this host's root
    if not (build / "Makefile").exists():
        sys.stderr.write(
            f"make[1]: *** /lib/modules/{kernel}/build: No such file or directory.  Stop.\n"
            f"make: *** [Makefile:{len(module)}: {module}.ko] Error 2\n"
        )
        return 2
    if host.has_fault("install-fail"):
        src = "kernel-open" if flavour == "open" else "kernel"
        sys.stderr.write(
            f"{src}/nvidia/nv.c: In function 'nv_pci_probe':\n"
            f"{src}/nvidia/nv.c:1717:13: error: implicit declaration of function "
            "'pci_enable_pcie_error_reporting' [-Werror=implicit-function-declaration]\n"
            "cc1: some warnings being treated as errors\n"
            f"make[3]: *** [scripts/Makefile.build:243: {src}/nvidia/nv.o] Error 1\n"
            "make[2]: *** [/usr/src/linux-headers/Makefile:1938: .] Error 2\n"
            f"make: *** [Makefile:{len(module)}: modules] Error 2\n"
            f"(gpuprov lab: install-fail fault injected; {core.SIMULATED} build of {module} {version})\n"
        )
        return 2
    sys.stdout.write(f"  CC [M]  {module}.ko ({core.SIMULATED} NVIDIA {flavour} {version} for {kernel})\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.stderr.write("usage: python3 -m gpu.dkmsbuild MODULE KERNEL FLAVOUR VERSION\n")
        sys.exit(2)
    sys.exit(check(core.Host(), *sys.argv[1:5]))
