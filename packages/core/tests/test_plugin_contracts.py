"""The plugin contracts, checked with the ``plugintester`` harness: a reward a plugin registers
scores the episodes of eval, optimize and training; a tracker a plugin registers receives
every lifecycle event of each command; ``check_tool_call`` is asked of the run's plugin
manager; the harness records every hook call."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cuda_agent.core.hookspecs import hookimpl
from cuda_agent.core.interfaces import RewardFunction, Tracker
from cuda_agent.core.types import RewardResult



@dataclass
class FlatOptions:
    value: float = 0.25


class FlatReward(RewardFunction):
    name = "flat_test_reward"
    description = "The same reward for every outcome (a test's)."
    Options = FlatOptions

    def score(self, outcome):
        return RewardResult(value=self.options.value, reward=self.name, correct=outcome.correct)


@dataclass
class NoOptions:
    pass


class RecordingTracker(Tracker):
    """Keeps every event it is handed, in order, in ``RecordingTracker.events``."""

    name = "recording_test_tracker"
    description = "Records the events it receives (a test's)."
    Options = NoOptions
    events: list[tuple] = []

    def __init__(self, options=None, run_dir=None):
        super().__init__(options)
        self.events.append(("init", str(run_dir)))

    def run_started(self, run):
        self.events.append(("run_started", run.command))

    def stage_started(self, stage):
        self.events.append(("stage_started", stage.name))

    def log(self, step, metrics):
        self.events.append(("log", step, dict(metrics)))

    def trajectory_ended(self, trajectory):
        self.events.append(("trajectory_ended", trajectory.reward.value if trajectory.reward else None))

    def run_ended(self, status):
        self.events.append(("run_ended", status))

    def close(self):
        self.events.append(("close",))


class ContractPlugin:
    @hookimpl
    def register_rewards(self, register):
        register(FlatReward)

    @hookimpl
    def register_trackers(self, register):
        register(RecordingTracker)


class Guard:
    """Refuses every read of model.py."""

    def __init__(self):
        self.asked: list[str] = []

    @hookimpl
    def check_tool_call(self, tool_name, arguments, workspace):
        self.asked.append(tool_name)
        return "reading model.py is not allowed here" if tool_name == "read" else None


@pytest.fixture
def tester(plugintester):
    RecordingTracker.events = []
    plugintester.register(ContractPlugin(), "contract-test")
    return plugintester


TRACK = "trackers=[{name: recording_test_tracker}]"
REWARD = "reward={name: flat_test_reward, options: {value: 0.25}}"


def kinds(events):
    return [e[0] for e in events]


def test_eval_uses_the_plugin_reward_and_tells_the_tracker(tester):
    res = tester.eval(REWARD, TRACK)
    assert res.exit_code == 0, res.output
    (traj,) = res.hook_kwargs("on_trajectory_end", "trajectory")
    assert traj.reward.reward == "flat_test_reward" and traj.reward.value == 0.25
    assert res.lifecycle() == ["on_run_start", "on_trajectory_end", "on_step_end", "on_run_end"]
    (metrics,) = res.hook_kwargs("on_step_end", "metrics")
    assert metrics["eval/n"] == 1
    assert kinds(RecordingTracker.events) == ["init", "run_started", "trajectory_ended", "log", "run_ended", "close"]
    assert RecordingTracker.events[1] == ("run_started", "eval") and RecordingTracker.events[2][1] == 0.25
    assert RecordingTracker.events[-2] == ("run_ended", "ok")
    assert RecordingTracker.events[0][1] == str(res.run_dir)  # built in the run folder


def test_optimize_uses_the_plugin_reward_and_tells_the_tracker(tester):
    res = tester.optimize(REWARD, TRACK)
    assert res.exit_code == 0, res.output
    (traj,) = res.hook_kwargs("on_trajectory_end", "trajectory")
    assert traj.reward.reward == "flat_test_reward" and traj.reward.value == 0.25
    assert res.lifecycle() == ["on_run_start", "on_trajectory_end", "on_run_end"]
    assert kinds(RecordingTracker.events) == ["init", "run_started", "trajectory_ended", "run_ended", "close"]
    assert RecordingTracker.events[1] == ("run_started", "optimize")


def test_training_in_cuda_workspaces_uses_the_plugin_reward(tester):
    res = tester.train(REWARD, TRACK, environment="cuda")
    assert res.exit_code == 0, res.output
    trajs = res.hook_kwargs("on_trajectory_end", "trajectory")
    assert len(trajs) == 2 and {t.reward.reward for t in trajs} == {"flat_test_reward"}
    (metrics,) = res.hook_kwargs("on_step_end", "metrics")
    assert metrics["reward/mean"] == pytest.approx(0.25)


def test_tracker_receives_every_training_event(tester):
    res = tester.train(TRACK, environment="toy", steps=2)
    assert res.exit_code == 0, res.output
    assert res.lifecycle() == (["on_run_start", "on_stage_start"] + ["on_trajectory_end"] * 2 + ["on_step_end"]
                               + ["on_trajectory_end"] * 2 + ["on_step_end", "on_run_end"])
    events = RecordingTracker.events
    assert kinds(events) == (["init", "run_started", "stage_started"] + ["trajectory_ended"] * 2 + ["log"]
                             + ["trajectory_ended"] * 2 + ["log", "run_ended", "close"])
    assert events[2] == ("stage_started", "ppo") and [e[1] for e in events if e[0] == "log"] == [0, 1]
    logged = [e[2] for e in events if e[0] == "log"]
    assert logged == res.hook_kwargs("on_step_end", "metrics")  # what the hook carried, unchanged
    # the step checkpointing answered the same hook: both steps were saved
    saved = sorted(p.name for p in (res.run_dir / "stages" / "00-ppo" / "checkpoints").iterdir())
    assert saved == ["step-000000", "step-000001"]


def test_failed_run_ends_the_trackers_with_its_status(tester):
    res = tester.eval(TRACK, "policy.options.path=/nonexistent/script.json")
    assert res.exit_code == 2 and "recording not found" in res.output
    assert res.hook_kwargs("on_run_end", "status") == ["failed"]
    assert RecordingTracker.events[1:] == [("run_started", "eval"), ("run_ended", "failed"), ("close",)]


def test_check_tool_call_is_asked_of_the_runs_plugin_manager(tester):
    guard = Guard()
    tester.register(guard, "guard")
    res = tester.optimize()
    assert res.exit_code == 0, res.output
    (traj,) = res.hook_kwargs("on_trajectory_end", "trajectory")
    result = traj.turns[0].tool_results[0]
    assert not result.ok and result.content == "refused: reading model.py is not allowed here"
    assert guard.asked == ["read"] and [c.tool_name for c in res.getcalls("check_tool_call")] == ["read"]
    # the process-wide plugin manager has no such guard: the same episode outside this run reads the file
    from cuda_agent.core.plugins import get_plugin_manager

    assert "guard" not in {p.name for p in get_plugin_manager().plugins()}


def test_recorder_holds_registration_and_lifecycle_calls(tester):
    res = tester.optimize()
    names = [c.name for c in res.calls]
    assert "register_config_fragments" in names and names.index("on_run_start") < names.index("on_run_end")
    assert res.run_dir is not None and (res.run_dir / "report.json").exists()
