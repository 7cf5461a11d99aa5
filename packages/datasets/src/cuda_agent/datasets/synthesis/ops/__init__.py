"""Seed operators with shape rules, one module per operator family, and the model builder.

Each operator knows which input ranks it accepts and how it changes the shape; applied
to a :class:`Builder` it adds its lines to the model.py being written. Importing this
package fills :data:`REGISTRY` by importing the modules of :data:`FAMILIES` in that
order, which is the registry's order: the composer's weighted draws follow it, so the
same seed gives the same candidates only while the order stays (add new families last).
"""

from __future__ import annotations

import importlib

from .builder import PRESETS, Builder, Dim, NotApplicable, ShapePreset
from .registry import REGISTRY, OpDef, register

FAMILIES = (
    "unary",
    "activation",
    "elementwise",
    "stochastic",
    "softmax",
    "reduction",
    "matmul",
    "conv",
    "norm",
    "pool",
    "shape",
    "loss",
    "transformers_modules",
)
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")

__all__ = ["FAMILIES", "PRESETS", "REGISTRY", "Builder", "Dim", "NotApplicable", "OpDef", "ShapePreset", "register"]
