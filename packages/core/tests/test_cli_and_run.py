"""The cuda-agent CLI and run folders, through real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys

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
