#!/usr/bin/python3
"""OCI runtime wrapper for machines whose capability bounding set is short (e.g. a VM without
CAP_SYS_RESOURCE): `docker run --privileged` asks for every capability the engine knows and runc fails
with "unable to apply caps". This wrapper removes the capabilities this machine cannot grant from the
OCI spec (``<bundle>/config.json`` for create/run, the ``--process`` file for exec) and execs runc.

gpuprov installs it (as a standalone script, stdlib only) and registers it as Docker's default runtime
only on machines where that failure was seen; lab hosts run it in front of their own runc (their
containerd's and Docker's containers hit the same limit), where it also drops a negative oomScoreAdj,
which needs CAP_SYS_RESOURCE too.
"""

from __future__ import annotations

import json
import os
import sys

REAL_RUNC = "/usr/sbin/runc"

# Linux capability numbers (include/uapi/linux/capability.h), index = bit.
CAPS = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]


def bounding_set(status_text: str) -> int:
    for line in status_text.splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    raise ValueError("no CapBnd line")


def missing_caps(bnd: int) -> set[str]:
    """Capabilities (CAP_ names) this machine's bounding set does not hold."""
    return {"CAP_" + name for bit, name in enumerate(CAPS) if not (bnd >> bit) & 1}


def spec_path(args: list[str]) -> str | None:
    """The OCI file runc will read: <bundle>/config.json (create/run) or the --process file (exec)."""
    found: str | None = None
    prev = ""
    for arg in args:
        if prev in ("--bundle", "-b"):
            found = os.path.join(arg, "config.json")
        elif prev in ("--process", "-p"):
            found = arg
        elif arg.startswith("--bundle="):
            found = os.path.join(arg.split("=", 1)[1], "config.json")
        elif arg.startswith("--process="):
            found = arg.split("=", 1)[1]
        prev = arg
    return found


def filter_caps(doc: dict, missing: set[str]) -> bool:
    """Drop missing capabilities from every capability set of a spec or process document."""
    caps = doc.get("process", doc).get("capabilities")
    if not caps or not missing:
        return False
    changed = False
    for key, values in caps.items():
        kept = [c for c in values if c not in missing]
        if len(kept) != len(values):
            caps[key] = kept
            changed = True
    return changed


def filter_oom_score(doc: dict, missing: set[str]) -> bool:
    """Drop a negative oomScoreAdj when CAP_SYS_RESOURCE is missing: lowering a process's OOM score
    needs that capability, and the kubelet asks for -997 for its critical pods."""
    proc = doc.get("process", doc)
    if "CAP_SYS_RESOURCE" in missing and int(proc.get("oomScoreAdj", 0) or 0) < 0:
        del proc["oomScoreAdj"]
        return True
    return False


def main(args: list[str]) -> None:
    path = spec_path(args)
    if path and os.path.isfile(path):
        with open("/proc/self/status") as fh:
            missing = missing_caps(bounding_set(fh.read()))
        with open(path) as fh:
            doc = json.load(fh)
        if filter_caps(doc, missing) | filter_oom_score(doc, missing):
            tmp = path + ".capfilter"
            with open(tmp, "w") as fh:
                json.dump(doc, fh)
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
            os.replace(tmp, path)
    os.execv(REAL_RUNC, [REAL_RUNC, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
