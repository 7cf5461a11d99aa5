"""EpisodeFactory: CUDA-environment episodes driven step by step (what the TRL/OpenEnv/verl adapters use),
on the CPU backend with real g++ builds, verification and the milestone reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.core.agent import EpisodeOver
from cuda_agent.core.errors import ConfigError, TaskError
from cuda_agent.core.types import Task
from cuda_agent.sandbox.workspace.episodes import EpisodeFactory, EpisodeOptions

EXAMPLE = Path(__file__).resolve().parents[3] / "tools" / "template" / "gxx" / "examples" / "model.py"
COPY = "cp -r examples/kernels examples/model_new.py ."


def test_an_episode_is_judged_and_its_workspace_removed(tmp_path):
    scored = []
    opts = EpisodeOptions(backend="cpu", max_turns=2, tools=["bash", "read"], workdir=str(tmp_path))
    with EpisodeFactory([Task(id="axpby", source="test", code=EXAMPLE.read_text())], options=opts,
                        on_end=lambda ep, traj: scored.append(traj.reward)) as factory:
        with pytest.raises(TaskError, match="unknown task 'axpbi'.*did you mean 'axpby'"):
            factory.open("axpbi")
        ep = factory.open("axpby")
        assert ep.workspace.is_dir() and ep.stepper.schemas[0]["function"]["name"] == "bash"
        r = ep.stepper.step("", [{"name": "bash", "arguments": {"command": COPY}}])
        assert r.results[0].ok and not r.done
        r = ep.stepper.step("", [{"name": "compile_everything", "arguments": {}}])
        assert r.done and r.finish_reason == "max_turns" and "unknown tool" in r.results[0].content
        with pytest.raises(EpisodeOver):
            ep.stepper.step("again")
        traj = ep.finish()
        cand = traj.candidates[-1]  # the copied example, scored at the end
        assert cand.outcome.verify is not None and cand.outcome.verify.ok, cand.outcome.verify
        assert traj.reward is not None and scored == [traj.reward]
        assert ep.finish() is traj and len(scored) == 1
        ws = ep.workspace
        ep.close()
        assert not ws.exists()
        left_open = factory.open("axpby")
        left_ws = left_open.workspace
    assert not left_ws.exists()  # the factory closed the episode still open


def test_no_tasks_is_a_config_error():
    with pytest.raises(ConfigError, match="no tasks"):
        EpisodeFactory([], options=EpisodeOptions(backend="cpu"))
