"""Property-based: every check over every probe's output, where that output is a real capture mutated
at random (cut, spliced with arbitrary text, control characters, markup), never raises and always
answers each check. Bounded: a few hundred examples, well under a minute."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import verify_fixtures as vf

from provisioner.checks import CHECK_IDS, HostFacts, evaluate
from provisioner.expectations import Expectations
from provisioner.probes.base import ParseError
from provisioner.probes.script import parse_script_output
from provisioner.probes.smi import parse_nvidia_smi_xml

REAL = vf.h200_probes()
NAMES = sorted(REAL)
# Text a host might send: anything printable, control characters, XML and rich markup, huge numbers.
NOISE = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["<", "</gpu>", "<!ENTITY x 'y'>", "&x;", "\x1b[2J", "\x00", "[/red]", "9" * 30]),
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, tuple[int | None, str, str]]:
    probes = dict(REAL)
    for name in draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True)):
        rc, text, err = probes[name]
        cut = draw(st.integers(0, len(text)))
        how = draw(st.sampled_from(["truncate", "splice", "replace-all"]))
        if how == "truncate":
            text = text[:cut]
        elif how == "splice":
            text = text[:cut] + draw(NOISE) + text[cut + draw(st.integers(0, 50)) :]
        else:
            text = draw(NOISE)
        probes[name] = (rc, text, err)
    return probes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_checks_never_crash_on_mutated_real_output(probes: dict[str, tuple[int | None, str, str]]) -> None:
    findings = evaluate(HostFacts("h200", vf.results(probes)), Expectations())
    assert {f.id for f in findings} == set(CHECK_IDS)
    assert all(f.status in ("pass", "warn", "fail", "error", "skip") for f in findings)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_the_xml_parser_only_ever_raises_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse_nvidia_smi_xml(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=500), st.text(max_size=200))
def test_the_probe_framing_never_crashes(stdout: str, stderr: str) -> None:
    token = "0123456789abcdef"
    text = f"@@{token} B os-release\n{stdout}\n@@{token} E os-release 0 1.0 2.0\n"
    results = parse_script_output(text, token, ["os-release", "uname-r"], stderr)
    assert set(results) == {"os-release", "uname-r"}
