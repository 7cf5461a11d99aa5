"""Actor (causal LM) and critic (backbone + scalar value head) models, and their forward passes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from cuda_agent.core.errors import ConfigError
from torch import nn

from .losses import entropy_from_logits, logprobs_from_logits

VALUE_HEAD = "value_head.safetensors"


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, str(name), None)
    if not isinstance(dt, torch.dtype):
        raise ConfigError(f"unknown dtype {name!r}; valid: float32, bfloat16, float16")
    return dt


def load_causal_lm(path: str | Path, dtype: str = "float32") -> nn.Module:
    from transformers import AutoModelForCausalLM

    if not Path(path).exists():
        raise ConfigError(f"model folder not found: {path}")
    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype))
    except TypeError:  # older transformers
        return AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch_dtype(dtype))


class ValueModel(nn.Module):
    """A transformer backbone with a linear head giving one value per position."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.v_head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.v_head.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.v_head.bias)
        self.config = backbone.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        hidden = out.last_hidden_state
        return self.v_head(hidden.to(self.v_head.weight.dtype)).squeeze(-1).float()

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "float32") -> "ValueModel":
        """From a causal-LM folder (the head starts fresh) or a saved critic (the head is restored)."""
        from transformers import AutoModel

        if not Path(path).exists():
            raise ConfigError(f"critic folder not found: {path}")
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the causal LM's lm_head is expected to be left out
        try:
            try:
                backbone = AutoModel.from_pretrained(str(path), dtype=torch_dtype(dtype))
            except TypeError:
                backbone = AutoModel.from_pretrained(str(path), torch_dtype=torch_dtype(dtype))
        finally:
            hf_logging.set_verbosity(verbosity)
        model = cls(backbone, backbone.config.hidden_size).to(torch_dtype(dtype))
        head = Path(path) / VALUE_HEAD
        if head.exists():
            from safetensors.torch import load_file

            model.v_head.load_state_dict(load_file(str(head)))
        return model

    def save_pretrained(self, path: str | Path, state_dict: dict | None = None) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        sd = state_dict if state_dict is not None else self.state_dict()
        backbone = {k[len("backbone."):]: v for k, v in sd.items() if k.startswith("backbone.")}
        head = {k[len("v_head."):]: v.detach().cpu().contiguous() for k, v in sd.items() if k.startswith("v_head.")}
        self.backbone.save_pretrained(path, state_dict=backbone)
        save_file(head, str(path / VALUE_HEAD))


def value_model_from_causal_lm(lm: nn.Module) -> ValueModel:
    """A critic sharing nothing with ``lm`` but starting from a copy of its backbone weights."""
    import copy

    base = copy.deepcopy(lm.base_model if hasattr(lm, "base_model") else lm.model)
    return ValueModel(base, lm.config.hidden_size).to(next(lm.parameters()).dtype)


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether the causal LM (under an engine or DDP wrapper) computes its output head at given positions only."""
    target = model
    while hasattr(target, "module") and isinstance(getattr(target, "module"), nn.Module):
        target = target.module
    return _forward_takes_logits_to_keep(type(target))


@functools.lru_cache(maxsize=None)
def _forward_takes_logits_to_keep(cls: type) -> bool:
    """(once per model class: ``actor_forward`` asks at every micro-batch)"""
    import inspect

    try:
        return "logits_to_keep" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


def _at_columns(values: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``values`` (``[B, len(cols)]``) placed at ``cols`` of a zero tensor of ``shape``."""
    full = values.new_zeros(shape)
    full[:, cols] = values
    return full


def actor_forward(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
                  with_entropy: bool = False, action_mask: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[B, L-1]`` of ``input_ids[:, 1:]`` (and per-position entropy) from one forward pass.

    With ``action_mask`` (``[B, L-1]``) the output head, softmax and entropy run only at the columns
    where some row has a model token (prompt and tool output are most of an agent's sequence, and
    the head over a large vocabulary is a large share of the cost); other positions get 0.
    """
    keep = None
    if action_mask is not None and accepts_logits_to_keep(model):
        cols = action_mask.bool().any(0).nonzero().flatten()
        if 0 < len(cols) < action_mask.shape[1]:
            keep = cols.to(input_ids.device)
    if keep is None:
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        logits = out.logits[:, :-1]
        targets = input_ids[:, 1:]
    else:
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=keep)
        logits = out.logits
        targets = input_ids[:, keep + 1]
    logp = logprobs_from_logits(logits, targets, temperature)
    ent = None
    if with_entropy:
        scaled = logits.float() / temperature if temperature and temperature != 1.0 else logits
        ent = entropy_from_logits(scaled)
    if keep is not None:
        shape = (input_ids.shape[0], input_ids.shape[1] - 1)
        logp = _at_columns(logp, keep, shape)
        ent = _at_columns(ent, keep, shape) if ent is not None else None
    return logp, ent


def critic_forward(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Values ``[B, L-1]``: the value of the state before each action token."""
    return model(input_ids=input_ids, attention_mask=attention_mask)[:, :-1]
