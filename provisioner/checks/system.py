"""The software around the GPU: OS, CUDA toolkit, held packages, services, container runtimes."""

from __future__ import annotations

import fnmatch

from provisioner.checks.model import FAIL, PASS, SKIP, WARN, Finding, Unavailable, check, outcome
from provisioner.expectations import Expectations
from provisioner.probes import container, cuda, host, packages, system
from provisioner.probes.base import HostFacts
from provisioner.probes.container import CONTAINERD_DUMP, DOCKER_DAEMON
from provisioner.probes.cuda import NVCC_VERSION
from provisioner.probes.host import HOST_FACTS
from provisioner.probes.kubernetes import KUBE_NODE
from provisioner.probes.packages import APT_HOLDS, PACKAGES
from provisioner.probes.system import OS_RELEASE, SERVICE_PROCESSES, SERVICES


@check("os.supported", probes=(OS_RELEASE,), severity="high")
def os_supported(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """OS and version in the supported set"""
    osr = system.os_release(facts)
    ident = osr.get("ID", "").lower()
    version = osr.get("VERSION_ID", "")
    pretty = osr.get("PRETTY_NAME") or f"{ident} {version}"
    name = f"{ident} {version}".strip()
    for allowed in exp.os_supported:
        a_id, _, a_ver = allowed.partition(" ")
        if ident == a_id and (version == a_ver or version.startswith(a_ver + ".")):
            return [outcome(PASS, f"{pretty} is supported", os=name)]
    return [
        outcome(
            FAIL,
            f"{pretty} ({name}) is not supported (supported: {', '.join(exp.os_supported)}; "
            f"{exp.source('os.supported')})",
            os=name,
        )
    ]


@check("cuda.version", probes=(NVCC_VERSION, PACKAGES), severity="medium")
def cuda_version(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """CUDA toolkit at /usr/local/cuda present and = policy"""
    toolkit = cuda.toolkit(facts)
    want = exp.cuda_version
    if toolkit is None:
        if want is not None:
            return [
                outcome(
                    FAIL,
                    f"no CUDA toolkit at /usr/local/cuda (no nvcc), expected {want} "
                    f"({exp.source('cuda.version')})",
                    expected=want,
                )
            ]
        try:
            toolkits = sorted(p for p in packages.installed(facts) if p.startswith("cuda-toolkit-"))
        except Unavailable:
            toolkits = []
        if toolkits:
            return [outcome(FAIL, f"{', '.join(toolkits)} installed but /usr/local/cuda/bin/nvcc is missing")]
        return [outcome(SKIP, "no CUDA toolkit at /usr/local/cuda, and none expected (cuda.version)")]
    if want is None:
        return [
            outcome(
                PASS,
                f"CUDA {toolkit.release} (nvcc {toolkit.version}) at /usr/local/cuda; no expected "
                "version set",
                release=toolkit.release,
            )
        ]
    have = toolkit.version if want.count(".") >= 2 else toolkit.release
    if have.split(".")[: len(want.split("."))] == want.split("."):
        return [
            outcome(
                PASS,
                f"CUDA {toolkit.release} (nvcc {toolkit.version}) at /usr/local/cuda, as expected "
                f"({exp.source('cuda.version')})",
                release=toolkit.release,
            )
        ]
    return [
        outcome(
            FAIL,
            f"CUDA {toolkit.release} (nvcc {toolkit.version}) at /usr/local/cuda, expected {want} "
            f"({exp.source('cuda.version')})",
            release=toolkit.release,
            expected=want,
        )
    ]


def _declared(exp: Expectations, key: str, none_expected: str) -> tuple[list[str], str]:
    """What the policy lists for `key` and where it says so; skip (`none_expected`) when the list is
    empty."""
    wanted = list(getattr(exp, key.replace(".", "_")))
    where = exp.source(key)
    if not wanted:
        raise Unavailable(SKIP, f"{none_expected} ({where})")
    return wanted, where


# Kubernetes' own install guide holds these; the kubernetes role pins and holds them.
_K8S_HELD = ("kubeadm", "kubelet", "kubectl")


@check("packages.held", probes=(APT_HOLDS, PACKAGES), severity="medium")
def packages_held(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """packages that must not move on apt upgrade are held"""
    holds = packages.holds(facts)
    installed = packages.installed(facts)
    if exp.packages_held is None:
        # A Kubernetes node (kubelet installed) keeps its Kubernetes packages held, as Kubernetes'
        # install guide and the kubernetes role do; nothing else can be assumed.
        wanted = tuple(p for p in _K8S_HELD if p in installed) if "kubelet" in installed else ()
        where = "default: Kubernetes packages on a node"
        if not wanted:
            held = ", ".join(sorted(holds)) or "none"
            return [outcome(SKIP, f"no expected holds (packages.held in a policy); held now: {held}")]
    else:
        wanted, where = _declared(exp, "packages.held", "no package expected held")
    not_held: list[str] = []
    absent: list[str] = []
    for pattern in wanted:
        matches = sorted(p for p in installed if fnmatch.fnmatchcase(p, pattern))
        if not matches:
            absent.append(pattern)
            continue
        not_held += [p for p in matches if p not in holds]
    findings: list[Finding] = []
    if not_held:
        findings.append(outcome(FAIL, f"not held: {', '.join(not_held)} ({where})", not_held=not_held))
    if absent:
        findings.append(
            outcome(WARN, f"expected held but not installed: {', '.join(absent)} ({where})", absent=absent)
        )
    return findings or [outcome(PASS, f"held: {', '.join(wanted)} ({where})")]


def _expected_services(facts: HostFacts) -> tuple[list[str], str]:
    installed = packages.installed(facts)
    wanted: list[str] = []
    if "nvidia-persistenced" in installed or any(p.startswith("nvidia-compute-utils-") for p in installed):
        wanted.append("nvidia-persistenced")
    try:
        nvswitch = bool(host.nvswitches(facts))
    except Unavailable:
        nvswitch = False
    if nvswitch or any(p.startswith("nvidia-fabricmanager") for p in installed):
        wanted.append("nvidia-fabricmanager")
    if installed & {"docker.io", "docker-ce"}:
        wanted.append("docker")
    if installed & {"containerd", "containerd.io"}:
        wanted.append("containerd")
    kube = facts.results.get(KUBE_NODE)
    if "kubelet" in installed and kube is not None and kube.collected and not kube.not_applicable:
        wanted.append("kubelet")
    return wanted, "default: units of installed packages" + (", NVSwitch present" if nvswitch else "")


@check(
    "services.active", probes=(SERVICES, SERVICE_PROCESSES, PACKAGES, HOST_FACTS, KUBE_NODE), severity="high"
)
def services_active(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """expected services active"""
    if exp.services_active is None:
        wanted, where = _expected_services(facts)
        if not wanted:
            return [
                outcome(
                    SKIP,
                    "no GPU-stack service installed from packages; none expected "
                    "(services.active in a policy)",
                )
            ]
    else:
        wanted, where = _declared(exp, "services.active", "no service expected active")
    states, how = system.services(facts)
    inactive = [u for u in wanted if not states.get(u, False)]
    judged = "" if how == "systemd" else f"; judged by running processes ({how})"
    if inactive:
        return [outcome(FAIL, f"not active: {', '.join(inactive)} ({where}){judged}", inactive=inactive)]
    return [outcome(PASS, f"active: {', '.join(wanted)} ({where}){judged}")]


@check("container_toolkit.runtime", probes=(DOCKER_DAEMON, CONTAINERD_DUMP, PACKAGES), severity="high")
def container_toolkit_runtime(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """nvidia runtime configured for docker / containerd"""
    installed = packages.installed(facts)
    if exp.container_toolkit_runtime is None:
        if "nvidia-container-toolkit" not in installed:
            return [
                outcome(
                    SKIP,
                    "nvidia-container-toolkit not installed; no runtime expected "
                    "(container_toolkit.runtime in a policy)",
                )
            ]
        engines = []
        if installed & {"docker.io", "docker-ce"}:
            engines.append("docker")
        if "kubelet" in installed and installed & {"containerd", "containerd.io"}:
            engines.append("containerd")
        where = "default: engines installed"
        if not engines:
            return [
                outcome(
                    SKIP,
                    "nvidia-container-toolkit installed but no docker or Kubernetes containerd to configure",
                )
            ]
    else:
        engines, where = _declared(
            exp, "container_toolkit.runtime", "no container engine expected to have the nvidia runtime"
        )
    missing: list[str] = []
    configured: list[str] = []
    for engine in engines:
        if engine == "docker":
            daemon = container.docker_daemon(facts)
            runtimes = (daemon or {}).get("runtimes")
            if isinstance(runtimes, dict) and "nvidia" in runtimes:
                configured.append("docker (/etc/docker/daemon.json)")
            else:
                missing.append(
                    "docker: no 'nvidia' in runtimes of /etc/docker/daemon.json"
                    + (" (file absent)" if daemon is None else "")
                )
        else:
            # What containerd really uses (config.toml and what it imports, merged as containerd merges
            # them), not every file under /etc/containerd.
            cfg = container.containerd_config(facts)
            if cfg is None:
                missing.append("containerd: not installed (no containerd to ask)")
                continue
            runtime = cfg.runtimes.get("nvidia")
            if runtime is None:
                missing.append(
                    "containerd: `containerd config dump` has no nvidia runtime"
                    + (f" (config.toml imports {', '.join(cfg.imports)})" if cfg.imports else "")
                )
            elif not runtime.binary.endswith("/nvidia-container-runtime"):
                missing.append(
                    f"containerd: the nvidia runtime's BinaryName is {runtime.binary!r}, "
                    "not nvidia-container-runtime"
                )
            else:
                how = "CDI on" if cfg.enable_cdi else "CDI off"
                configured.append(f"containerd (default runtime {cfg.default_runtime or 'runc'}, {how})")
    if missing:
        return [outcome(FAIL, "; ".join(missing) + f" ({where})", missing=missing)]
    return [outcome(PASS, f"nvidia runtime configured: {', '.join(configured)} ({where})")]
