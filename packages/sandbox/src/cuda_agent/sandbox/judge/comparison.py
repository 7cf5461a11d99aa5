"""Comparing a candidate's outputs with the reference's.

:func:`compare_outputs` walks both outputs (tensors, tuples, lists, dicts, numbers, None):
the same structure, shapes and dtypes, ``|out - ref| <= atol + rtol * |ref|`` everywhere,
and NaN/Inf only where the reference has them. Where the tolerance cannot tell the
reference from zero (rule ``tolerance.vacuous``), the output is also compared at the
reference's own scale, and a constant output is refused where the reference is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class Comparison:
    ok: bool
    message: str = ""
    where: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0


def _unravel(flat_index: int, shape: tuple) -> tuple:
    idx = []
    for dim in reversed(shape):
        idx.append(flat_index % dim if dim else 0)
        flat_index //= dim if dim else 1
    return tuple(reversed(idx))


# a tolerance that cannot tell the reference from zero: at most this share of its elements
# are larger than atol (softmax over very wide rows: every output near 1e-6)
VACUOUS_SHARE = 0.01
RULE_VACUOUS = "tolerance.vacuous"


def compare_tensors(ref: Any, out: Any, atol: float, rtol: float, path: str, check_dtype: bool = True,
                    scaled: bool = True) -> Comparison:
    """``|out - ref| <= atol + rtol |ref|`` everywhere, NaN/Inf only where the reference has
    them. Where the tolerance cannot tell the reference from zero (``scaled``; see
    :data:`VACUOUS_SHARE`), the output is also compared at the reference's own scale
    (``atol`` times its largest magnitude) and a constant output is refused where the
    reference is not (rule ``tolerance.vacuous``)."""
    import torch

    if not isinstance(out, torch.Tensor):
        return Comparison(False, f"{path}: expected a tensor, got {type(out).__name__}", path)
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, f"{path}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}", path)
    if check_dtype and out.dtype != ref.dtype:
        return Comparison(False, f"{path}: dtype {out.dtype} != reference {ref.dtype}", path)
    if out.device != ref.device:
        return Comparison(False, f"{path}: on {out.device}, reference on {ref.device}", path)
    if out.is_complex() or ref.is_complex():
        out, ref = torch.view_as_real(out), torch.view_as_real(ref)
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    o = out.reshape(-1)
    r = ref.reshape(-1)
    n = r.numel()
    within = _all_within(o, r, n, work, atol, rtol)
    if within is not None:
        max_abs, max_rel, seen = within
        vacuous = _vacuous(out, ref, atol, rtol, path, check_dtype) if scaled and not seen else None
        return vacuous or Comparison(True, "", path, max_abs, max_rel)
    max_abs = 0.0
    max_rel = 0.0
    chunk = CHUNK
    first_bad = None
    first_kind = ""
    for start in range(0, n, chunk):
        oc = o[start : start + chunk].to(work)
        rc = r[start : start + chunk].to(work)
        ofin = torch.isfinite(oc)
        rfin = torch.isfinite(rc)
        both = ofin & rfin
        diff = torch.where(both, (oc - rc).abs(), torch.zeros((), dtype=work, device=oc.device))
        tol = atol + rtol * rc.abs()
        bad_val = both & (diff > tol)
        # non-finite: NaN/Inf where the reference is finite, or a different non-finite value
        rnan, onan = torch.isnan(rc), torch.isnan(oc)
        bad_nonfinite = (rfin & ~ofin) | (~rfin & ~((rnan & onan) | (~rnan & ~onan & (oc == rc))))
        if both.any():
            max_abs = max(max_abs, float(diff.max()))
            rel = diff / rc.abs().clamp_min(max(atol, 1e-12))
            max_rel = max(max_rel, float(torch.where(both, rel, torch.zeros((), dtype=work, device=oc.device)).max()))
        if first_bad is None:
            nf = bad_nonfinite.nonzero()
            bv = bad_val.nonzero()
            cands = []
            if nf.numel():
                cands.append((int(nf[0, 0]) + start, "nonfinite"))
            if bv.numel():
                cands.append((int(bv[0, 0]) + start, "value"))
            if cands:
                first_bad, first_kind = min(cands)
    if first_bad is None:
        vacuous = _vacuous(out, ref, atol, rtol, path, check_dtype) if scaled and n else None
        return vacuous or Comparison(True, "", path, max_abs, max_rel)
    idx = _unravel(first_bad, tuple(ref.shape)) if ref.dim() else ()
    got = out.reshape(-1)[first_bad].item() if not out.is_complex() else "?"
    want = ref.reshape(-1)[first_bad].item() if not ref.is_complex() else "?"
    where = f"{path} at index {idx}"
    if first_kind == "nonfinite":
        msg = f"{where}: got {got}, reference {want} (NaN/Inf where the reference has none: unwritten or overflowing output)"
    else:
        msg = (
            f"{where}: got {got}, reference {want}; max abs err {max_abs:.3g}, max rel err {max_rel:.3g} "
            f"(atol={atol}, rtol={rtol})"
        )
    return Comparison(False, msg, where, max_abs, max_rel)


CHUNK = 1 << 26  # elements per step of a comparison: its temporaries stay a few hundred MB


def _all_within(o: Any, r: Any, n: int, work: Any, atol: float, rtol: float) -> tuple[float, float, bool] | None:
    """``(max abs err, max rel err, seen)`` when every element of both flat tensors is finite
    and within the tolerance, else None (then :func:`compare_tensors` looks for the first
    element that is not, and why). ``seen``: the tolerance can tell the reference from zero
    (more than :data:`VACUOUS_SHARE` of it above ``atol``), so the reference's own scale need
    not be looked at (:func:`reference_scale` would say None). A few passes per chunk and one
    wait for the device at the end: the full walk makes about thirty passes and waits on every
    chunk, which on a 6.4 GB output is most of a verification's comparison."""
    import torch

    if not n:
        return None
    floor = max(atol, 1e-12)
    acc = None  # [all within, max abs err, max rel err, elements above atol, largest magnitude]
    for start in range(0, n, CHUNK):
        oc = o[start : start + CHUNK].to(work)
        rc = r[start : start + CHUNK].to(work)
        mag = rc.abs()
        diff = (oc - rc).abs_()
        # a non-finite element on either side makes diff inf or NaN: not within
        ok = (diff <= mag * rtol + atol).logical_and_(torch.isfinite(diff)).all()
        part = [ok, diff.max(), None, torch.count_nonzero(mag > atol), mag.max()]
        part[2] = diff.div_(mag.clamp_min_(floor)).max()
        acc = part if acc is None else [acc[0].logical_and(part[0]), torch.maximum(acc[1], part[1]),
                                        torch.maximum(acc[2], part[2]), acc[3] + part[3], torch.maximum(acc[4], part[4])]
    if not bool(acc[0]):
        return None
    a, b, largest = torch.stack([acc[1], acc[2], acc[4]]).tolist()
    above = int(acc[3])
    seen = atol <= 0 or (largest > atol and above / n > VACUOUS_SHARE)
    return float(a), float(b), seen


