"""The report as one self-contained HTML page: the Markdown report's tables, the SVG
charts beside them, and each task's samples folded under its row (no scripts, opens offline).
"""

from __future__ import annotations

from typing import Sequence

from .charts import escape, svg_failures, svg_histogram, svg_refusals, svg_task_bars
from .model import levels, report_title, run_label
from .tables import PASS_AT_K_NOTE, Table, coverage_line, environment_table, info_lines, main_table, ms, pass_at_k_table
from .tables import distribution_table, failure_table, level_table, refusal_table, result_label, strict_table
from .tables import task_table, times


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

def html_table(table: Table, cls: str = "", ours: str | None = None) -> str:
    """``table`` as an HTML table; the row whose first cell is ``ours`` is highlighted
    (Markdown bold ``**`` around a first cell is dropped)."""
    out = [f'<table class="{escape(cls)}">' if cls else "<table>", "<thead><tr>"]
    out += [f"<th>{escape(h)}</th>" for h in table.header]
    out.append("</tr></thead><tbody>")
    for row in table.rows:
        first = str(row[0]).strip("*")
        tr = '<tr class="ours">' if ours is not None and first == ours else "<tr>"
        out.append(tr + "".join(f"<td>{escape(str(c).strip('*') if i == 0 else c)}</td>" for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


SAMPLE_HEADER = ["sample", "source", "result", "rule", "t (ms)", "vs eager", "vs compile", "weights", "message"]


def _samples_html(task: dict, samples: Sequence[dict], columns: int) -> str:
    """A full-width row under a task's row: its samples, folded (details/summary)."""
    counts: dict[str, int] = {}
    for x in samples:
        label = result_label(x["correct"], x["failure"])
        counts[label] = counts.get(label, 0) + 1
    summary = f"{len(samples)} sample row(s): " + ", ".join(f"{v} {k}" for k, v in counts.items())
    rows = []
    for x in samples:
        best = x["source"] == task.get("source")
        name = x["sample"] + (f" #{x['candidate']}" if x["trajectory"] else "")
        cells = [name + (" (scored)" if best else ""), x["source"], result_label(x["correct"], x["failure"]),
                 x["rule"] or "—", ms(x["t_candidate_ms"]), times(x["speedup_vs_eager"]),
                 times(x["speedup_vs_compile"]), x.get("weights") or "—"]
        cls = "ok" if x["correct"] else "fail"
        rows.append(
            f'<tr class="sample{" best" if best else ""}" data-sample="{escape(x["sample"])}" data-rule="{escape(x["rule"] or "")}">'
            + "".join(f'<td class="{cls}">{escape(c)}</td>' if i == 2 else f"<td>{escape(c)}</td>" for i, c in enumerate(cells))
            + f'<td class="msg">{escape(x["message"])}</td></tr>'
        )
    return (
        f'<tr class="samples-row" data-task="{escape(task["task_id"])}"><td colspan="{columns}"><details>'
        f"<summary>{escape(summary)}</summary><table class=\"samples\"><thead><tr>"
        + "".join(f"<th>{escape(h)}</th>" for h in SAMPLE_HEADER)
        + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></details></td></tr>"
    )


def _sample_sections_html(report: dict) -> list[str]:
    if report.get("samples") is None:
        return []
    n = report["metrics"]["overall"].get("n_samples", 0)
    body = ['<h2 id="pass-at-k">pass@k over samples</h2>',
            html_table(pass_at_k_table(report), "pass-at-k"),
            f'<p class="note">{escape(PASS_AT_K_NOTE)}</p>', '<h2 id="refusals">Refusals by rule</h2>']
    body.append(f"<figure>{svg_refusals(report['refusals'])}<figcaption>failed samples by the rule that refused "
                f"them (of {n} samples; colour = failure category)</figcaption></figure>")
    if report["refusals"]:
        body.append(html_table(refusal_table(report), "refusals"))
    body.append('<p class="note">A failure that names no rule is counted under its category. Each task\'s samples, '
                "with their messages, unfold under its row in the task table; all of them are in samples.jsonl.</p>")
    return body


def render_html(report: dict) -> str:
    m = report["metrics"]
    margin = m["overall"]["margin"]
    label = run_label(report)
    title = report_title(report)
    level_names = levels(m)
    by_level: dict[str, list[dict]] = {lv: [] for lv in level_names}
    for t in report["tasks"]:
        key = f"L{t['level']}" if t["level"] is not None else "other"
        by_level.setdefault(key, []).append(t)

    body = [f"<h1>{escape(title)}</h1>", "<ul class=\"info\">"]
    body += [f"<li>{escape(line)}</li>" for line in info_lines(report)]
    body.append("</ul>")
    body.append(f'<h2 id="table1">Table 1: KernelBench, {m["overall"]["n"]} tasks</h2>')
    body.append(html_table(main_table(report), "table1", ours=label))
    body.append(
        f'<p class="note">"Faster" means more than {100 * margin:g}% lower time than the baseline (the paper\'s rule); '
        "shares are over all tasks, geometric means over correct solutions. Paper rows come from the CUDA Agent "
        "paper (its own GPUs and software) and are shown for reference.</p>"
    )
    if coverage_line(report):
        body.append(f'<p class="note">{escape(coverage_line(report))}</p>')
    body.append('<h2 id="levels">Per level</h2>')
    body.append(html_table(level_table(report), "levels"))
    body.append('<h2 id="strict">Strictly faster and with the margin</h2>')
    body.append(html_table(strict_table(report), "strict"))

    body.append('<h2 id="distribution">Speedup distribution</h2><div class="plots">')
    for lv in level_names + ["overall"]:
        body.append(f"<figure>{svg_histogram(m[lv], lv)}<figcaption>{escape(lv)}: speedup vs torch.compile</figcaption></figure>")
    body.append("</div>")
    body.append(html_table(distribution_table(report), "distribution"))

    body.append('<h2 id="tasks-plot">Per task</h2>')
    for lv in level_names:
        body.append(
            f"<figure>{svg_task_bars(by_level.get(lv, []), lv, margin)}"
            f"<figcaption>{escape(lv)}: speedup vs torch.compile per task (log scale)</figcaption></figure>"
        )

    body.append('<h2 id="failures">Failures</h2>')
    body.append(f"<figure>{svg_failures(m)}<figcaption>failed tasks by category and level</figcaption></figure>")
    body.append(html_table(failure_table(report), "failures"))
    body += _sample_sections_html(report)

    body.append('<h2 id="environment">Measured with</h2>')
    body.append(html_table(environment_table(report["environment"]), "environment"))

    body.append('<h2 id="task-table">Tasks</h2><details open><summary>all tasks</summary>')
    tasks = task_table(report)
    rows = []
    by_task: dict[str, list[dict]] = {}
    for x in report.get("samples") or []:
        by_task.setdefault(x["task_id"], []).append(x)
    for row, t in zip(tasks.rows, report["tasks"]):
        cls = "ok" if t["correct"] else "fail"
        rows.append(
            f'<tr class="task" data-task="{escape(t["task_id"])}">'
            + "".join(f'<td class="{cls}">{escape(c)}</td>' if i == 2 else f"<td>{escape(c)}</td>" for i, c in enumerate(row))
            + "</tr>"
        )
        if by_task.get(t["task_id"]):
            rows.append(_samples_html(t, by_task[t["task_id"]], len(tasks.header)))
    body.append(
        '<table class="tasks"><thead><tr>'
        + "".join(f"<th>{escape(h)}</th>" for h in tasks.header)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></details>"
    )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
