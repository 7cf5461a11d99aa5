"""Pooling in 1, 2 and 3 dimensions: max and average windows, and adaptive pooling.

Window pooling refuses inputs smaller than the window; adaptive pooling draws a small
output size (mostly 1, i.e. global pooling).
"""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder, Dim, NotApplicable
from .registry import OpDef, register


def _pool(kind: str, nd: int) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        k = b.rng.choice([2, 2, 3])
        stride = b.rng.choice([None, 1, 2]) if kind == "Max" else b.rng.choice([None, 2])
        s = k if stride is None else stride
        spatial = [d.value for d in b.shape[2:]]
        if any(x < k for x in spatial):
            raise NotApplicable("input smaller than the window")
        out_sp = [(x - k) // s + 1 for x in spatial]
        ks = b.init_param("pool_kernel_size", k)
        extra = "" if stride is None else f", stride={stride}"
        a = b.attr(f"{kind.lower()}_pool")
        b.init_lines.append(f"{a} = nn.{kind}Pool{nd}d(kernel_size={ks}{extra})")
        b.forward_lines.append(f"x = {a}(x)")
        b.set_shape(b.shape[:2] + [Dim(v, None) for v in out_sp])

    return apply


def _adaptive(kind: str, nd: int) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        o = b.rng.choice([1, 1, 2, 4])
        if any(d.value < o for d in b.shape[2:]):
            raise NotApplicable("input smaller than the output size")
        a = b.attr(f"adaptive_{kind.lower()}_pool")
        b.init_lines.append(f"{a} = nn.Adaptive{kind}Pool{nd}d({o})")
        b.forward_lines.append(f"x = {a}(x)")
        b.set_shape(b.shape[:2] + [Dim(o, None) for _ in range(nd)])

    return apply


# spatial dims -> (weight of nn.MaxPoolNd, weight of nn.AvgPoolNd)
_WEIGHTS = {1: (0.5, 0.4), 2: (1.2, 0.8), 3: (0.5, 0.4)}
for _nd, (_max_weight, _avg_weight) in _WEIGHTS.items():
    _ranks = (_nd + 2,)
    register(OpDef(name=f"nn.MaxPool{_nd}d", category="pool", apply=_pool("Max", _nd), ranks=_ranks, weight=_max_weight))
    register(OpDef(name=f"nn.AvgPool{_nd}d", category="pool", apply=_pool("Avg", _nd), ranks=_ranks, weight=_avg_weight))
    register(OpDef(name=f"nn.AdaptiveAvgPool{_nd}d", category="pool", apply=_adaptive("Avg", _nd), ranks=_ranks, weight=0.3))
register(OpDef(name="nn.AdaptiveMaxPool2d", category="pool", apply=_adaptive("Max", 2), ranks=(4,), weight=0.2))
