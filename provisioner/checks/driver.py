"""The NVIDIA driver: loaded and answering, the expected version, userspace matching the module."""

from __future__ import annotations

from provisioner.checks.model import ERROR, FAIL, PASS, SKIP, Finding, Unavailable, check, outcome
from provisioner.expectations import Expectations
from provisioner.probes import host, smi
from provisioner.probes.base import HostFacts
from provisioner.probes.host import HOST_FACTS
from provisioner.probes.smi import SMI_VERSION, SMI_XML


def _gpu_expected(facts: HostFacts) -> None:
    """Skip driver checks on a host with no GPU; carry on when the PCI list itself is unreadable."""
    try:
        host.require_gpu(facts)
    except Unavailable as exc:
        if exc.status == SKIP:
            raise


@check("driver.loaded", probes=(HOST_FACTS, SMI_XML), severity="critical")
def driver_loaded(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """NVIDIA kernel module loaded and nvidia-smi answers"""
    _gpu_expected(facts)
    problems: list[str] = []
    module = None
    try:
        module = host.kernel_driver(facts)
    except Unavailable as exc:
        if exc.status == ERROR:
            raise
        problems.append("NVIDIA kernel module not loaded (no /proc/driver/nvidia/version)")
        if host.nouveau_loaded(facts):
            problems.append("nouveau is loaded")
    res = smi.smi_result(facts)
    if res.rc == 127:
        problems.append("nvidia-smi not found")
    elif smi.smi_no_devices(facts):
        if module is not None:
            return [
                outcome(
                    PASS,
                    f"kernel module {module.version} loaded, but the driver sees no GPU (see gpu.count)",
                    version=module.version,
                )
            ]
    elif not res.ok:
        problems.append(f"nvidia-smi failed: {res.reason()}")
    if problems:
        return [outcome(FAIL, "; ".join(problems))]
    assert module is not None
    flavour = "open" if module.open_modules else "proprietary" if module.open_modules is False else "NVIDIA"
    return [
        outcome(
            PASS,
            f"{flavour} kernel module {module.version} loaded; nvidia-smi answers",
            version=module.version,
            open_modules=module.open_modules,
        )
    ]


def installed_version(facts: HostFacts) -> str:
    """The running driver's version: from nvidia-smi, else from the kernel module."""
    try:
        version = smi.smi_log(facts).driver_version
        if version:
            return version
    except Unavailable:
        pass
    try:
        return host.kernel_driver(facts).version
    except Unavailable as exc:
        raise Unavailable(SKIP, f"driver not loaded (see driver.loaded): {exc.reason}") from None


def version_matches(actual: str, expected: str) -> bool:
    """'580' is a branch (any 580.x); '580.159' and '580.159.04' compare component by component."""
    want = expected.split(".")
    have = actual.split(".")
    return have[: len(want)] == want


@check("driver.version", probes=(SMI_XML, HOST_FACTS), severity="high")
def driver_version(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """driver version = policy (exact, or branch like 580)"""
    _gpu_expected(facts)
    actual = installed_version(facts)
    if exp.driver_version is None:
        return [
            outcome(
                SKIP,
                f"driver {actual} installed; no expected version set (driver.version in a policy)",
                installed=actual,
            )
        ]
    kind = "branch" if "." not in exp.driver_version else "version"
    where = exp.source("driver.version")
    if version_matches(actual, exp.driver_version):
        return [
            outcome(
                PASS,
                f"driver {actual} matches expected {kind} {exp.driver_version} ({where})",
                installed=actual,
                expected=exp.driver_version,
            )
        ]
    return [
        outcome(
            FAIL,
            f"driver {actual} installed, expected {kind} {exp.driver_version} ({where})",
            installed=actual,
            expected=exp.driver_version,
        )
    ]


@check("driver.userspace_match", probes=(HOST_FACTS, SMI_VERSION, SMI_XML), severity="high")
def driver_userspace_match(facts: HostFacts, exp: Expectations) -> list[Finding]:
    """kernel module version = userspace (nvidia-smi/NVML) version"""
    _gpu_expected(facts)
    try:
        kernel = host.kernel_driver(facts).version
    except Unavailable as exc:
        if exc.status == ERROR:
            raise
        try:
            kernel = host.module_version(facts)
        except Unavailable:
            raise Unavailable(SKIP, "NVIDIA kernel module not loaded (see driver.loaded)") from None
    res = facts.results.get(SMI_XML)
    text = (res.stdout + "\n" + res.stderr) if res is not None else ""
    if "version mismatch" in text.lower():
        lib = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in text.splitlines()
                if ln.lower().startswith("nvml library version")
            ),
            "?",
        )
        return [
            outcome(
                FAIL,
                f"kernel module {kernel}, NVML library {lib}: driver/library version mismatch "
                "(reboot or reload the module after a driver upgrade)",
                kernel=kernel,
                nvml=lib,
            )
        ]
    try:
        versions = smi.smi_version(facts)
    except Unavailable as version_exc:
        # Older nvidia-smi lacks --version; NVML initialising at all means library and module agree.
        try:
            reported = smi.smi_log(facts).driver_version
        except Unavailable:
            raise Unavailable(version_exc.status, version_exc.reason) from None
        if reported and reported == kernel:
            return [outcome(PASS, f"NVML initialised against kernel module {kernel}", kernel=kernel)]
        raise Unavailable(version_exc.status, version_exc.reason) from None
    user = versions.get("nvidia-smi version", "")
    nvml = versions.get("nvml version", "")
    if user != kernel or (nvml and not version_matches(kernel, nvml)):
        return [
            outcome(
                FAIL,
                f"kernel module {kernel}, userspace nvidia-smi {user}" + (f" / NVML {nvml}" if nvml else ""),
                kernel=kernel,
                userspace=user,
                nvml=nvml,
            )
        ]
    return [outcome(PASS, f"kernel module and userspace both {kernel}", kernel=kernel, userspace=user)]
