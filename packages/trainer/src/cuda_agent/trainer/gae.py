"""Generalised advantage estimation over token sequences with tool-output gaps.

All tensors are ``[batch, T]`` in *action coordinates*: position ``t`` is the choice of
one token given everything before it. ``mask`` is 1 where the policy chose the token
(model tokens) and 0 elsewhere (prompt, tool output, padding). GAE runs over the
masked-in positions only: at a masked position the running advantage and the next
value are carried through unchanged, so the values (and rewards) written at masked
positions never change any advantage. Discounting counts model tokens only.
"""

from __future__ import annotations

import torch


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards: the outcome score at each row's last model token, minus ``kl_coef * kl``.

    ``scores``: ``[batch]``. ``kl``: ``[batch, T]`` per-token KL estimate (or None).
    """
    mask = mask.to(torch.float32)
    rewards = torch.zeros_like(mask)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.to(torch.float32) * mask
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    has = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has]
    rewards[rows, last[has]] += scores.to(torch.float32)[has]
    return rewards


@torch.no_grad()
def compute_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                gamma: float = 1.0, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (``advantages + values``), both 0 at masked positions.

    The value after a row's last model token is 0 (the episode ends there).
    """
    rewards = rewards.to(torch.float32)
    values = values.to(torch.float32)
    m = mask.to(torch.bool)
    B, T = rewards.shape
    adv = torch.zeros_like(rewards)
    last_gae = torch.zeros(B, dtype=torch.float32, device=rewards.device)
    next_value = torch.zeros(B, dtype=torch.float32, device=rewards.device)
    for t in range(T - 1, -1, -1):
        mt = m[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        last_gae = torch.where(mt, gae_t, last_gae)
        next_value = torch.where(mt, values[:, t], next_value)
        adv[:, t] = torch.where(mt, gae_t, torch.zeros_like(gae_t))
    returns = (adv + values) * m
    return adv, returns


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
                  reduce=None) -> torch.Tensor:
    """Normalise ``x`` to unit variance (and zero mean) over masked-in positions; 0 elsewhere.

    ``reduce(float) -> float`` sums a statistic across data-parallel ranks (whitening over the global batch).
    """
    m = mask.to(x.dtype)
    n, s1 = float(m.sum()), float((x * m).sum())
    if reduce is not None:
        n, s1 = reduce(n), reduce(s1)
    mean = s1 / max(n, 1.0)
    s2 = float((((x - mean) ** 2) * m).sum())
    if reduce is not None:
        s2 = reduce(s2)
    var = torch.tensor(s2 / max(n, 1.0), dtype=x.dtype, device=x.device)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


def group_advantages(scores: torch.Tensor, groups: list, mask: torch.Tensor, normalize_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO: each trajectory's score minus its group's mean (over std), broadcast to its model tokens."""
    scores = scores.to(torch.float32)
    out = torch.zeros_like(scores)
    index: dict = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    for members in index.values():
        idx = torch.tensor(members, device=scores.device)
        s = scores[idx]
        a = s - s.mean()
        if normalize_std and len(members) > 1:
            a = a / (s.std(unbiased=True) + eps)
        out[idx] = a
    return out[:, None] * mask.to(torch.float32)
