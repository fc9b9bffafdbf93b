"""The lab's own error: a GpuprovError, so the product's CLI reports it as one line with exit code 1."""

from __future__ import annotations

from provisioner.errors import EXIT_FAILED, GpuprovError


class LabError(GpuprovError):
    """The local lab could not be built, started or stopped."""

    exit_code = EXIT_FAILED
