"""Collecting seed operators from the installed torch (and transformers, when present).

The seeds are the registry's operators whose API exists in this environment. The
inventory also lists the ``torch.nn`` modules and ``torch.nn.functional`` functions
found by introspection, marking the ones the rule-based composer has a shape rule for.
"""

from __future__ import annotations

import importlib.util
import inspect

from .ops import REGISTRY, OpDef


def transformers_installed() -> bool:
    return importlib.util.find_spec("transformers") is not None


def collect_seeds(transformers: str | bool = "auto", include_stochastic: bool = True) -> dict[str, OpDef]:
    """Available seed operators by name. ``transformers``: auto | true | false."""
    use_hf = transformers_installed() if transformers in ("auto", None) else bool(transformers)
    out = {}
    for name, op in REGISTRY.items():
        if op.source == "transformers" and not use_hf:
            continue
        if op.stochastic and not include_stochastic:
            continue
        if op.available():
            out[name] = op
    return out


def torch_inventory() -> dict[str, list[tuple[str, bool]]]:
    """torch.nn module classes and functional ops found, each with "has a shape rule"."""
    import torch.nn as nn
    import torch.nn.functional as F

    covered = {n.split("[")[0] for n in REGISTRY}
    modules = sorted(
        name
        for name, obj in vars(nn).items()
        if inspect.isclass(obj) and issubclass(obj, nn.Module) and not name.startswith("_")
    )
    funcs = sorted(name for name, obj in vars(F).items() if callable(obj) and not name.startswith("_") and name.islower())
    return {
        "nn": [(m, f"nn.{m}" in covered) for m in modules],
        "functional": [(f, f"F.{f}" in covered or f"torch.{f}" in covered) for f in funcs],
    }
