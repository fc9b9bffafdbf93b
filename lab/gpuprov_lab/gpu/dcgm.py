"""Part of the gpuprov lab simulation: DCGM's nv-hostengine and dcgmi.

nv-hostengine runs in the foreground (-n, as nvidia-dcgm.service starts it) and holds the NVIDIA device
files like the real one. dcgmi talks to it: ``discovery -l`` lists the GPUs, ``diag -r 1 -j`` (what
gpuprov's verification runs) does the
level-1 (deployment) checks and reports per GPU in DCGM 4's JSON shape, failing where the host's faults
say the real one would (pending or failed row remaps, uncorrectable ECC errors, persistence off, fabric
manager not running on an NVSwitch system). Nothing else of DCGM is simulated: nothing in the lab runs it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from . import core, kmod, smi, watch

PLUGINS = "/usr/libexec/datacenter-gpu-manager-4/plugins"
NO_HOSTENGINE = (
    "Error: unable to establish a connection to the specified host: localhost\n"
    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
)
RC_CONNECTION = 255
RC_DIAG_FAILED = 226


def hostengine_running(host: core.Host) -> bool:
    st = host.state()
    return "nv-hostengine" in kmod.users(st)


def hostengine(host: core.Host, argv: list[str], version: str) -> int:
    if "--version" in argv or "-v" in argv:
        sys.stdout.write(f"Version : {version}\nBuild ID : 24\nBuild Date : 2025-10-02\n")
        return 0
    if "-n" not in argv and "--no-daemon" not in argv:
        sys.stderr.write("nv-hostengine: the gpuprov lab runs it in the foreground only (-n)\n")
        return 2
    if hostengine_running(host):
        sys.stderr.write("Err: Failed to start DCGM Server: -7\n")
        return 1
    watch.sync(host)
    if not kmod.ensure_loaded(host):
        sys.stderr.write(
            "Err: Failed to start DCGM Server: DCGM initialization failed: NVML Library not loaded\n"
        )
        return 1

    def terminate(_sig: int, _frame: object) -> None:
        kmod.remove_user(host, "nv-hostengine")
        sys.exit(0)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    kmod.add_user(host, "nv-hostengine", os.getpid())
    sys.stdout.write(f"Started host engine version {version} using port number: 5555 \n")
    sys.stdout.flush()
    while True:
        time.sleep(3600)


# ------------------------------------------------------------------------------------------- dcgmi


def _result(gpu: int, status: str, warning: str | None = None, error_id: int = 0) -> dict[str, Any]:
    r: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": status}
    if warning:
        r["warnings"] = [{"error_category": 6, "error_id": error_id, "error_severity": 2, "warning": warning}]
    return r


# The page-retirement failures a fault stands for, the first that applies: (fault, warning, error id).
PAGE_RETIREMENT_FAULTS = (
    (
        "remap-failure",
        "GPU {gpu} had uncorrectable memory errors and row remapping failed. "
        "Drain the GPU and reset it or reboot the node to resolve this issue.",
        94,
    ),
    (
        "remap-pending",
        "GPU {gpu} had uncorrectable memory errors and row remapping is pending. "
        "Run a GPU reset or reboot the system to resolve this issue.",
        93,
    ),
    ("ecc", "Volatile double-bit ECC error(s) detected: {ecc} on GPU {gpu}.", 30),
)
# The diagnostic's warnings for persistence off and an untrained fabric, in DCGM's words ("peristence" too).
PERSISTENCE_OFF = (
    "Persistence mode for GPU {gpu} is currently disabled. The DCGM diagnostic requires peristence mode to "
    'be enabled. Enable persistence mode by running "nvidia-smi -i <gpuId> -pm 1 " as root.'
)
FABRIC_UNTRAINED = (
    "GPU {gpu}'s fabric manager has not completed the training. The fabric manager service is not running or "
    "failed to start."
)


def diag_level1(host: core.Host, st: dict[str, Any], version: str) -> dict[str, Any]:
    """Level-1 (deployment) diagnostic in DCGM 4's JSON shape."""
    gpus = smi.visible(host, st)
    nvswitch = bool(host.nvswitches())
    fm_ok = st.get("fabric") == "configured" and "nv-fabricmanager" in kmod.users(st)
    tests: dict[str, list[dict[str, Any]]] = {
        name: [] for name in ("software", "persistence_mode", "page_retirement", "fabric_manager")
    }
    for i, g in enumerate(gpus):
        tests["software"].append(_result(i, "Pass"))
        if smi.persistence(st, g):
            tests["persistence_mode"].append(_result(i, "Pass"))
        else:
            tests["persistence_mode"].append(_result(i, "Warn", PERSISTENCE_OFF.format(gpu=i), 13))
        idx = g["index"]
        fault = next((f for f in PAGE_RETIREMENT_FAULTS if host.has_fault(f[0], idx)), None)
        if fault:
            _, warning, error_id = fault
            warning = warning.format(gpu=i, ecc=smi.ECC_FAULT_COUNT)
            tests["page_retirement"].append(_result(i, "Fail", warning, error_id))
        else:
            tests["page_retirement"].append(_result(i, "Pass"))
        if not nvswitch:
            tests["fabric_manager"].append(_result(i, "Skip"))
        elif fm_ok:
            tests["fabric_manager"].append(_result(i, "Pass"))
        else:
            tests["fabric_manager"].append(_result(i, "Fail", FABRIC_UNTRAINED.format(gpu=i), 110))

    def summary(results: list[dict[str, Any]]) -> str:
        states = {r["status"] for r in results}
        for s in ("Fail", "Warn", "Pass"):
            if s in states:
                return s
        return "Skip"

    test_list = [
        {"name": name, "results": results, "test_summary": {"status": summary(results)}}
        for name, results in tests.items()
    ]
    return {
        "DCGM Diagnostic": {
            "test_categories": [{"category": "Deployment", "tests": test_list}],
        },
        "entity_groups": [
            {
                "entities": [
                    {"entity_id": i, "serial_num": g["serial"], "sku": g["device_id"][2:]}
                    for i, g in enumerate(gpus)
                ],
                "entity_group": "GPU",
                "entity_group_id": 1,
            }
        ],
        "metadata": {
            "DCGM Version": version,
            "Driver Version Detected": kmod.driver_version(st),
            "GPU Device IDs": [g["device_id"][2:] for g in gpus],
            "version": version,
            "simulated": core.SIMULATED,
        },
    }


