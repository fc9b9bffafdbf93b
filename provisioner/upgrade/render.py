"""How the CLI shows an upgrade: the dry-run plan, or the run's summary (provisioner.rollout.render)."""

from __future__ import annotations

import json
import sys
from typing import Any

from provisioner.rollout.render import render_summary
from provisioner.upgrade.plan import render_plan


def render_dry_run(result: Any, output_format: str) -> None:
    """A dry run's plan: JSON, or the plan as text; warnings on stderr."""
    if output_format == "json":
        sys.stdout.write(json.dumps(result.plan_doc, indent=2) + "\n")
    else:
        opts = result.options
        sys.stdout.write(
            render_plan(
                result.plan,
                drain=opts.drain,
                reboot_allowed=opts.reboot_allowed,
                max_fail=opts.max_fail,
                install_version=opts.install_version,
            )
        )
    for line in result.warnings:
        sys.stderr.write(line + "\n")


def show(result: Any, output_format: str) -> int:
    """Print an UpgradeResult the way the CLI does; returns its exit code."""
    if result.summary is not None:
        render_summary(result.summary, output_format)
    else:
        render_dry_run(result, output_format)
    return int(result.exit_code)
