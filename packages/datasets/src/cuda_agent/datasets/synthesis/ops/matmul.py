"""Matrix products: ``nn.Linear``, matmul and bmm with a second input, and the Gram matrix.

Each changes the last dimension (the Gram matrix makes it equal to the one before).
The transformers ``Conv1D`` projection is in :mod:`.transformers_modules`.
"""

from __future__ import annotations

from .builder import Builder, Dim
from .registry import OpDef, register


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


register(OpDef(name="nn.Linear", category="matmul", apply=_linear, ranks=(2, 3), weight=3.0))
register(OpDef(name="torch.matmul", category="matmul", apply=_matmul_input, ranks=(2, 3), weight=1.0))
register(OpDef(name="torch.bmm", category="matmul", apply=_bmm_input, ranks=(3,), weight=0.5))
register(OpDef(name="torch.matmul[gram]", category="matmul", apply=_gram, ranks=(3, 4), weight=0.3))
