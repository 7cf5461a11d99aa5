"""``cuda-agent eval`` when the infrastructure fails, through the real CLI: a policy endpoint
that answers 500 is no result of the model. Such tasks are marked infrastructure errors (not
scored), the run stops non-zero with one line past eval.max_infra_error_share, every retry is
in log.jsonl, and --resume redoes exactly those tasks. --resume refuses a folder that is not
an eval run."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuda_agent.core.agent.testing import ScriptedChatServer, reply
from cuda_agent.core.plugins import get_plugin_manager

pytestmark = pytest.mark.skipif("kernelbench" not in get_plugin_manager().components("dataset"),
                                reason="the kernelbench dataset plugin (cuda-agent-datasets) is not installed")

TASK = textwrap.dedent("""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, a, b):
            return a {op} b


    def get_inputs():
        return [torch.randn(256), torch.randn(256)]


    def get_init_inputs():
        return []
""")
DOWN = {"status": 500, "body": "upstream down"}


@pytest.fixture()
def kb(tmp_path):
    level = tmp_path / "kb" / "level1"
    level.mkdir(parents=True)
    (level / "1_Add.py").write_text(TASK.format(op="+"))
    (level / "2_Sub.py").write_text(TASK.format(op="-"))
    return tmp_path


def _eval(*args, timeout=300):
    env = dict(os.environ, CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run([sys.executable, "-m", "cuda_agent.core.cli", "eval", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)


def _overrides(tmp: Path, url: str) -> list[str]:
    return ["eval.dataset.name=kernelbench", f"eval.dataset.options.root={tmp / 'kb'}", "policy.name=openai",
            "policy.options.model=m", f"policy.options.base_url={url}", "policy.options.max_retries=2",
            "policy.options.backoff=0.01", "executor.name=cpu", "backend=cpu", f"run.output_dir={tmp / 'runs'}",
            "eval.workers=1", "eval.progress=false", "eval.profile.options.baselines=false", "logging.console=false",
            "environment.evaluate_final=false"]


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "log.jsonl").read_text().splitlines()]


def _results(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines() if x.strip()]


def test_endpoint_down_stops_the_run_and_resume_redoes_its_tasks(kb):
    with ScriptedChatServer([], final=DOWN) as server:
        r = _eval(*_overrides(kb, server.base_url))
    assert r.returncode == 2, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: eval stopped: 1 of 1 episodes finished in this session failed for "
                           "infrastructure reasons (more than eval.max_infra_error_share=0.25)"), last
    assert "HTTP 500" in last and "gave up after 3 attempts" in last and "cuda-agent eval --resume" in last
    (run_dir,) = (kb / "runs").iterdir()
    events = _events(run_dir)
    assert [(e["attempt"], e["attempts"]) for e in events if e["event"] == "policy.retry"] == [(1, 3), (2, 3)]
    assert events[-1]["event"] == "run.end" and events[-1]["status"] == "infra_error"
    (first,) = _results(run_dir)
    assert first["failure"] == "infra_error" and not first["correct"]
    # the endpoint is back: --resume redoes the task the outage ended, then the rest
    with ScriptedChatServer([], final=reply("Nothing to change.\nDONE")) as server:
        r = _eval("--resume", run_dir, f"policy.options.base_url={server.base_url}")
    assert r.returncode == 0, r.stderr[-3000:]
    tasks = [e for e in _events(run_dir) if e["event"] == "eval.tasks"]
    assert (tasks[-1]["finished"], tasks[-1]["todo"]) == (0, 2)
    latest = {x["task_id"]: x["failure"] for x in _results(run_dir)}
    assert latest == {"L1/1_Add": "missing", "L1/2_Sub": "missing"}  # now the model's own (empty) answers
    report = json.loads((run_dir / "results.json").read_text())
    assert report["metrics"]["overall"]["n"] == 2 and report["info"]["infra_errors"] == 0


def test_infra_errors_below_the_share_are_left_out_of_the_scores(kb):
    """One of two tasks hits the outage; with eval.max_infra_error_share=0.5 the run ends
    (exit 0) and scores only the other, naming the one not scored."""
    script = [reply("Nothing to change.\nDONE")]  # the first task's episode; every later request fails
    with ScriptedChatServer(script, final=DOWN) as server:
        r = _eval(*_overrides(kb, server.base_url), "eval.max_infra_error_share=0.5")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 task(s) not scored: the infrastructure failed (HTTP 500" in r.stdout
    (run_dir,) = (kb / "runs").iterdir()
    report = json.loads((run_dir / "results.json").read_text())
    assert report["metrics"]["overall"]["n"] == 1 and [t["task_id"] for t in report["tasks"]] == ["L1/1_Add"]
    assert report["info"]["infra_errors"] == 1 and report["not_scored"][0]["task_id"] == "L1/2_Sub"
    assert "not scored (infrastructure errors, redone by --resume): 1" in (run_dir / "report.md").read_text()
    assert _events(run_dir)[-1]["status"] == "ok"


def test_resume_refuses_a_folder_that_is_not_an_eval_run(tmp_path):
    from cuda_agent.core.config import compose
    from cuda_agent.core.run import Run

    cfg = compose([], [f"run.output_dir={tmp_path}", "logging.console=false"])
    with Run(cfg, command="train") as run:
        pass
    r = _eval("--resume", run.dir)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: --resume {run.dir}: not an eval run folder (a 'train' run); give the folder of an earlier "
        "cuda-agent eval run"]
    r = _eval("--resume", tmp_path / "nothing")
    assert r.returncode == 2 and "not a run folder (no config.yaml)" in r.stderr
