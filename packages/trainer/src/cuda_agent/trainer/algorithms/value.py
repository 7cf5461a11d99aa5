"""Critic value pretraining: GAE targets (gamma 1, lambda 0.95) from the critic's own values, MSE per token."""

from __future__ import annotations

from dataclasses import dataclass

from ..gae import compute_gae, masked_mean, token_rewards
from ..losses import value_loss
from .base import TrainAlgorithm
from .ppo import check_common


@dataclass
class ValueOptions:
    batch_size: int = 1024
    mini_batch_size: int = 1024
    micro_batch_size: int = 1
    epochs: int = 1
    critic_lr: float = 6e-6
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    lam: float = 0.95
    loss_agg: str = "token-mean"
    value_clip: float | None = None  # plain MSE (paper)
    source: str = "previous"  # previous: the trajectories the previous stage kept; collect: new rollouts
    temperature: float = 1.0


class ValuePretrain(TrainAlgorithm):
    name = "value"
    description = "Critic value pretraining on fixed trajectories: GAE targets, token-mean MSE."
    Options = ValueOptions
    trains_actor = False
    trains_critic = True
    needs_values = True
    needs_old_logp = False

    def __init__(self, options=None):
        super().__init__(options)
        check_common(self.options, "algorithm value")

    def compute_advantages(self, batch):
        o = self.options
        rewards = token_rewards(batch.scores, batch.action_mask)
        adv, ret = compute_gae(rewards, batch.values, batch.action_mask, o.gamma, o.lam)
        batch.advantages, batch.returns = adv, ret
        return {"return_mean": masked_mean(ret, batch.action_mask).item()}

    def critic_loss(self, mb, values, normalizer):
        o = self.options
        return value_loss(values, mb.values, mb.returns, mb.action_mask, o.value_clip, o.loss_agg, normalizer)
