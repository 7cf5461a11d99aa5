"""Seed operators with shape rules, and the builder that turns an op chain into model.py.

Each operator knows which input ranks it accepts and how it changes the shape. A
:class:`Builder` tracks the current tensor shape with a symbolic name per dimension
(``batch_size``, ``in_channels``...), the module-level constants, the ``__init__``
parameters (passed through ``get_init_inputs``), extra forward inputs and the lines of
``__init__`` and ``forward``; :meth:`Builder.render` writes a KernelBench-style file.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Callable


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


@dataclass
class OpDef:
    name: str  # e.g. "nn.Conv2d", "torch.relu", "F.gelu"
    category: str
    ranks: tuple[int, ...] | None  # accepted input ranks (None: any rank >= 1)
    apply: Callable[[Builder], None]
    weight: float = 1.0
    terminal: bool = False  # output is a scalar; nothing may follow
    source: str = "torch"  # "torch" or "transformers"
    requires: str | None = None  # "module:attr" that must import for the op to be available
    stochastic: bool = False

    def accepts(self, rank: int) -> bool:
        return rank >= 1 if self.ranks is None else rank in self.ranks

    def available(self) -> bool:
        if not self.requires:
            return True
        module, _, attr = self.requires.partition(":")
        try:
            obj = importlib.import_module(module)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
        except Exception:  # noqa: BLE001
            return False
        return True


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    REGISTRY[op.name] = op
    return op


# --- elementwise and activations -------------------------------------------------

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


def _unary(expr: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        b.forward_lines.append(f"x = {expr}")

    return apply


def _requires(name: str) -> str:
    """ "F.gelu" -> "torch.nn.functional:gelu", "torch.relu" -> "torch:relu"."""
    prefix, _, attr = name.partition(".")
    return ("torch.nn.functional:" if prefix == "F" else "torch:") + attr


_ACTIVATIONS = {"torch.relu", "torch.sigmoid", "torch.tanh"}
for _name, _expr, _w in _UNARY_FUNCS:
    _cat = "activation" if _name.startswith("F.") or _name in _ACTIVATIONS else "elementwise"
    register(OpDef(_name, _cat, None, _unary(_expr), _w, requires=_requires(_name)))

_MODULE_ACTS = [
    ("nn.ReLU", "act", "nn.ReLU()", 1.0),
    ("nn.GELU", "act", "nn.GELU()", 1.0),
    ("nn.SiLU", "act", "nn.SiLU()", 0.6),
    ("nn.Tanh", "act", "nn.Tanh()", 0.6),
    ("nn.Sigmoid", "act", "nn.Sigmoid()", 0.6),
    ("nn.Hardswish", "act", "nn.Hardswish()", 0.4),
    ("nn.Mish", "act", "nn.Mish()", 0.4),
    ("nn.ELU", "act", "nn.ELU()", 0.3),
    ("nn.Softplus", "act", "nn.Softplus()", 0.3),
]


def _module_act(base: str, ctor: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        a = b.attr(base)
        b.init_lines.append(f"{a} = {ctor}")
        b.forward_lines.append(f"x = {a}(x)")

    return apply


for _name, _base, _ctor, _w in _MODULE_ACTS:
    register(OpDef(_name, "activation", None, _module_act(_base, _ctor), _w, requires="torch.nn:" + _name[3:]))


def _leaky_relu(b: Builder) -> None:
    slope = b.rng.choice([0.01, 0.02, 0.1, 0.2])
    b.forward_lines.append(f"x = F.leaky_relu(x, negative_slope={slope})")


def _hardtanh(b: Builder) -> None:
    lo = b.rng.choice([-1.0, -0.5, -2.0])
    b.forward_lines.append(f"x = F.hardtanh(x, min_val={lo}, max_val={-lo})")


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


register(OpDef("F.leaky_relu", "activation", None, _leaky_relu, 1.0))
register(OpDef("F.hardtanh", "activation", None, _hardtanh, 0.6))
register(OpDef("torch.clamp", "elementwise", None, _clamp, 0.8))
register(OpDef("torch.mul", "elementwise", None, _mul_scalar, 1.2))
register(OpDef("torch.add", "elementwise", (2, 3, 4, 5), _add_bias, 1.2))
register(OpDef("torch.mul[input]", "elementwise", None, _mul_input, 0.3))
register(OpDef("torch.maximum", "elementwise", None, _maximum_input, 0.3))
register(OpDef("torch.tril", "elementwise", (2, 3, 4), _tril, 0.2))


# --- stochastic (kept as seeds: the determinism filter must remove them) ------------


def _dropout(b: Builder) -> None:
    p = b.rng.choice([0.1, 0.2, 0.5])
    a = b.attr("dropout")
    b.init_lines.append(f"{a} = nn.Dropout(p={p})")
    b.forward_lines.append(f"x = {a}(x)")


def _noise(b: Builder) -> None:
    b.forward_lines.append("x = x + 0.1 * torch.randn_like(x)")


register(OpDef("nn.Dropout", "stochastic", None, _dropout, 0.3, stochastic=True))
register(OpDef("torch.randn_like", "stochastic", None, _noise, 0.1, stochastic=True))


# --- softmax and reductions -----------------------------------------------------------


def _pick_dim(b: Builder, low: int = 1) -> int:
    return b.rng.randint(low, b.rank - 1) if b.rank - 1 >= low else b.rank - 1


def _softmax(fn: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        d = _pick_dim(b)
        b.forward_lines.append(f"x = {fn}(x, dim={d})")

    return apply


def _softmax_module(b: Builder) -> None:
    d = _pick_dim(b)
    a = b.attr("softmax")
    b.init_lines.append(f"{a} = nn.Softmax(dim={d})")
    b.forward_lines.append(f"x = {a}(x)")


register(OpDef("torch.softmax", "softmax", (2, 3, 4, 5), _softmax("torch.softmax"), 1.2))
register(OpDef("F.log_softmax", "softmax", (2, 3, 4, 5), _softmax("F.log_softmax"), 0.8))
register(OpDef("nn.Softmax", "softmax", (2, 3, 4, 5), _softmax_module, 0.5))


def _reduction(fn: str, keep_prob: float = 0.5) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        d = _pick_dim(b)
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


for _name, _w in (("torch.sum", 1.0), ("torch.mean", 1.2), ("torch.amax", 0.8), ("torch.amin", 0.4),
                  ("torch.logsumexp", 0.6), ("torch.var", 0.3), ("torch.std", 0.2), ("torch.norm", 0.3)):
    register(OpDef(_name, "reduction", (2, 3, 4, 5), _reduction(_name), _w))


def _cumsum(b: Builder) -> None:
    d = _pick_dim(b)
    b.forward_lines.append(f"x = torch.cumsum(x, dim={d})")


register(OpDef("torch.cumsum", "scan", (2, 3, 4), _cumsum, 0.4))


# --- matmul and linear ----------------------------------------------------------------


def _linear(b: Builder) -> None:
    inf = b.dim_param(-1, "in_features")
    out = b.new_features()
    outn = b.init_param("out_features", out)
    bias = b.rng.random() < 0.85
    a = b.attr("linear" if "linear" not in b.attrs else "fc")
    b.init_lines.append(f"{a} = nn.Linear({inf}, {outn}{'' if bias else ', bias=False'})")
    b.forward_lines.append(f"x = {a}(x)")
    b.set_shape(b.shape[:-1] + [Dim(out, outn)])


def _matmul_input(b: Builder) -> None:
    k = b.shape[-1]
    kname = b.dim_expr(-1, "K")
    n = b.new_features()
    nname = b.const("N", n)
    y = b.extra_input("w", [Dim(k.value, kname), Dim(n, nname)])
    b.forward_lines.append(f"x = torch.matmul(x, {y})")
    b.set_shape(b.shape[:-1] + [Dim(n, nname)])


def _bmm_input(b: Builder) -> None:
    bname = b.dim_expr(0, "batch_size")
    kname = b.dim_expr(-1, "K")
    n = b.new_features()
    nname = b.const("N", n)
    y = b.extra_input("w", [Dim(b.shape[0].value, bname), Dim(b.shape[-1].value, kname), Dim(n, nname)])
    b.forward_lines.append(f"x = torch.bmm(x, {y})")
    b.set_shape([b.shape[0], b.shape[1], Dim(n, nname)])


def _gram(b: Builder) -> None:
    b.forward_lines.append("x = torch.matmul(x, x.transpose(-2, -1))")
    b.set_shape(b.shape[:-1] + [Dim(b.shape[-2].value, b.shape[-2].name)])


register(OpDef("nn.Linear", "matmul", (2, 3), _linear, 3.0))
register(OpDef("torch.matmul", "matmul", (2, 3), _matmul_input, 1.0))
register(OpDef("torch.bmm", "matmul", (3,), _bmm_input, 0.5))
register(OpDef("torch.matmul[gram]", "matmul", (3, 4), _gram, 0.3))


# --- convolutions -----------------------------------------------------------------------


def _conv(nd: int, transpose: bool) -> Callable[[Builder], None]:
    cls = f"nn.ConvTranspose{nd}d" if transpose else f"nn.Conv{nd}d"

    def apply(b: Builder) -> None:
        rng = b.rng
        spatial = [d.value for d in b.shape[2:]]
        k = rng.choice([1, 3, 3, 3, 5]) if nd < 3 else rng.choice([1, 3, 3])
        stride = rng.choice([1, 1, 1, 2])
        pad = rng.choice([0, k // 2])
        out_pad = 0
        if transpose:
            out_pad = 1 if stride == 2 and rng.random() < 0.3 else 0
            out_sp = [(s - 1) * stride - 2 * pad + k + out_pad for s in spatial]
        else:
            if any(s + 2 * pad < k for s in spatial):
                raise NotApplicable("input smaller than kernel")
            out_sp = [(s + 2 * pad - k) // stride + 1 for s in spatial]
        inc = b.dim_param(1, "in_channels")
        oc = b.new_channels()
        ocn = b.init_param("out_channels", oc)
        ks = b.init_param("kernel_size", k)
        extra = ""
        if stride != 1:
            extra += f", stride={b.init_param('stride', stride)}"
        if pad:
            extra += f", padding={b.init_param('padding', pad)}"
        if out_pad:
            extra += ", output_padding=1"
        groups = ""
        if not transpose and rng.random() < 0.1 and b.shape[1].value == oc:
            groups = f", groups={inc}"
        a = b.attr("conv_transpose" if transpose else "conv")
        b.init_lines.append(f"{a} = {cls}({inc}, {ocn}, {ks}{extra}{groups})")
        b.forward_lines.append(f"x = {a}(x)")
        b.set_shape([b.shape[0], Dim(oc, ocn)] + [Dim(s, None) for s in out_sp])

    return apply


for _nd in (1, 2, 3):
    register(OpDef(f"nn.Conv{_nd}d", "conv", (_nd + 2,), _conv(_nd, False), {1: 1.0, 2: 3.0, 3: 1.0}[_nd]))
    register(OpDef(f"nn.ConvTranspose{_nd}d", "conv", (_nd + 2,), _conv(_nd, True), {1: 0.4, 2: 1.0, 3: 0.6}[_nd]))


# --- normalisation --------------------------------------------------------------------


def _batchnorm(nd: int) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        c = b.dim_param(1, "num_features")
        a = b.attr("bn")
        b.init_lines.append(f"{a} = nn.BatchNorm{nd}d({c})")
        b.forward_lines.append(f"x = {a}(x)")

    return apply


def _instancenorm(nd: int) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        c = b.dim_param(1, "num_features")
        a = b.attr("instance_norm")
        b.init_lines.append(f"{a} = nn.InstanceNorm{nd}d({c})")
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
    d = _pick_dim(b)
    b.forward_lines.append(f"x = F.normalize(x, p=2.0, dim={d})")


register(OpDef("nn.BatchNorm1d", "norm", (2, 3), _batchnorm(1), 0.8))
register(OpDef("nn.BatchNorm2d", "norm", (4,), _batchnorm(2), 1.5))
register(OpDef("nn.BatchNorm3d", "norm", (5,), _batchnorm(3), 0.8))
register(OpDef("nn.InstanceNorm1d", "norm", (3,), _instancenorm(1), 0.3))
register(OpDef("nn.InstanceNorm2d", "norm", (4,), _instancenorm(2), 0.6))
register(OpDef("nn.InstanceNorm3d", "norm", (5,), _instancenorm(3), 0.3))
register(OpDef("nn.GroupNorm", "norm", (3, 4, 5), _groupnorm, 1.0))
register(OpDef("nn.LayerNorm", "norm", (2, 3, 4), _layernorm, 1.2))
register(OpDef("F.normalize", "norm", (2, 3, 4), _normalize, 0.4))


# --- pooling ----------------------------------------------------------------------------


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


for _nd in (1, 2, 3):
    register(OpDef(f"nn.MaxPool{_nd}d", "pool", (_nd + 2,), _pool("Max", _nd), {1: 0.5, 2: 1.2, 3: 0.5}[_nd]))
    register(OpDef(f"nn.AvgPool{_nd}d", "pool", (_nd + 2,), _pool("Avg", _nd), {1: 0.4, 2: 0.8, 3: 0.4}[_nd]))
    register(OpDef(f"nn.AdaptiveAvgPool{_nd}d", "pool", (_nd + 2,), _adaptive("Avg", _nd), 0.3))
register(OpDef("nn.AdaptiveMaxPool2d", "pool", (4,), _adaptive("Max", 2), 0.2))


# --- shape changes and resampling --------------------------------------------------------


def _flatten(b: Builder) -> None:
    n = 1
    for d in b.shape[1:]:
        n *= d.value
    b.forward_lines.append("x = torch.flatten(x, 1)")
    b.set_shape([b.shape[0], Dim(n, None)])


def _transpose(b: Builder) -> None:
    b.forward_lines.append("x = torch.transpose(x, 1, 2)")
    dims = list(b.shape)
    dims[1], dims[2] = dims[2], dims[1]
    b.set_shape(dims)


def _interpolate(b: Builder) -> None:
    mode = b.rng.choice(["nearest", "nearest", "bilinear" if b.rank == 4 else "nearest"])
    extra = ", align_corners=False" if mode == "bilinear" else ""
    b.forward_lines.append(f"x = F.interpolate(x, scale_factor=2, mode={mode!r}{extra})")
    b.set_shape(b.shape[:2] + [Dim(d.value * 2, None) for d in b.shape[2:]])


def _pixel_shuffle(b: Builder) -> None:
    c = b.shape[1].value
    if c % 4:
        raise NotApplicable("channels not divisible by 4")
    b.forward_lines.append("x = F.pixel_shuffle(x, 2)")
    b.set_shape([b.shape[0], Dim(c // 4, None), Dim(b.shape[2].value * 2, None), Dim(b.shape[3].value * 2, None)])


register(OpDef("torch.flatten", "shape", (3, 4, 5), _flatten, 0.6))
register(OpDef("torch.transpose", "shape", (3,), _transpose, 0.3))
register(OpDef("F.interpolate", "resample", (3, 4, 5), _interpolate, 0.4))
register(OpDef("F.pixel_shuffle", "resample", (4,), _pixel_shuffle, 0.2))


# --- losses and similarities (scalar or reduced outputs) -------------------------------------


def _loss(fn: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        y = b.extra_input("targets", b.shape)
        b.forward_lines.append(f"x = {fn}(x, {y})")
        b.set_shape([])

    return apply


def _cosine(b: Builder) -> None:
    y = b.extra_input("y", b.shape)
    b.forward_lines.append(f"x = F.cosine_similarity(x, {y}, dim=1)")
    b.set_shape([d for i, d in enumerate(b.shape) if i != 1])


for _name, _w in (("F.mse_loss", 0.4), ("F.smooth_l1_loss", 0.3), ("F.l1_loss", 0.2), ("F.huber_loss", 0.2)):
    register(OpDef(_name, "loss", (2, 3, 4), _loss(_name), _w, terminal=True))
register(OpDef("F.cosine_similarity", "similarity", (2, 3), _cosine, 0.3))


# --- transformers modules (seeded only when transformers is installed) -------------------------


def _hf_module(import_line: str, cls: str, ctor_args: Callable[[Builder], str], base: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        b.imports.add(import_line)
        a = b.attr(base)
        b.init_lines.append(f"{a} = {cls}({ctor_args(b)})")
        b.forward_lines.append(f"x = {a}(x)")

    return apply


def _rmsnorm_args(b: Builder) -> str:
    return b.dim_param(-1, "hidden_size")


def _conv1d_hf(b: Builder) -> None:
    nx = b.dim_param(-1, "in_features")
    nf = b.new_features()
    nfn = b.init_param("out_features", nf)
    b.imports.add("from transformers.pytorch_utils import Conv1D")
    a = b.attr("proj")
    b.init_lines.append(f"{a} = Conv1D({nfn}, {nx})")
    b.forward_lines.append(f"x = {a}(x)")
    b.set_shape(b.shape[:-1] + [Dim(nf, nfn)])


_ACT_MOD = "transformers.activations"
for _cls, _w in (("NewGELUActivation", 1.0), ("QuickGELUActivation", 1.0), ("GELUActivation", 0.6),
                 ("FastGELUActivation", 0.6), ("AccurateGELUActivation", 0.4), ("MishActivation", 0.3)):
    register(
        OpDef(
            f"transformers.{_cls}",
            "activation",
            None,
            _hf_module(f"from {_ACT_MOD} import {_cls}", _cls, lambda b: "", "act"),
            _w,
            source="transformers",
            requires=f"{_ACT_MOD}:{_cls}",
        )
    )
register(
    OpDef(
        "transformers.LlamaRMSNorm",
        "norm",
        (2, 3, 4),
        _hf_module("from transformers.models.llama.modeling_llama import LlamaRMSNorm", "LlamaRMSNorm", _rmsnorm_args, "rms_norm"),
        1.0,
        source="transformers",
        requires="transformers.models.llama.modeling_llama:LlamaRMSNorm",
    )
)
register(
    OpDef(
        "transformers.T5LayerNorm",
        "norm",
        (2, 3, 4),
        _hf_module("from transformers.models.t5.modeling_t5 import T5LayerNorm", "T5LayerNorm", _rmsnorm_args, "t5_norm"),
        0.5,
        source="transformers",
        requires="transformers.models.t5.modeling_t5:T5LayerNorm",
    )
)
register(
    OpDef(
        "transformers.Conv1D",
        "matmul",
        (2, 3),
        _conv1d_hf,
        0.8,
        source="transformers",
        requires="transformers.pytorch_utils:Conv1D",
    )
)
