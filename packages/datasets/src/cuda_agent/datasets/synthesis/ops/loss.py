"""Losses against a second input (scalar output, so they end a chain) and cosine similarity.

A loss is ``terminal``: the composer places it last. Cosine similarity reduces dim 1.
"""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder
from .registry import OpDef, register


def _loss(fn: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        y = b.extra_input("targets", b.shape)
        b.forward_lines.append(f"x = {fn}(x, {y})")
        b.set_shape([])

    return apply


def _cosine(b: Builder) -> None:
    y = b.extra_input("y", b.shape)
    b.forward_lines.append(f"x = F.cosine_similarity(x, {y}, dim=1)")
    b.set_shape([d for i, d in enumerate(b.shape) if i != 1])


# (name, weight)
_LOSSES = [("F.mse_loss", 0.4), ("F.smooth_l1_loss", 0.3), ("F.l1_loss", 0.2), ("F.huber_loss", 0.2)]
for _name, _weight in _LOSSES:
    register(OpDef(name=_name, category="loss", apply=_loss(_name), ranks=(2, 3, 4), weight=_weight, terminal=True))
register(OpDef(name="F.cosine_similarity", category="similarity", apply=_cosine, ranks=(2, 3), weight=0.3))
