"""Evaluation reports: results as JSON, a Markdown table in the paper's Table-1 form,
and a self-contained HTML page with inline SVG plots (opens offline, no scripts).

Every report states what it was measured with: precision policy, profiler, GPU and
software versions (:func:`collect_environment`). With the run's samples (``samples.jsonl``)
it adds pass@k over samples, refusals counted by rule and, in the HTML, each task's samples.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import platform
from importlib import metadata as _md
from pathlib import Path
from typing import Any, Iterable, Sequence

from .metrics import FAILURE_ORDER, TaskResult, compute_metrics, is_infra_error, level_key, scored
from .samples import SampleResult, refusals_by_rule

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

FAILURE_LABELS = {
    "compile_error": "compile error",
    "wrong_result": "wrong result",
    "forbidden_op": "forbidden op",
    "timeout": "timeout",
    "crash": "crash",
    "missing": "no solution",
}
# metadata keys of verification/profiling results -> environment entries
ENV_FROM_JOBS = {
    "precision_policy": "precision",
    "profiler": "profiler",
    "gpu": "gpu",
    "device": "device",
    "cpu": "cpu",
    "torch": "torch",
    "cuda": "cuda",
    "driver": "driver",
    "triton": "triton",
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


# --- formatting -----------------------------------------------------------------------


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def times(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _result_label(correct: bool, failure: str) -> str:
    return "correct" if correct else FAILURE_LABELS.get(failure, failure)


def ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.4g} ms"


# --- environment --------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def timing_modes(results: Iterable[TaskResult]) -> str:
    """How many profiled tasks were timed in each profiler mode, with the reasons for a
    steadier one (see ``profilers.base.time_for_task``), e.g.
    ``cuda_events 233, cuda_events+graph 17 (unsteady 14, parallel streams 3)``; "" when no
    task was profiled."""
    counts: dict[str, int] = {}
    reasons: dict[str, dict[str, int]] = {}
    for r in results:
        md = (r.metadata or {}).get("profile") or {}
        if not md.get("profiler"):
            continue
        mode = str(md.get("timing_mode") or md["profiler"]).split(" ")[0]
        counts[mode] = counts.get(mode, 0) + 1
        why = str(md.get("timing_mode_reason") or "")
        if mode != md["profiler"]:  # a steadier mode than the configured one
            label = "parallel streams" if "parallel" in why else "unsteady"
            reasons.setdefault(mode, {})
            reasons[mode][label] = reasons[mode].get(label, 0) + 1
    parts = []
    for mode, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        why = ", ".join(f"{k} {v}" for k, v in sorted(reasons.get(mode, {}).items(), key=lambda kv: -kv[1]))
        parts.append(f"{mode} {n}" + (f" ({why})" if why else ""))
    return ", ".join(parts)


def collect_environment(results: Iterable[TaskResult] = (), extra: dict | None = None) -> dict:
    """What the numbers were measured with.

    Values reported by the profiler/verifier jobs (in each result's metadata) win over
    what this process sees: the jobs ran on the measuring machine.
    """
    results = list(results)  # read twice below
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    pkgs = {}
    for dist in (
        "cuda-agent-core",
        "cuda-agent-sandbox",
        "cuda-agent-rewards",
        "cuda-agent-datasets",
        "cuda-agent-evaluation",
    ):
        v = _version(dist)
        if v:
            pkgs[dist.removeprefix("cuda-agent-")] = v
    env["packages"] = pkgs
    for dist in ("torch", "triton"):
        v = _version(dist)
        if v:
            env[dist] = v
    # what the measuring jobs reported, for the keys that describe the setup
    seen: dict[str, set] = {}
    for r in results:
        for part in ("profile", "verify"):
            md = (r.metadata or {}).get(part) or {}
            for key, value in md.items():
                name = ENV_FROM_JOBS.get(key)
                if name is None or value is None:
                    continue
                if isinstance(value, dict):
                    value = value.get("key") or value.get("name") or json.dumps(value, sort_keys=True, default=str)
                seen.setdefault(name, set()).add(str(value))
    for key, values in seen.items():
        env[key] = " | ".join(sorted(values))
    modes = timing_modes(results)
    if modes:
        env["timing_modes"] = modes
    for key, value in (extra or {}).items():
        if value is not None and value != "":
            env.setdefault(key, value)
    env.setdefault("precision", "unknown")
    env.setdefault("profiler", "unknown")
    env.setdefault("gpu", "none")
    return env


# --- JSON --------------------------------------------------------------------------


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


# --- Markdown ----------------------------------------------------------------------


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _levels(metrics: dict) -> list[str]:
    return [k for k in metrics if k != "overall"]


def _main_rows(report: dict, label: str) -> list[list[str]]:
    rows = []
    for p in PAPER_ROWS:
        rows.append(
            [
                p["system"],
                pct(p.get("pass_rate")),
                pct(p.get("faster_eager")),
                pct(p.get("faster_compile")),
                times(p.get("geomean_vs_eager")),
                times(p.get("geomean_vs_compile")),
            ]
        )
    o = report["metrics"]["overall"]
    rows.append(
        [
            f"**{label}**",
            pct(o["pass_rate"]),
            pct(o["faster_eager"]),
            pct(o["faster_compile"]),
            times(o["geomean_vs_eager"]),
            times(o["geomean_vs_compile"]),
        ]
    )
    return rows


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


def _level_rows(report: dict) -> list[list[str]]:
    m = report["metrics"]
    rows = []
    for k in _levels(m) + ["overall"]:
        g = m[k]
        if k == "overall":
            p = PAPER_ROWS[-1]
        else:
            p = PAPER_LEVELS.get(k)
        paper = f"{pct(p['pass_rate'])} / {pct(p['faster_compile'])} / {times(p['geomean_vs_compile'])}" if p else "—"
        rows.append(
            [
                k,
                str(g["n"]),
                pct(g["pass_rate"]),
                pct(g["faster_eager"]),
                pct(g["faster_compile"]),
                times(g["geomean_vs_eager"]),
                times(g["geomean_vs_compile"]),
                paper,
            ]
        )
    return rows


STRICT_HEADER = [
    "level",
    "faster than eager (strict)",
    "faster than eager (>5%)",
    "faster than compile (strict)",
    "faster than compile (>5%)",
]


def _strict_rows(report: dict) -> list[list[str]]:
    m = report["metrics"]
    return [
        [
            k,
            pct(m[k]["faster_eager_strict"]),
            pct(m[k]["faster_eager"]),
            pct(m[k]["faster_compile_strict"]),
            pct(m[k]["faster_compile"]),
        ]
        for k in _levels(m) + ["overall"]
    ]


DIST_HEADER = ["level", "baseline", "solutions timed", "min", "p10", "p25", "median", "p75", "p90", "max"]


def _dist_rows(report: dict) -> list[list[str]]:
    m = report["metrics"]
    rows = []
    for k in _levels(m) + ["overall"]:
        for base in ("eager", "compile"):
            q = m[k][f"speedup_vs_{base}_quantiles"]
            n = sum(b["count"] for b in m[k][f"speedup_vs_{base}_histogram"])
            if q is None:
                rows.append([k, base, "0"] + ["—"] * 7)
            else:
                rows.append([k, base, str(n)] + [times(q[x]) for x in ("min", "p10", "p25", "median", "p75", "p90", "max")])
    return rows


FAIL_HEADER = ["level", "tasks", "failed"] + [FAILURE_LABELS[f] for f in FAILURE_ORDER]


def _fail_rows(report: dict) -> list[list[str]]:
    m = report["metrics"]
    rows = []
    for k in _levels(m) + ["overall"]:
        f = m[k]["failures"]
        rows.append([k, str(m[k]["n"]), str(m[k]["n"] - m[k]["n_correct"])] + [str(f[c]) for c in FAILURE_ORDER])
    return rows


def _pass_at_k_header(report: dict) -> list[str]:
    ks = list((report["metrics"]["overall"].get("pass_at_k") or {}).keys())
    return ["level", "tasks", "samples"] + [f"pass@{k}" for k in ks]


def _pass_at_k_rows(report: dict) -> list[list[str]]:
    m = report["metrics"]
    rows = []
    for k in _levels(m) + ["overall"]:
        g = m[k]
        cells = []
        for key, v in (g.get("pass_at_k") or {}).items():
            counted = g["pass_at_k_tasks"][key]
            cells.append(pct(v) if counted == g["tasks_with_samples"] else f"{pct(v)} ({counted} tasks)")
        rows.append([k, str(g["tasks_with_samples"]), str(g["n_samples"])] + cells)
    return rows


PASS_AT_K_NOTE = (
    "pass@k: the chance that at least one of k samples of a task, drawn from its n samples (c correct), is "
    "correct: 1 - C(n-c, k) / C(n, k), averaged over tasks. A sample is a solution file, or an agent attempt "
    "(it passes when one of its candidates is correct). A task without any sample counts 0; one with fewer than "
    "k samples is left out of pass@k (the count of tasks behind a value is given when it differs)."
)
REFUSAL_HEADER = ["rule", "category", "samples", "share of samples", "tasks", "example"]


def _tasks_cell(tasks: Sequence[str], most: int = 5) -> str:
    extra = len(tasks) - most
    return ", ".join(tasks[:most]) + (f", ... (+{extra})" if extra > 0 else "")


def _refusal_rows(report: dict) -> list[list[str]]:
    return [[e["rule"], FAILURE_LABELS.get(e["category"], e["category"]), str(e["count"]), pct(e["share"]),
             _tasks_cell(e["tasks"]), e["example"][:160]] for e in report.get("refusals") or []]


def _env_rows(env: dict) -> list[list[str]]:
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
    return rows


TASK_HEADER = ["task", "level", "result", "t (ms)", "eager (ms)", "compile (ms)", "vs eager", "vs compile", "candidates", "note"]


def _task_rows(report: dict) -> list[list[str]]:
    rows = []
    for t in report["tasks"]:
        result = _result_label(t["correct"], t["failure"])
        note = (t.get("message") or "").splitlines()[0][:120] if t.get("message") else ""
        rows.append(
            [
                t["task_id"],
                "—" if t["level"] is None else str(t["level"]),
                result,
                ms(t["t_candidate_ms"]),
                ms(t["t_eager_ms"]),
                ms(t["t_compile_ms"]),
                times(t["speedup_vs_eager"]),
                times(t["speedup_vs_compile"]),
                str(t["candidates"]),
                note,
            ]
        )
    return rows


def _title(report: dict) -> str:
    return report["info"].get("title") or "KernelBench evaluation"


def _label(report: dict) -> str:
    return report["info"].get("label") or "this run"


def _info_lines(report: dict) -> list[str]:
    i = report["info"]
    out = []
    for key, label in (
        ("run_id", "run"),
        ("mode", "mode"),
        ("dataset", "task set"),
        ("solutions", "solutions"),
        ("policy", "policy"),
        ("generated", "generated"),
        ("wall_seconds", "wall time (s)"),
        ("unmatched_solutions", "solutions matching no task"),
        ("infra_errors", "not scored (infrastructure errors, redone by --resume)"),
    ):
        if i.get(key) not in (None, "") and not (key == "infra_errors" and not i[key]):
            v = i[key]
            if key == "wall_seconds":
                v = f"{float(v):.1f}"
            elif isinstance(v, list):
                v = f"{len(v)} ({', '.join(map(str, v[:5]))}{', ...' if len(v) > 5 else ''})"
            out.append(f"{label}: {v}")
    return out


def render_markdown(report: dict) -> str:
    m = report["metrics"]
    margin = m["overall"]["margin"]
    parts = [f"# {_title(report)}", ""]
    parts += [f"- {line}" for line in _info_lines(report)]
    parts += [
        "",
        f"## Table 1: KernelBench, {m['overall']['n']} tasks",
        "",
        _md_table(MAIN_HEADER, _main_rows(report, _label(report))),
        "",
        f"\"Faster\" means more than {100 * margin:g}% lower time than the baseline (the paper's rule); "
        "shares are over all tasks; geometric means are over correct solutions. "
        "Paper rows are from the CUDA Agent paper (its own GPUs and software), shown for reference.",
        "",
        "## Per level",
        "",
        _md_table(LEVEL_HEADER, _level_rows(report)),
        "",
        "## Strictly faster and with the margin",
        "",
        _md_table(STRICT_HEADER, _strict_rows(report)),
        "",
        "## Speedup distribution (correct solutions)",
        "",
        _md_table(DIST_HEADER, _dist_rows(report)),
        "",
        "## Failures",
        "",
        _md_table(FAIL_HEADER, _fail_rows(report)),
        "",
        *_sample_sections_md(report),
        "## Measured with",
        "",
        _md_table(["", ""], _env_rows(report["environment"])),
        "",
        "## Tasks",
        "",
        _md_table(TASK_HEADER, _task_rows(report)),
        "",
    ]
    return "\n".join(parts)


def _sample_sections_md(report: dict) -> list[str]:
    """pass@k and refusals by rule, when the report has its samples."""
    if report.get("samples") is None:
        return []
    n = report["metrics"]["overall"].get("n_samples", 0)
    out = ["## pass@k over samples", "", _md_table(_pass_at_k_header(report), _pass_at_k_rows(report)), "",
           PASS_AT_K_NOTE, "", "## Refusals by rule", ""]
    if report["refusals"]:
        out += [_md_table(REFUSAL_HEADER, _refusal_rows(report)), "",
                f"Failed samples by the rule that refused them (of {n} samples; a failure that names no rule is "
                "counted under its category). Every sample's verdict and message is in samples.jsonl.", ""]
    else:
        out += [f"No sample was refused (of {n} samples).", ""]
    return out


def sample_summary(report: dict, most: int = 5) -> str:
    """One line of pass@k and one of the rules that refused most samples (for the console)."""
    o = report["metrics"]["overall"]
    ks = ", ".join(f"pass@{k} {pct(v)}" for k, v in (o.get("pass_at_k") or {}).items())
    lines = [f"{o.get('n_samples', 0)} samples of {o.get('tasks_with_samples', 0)} tasks: {ks}"]
    refusals = report.get("refusals") or []
    if refusals:
        top = ", ".join(f"{e['rule']} {e['count']}" for e in refusals[:most])
        lines.append(f"refused by rule: {top}" + (f", ... ({len(refusals) - most} more)" if len(refusals) > most else ""))
    return "\n".join(lines)


# --- HTML + SVG ---------------------------------------------------------------------

GOOD = "#2e7d32"
NEUTRAL = "#9e9e9e"
SLOW = "#ef6c00"
FAIL = "#c62828"
FAIL_COLORS = {
    "compile_error": "#6a1b9a",
    "wrong_result": "#c62828",
    "forbidden_op": "#ad1457",
    "timeout": "#ef6c00",
    "crash": "#4e342e",
    "missing": "#757575",
}

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:right}
th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}
tr.ours td{font-weight:bold;background:#e8f5e9}
.note{color:#555;font-size:.9em;max-width:60em}
.plots{display:flex;flex-wrap:wrap;gap:1em}
figure{margin:0}figcaption{font-size:.9em;color:#444;text-align:center}
svg text{font-size:11px;fill:#333}
details{margin:.6em 0}
td.fail{color:#c62828}td.ok{color:#2e7d32}
tr.samples-row>td{text-align:left;background:#fafafa;padding:0 .6em}
tr.samples-row details{margin:.2em 0}summary{cursor:pointer;color:#444}
table.samples{font-size:.9em;margin:.3em 0 .5em 1em}table.samples tr.best td{background:#e8f5e9}
table.refusals td,table.samples td{text-align:left}
td.msg{text-align:left;white-space:pre-wrap;font-family:monospace;font-size:.9em;max-width:60em}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _html_table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "", ours_first_col: str | None = None) -> str:
    out = [f'<table class="{_e(cls)}">' if cls else "<table>", "<thead><tr>"]
    out += [f"<th>{_e(h)}</th>" for h in header]
    out.append("</tr></thead><tbody>")
    for row in rows:
        first = str(row[0]).strip("*")
        tr = '<tr class="ours">' if ours_first_col is not None and first == ours_first_col else "<tr>"
        out.append(tr + "".join(f"<td>{_e(str(c).strip('*') if i == 0 else c)}</td>" for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _bar_color(s: float | None, margin: float) -> str:
    if s is None:
        return NEUTRAL
    if s > 1.0 / (1.0 - margin):
        return GOOD
    if s < 1.0:
        return SLOW
    return NEUTRAL


def svg_histogram(group: dict, level: str, baseline: str = "compile") -> str:
    """Bars: how many correct solutions fall in each speedup bin."""
    bins = group[f"speedup_vs_{baseline}_histogram"]
    w, h, left, bottom, top = 520, 220, 36, 40, 16
    bw = (w - left - 10) / len(bins)
    peak = max([b["count"] for b in bins] + [1])
    margin = group.get("margin", 0.05)
    out = [
        f'<svg class="hist" data-level="{_e(level)}" data-baseline="{baseline}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="speedup distribution {level}">'
    ]
    y0 = h - bottom
    out.append(f'<line x1="{left}" y1="{y0}" x2="{w - 10}" y2="{y0}" stroke="#333"/>')
    for frac in (0.5, 1.0):
        y = y0 - frac * (y0 - top)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - 10}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{peak * frac:.3g}</text>')
    for i, b in enumerate(bins):
        x = left + i * bw
        bh = (y0 - top) * b["count"] / peak
        lo = b["lo"]
        hi = b["hi"]
        label = f"≥{lo:g}" if hi is None else f"{lo:g}–{hi:g}"
        mid = lo * 1.01 if hi is None else (lo + hi) / 2
        color = _bar_color(mid, margin) if not (lo < 1.0 < (hi or math.inf)) else NEUTRAL
        out.append(
            f'<rect class="hist-bar" data-bin="{_e(label)}" data-count="{b["count"]}" x="{x + 2:.1f}" y="{y0 - bh:.1f}" '
            f'width="{bw - 4:.1f}" height="{bh:.1f}" fill="{color}"><title>{_e(label)}: {b["count"]}</title></rect>'
        )
        if b["count"]:
            out.append(f'<text x="{x + bw / 2:.1f}" y="{y0 - bh - 3:.1f}" text-anchor="middle">{b["count"]}</text>')
        out.append(
            f'<text x="{x + bw / 2:.1f}" y="{y0 + 14}" text-anchor="middle" style="font-size:10px">{_e(label)}</text>'
        )
    out.append(f'<text x="{w / 2}" y="{h - 6}" text-anchor="middle">speedup vs {baseline} (x)</text>')
    out.append("</svg>")
    return "".join(out)


def svg_task_bars(tasks: Sequence[dict], level: str, margin: float = 0.05, baseline: str = "compile") -> str:
    """One bar per task: log-scale speedup vs ``baseline`` (up above 1x, down below);
    failed tasks are red marks under the axis."""
    n = max(len(tasks), 1)
    left, right, top, bottom = 44, 10, 14, 28
    bw = max(3.0, min(16.0, 1100.0 / n))
    w = int(left + right + bw * n)
    h = 260
    lim = 4.0  # log2 range shown: 1/16x .. 16x
    plot_h = h - top - bottom
    y_one = top + plot_h / 2

    def y_of(s: float) -> float:
        v = max(-lim, min(lim, math.log2(s)))
        return y_one - v / lim * (plot_h / 2)

    out = [
        f'<svg class="taskbars" data-level="{_e(level)}" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" role="img" aria-label="per-task speedup {level}">'
    ]
    for s in (1 / 16, 1 / 4, 1, 4, 16):
        y = y_of(s)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="{"#333" if s == 1 else "#eee"}"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{s:g}x</text>')
    for i, t in enumerate(tasks):
        x = left + i * bw
        s = t.get(f"speedup_vs_{baseline}")
        tid = _e(t["task_id"])
        if not t["correct"]:
            label = FAILURE_LABELS.get(t["failure"], t["failure"])
            out.append(
                f'<rect class="task-bar fail" data-task="{tid}" data-failure="{_e(t["failure"])}" x="{x + 0.5:.1f}" '
                f'y="{h - bottom + 4}" width="{max(bw - 1, 1):.1f}" height="8" fill="{FAIL_COLORS.get(t["failure"], FAIL)}">'
                f"<title>{tid}: {_e(label)}</title></rect>"
            )
            continue
        if s is None:
            out.append(
                f'<rect class="task-bar untimed" data-task="{tid}" x="{x + 0.5:.1f}" y="{y_one - 1:.1f}" '
                f'width="{max(bw - 1, 1):.1f}" height="2" fill="{NEUTRAL}"><title>{tid}: correct, not timed</title></rect>'
            )
            continue
        y = y_of(s)
        y_top, bh = (y, y_one - y) if y < y_one else (y_one, y - y_one)
        out.append(
            f'<rect class="task-bar ok" data-task="{tid}" data-speedup="{s:.4g}" x="{x + 0.5:.1f}" y="{y_top:.1f}" '
            f'width="{max(bw - 1, 1):.1f}" height="{max(bh, 1):.1f}" fill="{_bar_color(s, margin)}">'
            f"<title>{tid}: {s:.3g}x vs {baseline}</title></rect>"
        )
    out.append(f'<text x="{left}" y="{h - 4}">{len(tasks)} tasks in order; marks under the axis: failed (colour = failure category)</text>')
    out.append("</svg>")
    return "".join(out)


def svg_failures(metrics: dict) -> str:
    """Horizontal bars: tasks per failure category, one row per category, stacked by level."""
    levels = _levels(metrics)
    cats = FAILURE_ORDER
    total = metrics["overall"]["failures"]
    peak = max([total[c] for c in cats] + [1])
    left, w, row = 110, 520, 26
    h = row * len(cats) + 40
    palette = ["#1565c0", "#00897b", "#f9a825", "#6d4c41", "#8e24aa"]
    out = [
        f'<svg class="failures" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        f'role="img" aria-label="failure categories">'
    ]
    span = w - left - 50
    for i, c in enumerate(cats):
        y = 10 + i * row
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{_e(FAILURE_LABELS[c])}</text>')
        x = left
        for j, lv in enumerate(levels):
            k = metrics[lv]["failures"][c]
            if not k:
                continue
            bw = span * k / peak
            out.append(
                f'<rect class="fail-bar" data-category="{c}" data-level="{_e(lv)}" data-count="{k}" x="{x:.1f}" y="{y}" '
                f'width="{bw:.1f}" height="{row - 8}" fill="{palette[j % len(palette)]}"><title>{_e(lv)}: {k}</title></rect>'
            )
            x += bw
        out.append(f'<text class="fail-total" data-category="{c}" x="{x + 4:.1f}" y="{y + 15}">{total[c]}</text>')
    out += _svg_legend([(lv, palette[j % len(palette)]) for j, lv in enumerate(levels)], left, h - 12, 70)
    out.append("</svg>")
    return "".join(out)


def _svg_legend(items: Sequence[tuple[str, str]], x: float, y: float, step: float) -> list[str]:
    """A row of colour swatches with their labels, ``step`` apart from ``x`` on baseline ``y``."""
    out = []
    for j, (label, color) in enumerate(items):
        out.append(f'<rect x="{x + j * step}" y="{y - 9}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x + j * step + 14}" y="{y}">{_e(label)}</text>')
    return out


def svg_refusals(refusals: Sequence[dict], most: int = 30) -> str:
    """Horizontal bars: failed samples per rule (colour = failure category), most frequent first."""
    rows = list(refusals)[:most]
    peak = max([e["count"] for e in rows] + [1])
    left, w, row = 190, 640, 24
    cats = [c for c in FAILURE_ORDER if any(e["category"] == c for e in rows)]
    h = row * max(len(rows), 1) + 44
    span = w - left - 90
    out = [
        f'<svg class="refusals" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        f'role="img" aria-label="refusals by rule">'
    ]
    for i, e in enumerate(rows):
        y = 8 + i * row
        name = e["rule"] if len(e["rule"]) <= 30 else e["rule"][:29] + "…"
        bw = max(span * e["count"] / peak, 1.0)
        color = FAIL_COLORS.get(e["category"], FAIL)
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{_e(name)}</text>')
        out.append(
            f'<rect class="refusal-bar" data-rule="{_e(e["rule"])}" data-category="{_e(e["category"])}" '
            f'data-count="{e["count"]}" x="{left}" y="{y}" width="{bw:.1f}" height="{row - 7}" fill="{color}">'
            f'<title>{_e(e["rule"])}: {e["count"]} sample(s), {_e(pct(e["share"]))}</title></rect>'
        )
        out.append(f'<text x="{left + bw + 4:.1f}" y="{y + 14}">{e["count"]} ({_e(pct(e["share"]))})</text>')
    if not rows:
        out.append(f'<text x="{left}" y="22">no sample was refused</text>')
    out += _svg_legend([(FAILURE_LABELS.get(c, c), FAIL_COLORS.get(c, FAIL)) for c in cats], left, h - 12, 105)
    out.append("</svg>")
    return "".join(out)


SAMPLE_HEADER = ["sample", "source", "result", "rule", "t (ms)", "vs eager", "vs compile", "weights", "message"]


def _samples_html(task: dict, samples: Sequence[dict], columns: int) -> str:
    """A full-width row under a task's row: its samples, folded (details/summary)."""
    counts: dict[str, int] = {}
    for x in samples:
        label = _result_label(x["correct"], x["failure"])
        counts[label] = counts.get(label, 0) + 1
    summary = f"{len(samples)} sample row(s): " + ", ".join(f"{v} {k}" for k, v in counts.items())
    rows = []
    for x in samples:
        best = x["source"] == task.get("source")
        name = x["sample"] + (f" #{x['candidate']}" if x["trajectory"] else "")
        cells = [name + (" (scored)" if best else ""), x["source"], _result_label(x["correct"], x["failure"]),
                 x["rule"] or "—", ms(x["t_candidate_ms"]), times(x["speedup_vs_eager"]),
                 times(x["speedup_vs_compile"]), x.get("weights") or "—"]
        cls = "ok" if x["correct"] else "fail"
        rows.append(
            f'<tr class="sample{" best" if best else ""}" data-sample="{_e(x["sample"])}" data-rule="{_e(x["rule"] or "")}">'
            + "".join(f'<td class="{cls}">{_e(c)}</td>' if i == 2 else f"<td>{_e(c)}</td>" for i, c in enumerate(cells))
            + f'<td class="msg">{_e(x["message"])}</td></tr>'
        )
    return (
        f'<tr class="samples-row" data-task="{_e(task["task_id"])}"><td colspan="{columns}"><details>'
        f"<summary>{_e(summary)}</summary><table class=\"samples\"><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in SAMPLE_HEADER)
        + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></details></td></tr>"
    )


def _sample_sections_html(report: dict) -> list[str]:
    if report.get("samples") is None:
        return []
    n = report["metrics"]["overall"].get("n_samples", 0)
    body = ['<h2 id="pass-at-k">pass@k over samples</h2>',
            _html_table(_pass_at_k_header(report), _pass_at_k_rows(report), "pass-at-k"),
            f'<p class="note">{_e(PASS_AT_K_NOTE)}</p>', '<h2 id="refusals">Refusals by rule</h2>']
    body.append(f"<figure>{svg_refusals(report['refusals'])}<figcaption>failed samples by the rule that refused "
                f"them (of {n} samples; colour = failure category)</figcaption></figure>")
    if report["refusals"]:
        body.append(_html_table(REFUSAL_HEADER, _refusal_rows(report), "refusals"))
    body.append('<p class="note">A failure that names no rule is counted under its category. Each task\'s samples, '
                "with their messages, unfold under its row in the task table; all of them are in samples.jsonl.</p>")
    return body


def render_html(report: dict) -> str:
    m = report["metrics"]
    margin = m["overall"]["margin"]
    label = _label(report)
    title = _title(report)
    levels = _levels(m)
    by_level: dict[str, list[dict]] = {lv: [] for lv in levels}
    for t in report["tasks"]:
        key = f"L{t['level']}" if t["level"] is not None else "other"
        by_level.setdefault(key, []).append(t)

    body = [f"<h1>{_e(title)}</h1>", "<ul class=\"info\">"]
    body += [f"<li>{_e(line)}</li>" for line in _info_lines(report)]
    body.append("</ul>")
    body.append(f'<h2 id="table1">Table 1: KernelBench, {m["overall"]["n"]} tasks</h2>')
    body.append(_html_table(MAIN_HEADER, _main_rows(report, label), "table1", ours_first_col=label))
    body.append(
        f'<p class="note">"Faster" means more than {100 * margin:g}% lower time than the baseline (the paper\'s rule); '
        "shares are over all tasks, geometric means over correct solutions. Paper rows come from the CUDA Agent "
        "paper (its own GPUs and software) and are shown for reference.</p>"
    )
    body.append('<h2 id="levels">Per level</h2>')
    body.append(_html_table(LEVEL_HEADER, _level_rows(report), "levels"))
    body.append('<h2 id="strict">Strictly faster and with the margin</h2>')
    body.append(_html_table(STRICT_HEADER, _strict_rows(report), "strict"))

    body.append('<h2 id="distribution">Speedup distribution</h2><div class="plots">')
    for lv in levels + ["overall"]:
        body.append(f"<figure>{svg_histogram(m[lv], lv)}<figcaption>{_e(lv)}: speedup vs torch.compile</figcaption></figure>")
    body.append("</div>")
    body.append(_html_table(DIST_HEADER, _dist_rows(report), "distribution"))

    body.append('<h2 id="tasks-plot">Per task</h2>')
    for lv in levels:
        body.append(
            f"<figure>{svg_task_bars(by_level.get(lv, []), lv, margin)}"
            f"<figcaption>{_e(lv)}: speedup vs torch.compile per task (log scale)</figcaption></figure>"
        )

    body.append('<h2 id="failures">Failures</h2>')
    body.append(f"<figure>{svg_failures(m)}<figcaption>failed tasks by category and level</figcaption></figure>")
    body.append(_html_table(FAIL_HEADER, _fail_rows(report), "failures"))
    body += _sample_sections_html(report)

    body.append('<h2 id="environment">Measured with</h2>')
    body.append(_html_table(["", ""], _env_rows(report["environment"]), "environment"))

    body.append('<h2 id="task-table">Tasks</h2><details open><summary>all tasks</summary>')
    rows = []
    by_task: dict[str, list[dict]] = {}
    for x in report.get("samples") or []:
        by_task.setdefault(x["task_id"], []).append(x)
    for row, t in zip(_task_rows(report), report["tasks"]):
        cls = "ok" if t["correct"] else "fail"
        rows.append(
            f'<tr class="task" data-task="{_e(t["task_id"])}">'
            + "".join(f'<td class="{cls}">{_e(c)}</td>' if i == 2 else f"<td>{_e(c)}</td>" for i, c in enumerate(row))
            + "</tr>"
        )
        if by_task.get(t["task_id"]):
            rows.append(_samples_html(t, by_task[t["task_id"]], len(TASK_HEADER)))
    body.append(
        '<table class="tasks"><thead><tr>'
        + "".join(f"<th>{_e(h)}</th>" for h in TASK_HEADER)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></details>"
    )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


# --- writing ------------------------------------------------------------------------


def write_reports(report: dict, out_dir: str | Path, formats: Sequence[str] = ("json", "md", "html")) -> dict[str, Path]:
    """Write ``results.json``, ``report.md`` and ``report.html`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    if "json" in formats:
        p = out / "results.json"
        p.write_text(json.dumps(report, indent=2, default=str))
        paths["json"] = p
    if "md" in formats:
        p = out / "report.md"
        p.write_text(render_markdown(report))
        paths["md"] = p
    if "html" in formats:
        p = out / "report.html"
        p.write_text(render_html(report), encoding="utf-8")
        paths["html"] = p
    return paths
