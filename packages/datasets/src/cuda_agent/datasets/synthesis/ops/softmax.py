"""Softmax and log-softmax over a random non-batch dimension (functional and module forms)."""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder
from .registry import OpDef, register


def _softmax(fn: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        d = b.pick_dim()
        b.forward_lines.append(f"x = {fn}(x, dim={d})")

    return apply


def _softmax_module(b: Builder) -> None:
    d = b.pick_dim()
    a = b.attr("softmax")
    b.init_lines.append(f"{a} = nn.Softmax(dim={d})")
    b.forward_lines.append(f"x = {a}(x)")


_RANKS = (2, 3, 4, 5)
register(OpDef(name="torch.softmax", category="softmax", apply=_softmax("torch.softmax"), ranks=_RANKS, weight=1.2))
register(OpDef(name="F.log_softmax", category="softmax", apply=_softmax("F.log_softmax"), ranks=_RANKS, weight=0.8))
register(OpDef(name="nn.Softmax", category="softmax", apply=_softmax_module, ranks=_RANKS, weight=0.5))
