"""The paper's evaluation metrics (Table 1), per level and overall.

A task is scored by its best correct candidate (highest speedup against
``torch.compile``, then against eager). Metrics of a group of tasks:

* pass rate: share of tasks with a correct solution;
* faster than eager / than compile: share of *all* tasks of the group whose best
  solution is faster, both strictly (``t < t0``) and with the paper's margin
  (``(t0 - t) / t0 > 0.05``);
* geometric-mean speedup against eager and against compile over the correct solutions;
* how many tasks had a solution at all (``n_with_solution``) and, when some had none (a
  solutions folder that covers part of the task set), the same metrics over the tasks that
  had one (``with_solution``), beside the all-task figures;
* the distribution of speedups and counts of failure categories;
* with the tasks' sample rows (:mod:`.samples`): pass@k over samples.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from cuda_agent.core.types import INFRA_ERROR, CandidateOutcome, FailureCategory
from cuda_agent.rewards.speedup import faster, geomean

from .jsonl import known_fields
from .samples import BATCH_KEY, SampleResult, group_pass_at_k, ks_for, rule_of, sample_counts

DEFAULT_MARGIN = 0.05
# the model's failures; an infrastructure error is no result of the task and is not among them
FAILURE_ORDER = [c.value for c in FailureCategory if c not in (FailureCategory.NONE, FailureCategory.INFRA_ERROR)]
# speedup histogram bin edges (speedup = t_baseline / t); the last bin is open
SPEEDUP_BINS = [0.0, 0.5, 0.8, 0.95, 1.05, 1.25, 1.5, 2.0, 4.0]


@dataclass
class TaskResult:
    """The score of one task: its best candidate, or why none was correct."""

    task_id: str
    level: int | None = None
    name: str = ""
    correct: bool = False
    failure: str = FailureCategory.MISSING.value
    message: str = ""
    t_candidate_ms: float | None = None
    t_eager_ms: float | None = None
    t_compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    candidates: int = 0  # candidates considered (samples, or verified agent attempts)
    source: str = ""  # solution path or trajectory id of the scored candidate
    seconds: float = 0.0  # wall time spent on the task
    metadata: dict[str, Any] = field(default_factory=dict)
    # every candidate's verdict (written to samples.jsonl, not to the task row)
    samples: list[SampleResult] = field(default_factory=list, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(dataclasses.replace(self, samples=[]))
        d.pop("samples")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TaskResult":
        return known_fields(cls, {k: v for k, v in d.items() if k != "samples"})


def infra_error_result(task_id: str, message: str, *, level: int | None = None, name: str = "",
                       seconds: float = 0.0) -> TaskResult:
    """A task whose episode the infrastructure ended (policy endpoint down after its retries):
    not scored, not counted in any metric, redone when the run is resumed."""
    return TaskResult(task_id=task_id, level=level, name=name, correct=False, failure=INFRA_ERROR,
                      message=message[:500], seconds=seconds, metadata={"infra_error": True})


def is_infra_error(r: TaskResult) -> bool:
    return r.failure == INFRA_ERROR


def scored(results: Iterable[TaskResult]) -> list[TaskResult]:
    """The results that are the tasks' own (infrastructure errors left out)."""
    return [r for r in results if not is_infra_error(r)]


def _timing_ms(t: Any) -> float | None:
    return None if t is None else float(t.median_ms)


def _speedup(t0: float | None, t: float | None) -> float | None:
    if t0 is None or t is None or t <= 0:
        return None
    return t0 / t


def _message(outcome: CandidateOutcome) -> str:
    c, v, p = outcome.compile, outcome.verify, outcome.profile
    if c is not None and not c.ok:
        if c.errors:
            return c.errors[0]
        tail = c.log.strip().splitlines()
        return tail[-1] if tail else "compile failed"
    if v is not None and not v.ok:
        return v.message
    if p is not None and not p.ok:
        return p.message
    return ""


