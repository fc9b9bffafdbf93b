"""Taking a lab host off its network and putting it back (the ``unreachable`` fault)."""

from __future__ import annotations

from gpuprov_lab.engine import Docker
from gpuprov_lab.plan import PlannedHost
from gpuprov_lab.state import LabState


def _attached(docker: Docker, st: LabState, h: PlannedHost) -> bool:
    """Whether the host's container is on the lab network."""
    networks = docker("inspect", "--format", "{{json .NetworkSettings.Networks}}", st.paths.container(h.name))
    return f'"{st.paths.network}"' in networks.stdout


def detach(st: LabState, h: PlannedHost) -> None:
    docker = Docker()
    if _attached(docker, st, h):
        name = st.paths.container(h.name)
        docker("network", "disconnect", "--force", st.paths.network, name, what=f"detach {h.name}")


def reattach(st: LabState, h: PlannedHost) -> None:
    docker = Docker()
    name = st.paths.container(h.name)
    if not _attached(docker, st, h):
        connect = ["network", "connect", "--ip", h.ip, "--alias", h.name, st.paths.network, name]
        docker(*connect, what=f"reattach {h.name}")
    # The default route left with the interface; put it back as the host's boot unit does.
    route = ["ip", "route", "replace", "default", "via", st.gateway]
    docker("exec", name, *route, what=f"default route on {h.name}")
