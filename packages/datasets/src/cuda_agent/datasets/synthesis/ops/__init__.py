"""Seed operators with shape rules, one module per operator family, and the model builder.

Each operator knows which input ranks it accepts and how it changes the shape; applied
to a :class:`Builder` it adds its lines to the model.py being written. Importing this
package fills :data:`REGISTRY`. The family modules are imported below in a fixed order,
which is the registry's order: the composer's weighted draws follow it, so the same seed
gives the same candidates only while the order stays (add new families at the end).
"""

from __future__ import annotations

# isort: off
from . import (  # noqa: F401  (imported to register their operators, in this order)
    unary,
    activation,
    elementwise,
    stochastic,
    softmax,
    reduction,
    matmul,
    conv,
    norm,
    pool,
    shape,
    loss,
    transformers_modules,
)
# isort: on
from .builder import PRESETS, Builder, Dim, NotApplicable, ShapePreset
from .registry import REGISTRY, OpDef, register

__all__ = ["PRESETS", "REGISTRY", "Builder", "Dim", "NotApplicable", "OpDef", "ShapePreset", "register"]