@dataclass
class FiniteStats:
    """A tensor's finite elements, summed up chunk by chunk (no temporaries of its size)."""

    count: int = 0  # finite elements
    low: float = 0.0  # smallest finite value
    high: float = 0.0  # largest finite value
    largest: float = 0.0  # largest finite magnitude
    above: int = 0  # finite elements of magnitude above the threshold asked for


def finite_stats(t: Any, threshold: float = 0.0) -> FiniteStats:
    """:class:`FiniteStats` of tensor ``t`` (``above`` counts magnitudes above ``threshold``).
    Masked indexing (``t[torch.isfinite(t)]``) would make an index tensor of 8 bytes per
    element and dimension: 24 GiB for a 6.4 GB output."""
    import torch

    if t.is_complex():
        t = torch.view_as_real(t)
    flat = t.reshape(-1)
    work = torch.float64 if flat.dtype == torch.float64 else torch.float32
    st = FiniteStats()
    inf = torch.tensor(math.inf, dtype=work, device=flat.device)
    acc = None  # [count, above] and [low, high, largest], kept on the device until the end
    for start in range(0, flat.numel(), CHUNK):
        c = flat[start : start + CHUNK].to(work)
        fin = torch.isfinite(c)
        mag = torch.where(fin, c.abs(), torch.zeros((), dtype=work, device=c.device))
        counts = torch.stack([fin.sum(), (mag > threshold).sum()])
        lo, hi = torch.where(fin, c, inf).min(), torch.where(fin, c, -inf).max()
        if acc is None:
            acc = [counts, lo, hi, mag.max()]
        else:
            acc = [acc[0] + counts, torch.minimum(acc[1], lo), torch.maximum(acc[2], hi),
                   torch.maximum(acc[3], mag.max())]
    if acc is None:
        return st
    st.count, st.above = (int(x) for x in acc[0].tolist())
    if st.count:
        st.low, st.high, st.largest = (float(x) for x in torch.stack(acc[1:]).tolist())
    return st


