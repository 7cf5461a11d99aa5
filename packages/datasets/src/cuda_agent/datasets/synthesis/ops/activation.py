"""Activations as ``nn`` modules, and the functional ones that draw a parameter.

The one-expression activations (``F.gelu``, ``torch.relu``...) are in :mod:`.unary`;
the transformers activation classes are in :mod:`.transformers_modules`.
"""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder
from .registry import OpDef, register

# nn module classes built without arguments: (name, weight)
_MODULE_ACTS = [
    ("nn.ReLU", 1.0),
    ("nn.GELU", 1.0),
    ("nn.SiLU", 0.6),
    ("nn.Tanh", 0.6),
    ("nn.Sigmoid", 0.6),
    ("nn.Hardswish", 0.4),
    ("nn.Mish", 0.4),
    ("nn.ELU", 0.3),
    ("nn.Softplus", 0.3),
]


def _module_act(ctor: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        a = b.attr("act")
        b.init_lines.append(f"{a} = {ctor}")
        b.forward_lines.append(f"x = {a}(x)")

    return apply


for _name, _weight in _MODULE_ACTS:
    register(
        OpDef(
            name=_name,
            category="activation",
            apply=_module_act(f"{_name}()"),
            weight=_weight,
            requires="torch.nn:" + _name.removeprefix("nn."),
        )
    )


def _leaky_relu(b: Builder) -> None:
    slope = b.rng.choice([0.01, 0.02, 0.1, 0.2])
    b.forward_lines.append(f"x = F.leaky_relu(x, negative_slope={slope})")


def _hardtanh(b: Builder) -> None:
    lo = b.rng.choice([-1.0, -0.5, -2.0])
    b.forward_lines.append(f"x = F.hardtanh(x, min_val={lo}, max_val={-lo})")


register(OpDef(name="F.leaky_relu", category="activation", apply=_leaky_relu, weight=1.0))
register(OpDef(name="F.hardtanh", category="activation", apply=_hardtanh, weight=0.6))
