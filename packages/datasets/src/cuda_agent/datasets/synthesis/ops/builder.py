"""The builder that turns a chain of operators into a KernelBench-style model.py.

A :class:`Builder` tracks the current tensor shape with a symbolic name per dimension
(``batch_size``, ``in_channels``...), the module-level constants, the ``__init__``
parameters (passed through ``get_init_inputs``), extra forward inputs and the lines of
``__init__`` and ``forward``; :meth:`Builder.render` writes the file. The shape presets
give the ranges that input shapes and new sizes are drawn from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


class NotApplicable(Exception):
    """The operator cannot follow the current shape (too small, too large, wrong rank)."""


@dataclass
class Dim:
    value: int
    name: str | None = None


@dataclass
class ShapePreset:
    """Ranges that input shapes and new sizes are drawn from."""

    batch: tuple[int, int]
    channels: tuple[int, int]
    spatial1d: tuple[int, int]
    spatial2d: tuple[int, int]
    spatial3d: tuple[int, int]
    features: tuple[int, int]
    max_numel: int


PRESETS: dict[str, ShapePreset] = {
    "tiny": ShapePreset((2, 4), (3, 16), (16, 64), (8, 16), (4, 8), (16, 128), 200_000),
    "small": ShapePreset((4, 16), (8, 32), (32, 256), (16, 32), (6, 12), (64, 512), 2_000_000),
    "medium": ShapePreset((16, 64), (16, 64), (256, 2048), (32, 96), (12, 24), (256, 2048), 40_000_000),
    "large": ShapePreset((32, 128), (32, 128), (1024, 8192), (64, 256), (16, 48), (1024, 8192), 268_435_456),
}


def _pow2_between(rng: random.Random, lo: int, hi: int) -> int:
    opts = [1 << k for k in range(0, 31) if lo <= (1 << k) <= hi]
    if opts and rng.random() < 0.7:
        return rng.choice(opts)
    return rng.randint(lo, hi)


@dataclass
class Builder:
    rng: random.Random
    preset: ShapePreset
    shape: list[Dim] = field(default_factory=list)
    consts: dict[str, object] = field(default_factory=dict)  # module-level constants, in order
    init_params: list[str] = field(default_factory=list)
    init_lines: list[str] = field(default_factory=list)
    forward_lines: list[str] = field(default_factory=list)
    inputs: list[tuple[str, list[Dim]]] = field(default_factory=list)  # forward args and shapes
    imports: set[str] = field(default_factory=set)
    attrs: set[str] = field(default_factory=set)
    ops: list[str] = field(default_factory=list)
    input_fn: str = "torch.rand"

    # -- names ----------------------------------------------------------------
    def const(self, base: str, value: object) -> str:
        name = base
        k = 2
        while name in self.consts and self.consts[name] != value:
            name = f"{base}_{k}"
            k += 1
        self.consts[name] = value
        return name

    def init_param(self, base: str, value: object) -> str:
        name = self.const(base, value)
        if name not in self.init_params:
            self.init_params.append(name)
        return name

    def dim_param(self, i: int, base: str) -> str:
        """The current dimension ``i`` as an ``__init__`` parameter (naming it if needed)."""
        d = self.shape[i]
        if d.name is None:
            d.name = self.const(base, d.value)
        if d.name not in self.init_params:
            self.init_params.append(d.name)
        return d.name

    def dim_expr(self, i: int, base: str) -> str:
        d = self.shape[i]
        if d.name is None:
            d.name = self.const(base, d.value)
        return d.name

    def attr(self, base: str) -> str:
        name = base
        k = 2
        while name in self.attrs:
            name = f"{base}{k}"
            k += 1
        self.attrs.add(name)
        return f"self.{name}"

    def extra_input(self, base: str, dims: list[Dim]) -> str:
        if self.numel(dims) > self.preset.max_numel:
            raise NotApplicable("second input too large")
        used = {n for n, _ in self.inputs}
        name = base
        k = 2
        while name in used:
            name = f"{base}{k}"
            k += 1
        self.inputs.append((name, [Dim(d.value, d.name) for d in dims]))
        return name

    # -- shapes ---------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.shape)

    def numel(self, dims: list[Dim] | None = None) -> int:
        n = 1
        for d in self.shape if dims is None else dims:
            n *= d.value
        return n

    def set_shape(self, dims: list[Dim]) -> None:
        if any(d.value < 1 for d in dims):
            raise NotApplicable("empty dimension")
        if self.numel(dims) > self.preset.max_numel:
            raise NotApplicable("too large")
        self.shape = dims

    def pick_dim(self, low: int = 1) -> int:
        """A random dimension from ``low`` to the last (the last one if there is no choice)."""
        return self.rng.randint(low, self.rank - 1) if self.rank - 1 >= low else self.rank - 1

    def new_channels(self) -> int:
        return _pow2_between(self.rng, *self.preset.channels)

    def new_features(self) -> int:
        return _pow2_between(self.rng, *self.preset.features)

    def start(self, rank: int) -> None:
        p, rng = self.preset, self.rng
        for _ in range(50):
            if rank == 2:
                dims = [Dim(_pow2_between(rng, *p.batch), "batch_size"), Dim(self.new_features(), "in_features")]
            elif rank == 3:
                dims = [
                    Dim(_pow2_between(rng, *p.batch), "batch_size"),
                    Dim(self.new_channels(), "in_channels"),
                    Dim(_pow2_between(rng, *p.spatial1d), "length"),
                ]
            elif rank == 4:
                h = _pow2_between(rng, *p.spatial2d)
                w = h if rng.random() < 0.7 else _pow2_between(rng, *p.spatial2d)
                dims = [
                    Dim(_pow2_between(rng, *p.batch), "batch_size"),
                    Dim(self.new_channels(), "in_channels"),
                    Dim(h, "height"),
                    Dim(w, "width"),
                ]
            elif rank == 5:
                s = _pow2_between(rng, *p.spatial3d)
                dims = [
                    Dim(_pow2_between(rng, *p.batch), "batch_size"),
                    Dim(self.new_channels(), "in_channels"),
                    Dim(s, "depth"),
                    Dim(s, "height"),
                    Dim(s, "width"),
                ]
            else:
                raise ValueError(f"rank {rank}")
            if self.numel(dims) <= p.max_numel // 2:
                break
        for d in dims:
            self.consts.setdefault(d.name, d.value)
        self.shape = dims
        self.inputs.append(("x", [Dim(d.value, d.name) for d in dims]))

    # -- rendering ------------------------------------------------------------
    def render(self, doc: str) -> str:
        lines = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
        lines += sorted(self.imports)
        args = "".join(f", {p}" for p in self.init_params)
        fwd_args = ", ".join(n for n, _ in self.inputs)
        lines += ["", "", "class Model(nn.Module):", '    """', f"    {doc}", '    """', ""]
        lines.append(f"    def __init__(self{args}):")
        lines.append("        super(Model, self).__init__()")
        lines += [f"        {ln}" for ln in self.init_lines] or []
        lines += ["", f"    def forward(self, {fwd_args}):"]
        lines += [f"        {ln}" for ln in self.forward_lines]
        lines += ["        return x", "", ""]
        for name, value in self.consts.items():
            lines.append(f"{name} = {value!r}")
        lines += ["", "", "def get_inputs():"]
        tensors = []
        for _name, dims in self.inputs:
            ds = ", ".join(d.name if d.name else str(d.value) for d in dims)
            tensors.append(f"{self.input_fn}({ds})")
        lines.append(f"    return [{', '.join(tensors)}]")
        lines += ["", "", "def get_init_inputs():", f"    return [{', '.join(self.init_params)}]", ""]
        return "\n".join(lines)
