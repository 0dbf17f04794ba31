"""progress.stage: a bar on a terminal, two lines per stage in a log (issue 33: a log got
541 KB of redraws), nothing when disabled; progress.interactive asks the stream."""
from __future__ import annotations

import io
import re

import pytest

from taylorattr.runtime import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_one_line_as_a_stage_starts_and_one_as_it_ends():
    log = io.StringIO()
    assert not progress.interactive(log)
    with progress.stage("attribute", "IG", total=6, unit="item", stream=log) as advance:
        for _ in range(6):
            advance()
    lines = log.getvalue().splitlines()
    assert lines[0] == "taylorattr attribute: IG: started, 6 items"
    assert re.fullmatch(r"taylorattr attribute: IG: done, 6 items in \d+\.\d s", lines[1])
    assert len(lines) == 2 and "\r" not in log.getvalue()


def test_a_failing_stage_adds_no_done_line_and_disabled_shows_nothing():
    log = io.StringIO()
    with pytest.raises(RuntimeError), progress.stage("evaluate", "GI", stream=log):
        raise RuntimeError("boom")
    assert log.getvalue() == "taylorattr evaluate: GI: started\n"
    quiet = io.StringIO()
    with progress.stage("evaluate", "GI", total=3, stream=quiet, enabled=False) as advance:
        advance(3)
    assert quiet.getvalue() == ""


def test_a_terminal_gets_a_bar_and_no_lines():
    term = _Terminal()
    assert progress.interactive(term)
    with progress.stage("reproduce", "stage 1/5, validation", total=4, stream=term) as advance:
        advance(4)
    out = term.getvalue()
    assert "stage 1/5, validation:" in out and "/4 [" in out  # tqdm's bar over 4 items
    assert "started" not in out and "done" not in out
