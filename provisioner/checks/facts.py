"""Parsed probe results for one host, parsed once, with the reasons a check cannot use them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from provisioner import probes as P
from provisioner.checks.model import ERROR, SKIP, Unavailable

T = TypeVar("T")
_MISSING = object()


class HostFacts:
    """What the probes said about one host. Accessors raise Unavailable(status, reason)."""

    def __init__(self, host: str, results: Mapping[str, P.ProbeResult]) -> None:
        self.host = host
        self.results = dict(results)
        self._cache: dict[str, Any] = {}

    # -- raw

    def result(self, name: str) -> P.ProbeResult:
        res = self.results.get(name)
        if res is None:
            raise Unavailable(SKIP, f"{name} was not collected")
        if res.rc is None:
            # Cut short, or a snapshot file refused (a link, a device, too big): an error, never a skip.
            bad = "cut short" in res.note or "ended early" in res.note or res.note.startswith("refused:")
            raise Unavailable(ERROR if bad else SKIP, f"{name}: {res.reason()}")
        return res

    def parsed(self, key: str, fn: Callable[[], T]) -> T:
        cached = self._cache.get(key, _MISSING)
        if cached is _MISSING:
            try:
                cached = fn()
            except Unavailable as exc:
                cached = exc
            except P.ParseError as exc:
                cached = Unavailable(ERROR, str(exc))
            self._cache[key] = cached
        if isinstance(cached, Unavailable):
            raise cached
        return cached  # type: ignore[return-value]

    def ok_text(self, name: str) -> str:
        """stdout of a probe that must have succeeded; otherwise error with its reason."""
        res = self.result(name)
        if res.not_applicable:
            raise Unavailable(SKIP, f"{name}: {res.reason()}")
        if not res.ok:
            raise Unavailable(ERROR, f"{name}: {res.reason()}")
        return res.stdout

    # -- parsed facts

    def os_release(self) -> dict[str, str]:
        return self.parsed("os", lambda: P.parse_os_release(self.ok_text("os-release")))

    def legacy(self) -> bool:
        """A snapshot made before host-facts.json: its PCI, module, driver and Secure Boot facts are in
        the older files (probes.LEGACY_PROBES)."""
        return P.HOST_FACTS not in self.results and "pci-devices.txt" in self.results

    def host_facts(self) -> P.HostFactsDoc:
        return self.parsed("hostfacts", lambda: P.parse_host_facts(self.ok_text(P.HOST_FACTS)))

    def pci(self) -> list[P.PciDevice]:
        if self.legacy():
            return self.parsed("pci", lambda: P.parse_pci_devices(self.ok_text("pci-devices.txt")))
        return self.host_facts().pci

    def nouveau_loaded(self) -> bool | None:
        """Whether nouveau is loaded; None when the module list cannot be read."""
        if self.legacy():
            mods = self.results.get("modules.txt")
            if mods is None or not mods.ok:
                return None
            return any(line.startswith("nouveau ") for line in mods.stdout.splitlines())
        try:
            return "nouveau" in self.host_facts().modules
        except Unavailable:
            return None

    def pci_gpus(self) -> list[P.PciDevice]:
        return P.nvidia_gpus(self.pci())

    def nvswitches(self) -> list[P.PciDevice]:
        return [d for d in self.pci() if d.is_nvswitch]

    def require_gpu(self) -> list[P.PciDevice]:
        """The PCI GPUs, or skip when there are none (GPU checks do not apply)."""
        gpus = self.pci_gpus()
        if not gpus:
            raise Unavailable(SKIP, "no NVIDIA GPU on the PCI bus")
        return gpus

    def smi_result(self) -> P.ProbeResult:
        return self.result("nvidia-smi-q.xml")

    def smi_no_devices(self) -> bool:
        """nvidia-smi ran against a loaded driver that sees no GPU at all."""
        res = self.results.get("nvidia-smi-q.xml")
        return bool(res and res.rc not in (None, 0) and "No devices were found" in (res.stdout + res.stderr))

    def smi(self) -> P.SmiLog:
        """nvidia-smi -q -x, parsed. Skips (pointing at driver.loaded) when the driver is not working."""

        def load() -> P.SmiLog:
            res = self.smi_result()
            if self.smi_no_devices():
                return P.SmiLog(None, None, 0, [])
            if res.rc == 127:
                raise Unavailable(SKIP, "nvidia-smi not found: driver not installed (see driver.loaded)")
            if not res.ok:
                raise Unavailable(SKIP, f"nvidia-smi failed (see driver.loaded): {res.reason()}")
            return P.parse_nvidia_smi_xml(res.stdout)

        return self.parsed("smi", load)

    def smi_gpus(self) -> list[P.SmiGpu]:
        """GPUs as the driver sees them; skip when the host has none or the driver sees none."""
        try:
            self.require_gpu()
        except Unavailable as exc:
            if exc.status == SKIP:
                raise
            # PCI list unreadable: still judge what the driver reports.
        log = self.smi()
        if not log.gpus:
            raise Unavailable(SKIP, "the driver sees no GPU (see gpu.count)")
        return log.gpus

    def kernel_driver(self) -> P.KernelDriver:
        def load() -> P.KernelDriver:
            if self.legacy():
                res = self.result("proc-driver-nvidia-version")
                if not res.ok:
                    raise Unavailable(SKIP, "no /proc/driver/nvidia/version: NVIDIA kernel module not loaded")
                return P.parse_driver_proc(res.stdout)
            driver = self.host_facts().driver
            if driver is None:
                raise Unavailable(SKIP, "no /proc/driver/nvidia/version: NVIDIA kernel module not loaded")
            return driver

        return self.parsed("kdriver", load)

    def module_version(self) -> str:
        def load() -> str:
            if self.legacy():
                return P.parse_module_version(self.ok_text("sys-module-nvidia-version"))
            version = self.host_facts().module_version
            if not version:
                raise Unavailable(SKIP, "no /sys/module/nvidia/version: NVIDIA kernel module not loaded")
            return version

        return self.parsed("modver", load)

    def smi_version(self) -> dict[str, str]:
        return self.parsed("smiver", lambda: P.parse_smi_version(self.ok_text("nvidia-smi-version.txt")))

    def xids(self) -> list[P.XidEvent]:
        def load() -> list[P.XidEvent]:
            res = self.result("kernel-log.txt")
            if not res.ok:
                raise Unavailable(ERROR, f"kernel log unreadable (needs root): {res.reason()}")
            return P.parse_kernel_log(res.stdout)

        return self.parsed("xids", load)

    def cuda(self) -> P.CudaToolkit | None:
        """The toolkit at /usr/local/cuda, or None when there is none."""

        def load() -> P.CudaToolkit | None:
            res = self.result("nvcc-version.txt")
            if res.rc == 127 or (not res.ok and "No such file" in res.stderr):
                return None
            if not res.ok:
                raise Unavailable(ERROR, f"nvcc-version.txt: {res.reason()}")
            return P.parse_nvcc(res.stdout)

        return self.parsed("cuda", load)

    def packages(self) -> dict[str, P.Package]:
        return self.parsed("pkgs", lambda: P.parse_packages(self.ok_text("packages.tsv")))

    def installed(self) -> set[str]:
        return {name for name, pkg in self.packages().items() if pkg.installed}

    def holds(self) -> set[str]:
        return self.parsed("holds", lambda: P.parse_holds(self.ok_text("apt-holds.txt")))

    def services(self) -> tuple[dict[str, bool], str]:
        """unit → active, and how it was judged: "systemd", or why processes were used instead."""

        def load() -> tuple[dict[str, bool], str]:
            res = self.results.get("services.tsv")
            if res is not None and res.ok:
                states = P.parse_tsv_states(res.stdout, "services.tsv")
                return {u: s == "active" for u, s in states.items()}, "systemd"
            procs = self.results.get("service-processes.tsv")
            if procs is not None and procs.ok:
                states = P.parse_tsv_states(procs.stdout, "service-processes.tsv")
                why = res.reason() if res is not None and res.collected else "services.tsv not collected"
                return {u: s == "running" for u, s in states.items()}, why
            if res is None or not res.collected:
                raise Unavailable(SKIP, "services.tsv was not collected")
            raise Unavailable(ERROR, f"services.tsv: {res.reason()}")

        return self.parsed("services", load)

    def optional_json(self, name: str) -> dict[str, Any] | None:
        """A JSON config file: None when absent (not applicable), error when unreadable."""

        def load() -> dict[str, Any] | None:
            res = self.result(name)
            if res.not_applicable:
                return None
            if not res.ok:
                raise Unavailable(ERROR, f"{name}: {res.reason()}")
            return P.parse_json_object(res.stdout, name)

        return self.parsed(name, load)

    def optional_toml(self, name: str) -> dict[str, Any] | None:
        def load() -> dict[str, Any] | None:
            res = self.result(name)
            if res.not_applicable:
                return None
            if not res.ok:
                raise Unavailable(ERROR, f"{name}: {res.reason()}")
            return P.parse_toml(res.stdout, name)

        return self.parsed(name, load)

    def containerd_config(self) -> P.ContainerdConfig | None:
        """What `containerd config dump` says containerd uses; None where containerd is not installed."""

        def load() -> P.ContainerdConfig | None:
            res = self.result("containerd-config-dump.toml")
            if res.not_applicable:
                return None
            if not res.ok:
                raise Unavailable(ERROR, f"containerd-config-dump.toml: {res.reason()}")
            return P.parse_containerd_dump(res.stdout)

        return self.parsed("containerd-config-dump.toml", load)

    def gpu_index_for_pci(self, pci: str) -> tuple[int | None, str]:
        """Map a kernel-log PCI address (0000:3b:00, no function) to the GPU index and full bus id."""
        wanted = P.normalize_bus_id(pci)
        lists: list[list[str]] = []
        for source in (
            lambda: [g.bus_id for g in self.smi().gpus],
            lambda: [d.address for d in self.pci_gpus()],
        ):
            try:
                lists.append(source())
            except Unavailable:
                continue
        for candidates in lists:
            for index, bus in enumerate(candidates):
                if bus == wanted or bus.startswith(wanted + "."):
                    return index, bus
        return None, wanted
