"""Trajectories -> padded token tensors in action coordinates.

Row ``i`` holds ``prompt_ids + response_ids`` right-padded to the batch's longest
sequence (``input_ids``, ``attention_mask``: ``[B, L]``). Everything the losses see is in
action coordinates ``[B, L-1]``: position ``t`` is the choice of ``input_ids[:, t+1]``
from the logits/values at ``t``. ``action_mask`` is the trajectory's loss mask there
(1 = a model token, 0 = prompt, tool output or padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from cuda_agent.core.types import Trajectory

TENSOR_FIELDS = ("input_ids", "attention_mask", "action_mask", "rollout_logp", "scores", "old_logp", "ref_logp",
                 "values", "advantages", "returns")


@dataclass
class TrainBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    rollout_logp: torch.Tensor
    scores: torch.Tensor
    groups: list = field(default_factory=list)
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    truncated: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum().item())

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum().item())

    def select(self, index: list[int] | torch.Tensor, trim: bool = True) -> "TrainBatch":
        """Rows ``index``; with ``trim`` the padding columns no row needs are dropped."""
        idx = torch.as_tensor(index, dtype=torch.long)
        length = self.input_ids.shape[1]
        if trim and len(idx):
            length = max(int(self.attention_mask[idx].sum(1).max().item()), 2)
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                v = v[idx.to(v.device)]
                if v.dim() == 2:
                    v = v[:, : length if f.name in ("input_ids", "attention_mask") else length - 1]
                out[f.name] = v
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in idx.tolist()] if v else []
            else:
                out[f.name] = v
        return TrainBatch(**out)

    def to(self, device: Any) -> "TrainBatch":
        for name in TENSOR_FIELDS:
            v = getattr(self, name)
            if isinstance(v, torch.Tensor):
                setattr(self, name, v.to(device))
        return self


def trajectory_score(traj: Trajectory, default: float = 0.0) -> float:
    return float(traj.reward.value) if traj.reward is not None else default


def collate(trajectories: list[Trajectory], pad_id: int = 0, max_length: int | None = None,
            missing_reward: float = 0.0) -> TrainBatch:
    """Pad a list of token-level trajectories; sequences longer than ``max_length`` lose their tail."""
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    rows = []
    truncated = []
    for t in trajectories:
        if len(t.loss_mask) != len(t.response_ids):
            raise ValueError(f"trajectory {t.id}: loss_mask has {len(t.loss_mask)} entries for "
                             f"{len(t.response_ids)} response ids")
        ids = list(t.prompt_ids) + list(t.response_ids)
        mask = [0] * len(t.prompt_ids) + [int(m) for m in t.loss_mask]
        lps = list(t.rollout_logprobs) if len(t.rollout_logprobs) == len(t.response_ids) else [0.0] * len(t.response_ids)
        lp = [0.0] * len(t.prompt_ids) + [float(x) for x in lps]
        cut = bool(max_length and len(ids) > max_length)
        if cut:
            ids, mask, lp = ids[:max_length], mask[:max_length], lp[:max_length]
        truncated.append(cut)
        rows.append((ids, mask, lp))
    L = max(2, max(len(r[0]) for r in rows))
    B = len(rows)
    input_ids = torch.full((B, L), int(pad_id), dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    amask = torch.zeros((B, L - 1), dtype=torch.float32)
    rlp = torch.zeros((B, L - 1), dtype=torch.float32)
    for i, (ids, mask, lp) in enumerate(rows):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids, dtype=torch.long)
        attn[i, :n] = 1
        if n > 1:
            amask[i, : n - 1] = torch.tensor(mask[1:], dtype=torch.float32)
            rlp[i, : n - 1] = torch.tensor(lp[1:], dtype=torch.float32)
    scores = torch.tensor([trajectory_score(t, missing_reward) for t in trajectories], dtype=torch.float32)
    groups = [t.metadata.get("group", t.task_id) for t in trajectories]
    return TrainBatch(input_ids, attn, amask, rlp, scores, groups=groups, truncated=truncated)


def micro_batches(n: int, size: int) -> list[list[int]]:
    size = max(1, int(size))
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]
