"""The operating system and its services: /etc/os-release, the running kernel, whether the GPU stack's
units are active (by systemd, else by their processes), and who the host says it is (hostname and
/etc/machine-id: what tells its Kubernetes node apart from another's)."""

from __future__ import annotations

import re
import shlex

from provisioner.probes.base import ERROR, SKIP, HostFacts, ParseError, Probe, Unavailable

OS_RELEASE = "os-release"
UNAME_R = "uname-r"
SERVICES = "services.tsv"
SERVICE_PROCESSES = "service-processes.tsv"
HOST_IDENTITY = "host-identity.txt"

SERVICE_UNITS = ("nvidia-persistenced", "nvidia-fabricmanager", "docker", "containerd", "kubelet")

_SERVICES = r"""
    if ! command -v systemctl >/dev/null 2>&1 || [ ! -d /run/systemd/system ]; then
      echo "no systemd on this host (systemctl absent or not booted with systemd)" >&2; return 200
    fi
    U="nvidia-persistenced nvidia-fabricmanager docker containerd kubelet"
    systemctl is-active $U 2>/dev/null |
      for u in $U; do read s || s=unknown; printf '%s\t%s\n' "$u" "$s"; done
"""

_SERVICE_PROCESSES = r"""
    C=$(cat /proc/[0-9]*/comm 2>/dev/null)
    for p in nvidia-persistenced:nvidia-persistenced nvidia-fabricmanager:nv-fabricmanager docker:dockerd \
             containerd:containerd kubelet:kubelet; do
      case "
$C
" in *"
${p#*:}
"*) s=running;; *) s=not-running;; esac
      printf '%s\t%s\n' "${p%%:*}" "$s"
    done
"""

_HOST_IDENTITY = r"""
    read h </proc/sys/kernel/hostname && printf 'hostname=%s\n' "$h"
    [ -r /etc/machine-id ] && read m </etc/machine-id && printf 'machine-id=%s\n' "$m"
    :
"""

PROBES: tuple[Probe, ...] = (
    Probe(
        OS_RELEASE,
        "[ -r /etc/os-release ] && rd /etc/os-release || rd /usr/lib/os-release",
        5,
        "/etc/os-release",
    ),
    Probe(UNAME_R, 'read v </proc/sys/kernel/osrelease && echo "$v"', 5, "running kernel release (uname -r)"),
    Probe(SERVICES, _SERVICES, 20, "systemctl is-active for the GPU stack's units"),
    Probe(SERVICE_PROCESSES, _SERVICE_PROCESSES, 10, "the same units judged by running process"),
    Probe(HOST_IDENTITY, _HOST_IDENTITY, 5, "hostname and /etc/machine-id"),
)


def parse_os_release(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            parts = shlex.split(value)
        except ValueError as exc:
            raise ParseError(f"os-release: bad line {line!r}") from exc
        out[key.strip()] = parts[0] if parts else ""
    if "ID" not in out:
        raise ParseError("os-release: no ID= line")
    return out


def parse_tsv_states(text: str, probe: str) -> dict[str, str]:
    states: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        unit, sep, state = line.partition("\t")
        if not sep or not unit.strip():
            raise ParseError(f"{probe} line {n}: expected unit<TAB>state: {line[:80]!r}")
        states[unit.strip()] = state.strip()
    return states


def os_release(facts: HostFacts) -> dict[str, str]:
    return facts.parsed("os", lambda: parse_os_release(facts.ok_text(OS_RELEASE)))


def services(facts: HostFacts) -> tuple[dict[str, bool], str]:
    """unit → active, and how it was judged: "systemd", or why processes were used instead."""

    def load() -> tuple[dict[str, bool], str]:
        res = facts.results.get(SERVICES)
        if res is not None and res.ok:
            states = parse_tsv_states(res.stdout, SERVICES)
            return {u: s == "active" for u, s in states.items()}, "systemd"
        procs = facts.results.get(SERVICE_PROCESSES)
        if procs is not None and procs.ok:
            states = parse_tsv_states(procs.stdout, SERVICE_PROCESSES)
            why = res.reason() if res is not None and res.collected else f"{SERVICES} not collected"
            return {u: s == "running" for u, s in states.items()}, why
        if res is None or not res.collected:
            raise Unavailable(SKIP, f"{SERVICES} was not collected")
        raise Unavailable(ERROR, f"{SERVICES}: {res.reason()}")

    return facts.parsed("services", load)


# /etc/machine-id: 32 lower-case hex digits (systemd's machine-id(5)).
_MACHINE_ID = re.compile(r"[0-9a-f]{32}")


def parse_host_identity(text: str) -> tuple[str, str | None]:
    """(hostname lower-cased, machine id or None where the host has none that reads as one)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("hostname", "machine-id") and key not in values:
            values[key] = value.strip()
    if "hostname" not in values:
        raise ParseError("host identity: no hostname line")
    machine_id = values.get("machine-id", "")
    return values["hostname"].lower()[:253], machine_id if _MACHINE_ID.fullmatch(machine_id) else None


def host_identity(facts: HostFacts) -> tuple[str, str | None]:
    return facts.parsed("identity", lambda: parse_host_identity(facts.ok_text(HOST_IDENTITY)))
