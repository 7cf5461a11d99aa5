"""The report as Markdown (Table 1 in the paper's form, then per-level detail), and the
short text summary the ``eval`` command prints on the console."""

from __future__ import annotations

from .model import report_title
from .tables import PASS_AT_K_NOTE, Table, coverage_line, environment_table, info_lines, main_table, pass_at_k_table
from .tables import pct
from .tables import distribution_table, failure_table, level_table, refusal_table, strict_table, task_table


def markdown_table(table: Table) -> str:
    """A Markdown pipe table (``|`` inside cells escaped)."""
    lines = ["| " + " | ".join(table.header) + " |", "| " + " | ".join("---" for _ in table.header) + " |"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _section(heading: str, table: Table, *notes: str) -> list[str]:
    """A ``##`` heading, its table and the paragraphs under it, each followed by a blank line."""
    out = [f"## {heading}", "", markdown_table(table), ""]
    for note in notes:
        out += [note, ""]
    return out


def render_markdown(report: dict) -> str:
    m = report["metrics"]
    margin = m["overall"]["margin"]
    table1_note = (
        f"\"Faster\" means more than {100 * margin:g}% lower time than the baseline (the paper's rule); "
        "shares are over all tasks; geometric means are over correct solutions. "
        "Paper rows are from the CUDA Agent paper (its own GPUs and software), shown for reference."
    )
    parts = [
        f"# {report_title(report)}",
        "",
        *(f"- {line}" for line in info_lines(report)),
        "",
        *_section(f"Table 1: KernelBench, {m['overall']['n']} tasks", main_table(report), table1_note,
                  *filter(None, [coverage_line(report)])),
        *_section("Per level", level_table(report)),
        *_section("Strictly faster and with the margin", strict_table(report)),
        *_section("Speedup distribution (correct solutions)", distribution_table(report)),
        *_section("Failures", failure_table(report)),
        *_sample_sections(report),
        *_section("Measured with", environment_table(report["environment"])),
        *_section("Tasks", task_table(report)),
    ]
    return "\n".join(parts)


def _sample_sections(report: dict) -> list[str]:
    """pass@k and refusals by rule, when the report has its samples."""
    if report.get("samples") is None:
        return []
    n = report["metrics"]["overall"].get("n_samples", 0)
    out = _section("pass@k over samples", pass_at_k_table(report), PASS_AT_K_NOTE)
    if not report["refusals"]:
        return out + ["## Refusals by rule", "", f"No sample was refused (of {n} samples).", ""]
    return out + _section("Refusals by rule", refusal_table(report),
                          f"Failed samples by the rule that refused them (of {n} samples; a failure that names no "
                          "rule is counted under its category). Every sample's verdict and message is in samples.jsonl.")


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
