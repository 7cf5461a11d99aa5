"""Elementwise arithmetic with a parameter or a second input: clamp, scale, bias, products.

The one-expression math functions (``torch.exp``, ``torch.abs``...) are in :mod:`.unary`.
"""

from __future__ import annotations

from .builder import Builder
from .registry import OpDef, register


def _clamp(b: Builder) -> None:
    lo = b.init_param("clamp_min", b.rng.choice([-1.0, -0.5, 0.0]))
    hi = b.init_param("clamp_max", b.rng.choice([0.5, 1.0, 2.0]))
    b.init_lines += [f"self.{lo} = {lo}", f"self.{hi} = {hi}"]
    b.forward_lines.append(f"x = torch.clamp(x, min=self.{lo}, max=self.{hi})")


def _mul_scalar(b: Builder) -> None:
    s = b.init_param("scaling_factor", b.rng.choice([0.5, 2.0, 1.5, 0.1, 10.0]))
    b.init_lines.append(f"self.{s} = {s}")
    b.forward_lines.append(f"x = x * self.{s}")


def _add_bias(b: Builder) -> None:
    if b.rank >= 3:
        shape = (b.shape[1].value,) + (1,) * (b.rank - 2)
    else:
        shape = (b.shape[-1].value,)
    s = b.init_param("bias_shape", shape)
    a = b.attr("bias")
    b.init_lines.append(f"{a} = nn.Parameter(torch.randn({s}) * 0.02)")
    b.forward_lines.append(f"x = x + {a}")


def _mul_input(b: Builder) -> None:
    y = b.extra_input("y", b.shape)
    b.forward_lines.append(f"x = x * {y}")


def _maximum_input(b: Builder) -> None:
    y = b.extra_input("y", b.shape)
    b.forward_lines.append(f"x = torch.maximum(x, {y})")


def _tril(b: Builder) -> None:
    b.forward_lines.append("x = torch.tril(x)")


register(OpDef(name="torch.clamp", category="elementwise", apply=_clamp, weight=0.8))
register(OpDef(name="torch.mul", category="elementwise", apply=_mul_scalar, weight=1.2))
register(OpDef(name="torch.add", category="elementwise", apply=_add_bias, ranks=(2, 3, 4, 5), weight=1.2))
register(OpDef(name="torch.mul[input]", category="elementwise", apply=_mul_input, weight=0.3))
register(OpDef(name="torch.maximum", category="elementwise", apply=_maximum_input, weight=0.3))
register(OpDef(name="torch.tril", category="elementwise", apply=_tril, ranks=(2, 3, 4), weight=0.2))
