"""Registration through the plugin hooks, the TensorBoard tracker, RFT filters."""

import random

import pytest

from cuda_agent.core.plugins import PluginManager
from cuda_agent.core.types import RewardResult, ToolCall, Trajectory, Turn
from cuda_agent.trainer.algorithms import RFT, has_loop, has_malformed_call


def test_components_registered():
    pm = PluginManager()
    algos = pm.components("algorithm")
    assert {"ppo", "grpo", "rft", "value"} <= set(algos)
    assert "tensorboard" in pm.components("tracker")
    ppo = pm.create("algorithm", {"name": "ppo", "options": {"clip_high": 0.3}})
    assert ppo.options.clip_low == 0.2 and ppo.options.clip_high == 0.3


def test_environments_registered_through_the_hook():
    from cuda_agent.core.config import compose
    from cuda_agent.core.errors import ConfigError

    pm = PluginManager()
    envs = pm.components("environment")
    assert {"toy", "cuda"} <= set(envs) and envs["toy"].plugin.name == "trainer"
    toy = pm.create("environment", {"name": "toy", "options": {"num_targets": 2}})
    assert toy.makes_tasks and {t.name for t in toy.tasks(20, random.Random(0))} <= {"apple", "river"}
    cfg = compose([], ["trainer.environment={name: toy, options: {num_targets: 3}}"], pm=pm)
    assert cfg.trainer.environment.options.turn_penalty == 0.0  # filled from the plugin's Options
    with pytest.raises(ConfigError, match=r"unknown environment 'tyo' at trainer.environment; did you mean 'toy'"):
        compose([], ["trainer.environment.name=tyo"], pm=pm)
    with pytest.raises(ConfigError, match="unknown option trainer.environment.options.environment.evaluate_fnal"):
        pm.create("environment", {"name": "cuda", "options": {"environment": {"evaluate_fnal": False}}})


def test_tensorboard_tracker_writes_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    pm = PluginManager()
    t = pm.create("tracker", {"name": "tensorboard"}, run_dir=tmp_path)
    t.log(0, {"reward/mean": 0.5, "note": "x"})
    t.log(1, {"reward/mean": 0.75})
    t.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    vals = [e.value for e in acc.Scalars("reward/mean")]
    assert vals == pytest.approx([0.5, 0.75])


def _traj(calls_per_turn, reward=1.0, texts=None):
    t = Trajectory(id="t", task_id="x")
    for i, calls in enumerate(calls_per_turn):
        t.turns.append(Turn(index=i, assistant=(texts or [""] * len(calls_per_turn))[i], tool_calls=calls))
    t.reward = RewardResult(value=reward, reward="r")
    return t


def test_rft_filters():
    a = ToolCall(id="1", name="bash", arguments={"command": "ls"})
    b = ToolCall(id="2", name="bash", arguments={"command": "python tools/verify.py"})
    bad = ToolCall(id="3", name="", raw_arguments="{oops", error="not JSON")
    good = _traj([[a], [b], [a]])
    loop = _traj([[a], [a], [a]])
    text_loop = _traj([[], [], []], texts=["same", "same", "same"])
    malformed = _traj([[a], [bad]])
    low = _traj([[a]], reward=-1.0)
    zero = _traj([[b]], reward=0.0)
    assert not has_loop(good) and has_loop(loop) and has_loop(text_loop)
    assert has_malformed_call(malformed) and not has_malformed_call(good)
    rft = RFT(RFT.Options())
    kept, stats = rft.select([good, loop, text_loop, malformed, low, zero])
    assert kept == [good]
    assert stats["rft/dropped_loop"] == 2 and stats["rft/dropped_malformed"] == 1
    assert stats["rft/dropped_low_reward"] == 2 and stats["rft/keep_rate"] == pytest.approx(1 / 6)
