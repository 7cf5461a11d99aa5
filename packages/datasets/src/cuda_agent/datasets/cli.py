"""``cuda-agent data``: list and validate tasks, synthesise new ones, show seed operators."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cuda_agent.core.configreads import command_reads
from cuda_agent.core.errors import ConfigError

READS = {
    "list": command_reads("data list", "dataset"),
    "validate": command_reads("data validate", "dataset", "validation"),
    "validate --no-run": command_reads("data validate --no-run", "dataset"),  # no run check: no executor
    "synthesize": command_reads("data synthesize", "synthesis", "dataset"),
}


def _split(args):
    files = [a for a in args if "=" not in a]
    overrides = [a for a in args if "=" in a]
    return files, overrides


def _plain(node):
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _dataset(cfg, validate: str | None = None):
    from cuda_agent.core.plugins import get_plugin_manager

    spec = _plain(cfg.get("dataset")) or {}
    if not spec.get("name"):
        raise ConfigError("no dataset selected: set dataset.name (kernelbench, ops6k or folder)")
    if validate is not None:
        spec = {"name": spec["name"], "options": dict(spec.get("options") or {}, validate=validate)}
    return get_plugin_manager().create("dataset", spec, where="dataset")


def _kernelbench_root(cfg) -> str | None:
    spec = _plain(cfg.get("dataset")) or {}
    if spec.get("name") == "kernelbench":
        return (spec.get("options") or {}).get("root")
    return None


@click.group("data")
def data_group() -> None:
    """Task datasets (KernelBench, Ops-6K, folders) and task synthesis."""


@data_group.command("list", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per task (without code).")
@click.option("--limit", type=int, default=None, help="Show at most N tasks.")
def list_cmd(args, as_json: bool, limit: int | None) -> None:
    """Show the tasks the config selects (FILES and key=value OVERRIDES)."""
    from cuda_agent.core.config import compose

    files, overrides = _split(args)
    cfg = compose(files, overrides, reads=READS["list"])
    ds = _dataset(cfg)
    tasks = ds.select()
    shown = tasks if limit is None else tasks[:limit]
    if as_json:
        for t in shown:
            d = t.to_dict()
            d.pop("code", None)
            click.echo(json.dumps(d))
    else:
        rows = [("ID", "LEVEL", "CATEGORY", "NAME / OPS")]
        for t in shown:
            ops = t.metadata.get("ops")
            desc = ", ".join(ops) if ops else t.name
            rows.append((t.id, "" if t.level is None else str(t.level), t.category or "", desc))
        widths = [min(48, max(len(r[i]) for r in rows)) for i in range(3)]
        for r in rows:
            click.echo("  ".join(v.ljust(w) for v, w in zip(r[:3], widths)) + "  " + r[3])
    for rep in ds.skipped:
        click.echo(f"skipped {rep.id}: {rep.reason}", err=True)
    more = f" (showing {len(shown)})" if len(shown) < len(tasks) else ""
    click.echo(f"{len(tasks)} tasks selected from {ds.name}{more}; {len(ds.skipped)} malformed skipped", err=True)


@data_group.command("validate", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--run/--no-run", "run_check", default=True, help="Also build and call each Model once on the CPU.")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds per task for the run check.")
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--memory-gb", type=float, default=8.0, show_default=True, help="Address-space cap of a run-check worker.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None, help="Write the per-task report as JSON lines.")
@click.option("--strict", is_flag=True, help="Exit with status 1 when a task is bad.")
def validate_cmd(args, run_check, timeout, workers, memory_gb, report_path, strict) -> None:
    """Check every selected task: parse, required names, and (with --run) one forward pass.

    Bad tasks are reported one per line and skipped; they never stop the check.
    """
    from cuda_agent.core.config import compose

    from .validate import TaskReport, static_problems

    files, overrides = _split(args)
    cfg = compose(files, overrides, reads=READS["validate" if run_check else "validate --no-run"])
    ds = _dataset(cfg, validate="none")
    tasks = ds.select()
    reports: dict[str, TaskReport] = {}
    runnable = []
    for t in tasks:
        problems = static_problems(t.code)
        if problems:
            reports[t.id] = TaskReport(t.id, False, "static", "; ".join(problems))
        else:
            runnable.append(t)
            reports[t.id] = TaskReport(t.id, True, "static")
    out = open(report_path, "w", encoding="utf-8") if report_path else None

    def emit(rep: TaskReport) -> None:
        click.echo(rep.line())
        if out is not None:
            out.write(json.dumps(rep.to_dict()) + "\n")
            out.flush()

    for t in tasks:
        if not reports[t.id].ok:
            emit(reports[t.id])
    if run_check and runnable:
        from tqdm import tqdm

        from .untrusted import open_executor, run_tasks

        settings = _plain(cfg.get("validation")) or {}
        executor = open_executor(settings.get("executor"), workers=workers, memory_limit_gb=memory_gb,
                                 where="validation.executor")
        results = run_tasks(executor, "cuda_agent.datasets.validate:run_task", ((t.id, t.code) for t in runnable),
                            timeout=timeout, batch_size=int(settings.get("batch_size") or 1), threads=1,
                            label="validation")
        with tqdm(total=len(runnable), desc="validate", unit="task", file=sys.stderr, leave=False) as bar:
            try:
                reports.update(_run_reports(results, bar, emit))
            finally:
                executor.close()
    else:
        for t in runnable:
            emit(reports[t.id])
    if out is not None:
        out.close()
    bad = [r for r in reports.values() if not r.ok]
    click.echo(f"{len(tasks)} tasks checked: {len(tasks) - len(bad)} ok, {len(bad)} bad"
               + (" (static checks only)" if not run_check else ""), err=True)
    if strict and bad:
        raise click.ClickException(f"{len(bad)} bad tasks (--strict)")


def _run_reports(results, bar, emit):
    """One TaskReport per run-check result, emitted as it comes."""
    from .validate import TaskReport

    for tid, res in results:
        stage = res.get("stage", "run")
        details = dict(res.get("details") or {}, privileges=res.get("privileges", ""))
        rep = TaskReport(tid, bool(res.get("ok")), stage, res.get("reason", ""), float(res.get("seconds", 0.0)), details)
        if stage == "too_large":
            rep.ok, rep.reason = True, "run check skipped: " + rep.reason
        bar.update(1)
        bar.clear()
        emit(rep)
        yield tid, rep


@data_group.command("synthesize", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--out", "out_dir", default=None, help="Output folder (synthesis.output_dir).")
@click.option("-n", "--num-tasks", type=int, default=None, help="Tasks to accept (synthesis.num_tasks).")
@click.option("--workers", type=int, default=None, help="Filter worker processes (synthesis.workers).")
@click.option("--fresh", is_flag=True, help="Discard an earlier run in the output folder instead of resuming it.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def synthesize_cmd(args, out_dir, num_tasks, workers, fresh, no_progress) -> None:
    """Compose candidate models from seed operators, filter them, write Ops-6K rows.

    Rerunning the same command resumes: judged candidates are skipped.
    """
    from cuda_agent.core.config import compose

    from .synthesis.pipeline import SynthesisOptions, Synthesizer, format_report

    files, overrides = _split(args)
    if out_dir is not None:
        overrides.append(f"synthesis.output_dir={out_dir}")
    if num_tasks is not None:
        overrides.append(f"synthesis.num_tasks={num_tasks}")
    if workers is not None:
        overrides.append(f"synthesis.workers={workers}")
    cfg = compose(files, overrides, reads=READS["synthesize"])
    opts = SynthesisOptions.from_mapping(_plain(cfg.get("synthesis")))
    synth = Synthesizer(opts, kernelbench_root=_kernelbench_root(cfg))
    report = synth.run(fresh=fresh, progress=not no_progress)
    click.echo(format_report(report))
    click.echo(f"\nrows: {Path(opts.output_dir) / 'tasks.jsonl'}  (load with dataset.name=ops6k "
               f"dataset.options.path={opts.output_dir})")


@data_group.command("seeds")
@click.option("--inventory", is_flag=True, help="Also list torch.nn modules / functional ops found, with rule coverage.")
def seeds_cmd(inventory: bool) -> None:
    """Seed operators available to the composers in this environment."""
    from .synthesis.seeds import collect_seeds, torch_inventory

    seeds = collect_seeds("auto")
    rows = [("NAME", "CATEGORY", "SOURCE", "RANKS")]
    for name in sorted(seeds):
        op = seeds[name]
        ranks = "any" if op.ranks is None else ",".join(map(str, op.ranks))
        rows.append((name, op.category + (" (stochastic)" if op.stochastic else ""), op.source, ranks))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    click.echo(f"{len(seeds)} seed operators", err=True)
    if inventory:
        inv = torch_inventory()
        for kind, items in inv.items():
            covered = [n for n, c in items if c]
            click.echo(f"\ntorch {kind}: {len(items)} found, {len(covered)} with a shape rule")
            click.echo("  without a rule: " + ", ".join(n for n, c in items if not c))
