"""The cuda-agent CLI and run folders, through real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from cuda_agent.core import runlog
from cuda_agent.core.config import compose
from cuda_agent.core.run import Run


def cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "cuda_agent.core.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_plugins_lists_builtins():
    r = cli("plugins")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "VERSION", "DISTRIBUTION", "PLUGIN"]
    rows = {tuple(line.split()[:2]) for line in lines[1:] if line.strip()}
    assert ("reward", "milestone") in rows
    assert ("tracker", "jsonl") in rows


def test_config_typo_is_one_line_error():
    r = cli("config", "show", "agent.max_turn=3")
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr
    assert err[0].startswith("error: unknown config key 'agent.max_turn'")
    assert "Traceback" not in r.stderr


def test_config_show_prints_resolved(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("agent:\n  max_turns: 12\n")
    r = cli("config", "show", str(f), "run.seed=5")
    assert r.returncode == 0, r.stderr
    assert "max_turns: 12" in r.stdout and "seed: 5" in r.stdout


def test_run_folder_saves_config_versions_and_json_log(tmp_path):
    cfg = compose([], [f"run.output_dir={tmp_path}", "logging.console=false"])
    with Run(cfg, command="unit") as run:
        with runlog.bound(task_id="t1", trajectory_id="traj-1", turn=3):
            run.log.info("tool.call", tool="bash")
    saved = yaml.safe_load((run.dir / "config.yaml").read_text())
    assert saved["agent"]["max_turns"] == 150 and saved["run"]["output_dir"] == str(tmp_path)
    meta = json.loads((run.dir / "plugins.json").read_text())
    assert {p["name"] for p in meta["plugins"]} >= {"core", "rewards"}
    events = [json.loads(line) for line in (run.dir / "log.jsonl").read_text().splitlines()]
    call = next(e for e in events if e["event"] == "tool.call")
    assert call["run_id"] == run.id
    assert call["task_id"] == "t1" and call["trajectory_id"] == "traj-1" and call["turn"] == 3
    assert events[-1]["event"] == "run.end" and events[-1]["status"] == "ok"


def test_run_records_failure_status(tmp_path):
    cfg = compose([], [f"run.output_dir={tmp_path}", "logging.console=false"])
    try:
        with Run(cfg, command="unit") as run:
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    events = [json.loads(line) for line in (run.dir / "log.jsonl").read_text().splitlines()]
    assert events[-1]["status"] == "failed"


def test_session_seconds_add_up_every_session_of_a_run_folder(tmp_path):
    """A resumed run knows how long its earlier sessions ran, a killed one (no run.end) up to
    its last log line; lines that are not JSON events are skipped."""
    from cuda_agent.core.run import session_seconds

    log = tmp_path / "log.jsonl"
    lines = [
        {"event": "run.start", "timestamp": "2026-01-01T00:00:00Z"},
        {"event": "eval.task", "timestamp": "2026-01-01T00:01:40Z"},  # killed here: 100 s
        {"event": "run.start", "timestamp": "2026-01-01T05:00:00Z"},
        {"event": "run.end", "timestamp": "2026-01-01T05:00:20.5Z"},  # 20.5 s
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\nnot json\n" + "\n".join(json.dumps(x) for x in lines[2:]))
    assert session_seconds(log) == pytest.approx(120.5)
    assert session_seconds(tmp_path / "missing.jsonl") == 0.0
    cfg = compose([], [f"run.output_dir={tmp_path}", "logging.console=false", f"run.resume={tmp_path}"])
    (tmp_path / "config.yaml").write_text("{}")
    assert Run(cfg, command="unit").earlier_seconds == pytest.approx(120.5)


CLAIM = r"""
import os, sys, time
from pathlib import Path
from cuda_agent.core.cli import main
from cuda_agent.core.config import compose
from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.run import Run

folder, gate = Path(sys.argv[1]), Path(sys.argv[2])
cfg = compose([], ["logging.console=false"])
run = Run(cfg, command="unit")
run.dir, run.id = folder, folder.name  # as `optimize --out FOLDER` does
(gate / f"ready-{os.getpid()}").touch()
while not (gate / "go").exists():
    time.sleep(0.0005)
try:
    with run:
        for i in range(20):
            run.log.info("work", owner=os.getpid(), i=i)
            time.sleep(0.01)
except CudaAgentError as exc:
    print(f"error: {exc.one_line()}", file=sys.stderr)
    sys.exit(2)
"""


def test_two_runs_started_on_one_folder_at_once(tmp_path):
    """Both processes find the folder free and enter at the same moment: one claims it, the
    other stops with a one-line error before writing anything (its lines never reach the
    winner's log.jsonl)."""
    folder, gate = tmp_path / "out", tmp_path / "gate"
    gate.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", CLAIM, str(folder), str(gate)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    deadline = time.time() + 60
    while len(list(gate.glob("ready-*"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert not folder.exists()  # neither has touched it yet: the next step is a real race
    (gate / "go").touch()
    outs = [p.communicate(timeout=60) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = next(err for p, (_, err) in zip(procs, outs) if p.returncode == 2)
    assert loser.strip().count("\n") == 0 and "already holds a run" in loser, loser
    winner = next(p.pid for p in procs if p.returncode == 0)
    events = [json.loads(x) for x in (folder / "log.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("run.start") == 1
    assert {e["owner"] for e in events if e["event"] == "work"} == {winner}
    assert len([e for e in events if e["event"] == "work"]) == 20
