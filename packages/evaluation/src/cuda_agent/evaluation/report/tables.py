"""The report's tables, as plain text cells that the Markdown and HTML writers both lay out.

A :class:`Table` is a header and rows of strings; one function per table of the report
(Table 1 against the paper, per level, strict, distribution, failures, pass@k, refusals,
environment, tasks) reads the report model and formats its numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from ..metrics import FAILURE_ORDER
from .model import PAPER_LEVELS, PAPER_ROWS, groups, run_label

FAILURE_LABELS = {
    "compile_error": "compile error",
    "wrong_result": "wrong result",
    "forbidden_op": "forbidden op",
    "timeout": "timeout",
    "crash": "crash",
    "missing": "no solution",
}
ENV_LABELS = [
    ("precision", "precision policy"),
    ("profiler", "profiler"),
    ("timing_modes", "tasks per timing mode"),
    ("gpu", "GPU"),
    ("device", "device"),
    ("cpu", "CPU"),
    ("backend", "backend"),
    ("executor", "executor"),
    ("torch", "torch"),
    ("cuda", "CUDA"),
    ("triton", "triton"),
    ("driver", "driver"),
    ("rules", "anti-hacking rules"),
    ("python", "Python"),
    ("platform", "platform"),
    ("packages", "cuda-agent packages"),
]
INFO_LABELS = (
    ("run_id", "run"),
    ("mode", "mode"),
    ("dataset", "task set"),
    ("solutions", "solutions"),
    ("policy", "policy"),
    ("generated", "generated"),
    ("wall_seconds", "wall time (s)"),
    ("unmatched_solutions", "solutions matching no task"),
    ("infra_errors", "not scored (infrastructure errors, redone by --resume)"),
)
PASS_AT_K_NOTE = (
    "pass@k: the chance that at least one of k samples of a task, drawn from its n samples (c correct), is "
    "correct: 1 - C(n-c, k) / C(n, k), averaged over tasks. A sample is a solution file, or an agent attempt "
    "(it passes when one of its candidates is correct). A task without any sample counts 0; one with fewer than "
    "k samples is left out of pass@k (the count of tasks behind a value is given when it differs)."
)

MAIN_HEADER = ["system", "pass", "faster than eager", "faster than compile", "geomean vs eager", "geomean vs compile"]
LEVEL_HEADER = [
    "level",
    "tasks",
    "pass",
    "faster than eager",
    "faster than compile",
    "geomean vs eager",
    "geomean vs compile",
    "CUDA Agent (paper): pass / faster compile / geomean compile",
]
STRICT_HEADER = [
    "level",
    "faster than eager (strict)",
    "faster than eager (>5%)",
    "faster than compile (strict)",
    "faster than compile (>5%)",
]
DIST_HEADER = ["level", "baseline", "solutions timed", "min", "p10", "p25", "median", "p75", "p90", "max"]
FAIL_HEADER = ["level", "tasks", "failed"] + [FAILURE_LABELS[f] for f in FAILURE_ORDER]
REFUSAL_HEADER = ["rule", "category", "samples", "share of samples", "tasks", "example"]
TASK_HEADER = ["task", "level", "result", "t (ms)", "eager (ms)", "compile (ms)", "vs eager", "vs compile", "candidates", "note"]


@dataclass(frozen=True)
class Table:
    """A header and rows of already formatted cells."""

    header: list[str]
    rows: list[list[str]]


# --- formatting -----------------------------------------------------------------------


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def times(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g} ms"


def result_label(correct: bool, failure: str) -> str:
    return "correct" if correct else FAILURE_LABELS.get(failure, failure)


def _ratios(g: dict) -> list[str]:
    """pass, faster than eager / compile, geomean vs eager / compile of a metrics group or paper row."""
    return [pct(g.get("pass_rate")), pct(g.get("faster_eager")), pct(g.get("faster_compile")),
            times(g.get("geomean_vs_eager")), times(g.get("geomean_vs_compile"))]


# --- the tables -----------------------------------------------------------------------


def main_table(report: dict) -> Table:
    """Table 1: the paper's systems, then this run (its name in bold); when some tasks had no
    solution, a row for this run over the tasks that had one."""
    o = report["metrics"]["overall"]
    rows = [[p["system"], *_ratios(p)] for p in PAPER_ROWS]
    rows.append([f"**{run_label(report)}**", *_ratios(o)])
    if o.get("with_solution"):
        rows.append([f"{run_label(report)}: the {o['n_with_solution']} tasks with a solution",
                     *_ratios(o["with_solution"])])
    return Table(MAIN_HEADER, rows)


def coverage_line(report: dict) -> str:
    """How many tasks had a solution, when some had none ("" otherwise)."""
    o = report["metrics"]["overall"]
    if not o.get("with_solution"):
        return ""
    n, k = o["n"], o["n_with_solution"]
    return (f"{k} of {n} tasks had a solution; the {n - k} without one count as failed in the all-task figures "
            f"(the paper's form). Over the {k} with one: pass {pct(o['with_solution']['pass_rate'])}, faster than "
            f"compile {pct(o['with_solution']['faster_compile'])}. To score only the tasks the folder covers: "
            "--only-covered.")


def level_table(report: dict) -> Table:
    m = report["metrics"]
    rows = []
    for k in groups(m):
        p = PAPER_ROWS[-1] if k == "overall" else PAPER_LEVELS.get(k)
        paper = f"{pct(p['pass_rate'])} / {pct(p['faster_compile'])} / {times(p['geomean_vs_compile'])}" if p else "—"
        rows.append([k, str(m[k]["n"]), *_ratios(m[k]), paper])
    return Table(LEVEL_HEADER, rows)


def strict_table(report: dict) -> Table:
    m = report["metrics"]
    return Table(STRICT_HEADER, [
        [
            k,
            pct(m[k]["faster_eager_strict"]),
            pct(m[k]["faster_eager"]),
            pct(m[k]["faster_compile_strict"]),
            pct(m[k]["faster_compile"]),
        ]
        for k in groups(m)
    ])


def distribution_table(report: dict) -> Table:
    m = report["metrics"]
    rows = []
    for k in groups(m):
        for base in ("eager", "compile"):
            q = m[k][f"speedup_vs_{base}_quantiles"]
            n = sum(b["count"] for b in m[k][f"speedup_vs_{base}_histogram"])
            if q is None:
                rows.append([k, base, "0"] + ["—"] * 7)
            else:
                rows.append([k, base, str(n)] + [times(q[x]) for x in ("min", "p10", "p25", "median", "p75", "p90", "max")])
    return Table(DIST_HEADER, rows)


def failure_table(report: dict) -> Table:
    m = report["metrics"]
    rows = []
    for k in groups(m):
        f = m[k]["failures"]
        rows.append([k, str(m[k]["n"]), str(m[k]["n"] - m[k]["n_correct"])] + [str(f[c]) for c in FAILURE_ORDER])
    return Table(FAIL_HEADER, rows)


def pass_at_k_table(report: dict) -> Table:
    m = report["metrics"]
    ks = list((m["overall"].get("pass_at_k") or {}).keys())
    rows = []
    for k in groups(m):
        g = m[k]
        cells = []
        for key, v in (g.get("pass_at_k") or {}).items():
            counted = g["pass_at_k_tasks"][key]
            cells.append(pct(v) if counted == g["tasks_with_samples"] else f"{pct(v)} ({counted} tasks)")
        rows.append([k, str(g["tasks_with_samples"]), str(g["n_samples"])] + cells)
    return Table(["level", "tasks", "samples"] + [f"pass@{k}" for k in ks], rows)


def _tasks_cell(tasks: Sequence[str], most: int = 5) -> str:
    extra = len(tasks) - most
    return ", ".join(tasks[:most]) + (f", ... (+{extra})" if extra > 0 else "")


def refusal_table(report: dict) -> Table:
    return Table(REFUSAL_HEADER, [
        [e["rule"], FAILURE_LABELS.get(e["category"], e["category"]), str(e["count"]), pct(e["share"]),
         _tasks_cell(e["tasks"]), e["example"][:160]]
        for e in report.get("refusals") or []
    ])


def environment_table(env: dict) -> Table:
    """Known entries first, in :data:`ENV_LABELS` order and wording, then the rest by name."""
    rows = []
    done = set()
    for key, label in ENV_LABELS:
        if key in env:
            v = env[key]
            if isinstance(v, dict):
                v = ", ".join(f"{a} {b}" for a, b in v.items()) or "—"
            rows.append([label, str(v)])
            done.add(key)
    for key in sorted(env):
        if key not in done:
            v = env[key]
            rows.append([key, json.dumps(v) if isinstance(v, (dict, list)) else str(v)])
    return Table(["", ""], rows)


def task_table(report: dict) -> Table:
    """One row per task, in the report's task order."""
    rows = []
    for t in report["tasks"]:
        note = (t.get("message") or "").splitlines()[0][:120] if t.get("message") else ""
        rows.append(
            [
                t["task_id"],
                "—" if t["level"] is None else str(t["level"]),
                result_label(t["correct"], t["failure"]),
                ms(t["t_candidate_ms"]),
                ms(t["t_eager_ms"]),
                ms(t["t_compile_ms"]),
                times(t["speedup_vs_eager"]),
                times(t["speedup_vs_compile"]),
                str(t["candidates"]),
                note,
            ]
        )
    return Table(TASK_HEADER, rows)


def info_lines(report: dict) -> list[str]:
    """``label: value`` lines about the run (id, mode, task set, wall time, ...)."""
    i = report["info"]
    out = []
    for key, label in INFO_LABELS:
        if i.get(key) not in (None, "") and not (key == "infra_errors" and not i[key]):
            v = i[key]
            if key == "wall_seconds":
                v = f"{float(v):.1f}"
            elif isinstance(v, list):
                v = f"{len(v)} ({', '.join(map(str, v[:5]))}{', ...' if len(v) > 5 else ''})"
            out.append(f"{label}: {v}")
    return out
