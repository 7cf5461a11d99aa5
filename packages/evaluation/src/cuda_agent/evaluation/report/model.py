"""The report model: what an evaluation report holds, built from the scored tasks.

:func:`build_report` makes one JSON-ready mapping (run info, environment, metrics per
level and overall, refusals by rule, the paper's reference rows, every task and sample);
the Markdown, HTML and chart writers only read it.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Sequence

from ..metrics import TaskResult, compute_metrics, is_infra_error, level_key, scored
from ..samples import SampleResult, refusals_by_rule
from .environment import collect_environment

# The paper's Table 1 (KernelBench L1-L3, 250 problems): pass / faster than compile /
# geomean vs compile (and, for CUDA Agent, faster than eager / geomean vs eager overall).
PAPER_ROWS: list[dict[str, Any]] = [
    {"system": "paper's base model", "pass_rate": 0.740, "faster_compile": 0.272, "geomean_vs_compile": 0.69},
    {"system": "Claude Opus 4.5 (paper)", "pass_rate": 0.952, "faster_compile": 0.664, "geomean_vs_compile": 1.46},
    {"system": "Gemini 3 Pro (paper)", "pass_rate": 0.912, "faster_compile": 0.696, "geomean_vs_compile": 1.42},
    {
        "system": "CUDA Agent (paper)",
        "pass_rate": 0.988,
        "faster_eager": 0.984,
        "faster_compile": 0.968,
        "geomean_vs_eager": 2.60,
        "geomean_vs_compile": 2.11,
    },
]
PAPER_LEVELS: dict[str, dict[str, float]] = {
    "L1": {"pass_rate": 1.00, "faster_compile": 0.97, "geomean_vs_compile": 1.87},
    "L2": {"pass_rate": 1.00, "faster_compile": 1.00, "geomean_vs_compile": 2.80},
    "L3": {"pass_rate": 0.94, "faster_compile": 0.90, "geomean_vs_compile": 1.52},
}


def build_report(
    results: Sequence[TaskResult],
    *,
    info: dict | None = None,
    environment: dict | None = None,
    margin: float = 0.05,
    samples: Sequence[SampleResult] | None = None,
) -> dict:
    """The whole report as one JSON-ready mapping.

    Infrastructure errors are no task results: they are left out of the metrics and the
    task list, and counted in ``info.infra_errors`` (their tasks in ``not_scored``).
    With ``samples`` (every candidate's verdict), the metrics of each group add pass@k,
    ``refusals`` counts failed samples by rule and ``samples`` lists them all; without,
    both are None.
    """
    not_scored = sorted((r for r in results if is_infra_error(r)), key=_task_order)
    results = sorted(scored(results), key=_task_order)
    info = dict(info or {})
    info["infra_errors"] = len(not_scored)
    if samples is not None:
        order = {r.task_id: i for i, r in enumerate(results)}
        samples = sorted((s for s in samples if s.task_id in order),
                         key=lambda s: (order[s.task_id], s.index, s.candidate))
    return {
        "info": {"generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **info},
        "not_scored": [{"task_id": r.task_id, "message": r.message} for r in not_scored],
        "environment": environment if environment is not None else collect_environment(results),
        "metrics": compute_metrics(results, margin, samples),
        "refusals": None if samples is None else refusals_by_rule(samples, level_key),
        "paper": {"overall": PAPER_ROWS, "levels": PAPER_LEVELS},
        "tasks": [r.to_dict() for r in results],
        "samples": None if samples is None else [s.to_dict() for s in samples],
    }


def _task_order(r: TaskResult) -> tuple:
    num = r.task_id.rsplit("/", 1)[-1].split("_", 1)[0]
    return (r.level if r.level is not None else 99, int(num) if num.isdigit() else 10**9, r.task_id)


def report_title(report: dict) -> str:
    """The report's heading: the run's title, or a generic one."""
    return report["info"].get("title") or "KernelBench evaluation"


def run_label(report: dict) -> str:
    """The name of this run's row beside the paper's rows."""
    return report["info"].get("label") or "this run"


def levels(metrics: dict) -> list[str]:
    """The report's level groups (``L1``, ``L2``, ...), without ``overall``."""
    return [k for k in metrics if k != "overall"]


def groups(metrics: dict) -> list[str]:
    """The level groups, then ``overall``: the rows of the per-level tables."""
    return levels(metrics) + ["overall"]
