"""Speedup arithmetic shared by rewards, evaluation and reports."""

from __future__ import annotations

import math
from typing import Iterable


def improvement(t: float, t0: float) -> float:
    """b(t, t0) = (t0 - t) / t0: the fraction of baseline time saved."""
    if t0 <= 0:
        raise ValueError(f"baseline time must be positive, got {t0}")
    return (t0 - t) / t0


# improvements within this of the margin count as equal to it: 0.95 ms against 1.0 ms is
# exactly 5% although (1.0 - 0.95) / 1.0 rounds to 0.050000000000000044
_EPS = 1e-9


def faster(t: float, t0: float, margin: float = 0.05) -> bool:
    """True when ``t`` is more than ``margin`` lower than ``t0`` (the paper's 5% rule).

    Exactly ``margin`` is not faster, also where floating point rounds it above.
    """
    return improvement(t, t0) > margin + _EPS


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
