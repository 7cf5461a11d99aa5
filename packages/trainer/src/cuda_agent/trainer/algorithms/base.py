"""What every trainer algorithm provides; the trainer loop does the mechanics.

An algorithm says which models it trains (``trains_actor``, ``trains_critic``), whether
it needs a critic's values or a reference policy, filters the collected trajectories
(``select``), fills ``batch.advantages``/``batch.returns`` (``compute_advantages``) and
builds the per-micro-batch losses (``actor_loss``, ``critic_loss``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from cuda_agent.core.interfaces import Algorithm
from cuda_agent.core.types import Trajectory

from ..batch import TrainBatch


class TrainAlgorithm(Algorithm):
    trains_actor: ClassVar[bool] = True
    trains_critic: ClassVar[bool] = False
    needs_values: ClassVar[bool] = False
    needs_old_logp: ClassVar[bool] = True

    @property
    def needs_reference(self) -> bool:
        return bool(getattr(self.options, "kl_coef", 0.0)) and getattr(self.options, "kl_mode", "none") != "none"

    # sizes and rates every algorithm's options carry
    def opt(self, name: str, default: Any = None) -> Any:
        return getattr(self.options, name, default)

    def select(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict]:
        """Which trajectories to train on (all by default) and stats about the choice."""
        return trajectories, {}

    def compute_advantages(self, batch: TrainBatch) -> dict:
        return {}

    def actor_loss(self, mb: TrainBatch, logp: torch.Tensor, entropy: torch.Tensor | None,
                   normalizer: float) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def critic_loss(self, mb: TrainBatch, values: torch.Tensor, normalizer: float) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError
