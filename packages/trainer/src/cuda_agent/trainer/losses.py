"""PPO-family losses on ``[batch, T]`` token tensors with a loss mask.

Aggregation (``agg``): ``token-mean`` (sum over all model tokens of the batch divided by
their count, or by ``normalizer`` when given: the count over the whole mini-batch across
micro-batches and data-parallel ranks), ``seq-mean-token-mean`` and ``seq-mean-token-sum``.
"""

from __future__ import annotations

import torch

from .gae import masked_mean

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate(loss: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean",
              normalizer: float | None = None) -> torch.Tensor:
    mask = mask.to(loss.dtype)
    if agg == "token-mean":
        denom = normalizer if normalizer is not None else mask.sum().clamp(min=1.0)
        return (loss * mask).sum() / denom
    if agg == "seq-mean-token-mean":
        per_seq = (loss * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    elif agg == "seq-mean-token-sum":
        per_seq = (loss * mask).sum(1)
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}; valid: {', '.join(AGGREGATIONS)}")
    denom = normalizer if normalizer is not None else max(loss.shape[0], 1)
    return per_seq.sum() / denom


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.28, agg: str = "token-mean",
                normalizer: float | None = None, dual_clip: float | None = None) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate with separate low/high clip ("clip-higher"); optional dual clip for negative advantages."""
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    clipped = (loss2 > loss1).to(loss.dtype)
    if dual_clip is not None:
        loss3 = -advantages * dual_clip
        dual = torch.minimum(loss, loss3)
        loss = torch.where(advantages < 0, dual, loss)
    with torch.no_grad():
        m = mask.to(loss.dtype)
        stats = {
            "clipfrac": masked_mean(clipped, m).item(),
            "clipfrac_high": masked_mean(((ratio > 1 + clip_high) & (advantages > 0)).to(loss.dtype), m).item(),
            "clipfrac_low": masked_mean(((ratio < 1 - clip_low) & (advantages < 0)).to(loss.dtype), m).item(),
            "approx_kl": masked_mean(-log_ratio, m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
            "ratio_max": (ratio * m).max().item() if m.any() else 1.0,
        }
    return aggregate(loss, mask, agg, normalizer), stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.2, agg: str = "token-mean",
               normalizer: float | None = None) -> tuple[torch.Tensor, dict]:
    """0.5 * squared error to the returns, clipped around the rollout values (``clip=None``: plain MSE)."""
    err = (values - returns) ** 2
    if clip is not None and clip > 0:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err_clipped = (v_clipped - returns) ** 2
        loss = 0.5 * torch.maximum(err, err_clipped)
        frac = (err_clipped > err).to(values.dtype)
    else:
        loss = 0.5 * err
        frac = torch.zeros_like(err)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean(frac, mask).item(), "vf_mse": masked_mean(err, mask).item()}
    return aggregate(loss, mask, agg, normalizer), stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position (``[..., V] -> [...]``)."""
    logits = logits.float()
    logz = torch.logsumexp(logits, dim=-1)
    p = torch.softmax(logits, dim=-1)
    return logz - (p * logits).sum(-1)


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL(policy || reference) estimates: k1 (log-ratio), k2 (half squared), k3 (low variance, >= 0)."""
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        r = torch.clamp(-d, -20.0, 20.0)
        return (torch.exp(r) - r - 1.0).clamp(max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; valid: k1, k2, k3, abs")


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean",
             normalizer: float | None = None) -> torch.Tensor:
    """Negative log-likelihood of the model tokens (rejection fine-tuning)."""
    return aggregate(-logp, mask, agg, normalizer)


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over masked-in positions (nan when returns are constant)."""
    m = mask.to(torch.float32)
    r = returns.float()
    v = values.float()
    mr = masked_mean(r, m)
    var_r = masked_mean((r - mr) ** 2, m)
    diff = r - v
    md = masked_mean(diff, m)
    var_d = masked_mean((diff - md) ** 2, m)
    if var_r.item() <= 1e-12:
        return float("nan")
    return float(1.0 - var_d / var_r)


def actor_objective(o, mb, logp: torch.Tensor, entropy: torch.Tensor | None, normalizer: float) -> tuple:
    """The clipped surrogate of PPO and GRPO with their shared extras: an entropy bonus and
    KL to the reference policy as a loss. ``o`` holds clip_low, clip_high, loss_agg,
    dual_clip, entropy_coef, kl_mode, kl_coef and kl_estimator; ``mb`` is a micro-batch."""
    loss, stats = policy_loss(logp, mb.old_logp, mb.advantages, mb.action_mask, o.clip_low, o.clip_high,
                              o.loss_agg, normalizer, o.dual_clip)
    if entropy is not None and o.entropy_coef:
        loss = loss - o.entropy_coef * aggregate(entropy, mb.action_mask, o.loss_agg, normalizer)
    if o.kl_mode == "loss" and o.kl_coef and mb.ref_logp is not None:
        kl = kl_penalty(logp, mb.ref_logp, o.kl_estimator)
        loss = loss + o.kl_coef * aggregate(kl, mb.action_mask, o.loss_agg, normalizer)
        stats["kl_loss"] = masked_mean(kl.detach(), mb.action_mask).item()
    return loss, stats
