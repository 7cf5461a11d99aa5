"""``cuda-agent eval`` and ``cuda-agent baselines``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

import click

from cuda_agent.core.cli import split_args
from cuda_agent.core.configreads import check_overrides, command_reads
from cuda_agent.core.errors import ConfigError

_EVAL_SOLUTIONS = ("dataset", "levels", "ids", "limit", "shard", "solutions", "workers", "margin",
                   "max_infra_error_share", "enforce_rules", "rules", "verify", "profile", "judge", "formats", "title",
                   "label", "work_dir", "keep_workspaces", "progress")
_RUN = ("run.output_dir", "run.name", "run.resume", "backend", "logging", "trackers")
READS = {
    # an agent on every task: its episodes read what `optimize` reads
    "eval": command_reads("eval", *_RUN, "eval", "dataset", "policy", "agent", "environment", "compiler", "sandbox",
                          "executor", "service", "reward"),
    # a folder of solutions: no policy, no agent, no episode (so no eval.attempts, eval.max_turns)
    "eval --solutions": command_reads("eval --solutions", *_RUN, *(f"eval.{k}" for k in _EVAL_SOLUTIONS), "dataset",
                                      "compiler", "executor"),
    "baselines": command_reads("baselines", "backend", "executor", "dataset", "eval.dataset", "eval.levels",
                               "eval.ids", "eval.limit", "eval.shard", "eval.profile", "eval.progress"),
}


def _overrides_from_options(levels, limit, solutions, resume, workers, shard, ids) -> list[str]:
    ov = []
    if levels:
        nums = [x.strip().lstrip("Ll") for x in levels.split(",") if x.strip()]
        if not all(n.isdigit() for n in nums):
            raise ConfigError(f"--levels takes numbers like 1,2,3, got {levels!r}")
        ov.append(f"eval.levels=[{','.join(nums)}]")
    if limit is not None:
        ov.append(f"eval.limit={int(limit)}")
    if solutions:
        ov.append(f"eval.solutions={Path(solutions).resolve()}")
    if resume:
        ov.append(f"run.resume={Path(resume).resolve()}")
    if workers is not None:
        ov.append(f"eval.workers={int(workers)}")
    if shard:
        ov.append(f"eval.shard='{shard}'")
    if ids:
        ov.append(f"eval.ids=[{','.join(repr(x.strip()) for x in ids.split(',') if x.strip())}]")
    return ov


_common = [
    click.option("--levels", default=None, help="Only these levels, e.g. 1,2."),
    click.option("--limit", type=int, default=None, help="Only the first N tasks."),
    click.option("--ids", default=None, help="Only these task ids (comma separated; globs allowed)."),
    click.option("--shard", default=None, help="i/n: the i-th of n interleaved slices of the tasks."),
    click.option("--workers", type=int, default=None, help="Tasks in flight at once (default: 2 per device for solutions, 8 for agents)."),
]


def _with_common(fn):
    for opt in reversed(_common):
        fn = opt(fn)
    return fn


def check_eval_run(run_dir: Path) -> None:
    """A one-line ConfigError unless ``run_dir`` is a run folder that ``cuda-agent eval`` made."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume {run_dir}: not a run folder (no config.yaml)")
    meta = run_dir / "plugins.json"
    try:
        command = json.loads(meta.read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        command = None
    if command != "eval" and not (run_dir / "results.jsonl").is_file():
        made = f"a {command!r} run" if command else "no plugins.json or results.jsonl"
        raise ConfigError(f"--resume {run_dir}: not an eval run folder ({made}); "
                          "give the folder of an earlier cuda-agent eval run")


@click.command("eval", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--solutions", type=click.Path(), default=None, help="Score this folder of solutions (no agent).")
@click.option("--resume", type=click.Path(), default=None, help="Continue an interrupted eval run folder.")
@click.option("--report-only", is_flag=True, help="Only re-render the reports of --resume's run folder.")
@click.option("--only-covered", is_flag=True,
              help="With --solutions: score only the selected tasks that the folder has a solution for.")
@_with_common
def eval_cmd(args, solutions, resume, report_only, only_covered, levels, limit, ids, shard, workers) -> None:
    """Evaluate a policy (or a folder of solutions) on a task set; KernelBench L1-L3 by default.

    ARGS are config files and key=value overrides. Results, results.json, report.md and
    report.html go to the run folder. An interrupted run continues with --resume RUN_DIR
    (its saved config is used; finished tasks are not redone).
    """
    from cuda_agent.core.config import compose

    from .evaluate import evaluate, rerender

    files, overrides = split_args(args)
    if report_only:
        if not resume:
            raise ConfigError("--report-only needs --resume RUN_DIR")
        paths = rerender(Path(resume))
        for kind, p in paths.items():
            click.echo(f"{kind}: {p}")
        return
    if resume:
        saved = Path(resume) / "config.yaml"
        check_eval_run(Path(resume))
        files = [str(saved), *files]  # the run's own config first; arguments given now come after
    overrides += _overrides_from_options(levels, limit, solutions, resume, workers, shard, ids)
    cfg = compose(files, overrides, reads=READS["eval"])
    if cfg.eval.get("solutions"):
        from cuda_agent.core.config import parse_override

        check_overrides(READS["eval --solutions"], [parse_override(o) for o in overrides])
    if only_covered:
        restrict_to_covered(cfg)
    out = evaluate(cfg)
    click.echo("")
    click.echo(out["summary"])
    click.echo("")
    for kind, p in out["paths"].items():
        click.echo(f"{kind}: {p}")


def restrict_to_covered(cfg: Any) -> None:
    """Narrow ``cfg``'s task selection to the tasks its solutions folder covers (eval.ids,
    saved with the run, so that --resume selects the same; limit and shard were applied)."""
    from .evaluate import load_tasks
    from .solutions import covered_task_ids

    e = cfg.eval
    if not e.get("solutions"):
        raise ConfigError("--only-covered needs --solutions DIR (the folder whose tasks to score)")
    tasks = load_tasks(cfg)
    covered = covered_task_ids(tasks, e.solutions)
    if not covered:
        raise ConfigError(f"--only-covered: none of the {len(tasks)} selected tasks has a solution in {e.solutions}")
    e.ids, e.limit, e.shard = covered, None, None
    click.echo(f"--only-covered: {len(covered)} of the {len(tasks)} selected tasks have a solution in {e.solutions}")


@click.command("baselines", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--refresh-spread", type=float, default=None,
              help="Measure cached records again whose eager or compile spread (IQR / median) exceeds this, e.g. 0.03.")
@_with_common
def baselines_cmd(args, refresh_spread, levels, limit, ids, shard, workers) -> None:
    """Measure eager and torch.compile times of a task set and cache them for profiling.

    Uses eval.profile.options (precision, profiler, baseline_cache_dir) so that profiling
    jobs find the records; tasks already cached cost nothing, unless --refresh-spread
    finds them unsteady (measured on a busy host).
    """
    from cuda_agent.core.config import compose

    from .evaluate import measure_all_baselines

    files, overrides = split_args(args)
    if workers is not None:
        raise ConfigError("--workers has no effect on `cuda-agent baselines`: the executor runs one measurement "
                          "per device at a time; remove it")
    overrides += _overrides_from_options(levels, limit, None, None, None, shard, ids)
    if refresh_spread is not None:
        if refresh_spread <= 0:
            raise ConfigError(f"--refresh-spread must be > 0 (a relative spread such as 0.03), got {refresh_spread}")
        overrides.append(f"eval.profile.options.refresh_spread={refresh_spread}")
    cfg = compose(files, overrides, reads=READS["baselines"])
    t0 = time.perf_counter()
    rows = measure_all_baselines(cfg)
    click.echo(_baseline_table(rows))
    fresh = sum(1 for r in rows if not r.get("cached"))
    failed = sum(1 for r in rows if r.get("eager_ms") is None)
    click.echo(f"\n{len(rows)} tasks ({fresh} measured now, {len(rows) - fresh} from the cache, {failed} failed) "
               f"in {time.perf_counter() - t0:.1f} s")


def _baseline_table(rows: Sequence[dict[str, Any]]) -> str:
    out = [f"{'task':<48} {'eager ms':>10} {'compile ms':>11} {'spread':>7} {'cached':>7} {'s':>6}  note"]
    for r in rows:
        e = f"{r['eager_ms']:.4g}" if r.get("eager_ms") is not None else "—"
        c = f"{r['compile_ms']:.4g}" if r.get("compile_ms") is not None else "—"
        sp = f"{100 * r['spread']:.1f}%" if r.get("spread") is not None else "—"
        secs = f"{r.get('seconds') or 0:.1f}"
        again = r.get("measured_again_because")
        note = (r.get("error") or "; ".join(x for x in (r.get("timing_mode"), again and f"measured again: {again}") if x))[:120]
        out.append(f"{r['task_id'][:48]:<48} {e:>10} {c:>11} {sp:>7} {('yes' if r.get('cached') else 'no'):>7} {secs:>6}  {note}")
    return "\n".join(out)


def register(cli: Any) -> None:
    cli.add_command(eval_cmd)
    cli.add_command(baselines_cmd)
