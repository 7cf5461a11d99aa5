"""Drawing task inputs: fresh per seed, made on the target device, never all zeros.

``get_inputs()`` of a KernelBench-style task builds its tensors with torch's factory
functions (``torch.rand``, ``torch.randn``, ...). :func:`draw_inputs` seeds every generator,
calls it under ``torch.device(device)`` so that the tensors are drawn directly on the GPU
(tens of times faster than drawing gigabytes on the CPU and copying), and moves anything left
on another device over. A floating-point input that comes out all zeros (a task that builds
its inputs with ``torch.zeros``) is replaced by standard-normal values from the same seed:
zeros hide wrong kernels (``0 * anything``) and unwritten outputs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class DrawnInputs:
    values: list
    seed: int
    replaced_zeros: list[int] = field(default_factory=list)  # positions re-drawn because all zero


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # pragma: no cover
        pass


def to_device(obj: Any, device: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device) if obj.device != torch.device(device) else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def draw_inputs(get_inputs: Callable[[], Any], seed: int, device: Any = "cpu") -> DrawnInputs:
    """Call ``get_inputs()`` with every generator seeded by ``seed``, on ``device``."""
    import torch

    seed_everything(seed)
    dev = torch.device(device)
    with torch.device(dev):
        values = get_inputs()
    if not isinstance(values, (list, tuple)):
        values = [values]
    values = [to_device(v, dev) for v in values]
    replaced = []
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed + 7919)
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0:
            if not bool(v.any()):
                values[i] = torch.randn(v.shape, dtype=v.dtype, device=dev, generator=gen)
                replaced.append(i)
    return DrawnInputs(values=list(values), seed=seed, replaced_zeros=replaced)


def draw_input_sets(get_inputs: Callable[[], Any], seeds: list[int], device: Any = "cpu") -> list[list]:
    return [draw_inputs(get_inputs, s, device).values for s in seeds]


def clone_inputs(values: list) -> list:
    import torch

    out = []
    for v in values:
        out.append(v.clone() if isinstance(v, torch.Tensor) else v)
    return out


def describe(obj: Any) -> Any:
    """A JSON-ready description: shapes and dtypes of tensors, reprs of the rest."""
    import torch

    if isinstance(obj, torch.Tensor):
        return {"shape": list(obj.shape), "dtype": str(obj.dtype).replace("torch.", "")}
    if isinstance(obj, (list, tuple)):
        return [describe(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v) for k, v in obj.items()}
    if isinstance(obj, (int, float, bool, str)) or obj is None:
        return obj
    return repr(obj)


def nbytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    return 0


def perturb_(values: list, step: int) -> None:
    """Change every floating-point input in place (outside any timed region) so that a
    candidate caching results by input pointer or shape returns stale numbers, which the
    closing spot check catches. Cycles through four states (negate, scale by 1+2^-7, negate,
    scale back) so that values neither drift nor repeat on consecutive visits."""
    import torch

    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0:
            phase = step % 4
            if phase in (0, 2):
                v.neg_()
            elif phase == 1:
                v.mul_(1.0078125)
            else:
                v.div_(1.0078125)
