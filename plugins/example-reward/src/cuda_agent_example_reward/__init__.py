"""A third-party cuda-agent plugin, as a worked example.

It adds a reward function ``log_speedup``: ``log2(t_compile / t)`` for a correct
candidate (0 at parity, +1 at twice as fast), a fixed penalty otherwise. Select it with
``reward.name=log_speedup``. Installed, it appears in ``cuda-agent plugins``; uninstalled,
it is gone. Nothing in cuda-agent itself changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cuda_agent.core import hookimpl
from cuda_agent.core.interfaces import RewardFunction
from cuda_agent.core.types import CandidateOutcome, RewardResult

__version__ = "0.1.0"


@dataclass
class LogSpeedupOptions:
    penalty: float = -2.0  # reward of a wrong or unbuilt candidate
    floor: float = -1.0  # lowest reward of a correct candidate


class LogSpeedupReward(RewardFunction):
    name = "log_speedup"
    description = "log2 of the speedup against torch.compile; a penalty when wrong."
    Options = LogSpeedupOptions

    def score(self, outcome: CandidateOutcome) -> RewardResult:
        p = outcome.profile
        s_eager = p.speedup_vs_eager() if p else None
        s_compile = p.speedup_vs_compile() if p else None
        if not outcome.correct:
            return RewardResult(
                value=self.options.penalty,
                reward=self.name,
                correct=False,
                failure=outcome.failure,
                speedup_vs_eager=s_eager,
                speedup_vs_compile=s_compile,
            )
        value = math.log2(s_compile) if s_compile else 0.0
        return RewardResult(
            value=max(self.options.floor, value),
            reward=self.name,
            correct=True,
            speedup_vs_eager=s_eager,
            speedup_vs_compile=s_compile,
        )


@hookimpl
def register_rewards(register):
    register(LogSpeedupReward)
