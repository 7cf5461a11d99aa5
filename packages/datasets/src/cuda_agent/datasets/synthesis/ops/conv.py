"""Convolutions and transposed convolutions in 1, 2 and 3 dimensions.

The rule draws kernel size, stride and padding, computes the output spatial size and
refuses inputs smaller than the kernel; a few plain convolutions become depthwise.
"""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder, Dim, NotApplicable
from .registry import OpDef, register


def _conv_class(nd: int, transpose: bool) -> str:
    return f"nn.ConvTranspose{nd}d" if transpose else f"nn.Conv{nd}d"


def _conv(nd: int, transpose: bool) -> Callable[[Builder], None]:
    cls = _conv_class(nd, transpose)

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


# spatial dims -> (weight of nn.ConvNd, weight of nn.ConvTransposeNd)
_WEIGHTS = {1: (1.0, 0.4), 2: (3.0, 1.0), 3: (1.0, 0.6)}
for _nd, _weights in _WEIGHTS.items():
    for _transpose, _weight in zip((False, True), _weights):
        register(
            OpDef(
                name=_conv_class(_nd, _transpose),
                category="conv",
                apply=_conv(_nd, _transpose),
                ranks=(_nd + 2,),
                weight=_weight,
            )
        )