def discovery_list(host: core.Host, st: dict[str, Any]) -> str:
    """`dcgmi discovery -l`, shortened: a count line and each GPU's name, PCI bus id and UUID. gpuprov
    reads only its exit status (0: the host engine answered)."""
    gpus = smi.visible(host, st)
    lines = [f"{len(gpus)} GPU{'' if len(gpus) == 1 else 's'} found."]
    for i, g in enumerate(gpus):
        lines.append(f"| {i:<6} | Name: {g['name']} | PCI Bus ID: {g['bus_id']} | Device UUID: {g['uuid']} |")
    return "\n".join(lines) + "\n"


def dcgmi(host: core.Host, argv: list[str], version: str) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(f"dcgmi -- Interface to the Data Center GPU Manager ({core.SIMULATED})\n")
        return 0 if argv else 1
    if argv[0] in ("-v", "--version"):
        sys.stdout.write(f"dcgmi  version: {version}\n")
        return 0
    if not hostengine_running(host):
        sys.stdout.write(NO_HOSTENGINE)
        return RC_CONNECTION
    watch.sync(host)
    st = host.state()
    cmd = argv[0]
    if cmd == "diag" and ("-j" in argv or "--json" in argv):
        level = "1"
        for i, a in enumerate(argv):
            if a in ("-r", "--run") and i + 1 < len(argv):
                level = argv[i + 1]
        cuda = kmod.driver_version(st) or ""
        major = "13" if cuda.startswith("58") else "12"
        if not host.p(f"{PLUGINS}/cuda{major}").is_dir():
            sys.stdout.write(
                f"Error: Diagnostic could not be run while DCGM CUDA {major} support is missing: install "
                f"datacenter-gpu-manager-4-cuda{major}.\n"
            )
            return RC_DIAG_FAILED
        if level not in ("1", "short"):
            sys.stdout.write(
                f"Error: diagnostic level {level} is not available in the gpuprov lab ({core.SIMULATED})\n"
            )
            return 2
        doc = diag_level1(host, st, version)
        failed = any(
            t["test_summary"]["status"] == "Fail"
            for t in doc["DCGM Diagnostic"]["test_categories"][0]["tests"]
        )
        sys.stdout.write(json.dumps(doc, indent=4) + "\n")
        return RC_DIAG_FAILED if failed else 0
    if cmd == "discovery" and "-l" in argv[1:]:
        sys.stdout.write(discovery_list(host, st))
        return 0
    only = "only diag -j and discovery -l"
    sys.stdout.write(f"dcgmi {' '.join(argv)}: not provided by the gpuprov lab ({only})\n")
    return 2


def main(prog: str, argv: list[str], dcgm: str = "", **_: str) -> int:
    host = core.Host()
    if prog == "nv-hostengine":
        return hostengine(host, argv, dcgm)
    return dcgmi(host, argv, dcgm)
