"""Typed errors raised by the library; only the CLI turns them into exit codes.

Exit codes (architecture contract): 0 all good; 1 findings or failed hosts; 2 bad input (nothing was
touched); 3 interrupted or partial.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 3


class GpuprovError(Exception):
    """Base of every error the CLI reports as one line."""

    exit_code = EXIT_FAILED


class InputError(GpuprovError):
    """Bad input: a file, key, value or host name. Raised before any host is touched.

    The message must name the file and key (or argument) at fault.
    """

    exit_code = EXIT_BAD_INPUT


class Interrupted(GpuprovError):
    """The run was interrupted (Ctrl-C); what completed has been recorded."""

    exit_code = EXIT_INTERRUPTED
