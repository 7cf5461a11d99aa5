"""The operator registry: what a seed operator is and the table the family modules fill.

An :class:`OpDef` names an operator, its family (``category``), the input ranks it
accepts and the rule that applies it to a :class:`~.builder.Builder`. The family modules
call :func:`register` when imported; the registry keeps that order, and the composer's
weighted draws depend on it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from .builder import Builder


@dataclass
class OpDef:
    name: str  # e.g. "nn.Conv2d", "torch.relu", "F.gelu"
    category: str
    apply: Callable[[Builder], None]
    ranks: tuple[int, ...] | None = None  # accepted input ranks (None: any rank >= 1)
    weight: float = 1.0
    terminal: bool = False  # output is a scalar; nothing may follow
    source: str = "torch"  # "torch" or "transformers"
    requires: str | None = None  # "module:attr" that must import for the op to be available
    stochastic: bool = False

    def accepts(self, rank: int) -> bool:
        return rank >= 1 if self.ranks is None else rank in self.ranks

    def available(self) -> bool:
        if not self.requires:
            return True
        module, _, attr = self.requires.partition(":")
        try:
            obj = importlib.import_module(module)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
        except Exception:  # noqa: BLE001
            return False
        return True


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    REGISTRY[op.name] = op
    return op
