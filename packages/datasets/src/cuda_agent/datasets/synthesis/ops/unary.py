"""Unary functions written as one expression of ``x`` (``torch.*`` and ``F.*``).

The ``F.*`` functions and relu, sigmoid and tanh count as activations, the rest as
elementwise math. Each is available when its function exists in the installed torch.
"""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder
from .registry import OpDef, register

# (name, expression of x, weight)
_UNARY_FUNCS = [
    ("torch.relu", "torch.relu(x)", 2.0),
    ("torch.sigmoid", "torch.sigmoid(x)", 1.5),
    ("torch.tanh", "torch.tanh(x)", 1.5),
    ("F.gelu", "F.gelu(x)", 1.5),
    ("F.silu", "F.silu(x)", 1.0),
    ("F.mish", "F.mish(x)", 0.8),
    ("F.hardswish", "F.hardswish(x)", 0.8),
    ("F.hardsigmoid", "F.hardsigmoid(x)", 0.5),
    ("F.softplus", "F.softplus(x)", 0.6),
    ("F.elu", "F.elu(x)", 0.6),
    ("F.selu", "F.selu(x)", 0.5),
    ("F.relu6", "F.relu6(x)", 0.5),
    ("F.logsigmoid", "F.logsigmoid(x)", 0.4),
    ("F.softsign", "F.softsign(x)", 0.4),
    ("torch.abs", "torch.abs(x)", 0.4),
    ("torch.square", "torch.square(x)", 0.3),
    ("torch.exp", "torch.exp(x)", 0.3),
    ("torch.erf", "torch.erf(x)", 0.3),
    ("torch.sin", "torch.sin(x)", 0.2),
    ("torch.cos", "torch.cos(x)", 0.2),
    ("torch.rsqrt", "torch.rsqrt(torch.abs(x) + 1.0)", 0.2),
    ("torch.log1p", "torch.log1p(torch.abs(x))", 0.2),
]

_ACTIVATIONS = {"torch.relu", "torch.sigmoid", "torch.tanh"}


def _unary(expr: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        b.forward_lines.append(f"x = {expr}")

    return apply


def _requires(name: str) -> str:
    """ "F.gelu" -> "torch.nn.functional:gelu", "torch.relu" -> "torch:relu"."""
    prefix, _, attr = name.partition(".")
    return ("torch.nn.functional:" if prefix == "F" else "torch:") + attr


for _name, _expr, _weight in _UNARY_FUNCS:
    register(
        OpDef(
            name=_name,
            category="activation" if _name.startswith("F.") or _name in _ACTIVATIONS else "elementwise",
            apply=_unary(_expr),
            weight=_weight,
            requires=_requires(_name),
        )
    )
