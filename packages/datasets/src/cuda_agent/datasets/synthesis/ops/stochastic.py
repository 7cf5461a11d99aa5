"""Random operators, kept as seeds so that the determinism filter has something to remove.

Candidates that use them are dropped by the filters; ``collect_seeds`` can leave them out.
"""

from __future__ import annotations

from .builder import Builder
from .registry import OpDef, register


def _dropout(b: Builder) -> None:
    p = b.rng.choice([0.1, 0.2, 0.5])
    a = b.attr("dropout")
    b.init_lines.append(f"{a} = nn.Dropout(p={p})")
    b.forward_lines.append(f"x = {a}(x)")


def _noise(b: Builder) -> None:
    b.forward_lines.append("x = x + 0.1 * torch.randn_like(x)")


register(OpDef(name="nn.Dropout", category="stochastic", apply=_dropout, weight=0.3, stochastic=True))
register(OpDef(name="torch.randn_like", category="stochastic", apply=_noise, weight=0.1, stochastic=True))