def result_from_outcome(
    task_id: str,
    outcome: CandidateOutcome,
    *,
    level: int | None = None,
    name: str = "",
    source: str = "",
) -> TaskResult:
    """A TaskResult for one candidate outcome."""
    p = outcome.profile
    failure = outcome.failure
    r = TaskResult(task_id=task_id, level=level, name=name, source=source, candidates=1)
    r.correct = outcome.correct
    r.failure = failure.value
    message = _message(outcome)
    r.message = message[:500]
    if not r.correct:  # named from the whole message: the rule may come after the first 500 characters
        r.metadata["rule"] = rule_of(r.failure, message, {
            "verify": outcome.verify.metadata if outcome.verify is not None else None,
            "profile": p.metadata if p is not None else None})
    if p is not None:
        r.t_candidate_ms = _timing_ms(p.candidate)
        r.t_eager_ms = _timing_ms(p.eager)
        r.t_compile_ms = _timing_ms(p.compile)
        r.speedup_vs_eager = _speedup(r.t_eager_ms, r.t_candidate_ms)
        r.speedup_vs_compile = _speedup(r.t_compile_ms, r.t_candidate_ms)
        if p.metadata:
            r.metadata["profile"] = dict(p.metadata)
        # how steady each timing was (IQR / median) and how often it was measured
        r.metadata["timing_spread"] = {k: round(t.spread, 4) for k, t in
                                       (("candidate", p.candidate), ("eager", p.eager), ("compile", p.compile)) if t}
        r.metadata["timing_attempts"] = {k: t.attempts for k, t in
                                         (("candidate", p.candidate), ("eager", p.eager), ("compile", p.compile)) if t}
    if outcome.verify is not None and outcome.verify.metadata:
        r.metadata["verify"] = dict(outcome.verify.metadata)
    # where the time went: build, verification and profiling jobs (seconds)
    for part, obj in (("compile", outcome.compile), ("verify", outcome.verify), ("profile", p)):
        if obj is not None and getattr(obj, "seconds", None):
            r.metadata[f"{part}_seconds"] = round(float(obj.seconds), 3)
    return r


def _rank(r: TaskResult) -> tuple:
    return (
        1 if r.correct else 0,
        r.speedup_vs_compile if r.speedup_vs_compile is not None else -1.0,
        r.speedup_vs_eager if r.speedup_vs_eager is not None else -1.0,
    )


def best_result(results: Sequence[TaskResult]) -> TaskResult:
    """The best of several scored candidates of one task.

    The best correct one (highest speedup vs compile, then vs eager); when none is
    correct, the last candidate (the final attempt) with its failure.
    """
    if not results:
        raise ValueError("best_result needs at least one result")
    correct = [r for r in results if r.correct]
    best = max(correct, key=_rank) if correct else results[-1]
    out = dataclasses.replace(best, metadata=dict(best.metadata))
    out.candidates = sum(max(r.candidates, 1) for r in results)
    out.seconds = sum(r.seconds for r in results)
    if len(results) > 1:
        out.metadata["candidate_failures"] = [r.failure for r in results]
    return out


# --- faster-than judgments -------------------------------------------------------------


def is_faster(r: TaskResult, baseline: str, margin: float) -> bool:
    """Is the task's solution faster than ``baseline`` ("eager"/"compile")?

    ``margin=0`` is the strict test ``t < t0``; otherwise ``(t0 - t) / t0 > margin``.
    Incorrect solutions are never faster.
    """
    if not r.correct:
        return False
    t = r.t_candidate_ms
    t0 = r.t_eager_ms if baseline == "eager" else r.t_compile_ms
    if t is not None and t0 is not None and t0 > 0:
        return t < t0 if margin <= 0 else faster(t, t0, margin)
    s = r.speedup_vs_eager if baseline == "eager" else r.speedup_vs_compile
    if s is None or s <= 0:
        return False
    # s = t0 / t, so (t0 - t) / t0 = 1 - 1/s
    return s > 1.0 if margin <= 0 else (1.0 - 1.0 / s) > margin


# --- group metrics ------------------------------------------------------------------


def _share(k: int, n: int) -> float | None:
    return k / n if n else None


def _quantiles(vals: list[float]) -> dict[str, float] | None:
    if not vals:
        return None
    v = sorted(vals)

    def q(p: float) -> float:
        # linear interpolation between closest ranks
        x = p * (len(v) - 1)
        lo, hi = math.floor(x), math.ceil(x)
        return v[lo] + (v[hi] - v[lo]) * (x - lo)

    return {"min": v[0], "p10": q(0.1), "p25": q(0.25), "median": q(0.5), "p75": q(0.75), "p90": q(0.9), "max": v[-1]}


def histogram(vals: Iterable[float], edges: Sequence[float] = SPEEDUP_BINS) -> list[dict]:
    """Counts of ``vals`` in ``[edges[i], edges[i+1])``; the last bin is open-ended."""
    bins = [{"lo": edges[i], "hi": edges[i + 1] if i + 1 < len(edges) else None, "count": 0} for i in range(len(edges))]
    for x in vals:
        for b in reversed(bins):
            if x >= b["lo"]:
                b["count"] += 1
                break
    return bins


