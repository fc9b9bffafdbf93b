"""`run_bootstrap`: the verb. The stages chosen by --only/--skip (and the hosts --retry-failed leaves)
make a run of playbooks/site.yml, which goes as every playbook verb's does (provisioner.playbookverb)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from provisioner import records
from provisioner.content import PLAYBOOKS_DIR
from provisioner.errors import EXIT_OK, InputError
from provisioner.playbookverb.run import (
    FACTS_PLAY,
    PlaybookVerb,
    RunControls,
    StageRequest,
    VerbResult,
    choose_and_run,
    need_inventory,
)
from provisioner.stages import STAGE_NAMES, STAGES, select_stages

SITE_PLAYBOOK = PLAYBOOKS_DIR / "site.yml"


def _check_ids(stages: list[str], host: Any) -> list[str]:
    ids: list[str] = []
    for stage in STAGES:
        if stage.name in stages:
            ids.extend(stage.check_ids_for(host.groups))
    return list(dict.fromkeys(ids))


def progress_filter(only: list[str], skip: list[str]) -> set[str] | None:
    """The plays whose progress to show (None: all). Plays of stages left out by --only/--skip still
    start (Ansible validates every role's arguments, a task tagged `always`); only their failures show."""
    plays = [s for s in select_stages(only, skip) if s in STAGE_NAMES]
    return None if len(plays) == len(STAGE_NAMES) else {FACTS_PLAY, *plays}


def _retry_limit(inventory: Path, limit: str | None) -> str | None:
    record = records.latest("bootstrap", str(inventory.resolve()))
    if record is None:
        raise InputError(f"--retry-failed: no earlier bootstrap run recorded for {inventory}")
    doc = json.loads((record / "summary.json").read_text())
    failed = [h["host"] for h in doc.get("hosts", []) if h.get("status") not in ("done",)]
    if not failed:
        return None
    names = ",".join(failed)
    return f"{names}:&{limit}" if limit else names


def run_bootstrap(request: StageRequest, *, retry_failed: bool, controls: RunControls) -> VerbResult:
    """The verb. Bad input raises InputError before any host is touched; `controls` are run.py's."""
    inventory = need_inventory(request.inventory)
    chosen = select_stages(request.only, request.skip)
    plays = [s for s in chosen if s in STAGE_NAMES]
    spec = PlaybookVerb(
        verb="bootstrap",
        playbook=SITE_PLAYBOOK,
        stages=chosen,
        plays=plays,
        tags=None if len(plays) == len(STAGE_NAMES) else plays,
        checks=lambda h: _check_ids(chosen, h),
        expects=chosen,
    )
    inv = spec.open_inventory(inventory)
    limit = request.limit
    if retry_failed:
        limit = _retry_limit(inventory, limit)
        if limit is None:
            if controls.notify is not None:
                controls.notify("bootstrap: the last run left no failed host; nothing to retry")
            return VerbResult(EXIT_OK)
    return choose_and_run(spec, inv, inventory, limit, controls)
