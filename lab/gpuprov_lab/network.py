"""Taking a lab host off its network and putting it back (the ``unreachable`` fault)."""

from __future__ import annotations

from gpuprov_lab.engine import Docker
from gpuprov_lab.plan import PlannedHost
from gpuprov_lab.state import LabState


def detach(st: LabState, h: PlannedHost) -> None:
    docker = Docker()
    name = st.paths.container(h.name)
    attached = docker("inspect", "--format", "{{json .NetworkSettings.Networks}}", name).stdout
    if f'"{st.paths.network}"' in attached:
        docker("network", "disconnect", "--force", st.paths.network, name, what=f"detach {h.name}")


def reattach(st: LabState, h: PlannedHost) -> None:
    docker = Docker()
    name = st.paths.container(h.name)
    attached = docker("inspect", "--format", "{{json .NetworkSettings.Networks}}", name).stdout
    if f'"{st.paths.network}"' not in attached:
        docker(
            "network",
            "connect",
            "--ip",
            h.ip,
            "--alias",
            h.name,
            st.paths.network,
            name,
            what=f"reattach {h.name}",
        )
    # The default route left with the interface; put it back as the host's boot unit does.
    docker(
        "exec",
        name,
        "ip",
        "route",
        "replace",
        "default",
        "via",
        st.gateway,
        what=f"default route on {h.name}",
    )
