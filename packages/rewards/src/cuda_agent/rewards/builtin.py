"""Built-in reward plugin."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.core.hookspecs import hookimpl

from .functions import MilestoneReward, SpeedupReward


@hookimpl
def register_rewards(register):
    register(MilestoneReward)
    register(SpeedupReward)


@hookimpl
def register_config_fragments(register):
    register("rewards", Path(__file__).parent / "configs" / "rewards.yaml")
