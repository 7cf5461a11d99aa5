"""How far a rollout engine's recorded log-probs are from the trainer's own scoring.

PPO's importance ratio divides the trainer's probability of a sampled token by the rollout
engine's; the two must agree for the ratio to mean anything (the paper's first attempt without
warm-ups collapsed when training and inference precision disagreed). :func:`trainer_logprobs`
scores a trajectory exactly as :class:`~.loop.Trainer` does (``collate``, then
``actor_forward`` at the rollout temperature) and returns both sides at the model's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .batch import collate
from .models import actor_forward


@dataclass
class Agreement:
    tokens: int  # model tokens compared (tool output and prompt are not the model's)
    max_abs: float  # largest |rollout log-prob - trainer log-prob|
    mean_abs: float

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "max_abs": self.max_abs, "mean_abs": self.mean_abs}


@torch.no_grad()
def trainer_logprobs(model: Any, trajectory: Any, temperature: float, pad_id: int = 0) -> tuple[list[float], list[float]]:
    """``(rollout, trainer)``: the log-probs the engine recorded and the ones the trainer computes,
    at every position of ``trajectory`` where the loss mask is 1."""
    batch = collate([trajectory], pad_id)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        logp, _ = actor_forward(model, batch.input_ids.to(device), batch.attention_mask.to(device), temperature,
                                action_mask=batch.action_mask.to(device))
    finally:
        model.train(was_training)
    mask = batch.action_mask[0].bool()
    return batch.rollout_logp[0][mask].tolist(), logp[0].float().cpu()[mask].tolist()


def agreement(model: Any, trajectories: list, temperature: float, pad_id: int = 0) -> Agreement:
    """The largest and mean absolute difference over all model tokens of ``trajectories``."""
    diffs: list[float] = []
    for t in trajectories:
        rollout, trainer = trainer_logprobs(model, t, temperature, pad_id)
        diffs += [abs(a - b) for a, b in zip(rollout, trainer)]
    if not diffs:
        return Agreement(0, float("nan"), float("nan"))
    return Agreement(len(diffs), max(diffs), sum(diffs) / len(diffs))
