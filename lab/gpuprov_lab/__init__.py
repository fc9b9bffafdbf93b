"""The lab: a local fleet of disposable Debian 12 hosts (systemd + sshd in privileged containers) with a
signed local package mirror that serves real Debian packages and the simulated vendor packages.

It exists to exercise the roles and checks end to end on a machine without GPUs; it is never on the
product's path to a real host. Entry points are :mod:`gpuprov_lab.fleet` (up/down/status),
:mod:`gpuprov_lab.faults` and :mod:`gpuprov_lab.inventory`.
"""

from __future__ import annotations

__version__ = "0.1.0"
