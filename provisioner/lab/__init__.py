"""The lab: a local fleet of disposable Debian 12 hosts (systemd + sshd in privileged containers) with a
signed local package mirror that serves real Debian packages and the simulated vendor packages.

It exists to exercise the roles and checks end to end on a machine without GPUs; it is never on the
product's path to a real host. Entry points are :mod:`provisioner.lab.fleet` (up/down/status),
:mod:`provisioner.lab.faults` and :mod:`provisioner.lab.inventory`.
"""

from __future__ import annotations
