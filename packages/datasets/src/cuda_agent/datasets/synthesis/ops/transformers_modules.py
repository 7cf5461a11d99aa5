"""Modules from the transformers library: GELU variants, RMS norms and GPT-2's ``Conv1D``.

They are seeds only when transformers is installed (``source="transformers"``; each op
``requires`` its class), and the generated model.py imports the class it uses.
"""

from __future__ import annotations

from collections.abc import Callable

from .builder import Builder, Dim
from .registry import OpDef, register


def _hf_module(import_line: str, cls: str, ctor_args: Callable[[Builder], str], base: str) -> Callable[[Builder], None]:
    def apply(b: Builder) -> None:
        b.imports.add(import_line)
        a = b.attr(base)
        b.init_lines.append(f"{a} = {cls}({ctor_args(b)})")
        b.forward_lines.append(f"x = {a}(x)")

    return apply


def _no_args(b: Builder) -> str:
    return ""


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
# activation classes built without arguments: (class, weight)
_ACTIVATIONS = [
    ("NewGELUActivation", 1.0),
    ("QuickGELUActivation", 1.0),
    ("GELUActivation", 0.6),
    ("FastGELUActivation", 0.6),
    ("AccurateGELUActivation", 0.4),
    ("MishActivation", 0.3),
]
for _cls, _weight in _ACTIVATIONS:
    register(
        OpDef(
            name=f"transformers.{_cls}",
            category="activation",
            apply=_hf_module(f"from {_ACT_MOD} import {_cls}", _cls, _no_args, "act"),
            weight=_weight,
            source="transformers",
            requires=f"{_ACT_MOD}:{_cls}",
        )
    )

# RMS norms over the last dimension: (class, module, attribute base, weight)
_RMS_NORMS = [
    ("LlamaRMSNorm", "transformers.models.llama.modeling_llama", "rms_norm", 1.0),
    ("T5LayerNorm", "transformers.models.t5.modeling_t5", "t5_norm", 0.5),
]
for _cls, _module, _base, _weight in _RMS_NORMS:
    register(
        OpDef(
            name=f"transformers.{_cls}",
            category="norm",
            apply=_hf_module(f"from {_module} import {_cls}", _cls, _rmsnorm_args, _base),
            ranks=(2, 3, 4),
            weight=_weight,
            source="transformers",
            requires=f"{_module}:{_cls}",
        )
    )

register(
    OpDef(
        name="transformers.Conv1D",
        category="matmul",
        apply=_conv1d_hf,
        ranks=(2, 3),
        weight=0.8,
        source="transformers",
        requires="transformers.pytorch_utils:Conv1D",
    )
)
