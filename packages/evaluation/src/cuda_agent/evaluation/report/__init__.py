"""Evaluation reports: results as JSON, a Markdown table in the paper's Table-1 form,
and a self-contained HTML page with inline SVG plots (opens offline, no scripts).

Every report states what it was measured with: precision policy, profiler, GPU and
software versions (:func:`collect_environment`). With the run's samples (``samples.jsonl``)
it adds pass@k over samples, refusals counted by rule and, in the HTML, each task's samples.

Inside: :mod:`.model` (what a report holds, :func:`build_report`), :mod:`.environment`,
:mod:`.tables` (the tables both writers lay out), :mod:`.markdown`, :mod:`.charts` (SVG),
:mod:`.html_page` and :mod:`.files` (:func:`write_reports`). Import from here.
"""

from .charts import FAIL, FAIL_COLORS, GOOD, NEUTRAL, SLOW, svg_failures, svg_histogram, svg_refusals, svg_task_bars
from .environment import collect_environment, timing_modes
from .files import write_reports
from .html_page import html_table, render_html
from .markdown import markdown_table, render_markdown, sample_summary
from .model import PAPER_LEVELS, PAPER_ROWS, build_report
from .tables import FAILURE_LABELS, Table, main_table, ms, pct, times

__all__ = [
    "FAIL", "FAIL_COLORS", "FAILURE_LABELS", "GOOD", "NEUTRAL", "PAPER_LEVELS", "PAPER_ROWS", "SLOW", "Table",
    "build_report", "collect_environment", "html_table", "main_table", "markdown_table", "ms", "pct",
    "render_html", "render_markdown", "sample_summary", "svg_failures", "svg_histogram", "svg_refusals",
    "svg_task_bars", "timing_modes", "times", "write_reports",
]
