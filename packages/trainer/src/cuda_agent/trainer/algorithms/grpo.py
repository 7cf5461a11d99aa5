"""GRPO: group-relative advantages (several samples per task), no critic."""

from __future__ import annotations

from dataclasses import dataclass

from ..gae import group_advantages, masked_mean
from ..losses import actor_objective, kl_penalty
from .base import TrainAlgorithm
from .ppo import check_common


@dataclass
class GRPOOptions:
    batch_size: int = 1024  # trajectories per step (= tasks x group_size)
    group_size: int = 8  # samples per task
    mini_batch_size: int = 1024
    micro_batch_size: int = 1
    epochs: int = 1
    actor_lr: float = 1e-6
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    loss_agg: str = "token-mean"
    normalize_std: bool = True
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_mode: str = "none"  # none | loss | reward (reward: subtracted from the score as the mean token KL)
    kl_estimator: str = "k3"
    temperature: float = 1.0
    use_rollout_logprobs: bool = False


class GRPO(TrainAlgorithm):
    name = "grpo"
    description = "Group-relative policy optimisation: score minus the group mean (over std), no critic."
    Options = GRPOOptions

    def __init__(self, options=None):
        super().__init__(options)
        check_common(self.options, "algorithm grpo")

    def compute_advantages(self, batch):
        o = self.options
        scores = batch.scores
        stats = {}
        if o.kl_mode == "reward" and o.kl_coef and batch.ref_logp is not None:
            kl = kl_penalty(batch.old_logp, batch.ref_logp, o.kl_estimator)
            per_seq = masked_mean(kl, batch.action_mask, dim=1)
            scores = scores - o.kl_coef * per_seq
            stats["kl_reward"] = per_seq.mean().item()
        batch.advantages = group_advantages(scores, batch.groups, batch.action_mask, o.normalize_std)
        batch.returns = None
        groups = {}
        for g, s in zip(batch.groups, batch.scores.tolist()):
            groups.setdefault(g, set()).add(s)
        stats["groups_all_same"] = sum(1 for v in groups.values() if len(v) == 1) / max(len(groups), 1)
        return stats

    def actor_loss(self, mb, logp, entropy, normalizer):
        return actor_objective(self.options, mb, logp, entropy, normalizer)
