"""One training update from a list of scored trajectories: the mechanics shared by every algorithm.

Data parallel: each rank brings its own trajectories (its share of the global batch);
losses are divided by the mini-batch's token count summed over all ranks and scaled by the
world size, so that averaging gradients across ranks gives exactly the single-process
gradient of the same global batch.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from .algorithms.base import TrainAlgorithm
from .batch import TrainBatch, collate, micro_batches
from .engine import ModelEngine, all_reduce_sum, world_size
from .gae import masked_mean
from .losses import explained_variance
from .models import actor_forward, critic_forward


class Trainer:
    def __init__(self, actor: ModelEngine | None, critic: ModelEngine | None = None, reference: Any = None,
                 pad_id: int = 0, max_length: int | None = None):
        self.actor = actor
        self.critic = critic
        self.reference = reference
        self.pad_id = pad_id
        self.max_length = max_length

    @property
    def device(self) -> torch.device:
        eng = self.actor or self.critic
        return eng.device

    @torch.no_grad()
    def _score(self, batch: TrainBatch, algo: TrainAlgorithm, micro: int) -> None:
        """Old log-probs, reference log-probs and values, in micro-batches, without gradients."""
        o = algo.options
        temp = float(getattr(o, "temperature", 1.0))
        need_old = algo.needs_old_logp and self.actor is not None
        use_rollout = bool(getattr(o, "use_rollout_logprobs", False))
        need_ref = algo.needs_reference and self.reference is not None
        need_values = algo.needs_values and self.critic is not None
        B, T = batch.action_mask.shape
        old = torch.zeros(B, T) if need_old else None
        ref = torch.zeros(B, T) if need_ref else None
        vals = torch.zeros(B, T) if need_values else None
        if need_old:
            self.actor.eval()
        if need_values:
            self.critic.eval()
        for idx in micro_batches(B, micro):
            mb = batch.select(idx).to(self.device)
            t = mb.action_mask.shape[1]
            if need_old and not use_rollout:
                lp, _ = actor_forward(self.actor, mb.input_ids, mb.attention_mask, temp, action_mask=mb.action_mask)
                old[idx, :t] = lp.float().cpu()
            if need_ref:
                lp, _ = actor_forward(self.reference, mb.input_ids, mb.attention_mask, temp,
                                      action_mask=mb.action_mask)
                ref[idx, :t] = lp.float().cpu()
            if need_values:
                vals[idx, :t] = critic_forward(self.critic, mb.input_ids, mb.attention_mask).float().cpu()
        if need_old:
            batch.old_logp = batch.rollout_logp.clone() if use_rollout else old
        batch.ref_logp = ref
        batch.values = vals

    def update(self, trajectories: list, algo: TrainAlgorithm, step: int = 0, train_actor: bool = True,
               train_critic: bool = True) -> dict:
        """Select, score, compute advantages and run the optimiser updates; returns metrics."""
        o = algo.options
        metrics: dict[str, float] = {}
        kept, sel = algo.select(trajectories)
        metrics.update(sel)
        n_local = len(kept)
        if all_reduce_sum(n_local) == 0:
            metrics["skipped"] = 1.0
            return metrics
        t0 = time.monotonic()
        micro = int(o.micro_batch_size)
        ws = world_size()
        batch = collate(kept, self.pad_id, self.max_length) if kept else None
        metrics["train/truncated_ratio"] = (sum(batch.truncated) / len(batch)) if batch else 0.0
        if batch is not None:
            self._score(batch, algo, micro)
            metrics.update(algo.compute_advantages(batch))
        t_score = time.monotonic() - t0
        do_actor = algo.trains_actor and train_actor and self.actor is not None
        do_critic = algo.trains_critic and train_critic and self.critic is not None
        mini = max(1, int(o.mini_batch_size) // ws)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}

        def add(stats: dict, prefix: str = "") -> None:
            for k, v in stats.items():
                if isinstance(v, (int, float)) and not math.isnan(float(v)):
                    sums[prefix + k] = sums.get(prefix + k, 0.0) + float(v)
                    counts[prefix + k] = counts.get(prefix + k, 0) + 1

        tokens = 0
        updates = 0
        temp = float(getattr(o, "temperature", 1.0))
        gen = torch.Generator().manual_seed(1000 + step)
        n_mini_global = max(1, math.ceil(all_reduce_sum(n_local) / int(o.mini_batch_size)))
        t1 = time.monotonic()
        for epoch in range(int(o.epochs)):
            order = torch.randperm(n_local, generator=gen).tolist() if n_local > mini else list(range(n_local))
            minis = [order[i:i + mini] for i in range(0, n_local, mini)] if n_local else []
            while len(minis) < n_mini_global:  # every rank makes the same number of optimiser steps
                minis.append([])
            for mb_idx in minis:
                sub = batch.select(mb_idx) if mb_idx else None
                norm = all_reduce_sum(sub.action_mask.sum().item() if sub is not None else 0.0)
                if o.loss_agg != "token-mean":
                    norm = all_reduce_sum(len(mb_idx))
                norm = max(norm, 1.0)
                micros = micro_batches(len(mb_idx), micro) if mb_idx else []
                if do_actor:
                    self.actor.train()
                    for j, idx in enumerate(micros):
                        mb = sub.select(idx).to(self.device)
                        logp, ent = actor_forward(self.actor, mb.input_ids, mb.attention_mask, temp, with_entropy=True,
                                                  action_mask=mb.action_mask)
                        loss, st = algo.actor_loss(mb, logp, ent, norm)
                        self.actor.backward(loss * ws, last=(j == len(micros) - 1))
                        st["loss"] = loss.item() * norm / max(mb.action_mask.sum().item(), 1.0)
                        st["entropy"] = masked_mean(ent.detach(), mb.action_mask).item()
                        add(st, "actor/")
                        tokens += int(mb.attention_mask.sum().item())
                    if not micros:
                        _zero_backward(self.actor, ws)
                    metrics["actor/grad_norm"] = self.actor.step()
                    updates += 1
                if do_critic:
                    self.critic.train()
                    for j, idx in enumerate(micros):
                        mb = sub.select(idx).to(self.device)
                        values = critic_forward(self.critic, mb.input_ids, mb.attention_mask)
                        loss, st = algo.critic_loss(mb, values, norm)
                        self.critic.backward(loss * ws, last=(j == len(micros) - 1))
                        st["loss"] = loss.item() * norm / max(mb.action_mask.sum().item(), 1.0)
                        add(st, "critic/")
                        tokens += int(mb.attention_mask.sum().item())
                    if not micros:
                        _zero_backward(self.critic, ws)
                    metrics["critic/grad_norm"] = self.critic.step()
        t_train = time.monotonic() - t1
        for k, v in sums.items():
            metrics[k] = v / counts[k]
        if batch is not None and batch.values is not None and batch.returns is not None:
            metrics["critic/explained_variance"] = explained_variance(batch.values, batch.returns, batch.action_mask)
            metrics["critic/value_mean"] = masked_mean(batch.values, batch.action_mask).item()
        if batch is not None and batch.ref_logp is not None and batch.old_logp is not None:
            metrics["kl_ref"] = masked_mean(batch.old_logp - batch.ref_logp, batch.action_mask).item()
        if batch is not None and batch.old_logp is not None and not getattr(o, "use_rollout_logprobs", False):
            lp_mask = batch.action_mask
            metrics["rollout/logp_diff"] = masked_mean((batch.old_logp - batch.rollout_logp).abs(), lp_mask).item()
        metrics["train/trajectories"] = float(n_local)
        metrics["train/tokens"] = float(tokens)
        metrics["train/score_seconds"] = t_score
        metrics["train/update_seconds"] = t_train
        metrics["train/tokens_per_s"] = tokens / t_train if t_train > 0 else 0.0
        return metrics


def _zero_backward(engine: ModelEngine, ws: int) -> None:
    """A rank with no data still joins the gradient all-reduce (a zero loss through every parameter)."""
    zero = sum((p * 0.0).sum() for p in engine.module.parameters() if p.requires_grad)
    engine.backward(zero, last=True)
