"""PPO with a critic: GAE, token-level clipped surrogate with clip-higher, value clipping."""

from __future__ import annotations

from dataclasses import dataclass

from cuda_agent.core.errors import ConfigError

from ..batch import TrainBatch
from ..gae import compute_gae, masked_mean, masked_whiten, token_rewards
from ..losses import AGGREGATIONS, actor_objective, kl_penalty, value_loss
from ..engine import all_reduce_sum
from .base import TrainAlgorithm


@dataclass
class PPOOptions:
    # sizes: trajectories collected per step, per optimiser update, per forward pass
    batch_size: int = 1024
    mini_batch_size: int = 1024  # = batch_size: one update per step (paper)
    micro_batch_size: int = 1
    epochs: int = 1
    actor_lr: float = 3e-6
    critic_lr: float = 6e-6
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    lam: float = 0.95
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None  # e.g. 3.0 bounds the loss of negative-advantage tokens
    value_clip: float | None = 0.2
    loss_agg: str = "token-mean"
    normalize_advantages: bool = True
    entropy_coef: float = 0.0  # entropy is always logged; a bonus only when > 0
    kl_coef: float = 0.0
    kl_mode: str = "none"  # none | reward (per-token penalty in the reward) | loss (a KL term in the actor loss)
    kl_estimator: str = "k1"  # k1 | k2 | k3 | abs
    critic_warmup_steps: int = 0  # steps that train only the critic
    temperature: float = 1.0  # sampling temperature the log-probs are taken at
    use_rollout_logprobs: bool = False  # True: ratios against the sampler's log-probs instead of a recompute


def check_common(o, name: str) -> None:
    if o.loss_agg not in AGGREGATIONS:
        raise ConfigError(f"{name}: loss_agg={o.loss_agg!r}; valid: {', '.join(AGGREGATIONS)}")
    if getattr(o, "kl_mode", "none") not in ("none", "reward", "loss"):
        raise ConfigError(f"{name}: kl_mode={o.kl_mode!r}; valid: none, reward, loss")
    if o.mini_batch_size <= 0 or o.batch_size <= 0 or o.micro_batch_size <= 0:
        raise ConfigError(f"{name}: batch sizes must be positive")


class PPO(TrainAlgorithm):
    name = "ppo"
    description = "PPO with a critic: GAE, clip-higher token-level surrogate, value clipping, optional KL."
    Options = PPOOptions
    trains_critic = True
    needs_values = True

    def __init__(self, options=None):
        super().__init__(options)
        check_common(self.options, "algorithm ppo")

    def compute_advantages(self, batch: TrainBatch) -> dict:
        o = self.options
        mask = batch.action_mask
        kl = None
        stats = {}
        if o.kl_mode == "reward" and batch.ref_logp is not None:
            kl = kl_penalty(batch.old_logp, batch.ref_logp, o.kl_estimator)
            stats["kl_reward"] = masked_mean(kl, mask).item()
        rewards = token_rewards(batch.scores, mask, kl, o.kl_coef)
        adv, ret = compute_gae(rewards, batch.values, mask, o.gamma, o.lam)
        if o.normalize_advantages:
            adv = masked_whiten(adv, mask, reduce=all_reduce_sum)
        batch.advantages, batch.returns = adv, ret
        stats["advantage_mean"] = masked_mean(adv, mask).item()
        stats["return_mean"] = masked_mean(ret, mask).item()
        return stats

    def actor_loss(self, mb, logp, entropy, normalizer):
        return actor_objective(self.options, mb, logp, entropy, normalizer)

    def critic_loss(self, mb, values, normalizer):
        o = self.options
        return value_loss(values, mb.values, mb.returns, mb.action_mask, o.value_clip, o.loss_agg, normalizer)
