"""Shape changes and resampling: flatten, transpose, interpolation and pixel shuffle."""

from __future__ import annotations

from .builder import Builder, Dim, NotApplicable
from .registry import OpDef, register


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


register(OpDef(name="torch.flatten", category="shape", apply=_flatten, ranks=(3, 4, 5), weight=0.6))
register(OpDef(name="torch.transpose", category="shape", apply=_transpose, ranks=(3,), weight=0.3))
register(OpDef(name="F.interpolate", category="resample", apply=_interpolate, ranks=(3, 4, 5), weight=0.4))
register(OpDef(name="F.pixel_shuffle", category="resample", apply=_pixel_shuffle, ranks=(4,), weight=0.2))
