"""Writes a report's files into a run folder: ``results.json``, ``report.md``, ``report.html``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from .html_page import render_html
from .markdown import render_markdown


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
