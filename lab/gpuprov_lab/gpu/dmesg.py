"""Part of the gpuprov lab simulation: ``dmesg`` for a lab host, the kernel log of this boot.

The lab hosts share the controller's kernel, whose real ring buffer must not show up in them (journald
runs with ReadKMsg=no there). This dmesg prints the simulated kernel's log instead: the boot banner and
PCI enumeration of the host's profile, driver loads and unloads in the real format, and the NVRM Xid
lines of injected ``xid`` faults, stamped with the time they first showed. A GPU reset that clears one
(recovery.py) leaves its lines in this boot's log, as the kernel does; a reboot starts a log without them.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from . import core, watch

# Xid → the text the driver prints after "NVRM: Xid (PCI:dddd:bb:dd): N, pid=..., name=...,".
XID_TEXT = {
    8: ("1841", "python3", "Channel 00000010"),
    13: ("2048", "python3", "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address"),
    31: (
        "2048",
        "python3",
        "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_1c000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    ),
    43: ("2048", "python3", "Ch 00000008"),
    45: ("2048", "python3", "Ch 00000008"),
    48: (
        None,
        None,
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "partition 6, subpartition 0.",
    ),
    61: (None, None, "0cec(2f5c) 00000000 00000000"),
    62: (None, None, "0000(0000) 00000000 00000000"),
    63: (
        None,
        None,
        "Row Remapper: New row (0x0000000000a2b4c0) marked for remapping, reset gpu to activate.",
    ),
    64: (None, None, "Row Remapper: Failed to mark row (0x0000000000a2b4c0) for remapping."),
    74: (None, None, "NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"),
    79: (None, None, "GPU has fallen off the bus."),
    92: (None, None, "High single-bit ECC error rate"),
    94: ("3117", "python3", "Contained: SM (0x1). RST: No, D-RST: No"),
    95: (None, None, "Uncontained: FBHUB. RST: Yes, D-RST: No"),
    109: ("3117", "python3", "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c000"),
    119: (
        None,
        None,
        "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20800a4c 0x4).",
    ),
    120: (None, None, "GSP task exception: 0x2"),
}


def xid_lines(gpu: dict[str, Any], xid: int) -> list[str]:
    domain, bus, rest = gpu["pci_address"].split(":")
    short = f"{domain}:{bus}:{rest.split('.')[0]}"
    pid, name, text = XID_TEXT.get(
        xid, (None, None, "An error occurred on the GPU (see NVIDIA's Xid catalogue)")
    )
    who = f"pid={pid}, name={name}" if pid else "pid='<unknown>', name=<unknown>"
    lines = [f"NVRM: GPU at PCI:{short}: {gpu['uuid']}", f"NVRM: Xid (PCI:{short}): {xid}, {who}, {text}"]
    if xid == 79:
        lines += [
            f"NVRM: GPU {gpu['pci_address']}: GPU has fallen off the bus.",
            "NVRM: A GPU crash dump has been created. If possible, please run",
            "NVRM: nvidia-bug-report.sh as root to collect this data before",
            "NVRM: the NVIDIA kernel module is unloaded.",
        ]
    return lines


def entries(host: core.Host) -> list[tuple[float, str]]:
    """This boot's kernel log: (seconds since boot, message), oldest first."""
    watch.sync(host)
    st = host.state()
    out = [(float(t), str(line)) for t, line in st["klog"]]
    gpus = {g["index"]: g for g in host.gpus()}
    for key, at in st["fault_seen"].items():
        f = json.loads(key)
        if f.get("kind") == "xid" and f.get("gpu", 0) in gpus:
            for i, line in enumerate(xid_lines(gpus[f.get("gpu", 0)], int(f.get("xid", 79)))):
                out.append((float(at) + i * 0.000004, line))
    cleared = float(st.get("dmesg_cleared", -1))
    return sorted((e for e in out if e[0] > cleared), key=lambda e: e[0])


def render(host: core.Host, fmt: str = "default") -> str:
    st = host.state()
    lines = []
    for t, msg in entries(host):
        if fmt == "notime":
            lines.append(msg)
        elif fmt == "ctime":
            stamp = time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(float(st["boot_time"]) + t))
            lines.append(f"[{stamp}] {msg}")
        else:
            lines.append(f"[{t:12.6f}] {msg}")
    return "\n".join(lines) + ("\n" if lines else "")


FLAGS = (
    "-k",
    "--kernel",
    "-x",
    "--decode",
    "-L",
    "--color",
    "-H",
    "--human",
    "-P",
    "--nopager",
    "-e",
    "--reltime",
)
WITH_VALUE = ("-l", "--level", "-f", "--facility", "--time-format", "-n", "--console-level")
USAGE = """
Usage:
 dmesg [options]

Display or control the kernel ring buffer.
(gpuprov lab: SIMULATED kernel log of this host's simulated hardware)
"""


def main(prog: str, argv: list[str], **_: str) -> int:
    host = core.Host()
    fmt = "default"
    clear = show = False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("-T", "--ctime"):
            fmt = "ctime"
        elif a in ("-t", "--notime"):
            fmt = "notime"
        elif a in ("-c", "--read-clear"):
            clear = show = True
        elif a in ("-C", "--clear"):
            clear = True
        elif a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0
        elif a in FLAGS or a.startswith(("--level=", "--facility=", "--color=", "--time-format=")):
            continue
        elif a in WITH_VALUE:
            if args:
                args.pop(0)
        else:
            sys.stderr.write(f"dmesg: unrecognized option '{a}'\nTry 'dmesg --help' for more information.\n")
            return 1
    if clear:
        import os

        if host.on_host and os.geteuid() != 0:
            sys.stderr.write("dmesg: klogctl failed: Operation not permitted\n")
            return 1
        if show:
            sys.stdout.write(render(host, fmt))
        with host.locked() as st:
            st["dmesg_cleared"] = round(host.uptime(st), 6)
        return 0
    sys.stdout.write(render(host, fmt))
    return 0
