"""Rejection fine-tuning: keep trajectories with reward above a threshold and without redundant loops
or malformed tool calls, then supervised fine-tuning on their model tokens."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.core.errors import ConfigError

from cuda_agent.core.types import Trajectory

from ..losses import sft_loss
from .base import TrainAlgorithm
from .ppo import check_common


@dataclass
class RFTOptions:
    batch_size: int = 1024  # trajectories collected per step
    mini_batch_size: int = 64  # trajectories per optimiser update
    micro_batch_size: int = 1
    epochs: int = 1
    actor_lr: float = 1e-5
    max_grad_norm: float = 1.0
    loss_agg: str = "token-mean"
    min_reward: float = 0.0  # keep reward > min_reward
    drop_loops: bool = True
    loop_repeats: int = 3  # the same tool call (name + arguments) this many times in a row is a loop
    drop_malformed: bool = True
    drop_truncated: bool = False  # also drop episodes that ran out of context
    temperature: float = 1.0
    # collect: the stage's own rollouts; file: supervised fine-tuning on recorded trajectories
    # (token-exact, e.g. an expert's episodes; the same filters apply) read from `trajectories`
    source: str = "collect"
    trajectories: str = ""  # a .jsonl of trajectories (rollout.save_trajectories), for source: file


def call_signature(call) -> str:
    return call.name + ":" + (json.dumps(call.arguments, sort_keys=True) if call.arguments else call.raw_arguments)


def has_loop(traj: Trajectory, repeats: int = 3) -> bool:
    """True when the same tool call is made ``repeats`` times in a row, or one assistant message repeats as often."""
    sigs = [call_signature(c) for t in traj.turns for c in t.tool_calls]
    run = 1
    for a, b in zip(sigs, sigs[1:]):
        run = run + 1 if a == b else 1
        if run >= repeats:
            return True
    texts = [t.assistant.strip() for t in traj.turns if t.assistant.strip()]
    run = 1
    for a, b in zip(texts, texts[1:]):
        run = run + 1 if a == b else 1
        if run >= repeats:
            return True
    return False


def has_malformed_call(traj: Trajectory) -> bool:
    return any(c.error for t in traj.turns for c in t.tool_calls)


class RFT(TrainAlgorithm):
    name = "rft"
    description = "Rejection fine-tuning: filter by reward, loops and malformed calls; SFT on what is left."
    Options = RFTOptions
    needs_old_logp = False

    def __init__(self, options=None):
        super().__init__(options)
        check_common(self.options, "algorithm rft")
        if self.options.source not in ("collect", "file"):
            raise ConfigError(f"algorithm rft: source={self.options.source!r}; valid: collect, file")
        if self.options.source == "file" and not Path(self.options.trajectories or "").is_file():
            raise ConfigError(f"algorithm rft: source file needs trajectories, a .jsonl file "
                              f"(not found: {self.options.trajectories!r})")

    @property
    def needs_reference(self) -> bool:
        return False

    def select(self, trajectories):
        o = self.options
        kept, why = [], {"low_reward": 0, "loop": 0, "malformed": 0, "truncated": 0}
        for t in trajectories:
            r = t.reward.value if t.reward is not None else None
            if r is None or r <= o.min_reward:
                why["low_reward"] += 1
            elif o.drop_loops and has_loop(t, o.loop_repeats):
                why["loop"] += 1
            elif o.drop_malformed and has_malformed_call(t):
                why["malformed"] += 1
            elif o.drop_truncated and t.finish_reason == "context":
                why["truncated"] += 1
            else:
                kept.append(t)
        stats = {f"rft/dropped_{k}": v for k, v in why.items()}
        stats["rft/kept"] = len(kept)
        stats["rft/keep_rate"] = len(kept) / max(len(trajectories), 1)
        return kept, stats

    def actor_loss(self, mb, logp, entropy, normalizer):
        return sft_loss(logp, mb.action_mask, self.options.loss_agg, normalizer), {}
