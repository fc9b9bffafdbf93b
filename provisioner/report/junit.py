"""JUnit XML for CI systems: one testsuite per host, one testcase per finding."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from provisioner.checks.model import ERROR, FAIL, SKIP, WARN
from provisioner.report.model import Report


def render_junit(report: Report, *, fail_on: str = "warn") -> str:
    """A warn is a <failure type="warn"> when warnings fail the run, else a passing case with output."""
    root = ET.Element("testsuites", name="gpuprov verify")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for h in report.hosts:
        suite = ET.SubElement(root, "testsuite", name=h.host)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if h.address:
            suite.set("hostname", h.address)
        for f in h.findings:
            name = f.id if f.gpu is None else f"{f.id}[gpu {f.gpu}]"
            case = ET.SubElement(suite, "testcase", classname=f"gpuprov.{h.host}", name=name, time="0")
            counts["tests"] += 1
            message = f"{f.status}: {f.detail}"
            if f.status == FAIL or (f.status == WARN and fail_on == "warn"):
                node = ET.SubElement(case, "failure", type=f.status, message=message[:500])
                node.text = f"severity {f.severity}: {f.detail}"
                counts["failures"] += 1
            elif f.status == ERROR:
                node = ET.SubElement(case, "error", type=ERROR, message=message[:500])
                node.text = f.detail
                counts["errors"] += 1
            elif f.status == SKIP:
                ET.SubElement(case, "skipped", message=f.detail[:500])
                counts["skipped"] += 1
            elif f.status == WARN:
                ET.SubElement(case, "system-out").text = f"warn (severity {f.severity}): {f.detail}"
        close_suite(suite, counts, totals, h.duration_s)
    return close_document(root, totals, report.duration_s)


def close_suite(suite: ET.Element, counts: dict[str, int], totals: dict[str, int], duration_s: float) -> None:
    """A host's suite gets its time and counts; the document's totals add them up."""
    suite.set("time", f"{duration_s:.3f}")
    for key, value in counts.items():
        suite.set(key, str(value))
        totals[key] += value


def close_document(root: ET.Element, totals: dict[str, int], duration_s: float | None = None) -> str:
    """The document's totals (and time, when known), indented, with its XML declaration."""
    for key, value in totals.items():
        root.set(key, str(value))
    if duration_s is not None:
        root.set("time", f"{duration_s:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
