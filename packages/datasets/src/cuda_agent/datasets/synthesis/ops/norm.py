"""Normalisation layers: batch, instance, group and layer norm, and ``F.normalize``.

Batch and instance norm take the channel dimension, layer norm the last one; group norm
needs a group count that divides the channels. The transformers RMS norms are in
:mod:`.transformers_modules`.
"""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder, NotApplicable
from .registry import OpDef, register


def _channel_norm(cls: str, base: str) -> Callable[[Builder], None]:
    """A norm module built from the channel count alone (``nn.BatchNorm2d(num_features)``...)."""

    def apply(b: Builder) -> None:
        c = b.dim_param(1, "num_features")
        a = b.attr(base)
        b.init_lines.append(f"{a} = {cls}({c})")
        b.forward_lines.append(f"x = {a}(x)")

    return apply


def _groupnorm(b: Builder) -> None:
    c = b.shape[1].value
    groups = [g for g in (2, 4, 8, 16, 32) if c % g == 0 and g < c]
    if not groups:
        raise NotApplicable("no group count divides the channels")
    g = b.init_param("num_groups", b.rng.choice(groups))
    cn = b.dim_param(1, "num_channels")
    a = b.attr("group_norm")
    b.init_lines.append(f"{a} = nn.GroupNorm({g}, {cn})")
    b.forward_lines.append(f"x = {a}(x)")


def _layernorm(b: Builder) -> None:
    n = b.dim_param(-1, "normalized_shape")
    a = b.attr("layer_norm")
    b.init_lines.append(f"{a} = nn.LayerNorm({n})")
    b.forward_lines.append(f"x = {a}(x)")


def _normalize(b: Builder) -> None:
    d = b.pick_dim()
    b.forward_lines.append(f"x = F.normalize(x, p=2.0, dim={d})")


# (class, attribute base, accepted ranks, weight)
_CHANNEL_NORMS = [
    ("nn.BatchNorm1d", "bn", (2, 3), 0.8),
    ("nn.BatchNorm2d", "bn", (4,), 1.5),
    ("nn.BatchNorm3d", "bn", (5,), 0.8),
    ("nn.InstanceNorm1d", "instance_norm", (3,), 0.3),
    ("nn.InstanceNorm2d", "instance_norm", (4,), 0.6),
    ("nn.InstanceNorm3d", "instance_norm", (5,), 0.3),
]
for _cls, _base, _ranks, _weight in _CHANNEL_NORMS:
    register(OpDef(name=_cls, category="norm", apply=_channel_norm(_cls, _base), ranks=_ranks, weight=_weight))
register(OpDef(name="nn.GroupNorm", category="norm", apply=_groupnorm, ranks=(3, 4, 5), weight=1.0))
register(OpDef(name="nn.LayerNorm", category="norm", apply=_layernorm, ranks=(2, 3, 4), weight=1.2))
register(OpDef(name="F.normalize", category="norm", apply=_normalize, ranks=(2, 3, 4), weight=0.4))
