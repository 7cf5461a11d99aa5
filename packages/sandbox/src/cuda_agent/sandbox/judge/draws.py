"""The seeds of a verification's input draws, and its extra draws.

``get_inputs()`` decides the value distribution, and a narrow one lets a wrong candidate
pass (``torch.rand`` inputs are all positive, so "ReLU" returning its input unchanged
matches). An extra draw keeps the shapes, dtypes and non-floating-point inputs (indices,
sizes) of a ``get_inputs()`` draw and refills every floating-point input from another
distribution (:data:`EXTRA_DRAWS`). The verification skips a draw on which the reference is
not finite, raises, or is ill-conditioned: its output moves beyond the tolerance when the
inputs are scaled by 1 +- a few ulps (:func:`nudged`), e.g. a sum that cancels to almost zero.
"""

from __future__ import annotations

import os
from typing import Any

from .comparison import compare_outputs
from .inputs import clone_inputs
from .loading import short_exc
from .watchdog import synchronize


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def input_seeds(base: int, n: int) -> list[int]:
    return [(base + 1000003 * (i + 1)) & 0x7FFFFFFF for i in range(n)]


# name -> (label used in messages, sampler(shape, generator, device) -> float32 tensor)
EXTRA_DRAWS: dict[str, tuple[str, Any]] = {
    "normal": ("standard normal", lambda shape, gen, dev: _torch().randn(shape, generator=gen, device=dev)),
    "wide": ("uniform on [-8, 8], mixed signs",
             lambda shape, gen, dev: _torch().rand(shape, generator=gen, device=dev).mul_(16.0).sub_(8.0)),
}


def _torch() -> Any:
    import torch

    return torch


def extra_draw_inputs(values: list, kind: str, seed: int, device: Any) -> tuple[list, int]:
    """``values`` (a get_inputs() draw) with every floating-point tensor refilled from the
    distribution ``kind``: same shape, dtype, strides and device; everything else kept.
    Returns (new values, number of tensors refilled)."""
    import torch

    if kind not in EXTRA_DRAWS:
        raise ValueError(f"unknown extra input draw {kind!r}; valid: {', '.join(EXTRA_DRAWS)}")
    sampler = EXTRA_DRAWS[kind][1]
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    out, refilled = [], 0
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0:
            new = torch.empty_like(v)
            new.copy_(sampler(tuple(v.shape), gen, v.device))
            out.append(new)
            refilled += 1
        else:
            out.append(v)
    return out, refilled


def all_finite(obj: Any) -> bool:
    """True when every floating-point value in ``obj`` (tensors, nested containers, floats) is finite."""
    import math

    import torch

    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            return bool(torch.isfinite(obj).all())
        return True
    if isinstance(obj, (list, tuple)):
        return all(all_finite(v) for v in obj)
    if isinstance(obj, dict):
        return all(all_finite(v) for v in obj.values())
    if isinstance(obj, float):
        return math.isfinite(obj)
    return True


def nudged(values: list, seed: int) -> list:
    """Copies of ``values`` with floating-point tensors scaled elementwise by 1 +- 4 ulps
    (signs kept), to probe how sensitive the reference is to rounding-sized changes."""
    import torch

    out = []
    gen = None
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0:
            if gen is None:
                gen = torch.Generator(device=v.device)
                gen.manual_seed(seed)
            work = torch.float64 if v.dtype == torch.float64 else torch.float32
            eps = torch.finfo(v.dtype).eps
            u = torch.rand(v.shape, generator=gen, device=v.device, dtype=work).mul_(2.0).sub_(1.0)
            out.append((v.to(work) * (1.0 + 4.0 * eps * u)).to(v.dtype))
        else:
            out.append(v)
    return out


def steady(model: Any, inputs: list, ref_out: Any, seed: int, device: Any, atol: float, rtol: float,
           check_dtype: bool = True) -> bool:
    """Whether ``model``'s output on ``inputs`` (``ref_out``) stays within the tolerance when
    the inputs are :func:`nudged` by a few ulps (False where the nudged run raises)."""
    try:
        probe = model(*nudged(inputs, seed))
        synchronize(device)
        return compare_outputs(ref_out, probe, atol, rtol, "output", check_dtype, scaled=True).ok
    except Exception:
        return False


def reference_on_extra_draw(model: Any, inputs: list, seed: int, device: Any, opts: Any) -> tuple[Any, str]:
    """The reference ``model``'s output on an extra draw's ``inputs`` and "", or None and why
    the draw is skipped: the reference raised, is not finite on them (inputs outside its
    domain) or, with ``opts.extra_draw_stability_check``, is ill-conditioned on them."""
    try:
        ref_out = model(*clone_inputs(inputs))
        synchronize(device)
    except Exception as exc:  # inputs outside the reference's domain
        return None, f"reference raised: {short_exc(exc, 200)}"
    if not all_finite(ref_out):
        return None, "reference output not finite (inputs outside its domain)"
    # ref_out is finite: a probe within the tolerance of it is finite too
    if opts.extra_draw_stability_check and not steady(model, inputs, ref_out, seed + 1, device, opts.atol, opts.rtol,
                                                      opts.check_dtype):
        return None, "reference ill-conditioned (output moves beyond the tolerance under ulp-sized input changes)"
    return ref_out, ""
