"""Reductions over one dimension (sum, mean, max, norms...), with or without keepdim, and scans.

A reduction drops the dimension or keeps it as size 1; ``torch.cumsum`` keeps the shape.
"""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder, Dim
from .registry import OpDef, register


def _reduction(fn: str, keep_prob: float = 0.5) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        d = b.pick_dim()
        keep = b.rng.random() < keep_prob
        if keep:
            b.forward_lines.append(f"x = {fn}(x, dim={d}, keepdim=True)")
            dims = list(b.shape)
            dims[d] = Dim(1, None)
        else:
            b.forward_lines.append(f"x = {fn}(x, dim={d})")
            dims = [x for i, x in enumerate(b.shape) if i != d]
        b.set_shape(dims)

    return apply


# (name, weight)
_REDUCTIONS = [
    ("torch.sum", 1.0),
    ("torch.mean", 1.2),
    ("torch.amax", 0.8),
    ("torch.amin", 0.4),
    ("torch.logsumexp", 0.6),
    ("torch.var", 0.3),
    ("torch.std", 0.2),
    ("torch.norm", 0.3),
]
for _name, _weight in _REDUCTIONS:
    register(OpDef(name=_name, category="reduction", apply=_reduction(_name), ranks=(2, 3, 4, 5), weight=_weight))


def _cumsum(b: Builder) -> None:
    d = b.pick_dim()
    b.forward_lines.append(f"x = torch.cumsum(x, dim={d})")


register(OpDef(name="torch.cumsum", category="scan", apply=_cumsum, ranks=(2, 3, 4), weight=0.4))
