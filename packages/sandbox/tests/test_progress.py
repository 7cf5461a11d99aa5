"""The progress line of ``cuda-agent optimize``/``demo``: turn numbers and activity while a
long tool call runs."""

from __future__ import annotations

import io
import time

from cuda_agent.sandbox.workspace.agent_text import reuse_note
from cuda_agent.sandbox.workspace.optimize import Progress


def test_a_long_tool_call_shows_activity():
    out = io.StringIO()
    bar = Progress(150, stream=out, every=0.1)
    bar({"type": "turn", "turn": 5})
    bar({"type": "tool_start", "turn": 5, "tool": "bash", "detail": "python tools/profile.py"})
    time.sleep(0.45)
    bar({"type": "tool", "turn": 5, "tool": "bash", "ok": True})
    quiet_from = len(out.getvalue())
    time.sleep(0.25)
    bar.close()
    lines = out.getvalue().splitlines()
    still = [ln for ln in lines if "still running: bash `python tools/profile.py`" in ln]
    assert len(still) >= 2, lines
    assert all(ln.startswith("turn 5 (6 of 150) |") for ln in lines), lines
    assert lines[-1].startswith("turn 5 (6 of 150) | last tool: bash")
    assert len(out.getvalue()) == quiet_from  # nothing more once the call returned


def test_disabled_progress_prints_nothing():
    out = io.StringIO()
    bar = Progress(10, stream=out, enabled=False, every=0.05)
    bar({"type": "tool_start", "turn": 0, "tool": "bash", "detail": "sleep 1"})
    time.sleep(0.15)
    bar.close()
    assert out.getvalue() == ""


def test_reuse_note_names_what_was_reused():
    assert reuse_note("profile", []) == ""
    assert "result reused" in reuse_note("verify", ["verify"])
    assert "result reused" in reuse_note("profile", ["verify", "profile"])
    assert "the timing ran now" in reuse_note("profile", ["verify"])
