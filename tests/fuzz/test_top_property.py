"""Property-based: `gpuprov top`'s parser over the real H200's answer with fields replaced by anything a
host could print (other scripts' digits, huge and non-finite numbers, signs, exponents, control
characters), over arbitrary text and over arbitrary stream bytes. It raises nothing but its own error,
and every number it yields is finite and in the range a real GPU reports. Bounded: a few hundred
examples per property, seconds in all."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner import top as T
from provisioner.probes.kernel_log import XID_MAX

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "h200-ubuntu2404"


def real_h200_cells() -> list[str]:
    """Top's fields as the real H200 printed them (driver 580.159.04), with units."""
    q = [c.strip() for c in (HOSTS / "nvidia-smi-query-gpu.csv").read_text().splitlines()[1].split(",")]
    tel = [c.strip() for c in (HOSTS / "nvidia-smi-telemetry.csv").read_text().splitlines()[1].split(",")]
    return [q[0], q[1], q[2], q[3], tel[0], tel[1], tel[2], tel[3], tel[4], tel[5], q[18], tel[6]]


REAL = real_h200_cells()
FIELDS = {name: i for i, name in enumerate(T.QUERY_FIELDS)}
DIGITS = "0123456789²³¹٠١٢٣٧٩०१२३৭０１９⁰₀𝟘𝟙"
# What a host may print where a number belongs.
NUMBERISH = st.one_of(
    st.text(alphabet=DIGITS + "-+.eE, ", max_size=30),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["inf", "-inf", "nan", "Infinity", "1e999", "9" * 400, "9" * 5000, "[N/A]", "N/A", ""]),
    st.text(max_size=20),
)


def check_gpu(g: T.GpuSample) -> None:
    assert 0 <= g.index <= T.MAX_GPU_INDEX
    readings = {
        "utilization.gpu": g.util_gpu,
        "utilization.memory": g.util_mem,
        "memory.used": g.mem_used_mib,
        "memory.total": g.mem_total_mib,
        "temperature.gpu": g.temp_c,
        "power.draw": g.power_w,
        "power.limit": g.power_limit_w,
    }
    for name, value in readings.items():
        if value is not None:
            lo, hi = T.READING_RANGES[name]
            assert math.isfinite(value) and lo <= value <= hi, (name, value)
    assert all(0 <= x <= XID_MAX for x in g.xids)
    if g.error is None and g.mem_used_mib is not None and g.mem_total_mib is not None:
        assert g.mem_used_mib <= g.mem_total_mib


@st.composite
def mutated_answer(draw: st.DrawFn) -> str:
    lines = []
    for index in range(draw(st.integers(1, 3))):
        cells = list(REAL)
        cells[0] = str(index)
        for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=4, unique=True)):
            cells[FIELDS[name]] = draw(NUMBERISH)
        lines.append(", ".join(cells))
    return "\n".join(lines)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_answer())
def test_a_mutated_real_answer_yields_only_plausible_numbers_or_errors(text: str) -> None:
    with contextlib.suppress(T.TopParseError):
        for g in T.read_query(text):
            check_gpu(g)
    with contextlib.suppress(T.TopParseError):
        for g in T.parse_query(text):
            assert g.error is None
            check_gpu(g)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_arbitrary_text_raises_only_the_parsers_own_error(text: str) -> None:
    with contextlib.suppress(T.TopParseError):
        for g in T.read_query(text):
            check_gpu(g)


XID_PREFIX = "[ 9.0] NVRM: Xid (PCI:0000:00:06): "


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(NUMBERISH.map(lambda x: XID_PREFIX + x + ", pid=1"), st.text(max_size=80)), max_size=6)
)
def test_xid_lines_yield_plausible_xids_or_that_gpus_error(log: list[str]) -> None:
    (g,) = T.attach_xids(T.parse_query(", ".join(REAL)), log)
    check_gpu(g)


TOKEN = "0123abcd0123abcd"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=200),
            mutated_answer().map(lambda t: f"@@{TOKEN} S\n{t}\n@@{TOKEN} E 0\n".encode()),
            NUMBERISH.map(lambda rc: f"@@{TOKEN} S\n{', '.join(REAL)}\n@@{TOKEN} E {rc}\n".encode()),
        ),
        max_size=5,
    )
)
def test_the_stream_only_ever_refuses_with_its_own_error_and_samples_never_raise(chunks: list[bytes]) -> None:
    hs = T.HostStream(TOKEN)
    with contextlib.suppress(T.StreamError):
        for chunk in chunks:
            hs.feed(chunk)
    sample = hs.sample("h")
    assert (sample.error is None) == bool(sample.gpus)
    for g in sample.gpus:
        check_gpu(g)
    values = [row.rsplit(" ", 1)[1] for row in T.to_prometheus([sample]).splitlines() if row[:1] != "#"]
    assert all(math.isfinite(float(v)) for v in values), values
