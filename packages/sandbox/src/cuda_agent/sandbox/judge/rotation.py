"""What ties a timed call to its output, so that the trusted side can check timed work.

* Inputs change between timed calls (untimed): call ``j`` of a timing runs on input set
  ``j % k`` rewritten from its pristine copy as ``pristine * factor(seed, j)``. The factor
  alternates sign on every visit of a set and takes one of eight magnitudes (1 to 1.44), picked by the
  seed the trusted side sends with the loop: no result of an earlier call is right for
  the next one, and no call's inputs are known before the loop starts.
* After each timed call (untimed) the candidate process adds up the squares of its output
  in float64 (:func:`checksum`). The trusted side recomputes, for a few calls it picks after
  the loop, the reference on the same inputs and checks the reported sum against the
  reference's within what the tolerance allows (:func:`checksum_bounds`): a process that
  skipped calls, or reports outputs it never computed, fails.
"""

from __future__ import annotations

from typing import Any

_MASK = (1 << 64) - 1
CHUNK = 1 << 26  # elements per float64 reduction step (its float64 temporaries)
DOT_CHUNK = 1 << 16  # elements per float32 dot product of a checksum
# the float32 rounding a chunk's dot product can carry, relative (a bound, not a typical value)
DOT_ROUNDING = DOT_CHUNK * 2.0 ** -23
GPU_ROUNDING = 1e-4  # a float32 tree reduction on a GPU, relative (generous)


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def factor(seed: int, j: int, k: int) -> float:
    """The factor of call ``j``'s inputs (``k`` input sets): exact in every float format."""
    # eight magnitudes 1 .. 1.4375, far enough apart that sums of squares of outputs on two
    # of them differ by more than any tolerance of 1e-2 lets an output move
    magnitude = 1.0 + (_mix((seed & _MASK) ^ _mix(j)) % 8) / 16.0
    return -magnitude if (j // max(1, k)) % 2 else magnitude


def apply(pristine: list, work: list, f: float) -> None:
    """``work = pristine * f`` for every floating-point tensor (the rest is left alone)."""
    import torch

    for p, w in zip(pristine, work):
        if isinstance(p, torch.Tensor) and p.is_floating_point() and p.numel() > 0:
            torch.mul(p, f, out=w)


def inputs_at(pristine: list, f: float) -> list:
    """Fresh tensors ``pristine * f`` (the trusted side's copy of a call's inputs)."""
    import torch

    out = []
    for p in pristine:
        if isinstance(p, torch.Tensor) and p.is_floating_point() and p.numel() > 0:
            out.append(torch.mul(p, f))
        elif isinstance(p, torch.Tensor):
            out.append(p.clone())
        else:
            out.append(p)
    return out


def _tensors(obj: Any) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    return []


def _flat(t: Any) -> Any:
    import torch

    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if not t.is_floating_point():
        t = t.to(torch.float64)
    return t.reshape(-1)


def checksum_into(obj: Any, slot: Any) -> None:
    """Add the sum of squares of every tensor of ``obj`` to the 0-d float64 ``slot``
    (queued on the device; nothing waits for it). On a GPU one float32 norm per chunk of
    :data:`CHUNK` elements (one read of the output); on the CPU a float32 dot product (BLAS)
    per chunk of :data:`DOT_CHUNK` elements, the chunks added in float64."""
    import torch

    for t in _tensors(obj):
        flat = _flat(t)
        if flat.is_cuda:  # one read of the output: a float32 norm (no float64 copy), squared in float64
            for start in range(0, flat.numel(), CHUNK):
                norm = torch.linalg.vector_norm(flat[start:start + CHUNK], dtype=torch.float32)
                slot.add_(norm.to(torch.float64).square())
            continue
        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.to(torch.float32)
        for start in range(0, flat.numel(), DOT_CHUNK):
            c = flat[start:start + DOT_CHUNK]
            slot.add_(torch.dot(c, c))


def checksum(obj: Any) -> float:
    import torch

    tensors = _tensors(obj)
    if not tensors:
        return 0.0
    slot = torch.zeros((), dtype=torch.float64, device=tensors[0].device)
    checksum_into(obj, slot)
    return float(slot)


def checksum_bounds(ref: Any, atol: float, rtol: float, cpu_rounding: bool | None = None) -> tuple[float, float]:
    """(the reference's checksum, the largest difference an output within the tolerance can
    make to it): every element may move by ``e = atol + rtol |r|``, which moves its square
    by at most ``e (2 |r| + e)``; on the CPU the float32 rounding of the candidate side's dot
    products is allowed for too (``cpu_rounding``: whether it applies; by ``ref``'s device)."""
    import torch

    total, slack = 0.0, 0.0
    tensors = _tensors(ref)
    if cpu_rounding is None:
        cpu_rounding = not (tensors and tensors[0].is_cuda)
    for t in tensors:
        flat = _flat(t)
        for start in range(0, flat.numel(), 1 << 24):
            r = flat[start:start + (1 << 24)].to(torch.float64)
            e = atol + rtol * r.abs()
            total += float(r.square().sum())
            slack += float((e * (2 * r.abs() + e)).sum())
    return total, slack + (DOT_ROUNDING if cpu_rounding else GPU_ROUNDING) * abs(total) + 1e-12