def reference_scale(ref: Any, atol: float) -> float | None:
    """The largest magnitude of a reference the tolerance cannot tell from zero (see
    :func:`compare_tensors`), or None when the tolerance can."""
    import torch

    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or atol <= 0:
        return None
    st = finite_stats(ref, atol)
    if st.count == 0:
        return None
    scale = st.largest
    if scale <= 0 or (scale > atol and st.above / st.count > VACUOUS_SHARE):
        return None
    return scale


def _vacuous(out: Any, ref: Any, atol: float, rtol: float, path: str, check_dtype: bool) -> Comparison | None:
    """A failed Comparison when ``out`` passed only because the tolerance is too coarse for
    ``ref``'s scale (see :func:`compare_tensors`), else None."""
    scale = reference_scale(ref, atol)
    if scale is None:
        return None
    finite, fin_out = finite_stats(ref), finite_stats(out)
    if fin_out.count and fin_out.high == fin_out.low and finite.high != finite.low:
        return Comparison(False, f"{path}: the output is constant ({fin_out.high:.3g}) where the reference is not "
                                 f"(it spans {finite.low:.3g} .. {finite.high:.3g}, all within "
                                 f"atol={atol} of zero) (rule {RULE_VACUOUS}: an output must be computed, not "
                                 f"guessed at a scale the tolerance cannot see)", path)
    at_scale = compare_tensors(ref, out, atol * scale, rtol, path, check_dtype, scaled=False)
    if at_scale.ok:
        return None
    return Comparison(False, f"{at_scale.message} -- compared at the reference's own scale (largest magnitude "
                             f"{scale:.3g}, below atol={atol}: the tolerance alone could not tell it from zero) "
                             f"(rule {RULE_VACUOUS})", at_scale.where, at_scale.max_abs_err, at_scale.max_rel_err)


def compare_outputs(ref: Any, out: Any, atol: float, rtol: float, path: str = "output", check_dtype: bool = True,
                    scaled: bool = True) -> Comparison:
    """Recursive comparison: same structure (tensor / tuple / list / dict / scalar)."""
    import torch

    if isinstance(ref, torch.Tensor):
        return compare_tensors(ref, out, atol, rtol, path, check_dtype, scaled)
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)):
            return Comparison(False, f"{path}: expected a {type(ref).__name__} of {len(ref)}, got {type(out).__name__}", path)
        if len(out) != len(ref):
            return Comparison(False, f"{path}: {len(out)} outputs, reference has {len(ref)}", path)
        worst = Comparison(True, "", path)
        for i, (r, o) in enumerate(zip(ref, out)):
            c = compare_outputs(r, o, atol, rtol, f"{path}[{i}]", check_dtype, scaled)
            if not c.ok:
                return c
            worst.max_abs_err = max(worst.max_abs_err, c.max_abs_err)
            worst.max_rel_err = max(worst.max_rel_err, c.max_rel_err)
        return worst
    if isinstance(ref, dict):
        if not isinstance(out, dict) or set(out) != set(ref):
            return Comparison(False, f"{path}: keys {sorted(map(str, out)) if isinstance(out, dict) else type(out).__name__} != reference {sorted(map(str, ref))}", path)
        worst = Comparison(True, "", path)
        for k in ref:
            c = compare_outputs(ref[k], out[k], atol, rtol, f"{path}[{k!r}]", check_dtype, scaled)
            if not c.ok:
                return c
            worst.max_abs_err = max(worst.max_abs_err, c.max_abs_err)
            worst.max_rel_err = max(worst.max_rel_err, c.max_rel_err)
        return worst
    if isinstance(ref, (int, float, bool)) and not isinstance(out, torch.Tensor):
        if not isinstance(out, (int, float, bool)):
            return Comparison(False, f"{path}: expected a number, got {type(out).__name__}", path)
        import math

        if math.isnan(float(ref)) != math.isnan(float(out)) or abs(float(out) - float(ref)) > atol + rtol * abs(float(ref)):
            return Comparison(False, f"{path}: got {out}, reference {ref}", path)
        return Comparison(True, "", path, abs(float(out) - float(ref)))
    if ref is None:
        return Comparison(out is None, "" if out is None else f"{path}: expected None, got {type(out).__name__}", path)
    if isinstance(out, torch.Tensor):
        return Comparison(False, f"{path}: expected {type(ref).__name__}, got a tensor", path)
    return Comparison(out == ref, "" if out == ref else f"{path}: got {out!r}, reference {ref!r}", path)

