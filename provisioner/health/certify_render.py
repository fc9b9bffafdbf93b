"""`gpuprov certify`'s output: a table (a line per host, its reasons and warnings below), JSON, or JUnit XML
(one testsuite per host, one testcase per thing judged, and one per level asked for). Every text that
came from a host is made safe first (provisioner.hosttext); JSON is ASCII."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from provisioner.checks.model import ERROR, FAIL, SKIP, WARN
from provisioner.health.certify import LEVELS, CertResult
from provisioner.health.certify_run import CertRun
from provisioner.hosttext import safe_text, short_safe_text
from provisioner.report.junit import close_document, close_suite


def to_json(run: CertRun) -> str:
    doc = {"hosts": [r.to_json() for r in run.results], "notes": run.notes}
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


def _verdict(r: CertResult) -> str:
    if r.certified:
        return "certified"
    return "unreadable" if r.error is not None else "not certified"


def to_table(run: CertRun) -> str:
    hosts = [short_safe_text(r.host, 60) for r in run.results]
    width = max([len("HOST"), *map(len, hosts)])
    lines = [f"{'HOST':<{width}}  {'LEVEL':<9}  {'REACHED':<9}  RESULT"]
    for name, r in zip(hosts, run.results, strict=True):
        lines.append(f"{name:<{width}}  {r.level:<9}  {r.reached or '-':<9}  {_verdict(r)}")
        models = ", ".join(f"GPU {g['index']}: {g.get('model') or 'unknown model'}" for g in r.gpus)
        if models:
            lines.append(f"    GPUs: {short_safe_text(models, 300)}")
        for reason in r.reasons:
            lines.append(f"    reason: {short_safe_text(reason, 1000)}")  # whole: it names its sources
        for warning in r.warnings:
            lines.append(f"    warning: {short_safe_text(warning, 300)}")
        if r.label:
            lines.append(f"    node: {short_safe_text(r.label, 300)}")
    for note in run.notes:
        lines.append(f"note: {note}")
    certified = sum(r.certified for r in run.results)
    lines.append("")
    lines.append(
        f"{len(run.results)} host(s): {certified} certified, {len(run.results) - certified} not certified."
    )
    return "\n".join(lines) + "\n"


def to_junit(run: CertRun) -> str:
    root = ET.Element("testsuites", name="gpuprov certify")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for r in run.results:
        host = safe_text(r.host)
        suite = ET.SubElement(root, "testsuite", name=host)
        counts = dict.fromkeys(totals, 0)
        cases: list[tuple[str, str, str]] = [(p.name, p.status, p.detail) for p in r.parts]
        if r.error is not None:
            cases.insert(0, ("host", ERROR, f"host not read: {r.error}"))
        for i, t in enumerate(LEVELS[: LEVELS.index(r.level) + 1]):
            reached = r.reached is not None and LEVELS.index(r.reached) >= i
            below = i > 0 and (r.reached is None or LEVELS.index(r.reached) < i - 1)
            why = "; ".join(x for x in r.missing if x.startswith(f"{t}:"))
            why = why or (f"not reached: level {LEVELS[i - 1]} was not" if below else "see the failing cases")
            cases.append((f"level {t}", "pass" if reached else FAIL, "reached" if reached else why))
        for name, status, detail in cases:
            case = ET.SubElement(
                suite, "testcase", classname=f"gpuprov.certify.{host}", name=safe_text(name), time="0"
            )
            counts["tests"] += 1
            text = safe_text(detail)
            if status in (FAIL, WARN):
                ET.SubElement(case, "failure", type=status, message=f"{status}: {text}"[:500]).text = text
                counts["failures"] += 1
            elif status == ERROR:
                ET.SubElement(case, "error", type=ERROR, message=text[:500]).text = text
                counts["errors"] += 1
            elif status == SKIP:
                ET.SubElement(case, "skipped", message=f"not run: {text}"[:500])
                counts["skipped"] += 1
        if r.warnings:
            ET.SubElement(suite, "system-out").text = "\n".join(safe_text(w) for w in r.warnings)
        close_suite(suite, counts, totals, r.duration_s)
    return close_document(root, totals)
