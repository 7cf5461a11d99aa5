"""When a cached baseline record still stands, and why one is measured again.

A record is measured again when asked (``force``), when a spread exceeds
``refresh_spread`` (it was measured on a busy host), when it lacks the compiled baseline
asked for, or when it was measured under an older :data:`TIMING_RULE` and does not stand
under the current one (:func:`stale_reason`); an older record that stands is stamped with
the current rule. The replacing record says why in ``measured_again_because``.
"""

from __future__ import annotations

from typing import Any, Callable

from cuda_agent.core.types import Timing

from ..precision import precision_context
from .cache import BaselineCache

# The rule that picks a task's timing mode (profilers.base.time_for_task), recorded with each
# measurement. 1: steadier mode when the eager timing stays above max_spread (3% then);
# 2: also when the profiler names a reason up front (cuda_events: parallel streams);
# 3: warm-up continues until per-call times level off (cuda_events: settle_ms).
TIMING_RULE = 3


def noisy(rec: dict, max_spread: float) -> bool:
    """Whether a cached record's eager or compile timing spread exceeds ``max_spread``."""
    return any((rec.get(k) or {}).get("spread", 0.0) > max_spread for k in ("eager", "compile"))


def cached_record(cache: BaselineCache, key: str, force: bool = False, refresh_spread: float = 0.0,
                  want_compile: bool = True) -> tuple[dict | None, str]:
    """(the cached record for ``key``, "") when there is one that these options accept,
    else (None, why it is measured again; "" for a first measurement)."""
    rec = None if force else cache.get(key)
    because = "forced: measured again on request" if force and cache.path(key).is_file() else ""
    if rec is not None and refresh_spread > 0 and noisy(rec, refresh_spread):
        rec, because = None, f"refresh: a spread above refresh_spread {refresh_spread:.2%}"  # measured on a busy host
    if rec is not None and want_compile and rec.get("compile") is None and not rec.get("compile_error"):
        rec, because = None, "compile: measured without its compiled baseline"
    return rec, because


def under_current_rule(cache: BaselineCache, key: str, rec: dict, profiler: Any,
                       reference: Callable[[], tuple[Any, list]], device: str, max_spread: float,
                       precision: str) -> tuple[dict | None, str]:
    """``rec`` as it stands under the current :data:`TIMING_RULE`: (the record, "") when it
    was measured under this rule, or under an older one and passes :func:`stale_reason` (then
    stamped and stored), or when the check could not run (kept unstamped); else (None, why it
    is measured again). ``reference()`` gives the model and its input sets for the check."""
    import torch

    rule = int(rec.get("timing_rule") or 1)
    if rule >= TIMING_RULE:
        return rec, ""
    with precision_context(precision), torch.no_grad():
        stale = stale_reason(rec, profiler, *reference(), device, max_spread)
    if stale == "":
        rec = dict(rec, timing_rule=TIMING_RULE)
        cache.put(key, rec)
    elif stale:
        return None, f"rule {rule} record, {stale}"
    return rec, ""


def stale_reason(rec: dict, profiler: Any, model: Any, input_sets: list, device: str, max_spread: float) -> str | None:
    """Why a record measured under an older :data:`TIMING_RULE` does not stand under the
    current one, "" when it does: its spreads are within ``max_spread``; the reference's
    per-call time, in the mode the record was timed in, is level once the profiler's fixed
    warm-up is over (``warmup_drift`` within ``max_spread / 2``: the older rules timed
    right after it); and, timed in the profiler's normal mode, the profiler names no reason
    for its steadier mode. Costs a warm-up and a graph capture, no timing. None when a check
    could not run: the record is kept as it is, unstamped, and checked again on its next
    use."""
    from ...isolation import hostlock
    from ..profilers.base import profiler_for, reason_up_front

    if max_spread > 0 and noisy(rec, max_spread):
        worst = max(("eager", "compile"), key=lambda k: (rec.get(k) or {}).get("spread", 0.0))
        return f"spread: {worst} timing spread {rec[worst]['spread']:.2%} above {max_spread:.2%}"
    try:
        # the mode the record was timed in: its drift is measured on what that mode calls
        timed_by = profiler_for(profiler, Timing(median_ms=0.0, method=(rec.get("eager") or {}).get("method", "")))
        if max_spread > 0 and hasattr(timed_by, "warmup_drift"):
            with hostlock.timing():  # a timing of sorts: not beside another lane's compile
                drift = timed_by.warmup_drift(model, input_sets, device)
            if drift > max_spread / 2:
                return f"drift: per-call time moved {drift:.2%} after the fixed warm-up (limit {max_spread / 2:.2%})"
        if timed_by is not profiler:
            return ""  # timed in the steadier mode already
        reason = reason_up_front(profiler, model, input_sets, device, strict=True)
        return f"mode: {reason}" if reason else ""
    except Exception:
        return None
