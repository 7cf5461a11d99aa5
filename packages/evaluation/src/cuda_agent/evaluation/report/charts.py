"""The report's charts as inline SVG (no scripts, opens offline): speedup histograms,
per-task speedup bars, failures by category and level, refusals by rule.

Colours: green for faster than the baseline by the margin, orange for slower, grey in
between or untimed; each failure category has its own colour.
"""

from __future__ import annotations

import html
import math
from typing import Any, Sequence

from ..metrics import FAILURE_ORDER
from .model import levels
from .tables import FAILURE_LABELS, pct

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


def escape(x: Any) -> str:
    """``x`` as text safe inside HTML/SVG elements and attribute values."""
    return html.escape(str(x), quote=True)


def bar_color(s: float | None, margin: float) -> str:
    """The colour of a speedup ``s``: faster by the margin, slower, or in between."""
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
        f'<svg class="hist" data-level="{escape(level)}" data-baseline="{baseline}" xmlns="http://www.w3.org/2000/svg" '
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
        color = bar_color(mid, margin) if not (lo < 1.0 < (hi or math.inf)) else NEUTRAL
        out.append(
            f'<rect class="hist-bar" data-bin="{escape(label)}" data-count="{b["count"]}" x="{x + 2:.1f}" y="{y0 - bh:.1f}" '
            f'width="{bw - 4:.1f}" height="{bh:.1f}" fill="{color}"><title>{escape(label)}: {b["count"]}</title></rect>'
        )
        if b["count"]:
            out.append(f'<text x="{x + bw / 2:.1f}" y="{y0 - bh - 3:.1f}" text-anchor="middle">{b["count"]}</text>')
        out.append(
            f'<text x="{x + bw / 2:.1f}" y="{y0 + 14}" text-anchor="middle" style="font-size:10px">{escape(label)}</text>'
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
        f'<svg class="taskbars" data-level="{escape(level)}" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" role="img" aria-label="per-task speedup {level}">'
    ]
    for s in (1 / 16, 1 / 4, 1, 4, 16):
        y = y_of(s)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="{"#333" if s == 1 else "#eee"}"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{s:g}x</text>')
    for i, t in enumerate(tasks):
        x = left + i * bw
        s = t.get(f"speedup_vs_{baseline}")
        tid = escape(t["task_id"])
        if not t["correct"]:
            label = FAILURE_LABELS.get(t["failure"], t["failure"])
            out.append(
                f'<rect class="task-bar fail" data-task="{tid}" data-failure="{escape(t["failure"])}" x="{x + 0.5:.1f}" '
                f'y="{h - bottom + 4}" width="{max(bw - 1, 1):.1f}" height="8" fill="{FAIL_COLORS.get(t["failure"], FAIL)}">'
                f"<title>{tid}: {escape(label)}</title></rect>"
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
            f'width="{max(bw - 1, 1):.1f}" height="{max(bh, 1):.1f}" fill="{bar_color(s, margin)}">'
            f"<title>{tid}: {s:.3g}x vs {baseline}</title></rect>"
        )
    out.append(f'<text x="{left}" y="{h - 4}">{len(tasks)} tasks in order; marks under the axis: failed (colour = failure category)</text>')
    out.append("</svg>")
    return "".join(out)


def svg_failures(metrics: dict) -> str:
    """Horizontal bars: tasks per failure category, one row per category, stacked by level."""
    level_names = levels(metrics)
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
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{escape(FAILURE_LABELS[c])}</text>')
        x = left
        for j, lv in enumerate(level_names):
            k = metrics[lv]["failures"][c]
            if not k:
                continue
            bw = span * k / peak
            out.append(
                f'<rect class="fail-bar" data-category="{c}" data-level="{escape(lv)}" data-count="{k}" x="{x:.1f}" y="{y}" '
                f'width="{bw:.1f}" height="{row - 8}" fill="{palette[j % len(palette)]}"><title>{escape(lv)}: {k}</title></rect>'
            )
            x += bw
        out.append(f'<text class="fail-total" data-category="{c}" x="{x + 4:.1f}" y="{y + 15}">{total[c]}</text>')
    out += _legend([(lv, palette[j % len(palette)]) for j, lv in enumerate(level_names)], left, h - 12, 70)
    out.append("</svg>")
    return "".join(out)


def _legend(items: Sequence[tuple[str, str]], x: float, y: float, step: float) -> list[str]:
    """A row of colour swatches with their labels, ``step`` apart from ``x`` on baseline ``y``."""
    out = []
    for j, (label, color) in enumerate(items):
        out.append(f'<rect x="{x + j * step}" y="{y - 9}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x + j * step + 14}" y="{y}">{escape(label)}</text>')
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
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(name)}</text>')
        out.append(
            f'<rect class="refusal-bar" data-rule="{escape(e["rule"])}" data-category="{escape(e["category"])}" '
            f'data-count="{e["count"]}" x="{left}" y="{y}" width="{bw:.1f}" height="{row - 7}" fill="{color}">'
            f'<title>{escape(e["rule"])}: {e["count"]} sample(s), {escape(pct(e["share"]))}</title></rect>'
        )
        out.append(f'<text x="{left + bw + 4:.1f}" y="{y + 14}">{e["count"]} ({escape(pct(e["share"]))})</text>')
    if not rows:
        out.append(f'<text x="{left}" y="22">no sample was refused</text>')
    out += _legend([(FAILURE_LABELS.get(c, c), FAIL_COLORS.get(c, FAIL)) for c in cats], left, h - 12, 105)
    out.append("</svg>")
    return "".join(out)