def has_solution(r: TaskResult) -> bool:
    """Whether the task had any candidate to score (a solution file, an agent's attempt)."""
    return r.candidates > 0 or r.failure != FailureCategory.MISSING.value


def group_metrics(results: Sequence[TaskResult], margin: float = DEFAULT_MARGIN, covered: bool = True) -> dict:
    """Table-1 metrics of one group of tasks; with ``covered``, also those over the tasks that
    had a solution (``with_solution``) when some had none."""
    n = len(results)
    correct = [r for r in results if r.correct]
    se = [r.speedup_vs_eager for r in correct if r.speedup_vs_eager is not None]
    sc = [r.speedup_vs_compile for r in correct if r.speedup_vs_compile is not None]
    counts = {
        "faster_eager": sum(is_faster(r, "eager", margin) for r in results),
        "faster_eager_strict": sum(is_faster(r, "eager", 0.0) for r in results),
        "faster_compile": sum(is_faster(r, "compile", margin) for r in results),
        "faster_compile_strict": sum(is_faster(r, "compile", 0.0) for r in results),
    }
    failures = {k: 0 for k in FAILURE_ORDER}
    for r in results:
        if not r.correct:
            key = r.failure if r.failure in failures else FailureCategory.CRASH.value
            if r.failure == FailureCategory.NONE.value:
                key = FailureCategory.MISSING.value
            failures[key] += 1
    out: dict[str, Any] = {
        "n": n,
        "n_correct": len(correct),
        "pass_rate": _share(len(correct), n),
        "margin": margin,
    }
    for key, k in counts.items():
        out[f"n_{key}"] = k
        out[key] = _share(k, n)
    out["geomean_vs_eager"] = geomean(se)
    out["geomean_vs_compile"] = geomean(sc)
    out["n_profiled"] = len(sc)
    out["speedup_vs_eager_quantiles"] = _quantiles(se)
    out["speedup_vs_compile_quantiles"] = _quantiles(sc)
    out["speedup_vs_eager_histogram"] = histogram(se)
    out["speedup_vs_compile_histogram"] = histogram(sc)
    out["failures"] = failures
    with_solution = [r for r in results if has_solution(r)]
    out["n_with_solution"] = len(with_solution)
    if covered and len(with_solution) < n:
        out["with_solution"] = group_metrics(with_solution, margin, covered=False)
    return out


def level_key(level: int | None) -> str:
    return f"L{level}" if level is not None else "other"


def task_sample_counts(results: Iterable[TaskResult], samples: Iterable[SampleResult]) -> dict[str, tuple[int, int] | None]:
    """task id -> (samples, correct samples); None for a task whose samples were not recorded
    (a run from before samples.jsonl). A task scored without any candidate has (0, 0)."""
    counts = sample_counts(samples)
    out: dict[str, tuple[int, int] | None] = {}
    for r in results:
        if r.metadata.get(BATCH_KEY):
            out[r.task_id] = counts.get(r.task_id)
        else:
            out[r.task_id] = (0, 0) if r.candidates == 0 else None
    return out


def compute_metrics(results: Iterable[TaskResult], margin: float = DEFAULT_MARGIN,
                    samples: Iterable[SampleResult] | None = None) -> dict:
    """Metrics per level (``L1``, ``L2``, ...; ``other`` for tasks without one) and ``overall``;
    with ``samples``, each group also has pass@k for k = 1 and each power of two up to the
    most samples of a task (``pass_at_k``, and ``pass_at_k_tasks``: the tasks behind each)."""
    results = list(results)
    groups: dict[str, list[TaskResult]] = {}
    for r in results:
        groups.setdefault(level_key(r.level), []).append(r)

    def order(k: str) -> tuple:
        return (0, int(k[1:])) if k.startswith("L") and k[1:].isdigit() else (1, k)

    out = {k: group_metrics(groups[k], margin) for k in sorted(groups, key=order)}
    out["overall"] = group_metrics(results, margin)
    if samples is not None:
        counts = task_sample_counts(results, samples)
        ks = ks_for(max([x[0] for x in counts.values() if x is not None] + [1]))
        for key, rs in [*groups.items(), ("overall", results)]:
            out[key].update(group_pass_at_k([counts[r.task_id] for r in rs], ks))
    return out
