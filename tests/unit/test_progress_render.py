"""Bootstrap's progress and check-mode output: the live table a terminal sees, the plain lines a pipe
sees, and the diffs check mode reports per host and task."""

from __future__ import annotations

import io
import time

from provisioner.playbookverb.render import LiveProgress, PlainProgress, change_lines, make_progress
from provisioner.runner import Event, _diff_text


def _live() -> tuple[LiveProgress, io.StringIO]:
    """The live display on a 140-column terminal, and what it has written."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=140, color_system=None, highlight=False)
    return LiveProgress(console=console, refresh_per_second=20), buf


def test_the_live_table_shows_each_hosts_stage_task_and_time() -> None:
    live, buf = _live()
    with live:
        live(Event("play_start", None, "nvidia_driver", None))
        live(Event("runner_on_start", "gpu1", "nvidia_driver", "Install the driver packages"))
        live(Event("runner_on_start", "gpu2", "nvidia_driver", "Unload the modules"))
        live.rows["gpu1"].task_started -= 42  # the install has been running for 42 s
        time.sleep(0.2)  # a few refreshes of the live display
        table = _render_table(live)
        assert "gpu1" in table and "Install the driver packages" in table and "42s" in table
        assert "gpu2" in table and "Unload the modules" in table
        assert "bootstrap: nvidia_driver" in table
        live(Event("runner_on_ok", "gpu1", "nvidia_driver", "Install the driver packages", True))
        live(Event("runner_on_failed", "gpu2", "nvidia_driver", "Unload the modules", False, "in use"))
        # A failed host gets its line at once, above the table.
        assert "gpu2" in buf.getvalue() and "FAILED: Unload the modules: in use" in buf.getvalue()
        live(Event("play_start", None, "cuda_toolkit", None))
        live(Event("runner_on_start", "gpu1", "cuda_toolkit", "Install CUDA"))
    out = buf.getvalue()
    # The stage's finished line for gpu1, and its final line when the run ends; none for failed gpu2.
    assert "gpu1                 nvidia_driver              changed 1" in out
    assert "gpu1                 finished: 1 change(s)" in out
    assert "gpu2                 finished" not in out
    assert "Install the driver packages" in out  # drawn by the live display while it ran


def _render_table(live: LiveProgress) -> str:
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=140, color_system=None).print(live.table())
    return buf.getvalue()


def test_host_words_in_the_live_display_are_escaped() -> None:
    live, buf = _live()
    with live:
        live(Event("play_start", None, "docker", None))
        live(Event("runner_on_start", "gpu1", "docker", "task \x1b]0;owned\x07 [bold]x[/bold]"))
        table = _render_table(live)
        live(Event("runner_on_failed", "gpu1", "docker", "t", False, "boom\x1b[2J"))
    assert "\x1b]0;owned" not in table and "[bold]x[/bold]" in table
    assert "\x1b[2J" not in buf.getvalue().replace("\x1b[2K", "")


def test_plain_lines_when_stdout_is_not_a_terminal_or_the_output_is_json() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(make_progress("table", stdout=io.StringIO()), PlainProgress)
    assert isinstance(make_progress("json", stdout=Tty()), PlainProgress)
    assert isinstance(make_progress("table", stdout=Tty()), LiveProgress)


def test_check_mode_reports_the_diff_of_each_task_that_would_change() -> None:
    res = {
        "changed": True,
        "diff": [
            {
                "before": '{\n  "runtimes": {}\n}\n',
                "after": '{\n  "runtimes": {"nvidia": {}}\n}\n',
                "before_header": "/etc/docker/daemon.json",
                "after_header": "/etc/docker/daemon.json",
            },
            {"prepared": "The following NEW packages will be installed:\n  cuda-toolkit-13-0"},
        ],
    }
    diff = _diff_text(res)
    assert "--- /etc/docker/daemon.json" in diff and '+  "runtimes": {"nvidia": {}}' in diff
    assert "cuda-toolkit-13-0" in diff
    lines = change_lines(
        {
            "gpu1": [{"stage": "docker", "task": "Merge daemon.json", "diff": diff}],
            "gpu2": [],
            "gpu3": [{"stage": "docker", "task": "t", "diff": "+evil \x1b[2J"}],
        }
    )
    assert lines[0] == "gpu1: 1 task(s) would change"
    assert lines[1] == "  docker: Merge daemon.json"
    assert '    +  "runtimes": {"nvidia": {}}' in lines
    assert "gpu2: nothing would change" in lines
    assert all("\x1b" not in line for line in lines)


def test_a_long_diff_is_cut() -> None:
    res = {"diff": {"before": "", "after": "".join(f"line {n}\n" for n in range(1000))}}
    text = _diff_text(res)
    assert text.count("\n") == 200 and text.endswith("more lines in the run record)")
