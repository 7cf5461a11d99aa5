"""What ``cuda-agent train`` shows: one compact line per step, a first-to-last summary, a plot
of the reward curve in the run folder, and no third-party progress bars.

* :class:`StepPrinter` -- attached to the run's plugin manager, prints each step's line
  (step, stage, reward mean, KL, loss, tokens/s, seconds) on the main process;
* :func:`summary` -- the first and last step's figures and the best reward;
* :func:`write_reward_plot` -- ``reward.html`` (a self-contained SVG, no dependency) and,
  when matplotlib is installed, ``reward.png``;
* :func:`quiet_third_party_bars` -- transformers' and the hub's bars ("Loading weights",
  "Writing model shards" at every checkpoint) off; the rollout's own bar stays unless
  ``--no-progress``.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from cuda_agent.core.hookspecs import hookimpl

PLOT_NAME = "reward"
COLUMNS = ("step", "stage", "reward", "KL", "loss", "gen tok/s", "train tok/s", "s")
WIDTHS = (5, 10, 7, 9, 9, 9, 11, 6)


def _first(metrics: Mapping[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = metrics.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v)):
            return float(v)
    return None


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def figures(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """The figures a step line shows, from a step's metrics (``None``: the stage has none)."""
    return {
        "reward": _first(metrics, "reward/mean"),
        "KL": _first(metrics, "kl_ref", "actor/approx_kl"),
        "loss": _first(metrics, "actor/loss", "critic/loss", "loss"),
        "gen tok/s": _first(metrics, "rollout/tokens_per_s"),
        "train tok/s": _first(metrics, "train/tokens_per_s"),
        "s": _first(metrics, "step_seconds"),
    }


def header() -> str:
    return "  ".join(c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(COLUMNS, WIDTHS)))


def step_line(step: int, stage: str, metrics: Mapping[str, Any]) -> str:
    f = figures(metrics)
    cells = [str(step), stage[:WIDTHS[1]], _num(f["reward"], ".3f"), _num(f["KL"], ".2e"), _num(f["loss"], ".3g"),
             _num(f["gen tok/s"], ".0f"), _num(f["train tok/s"], ".0f"), _num(f["s"], ".1f")]
    return "  ".join(c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, WIDTHS)))


class StepPrinter:
    """Prints a header, then one line per training step (``on_step_end``); main process only."""

    def __init__(self, stage_names: Sequence[str], echo: Callable[[str], None] = print, main: bool = True):
        self.stage_names = list(stage_names)
        self.echo = echo
        self.main = main
        self._stage: int | None = None

    @hookimpl
    def on_step_end(self, run: Any, step: int, metrics: Mapping[str, float]) -> None:
        if not self.main:
            return
        index = int(metrics.get("stage", 0) or 0)
        if index != self._stage:
            self._stage = index
            self.echo(header())
        name = self.stage_names[index] if 0 <= index < len(self.stage_names) else str(index)
        self.echo(step_line(step, name, metrics))


def load_steps(run_dir: Path, fallback: Sequence[Mapping[str, Any]] = ()) -> list[dict]:
    """Every step's metrics of the run (its ``metrics.jsonl``, resumed sessions included), else ``fallback``."""
    path = Path(run_dir) / "metrics.jsonl"
    steps: dict[int, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill
            if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                steps[rec["step"]] = rec
    if not steps:
        return [dict(m) for m in fallback]
    return [steps[k] for k in sorted(steps)]


def summary(steps: Sequence[Mapping[str, Any]]) -> list[str]:
    """First to last: reward, KL and loss of the first and last step, and the best reward."""
    if not steps:
        return []
    first, last = steps[0], steps[-1]
    lines = [f"{len(steps)} steps (step {first.get('step', 0)} to {last.get('step', len(steps) - 1)}):"]
    ff, fl = figures(first), figures(last)
    for key in ("reward", "KL", "loss"):
        if ff[key] is None and fl[key] is None:
            continue
        spec = ".3f" if key == "reward" else ".3g"
        lines.append(f"  {key + ' mean' if key == 'reward' else key:<12} {_num(ff[key], spec):>9} -> {_num(fl[key], spec)}")
    rewards = [(figures(s)["reward"], s.get("step")) for s in steps]
    rewards = [(r, st) for r, st in rewards if r is not None]
    if rewards:
        best, at = max(rewards, key=lambda x: x[0])
        lines.append(f"  {'best reward':<12} {best:>9.3f} at step {at}")
    return lines


def _svg_line(points: Sequence[tuple[float, float]], width: int = 640, height: int = 300) -> str:
    """A line chart of ``(step, reward)`` as an SVG element, axes labelled."""
    pad_l, pad_r, pad_t, pad_b = 56, 16, 16, 40
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys + [0.0]), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 - y0 < 1e-9:
        y1 = y0 + 1
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return pad_t + (1 - (y - y0) / (y1 - y0)) * h

    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(points))
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5"><title>step {x:g}: {y:.4g}</title></circle>'
                   for x, y in points)
    ticks = []
    for k in range(5):
        yv = y0 + (y1 - y0) * k / 4
        ticks.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" stroke="#ddd"/>'
                     f'<text x="{pad_l - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
        xv = x0 + (x1 - x0) * k / 4
        ticks.append(f'<text x="{sx(xv):.1f}" y="{pad_t + h + 16}" text-anchor="middle">{xv:.0f}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
            f'font-size="11">{"".join(ticks)}'
            f'<line x1="{pad_l}" x2="{pad_l}" y1="{pad_t}" y2="{pad_t + h}" stroke="#444"/>'
            f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{pad_t + h}" y2="{pad_t + h}" stroke="#444"/>'
            f'<path d="{path}" fill="none" stroke="#1f77b4" stroke-width="2"/><g fill="#1f77b4">{dots}</g>'
            f'<text x="{pad_l + w / 2:.0f}" y="{height - 6}" text-anchor="middle">step</text>'
            f'<text x="14" y="{pad_t + h / 2:.0f}" text-anchor="middle" '
            f'transform="rotate(-90 14 {pad_t + h / 2:.0f})">reward mean</text></svg>')


def write_reward_plot(steps: Sequence[Mapping[str, Any]], run_dir: Path, title: str = "") -> Path | None:
    """``reward.html`` (and ``reward.png`` when matplotlib is installed) in ``run_dir``: the
    reward mean per step. Returns the HTML's path (None: no step has a reward)."""
    points = [(float(s["step"]), r) for s in steps if (r := figures(s)["reward"]) is not None and "step" in s]
    if not points:
        return None
    run_dir = Path(run_dir)
    rows = "".join(f"<tr><td>{x:g}</td><td>{y:.4f}</td></tr>" for x, y in points)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title or 'reward')}</title>"
            "<style>body{font-family:sans-serif;margin:2em}td{padding:0 1em;text-align:right}</style></head><body>"
            f"<h1>Reward mean per step</h1><p>{html.escape(title)}</p>{_svg_line(points)}"
            f"<details><summary>values</summary><table><tr><th>step</th><th>reward mean</th></tr>{rows}</table>"
            "</details></body></html>\n")
    out = run_dir / f"{PLOT_NAME}.html"
    out.write_text(page)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return out
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("reward mean")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / f"{PLOT_NAME}.png", dpi=100)
    plt.close(fig)
    return out


def quiet_third_party_bars() -> None:
    """No progress bars from transformers or the Hugging Face hub in this process (they draw
    two at every checkpoint: "Writing model shards", and "Loading weights" at each load)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        hf_logging = None
    if hf_logging is not None:
        hf_logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:
        return
    disable_progress_bars()
