"""Evaluation runs: tasks from a dataset plugin, scored by solutions or by an agent, in a run folder."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cuda_agent.core.errors import ConfigError, InfrastructureError
from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.core.types import Task

from .metrics import TaskResult, is_infra_error, scored
from .report import (build_report, collect_environment, main_table, markdown_table, sample_summary,
                     write_reports)
from .runner import RESULTS_FILE, ResultStore, run_tasks
from .samples import SampleResult
from .scoring import AgentScorer, ScoringOptions, SolutionScorer, select_tasks
from .solutions import load_solutions, match_solutions


def _plain(node: Any) -> Any:
    if isinstance(node, DictConfig) or OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def load_tasks(cfg: DictConfig, pm: Any = None) -> list[Task]:
    """The tasks of ``eval.dataset`` (or the top-level ``dataset``), selected by eval.levels/ids/shard/limit."""
    pm = pm or get_plugin_manager()
    e = cfg.eval
    spec = _plain(e.get("dataset")) or {}
    top = _plain(cfg.get("dataset")) or {}
    where = "eval.dataset"
    if not spec.get("name"):
        spec, where = dict(top), "dataset"
    elif top.get("name") == spec.get("name"):
        # same plugin as the top-level dataset: its options fill what eval.dataset leaves at the default
        import dataclasses

        defaults = dataclasses.asdict(pm.get("dataset", spec["name"], where).Options())
        merged = dict(top.get("options") or {})
        for k, v in (spec.get("options") or {}).items():
            if k not in defaults or v != defaults[k]:
                merged[k] = v
        spec = {"name": spec["name"], "options": merged}
    if not spec.get("name"):
        raise ConfigError("no task set: set eval.dataset.name (e.g. kernelbench)")
    ds = pm.create("dataset", spec, where=where)
    tasks = list(ds.tasks())
    levels = _plain(e.get("levels"))
    if isinstance(levels, int):
        levels = [levels]
    ids = _plain(e.get("ids"))
    if isinstance(ids, str):
        ids = [ids]
    return select_tasks(tasks, levels=levels, ids=ids, limit=e.get("limit"), shard=e.get("shard"))


def _dataset_name(cfg: DictConfig) -> str:
    for node in (cfg.eval.get("dataset"), cfg.get("dataset")):
        spec = _plain(node)
        if isinstance(spec, dict) and spec.get("name"):
            return str(spec["name"])
    return "kernelbench"


def make_executor(cfg: DictConfig, pm: Any) -> Any:
    """The run's executor, on the run's backend (``backend=cpu`` reaches ``local`` and ``ray``)."""
    from cuda_agent.sandbox.executors.configured import make_executor as make

    return make(cfg, pm)


def resolve_backend(cfg: DictConfig, executor: Any) -> str:
    b = str(cfg.get("backend") or "auto")
    if b == "auto":
        return getattr(executor, "backend", "cuda")
    if b not in ("cuda", "cpu"):
        raise ConfigError(f"backend must be auto, cuda or cpu, got {b!r}")
    return b


def _device_count(executor: Any) -> int:
    try:
        return max(1, len(executor.devices))
    except Exception:
        return 1


def _scoring_options(cfg: DictConfig, backend: str, work_dir: Path) -> ScoringOptions:
    e = cfg.eval
    return ScoringOptions(
        backend=backend,
        compiler=_plain(cfg.get("compiler")),
        work_dir=str(work_dir),
        verify_options=dict(_plain(e.verify.get("options")) or {}),
        profile_options=dict(_plain(e.profile.get("options")) or {}),
        verify_timeout=e.verify.get("timeout"),
        profile_timeout=e.profile.get("timeout"),
        enforce_rules=bool(e.get("enforce_rules", True)),
        rules=str(e.get("rules") or "cuda-agent"),
        keep_workspaces=bool(e.get("keep_workspaces", False)),
        judge=dict(_plain(e.get("judge")) or {}),
    )


def _agent_scorer(cfg: DictConfig, pm: Any, executor: Any, opts: ScoringOptions, run: Any) -> AgentScorer:
    pol = _plain(cfg.get("policy"))
    if not pol or not pol.get("name"):
        raise ConfigError("nothing to evaluate: set policy.name=<policy> to run an agent, or pass --solutions DIR")
    policy = pm.create("policy", pol, where="policy")
    try:
        from cuda_agent.sandbox.workspace.environment import CudaEnvironment, environment_options
    except ImportError as exc:
        raise ConfigError(
            "agent evaluation needs cuda_agent.sandbox.workspace.environment.CudaEnvironment (install cuda-agent-sandbox)"
        ) from exc
    from cuda_agent.core.agent import AgentOptions, TrajectoryStore

    agent = dict(_plain(cfg.get("agent")) or {})
    fields = set(AgentOptions.__dataclass_fields__)
    agent_options = AgentOptions(**{k: v for k, v in agent.items() if k in fields})
    agent_options.max_turns = int(cfg.eval.get("max_turns") or agent_options.max_turns)
    env_options = environment_options(cfg, backend=opts.backend)
    # the episode's verify/profile requests use eval's options too (precision policy, profiler)
    extra = {k: v for k, v in (("verify_options", opts.verify_options), ("profile_options", opts.profile_options)) if v}

    def make_env(task: Task, dest: Path) -> Any:
        return CudaEnvironment.from_config(task, dest, cfg, pm, executor=executor, options=env_options, service=extra)

    return AgentScorer(
        policy,
        make_env,
        attempts=int(cfg.eval.get("attempts") or 1),
        agent_options=agent_options,
        work_dir=opts.work_dir,
        trajectories=TrajectoryStore(run.path("trajectories.jsonl")),
        keep_workspaces=opts.keep_workspaces,
        on_trajectory=lambda traj: pm.hook.on_trajectory_end(run=run, trajectory=traj),
        pm=pm,
    )


def _extra_environment(cfg: DictConfig, backend: str, executor: Any) -> dict:
    """What the config says the numbers are measured with; the jobs' own reports win."""
    po = _plain(cfg.eval.profile.get("options")) or {}
    vo = _plain(cfg.eval.verify.get("options")) or {}
    return {
        "backend": backend,
        "executor": f"{getattr(executor, 'name', '?')} ({_device_count(executor)} device(s))",
        "profiler": po.get("profiler") or ("wallclock" if backend == "cpu" else "cuda_events"),
        "precision": po.get("precision") or vo.get("precision") or "fp32-strict",
        "rules": (f"profile {cfg.eval.get('rules') or 'cuda-agent'}" if cfg.eval.get("enforce_rules", True)
                  else "off (no forbidden-op checks)"),
    }


def evaluate(cfg: DictConfig, pm: Any = None) -> dict:
    """Run an evaluation described by a composed config; returns summary, paths and report."""
    from cuda_agent.core.run import Run

    pm = pm or get_plugin_manager()
    e = cfg.eval
    # everything that can be wrong with the input is checked before a run folder exists
    tasks = load_tasks(cfg, pm)
    if not tasks:
        raise ConfigError("no tasks selected (check eval.levels, eval.ids, eval.shard, eval.limit)")
    info: dict[str, Any] = {"dataset": _dataset_name(cfg)}
    solutions = unmatched = None
    if e.get("solutions"):
        sols = load_solutions(e.solutions)
        solutions, unmatched = match_solutions(tasks, sols)
        info.update(mode="solutions", solutions=str(e.solutions), n_solutions=len(sols))
        if unmatched:
            info["unmatched_solutions"] = [s.label for s in unmatched][:200]
    else:
        pol = _plain(cfg.get("policy"))
        if not pol or not pol.get("name"):
            raise ConfigError("nothing to evaluate: set policy.name=<policy> to run an agent, or pass --solutions DIR")
    if cfg.run.get("name") in (None, "", "run"):
        cfg.run.name = "eval"
    executor = make_executor(cfg, pm)  # the run's backend reaches it; checks devices; starts lazily
    with Run(cfg, command="eval", pm=pm) as run:
        info["run_id"] = run.id
        if unmatched:
            run.log.warning("eval.unmatched_solutions", count=len(unmatched), first=unmatched[0].label)
        t0 = time.perf_counter()
        try:
            backend = resolve_backend(cfg, executor)
            work_dir = Path(e.work_dir) if e.get("work_dir") else run.path("workspaces")
            opts = _scoring_options(cfg, backend, work_dir)
            if solutions is not None:
                scorer: Any = SolutionScorer(executor, solutions, opts, pm)
                label = "solutions"
            else:
                scorer = _agent_scorer(cfg, pm, executor, opts, run)
                info.update(mode="agent", policy=cfg.policy.name)
                label = str(cfg.policy.name)
            # episodes wait mostly on the model; solutions on the GPU, and single files on
            # their builds (which run in the judge's build pool alongside)
            per_device = 2 if solutions is not None else 8
            workers = int(e.get("workers") or 0) or per_device * _device_count(executor) + (
                scorer.judge.build_workers() if solutions is not None else 0)
            store = ResultStore(run.path(RESULTS_FILE))
            try:
                results = run_tasks(
                    tasks,
                    scorer.score,
                    store,
                    workers=workers,
                    progress=bool(e.get("progress", True)),
                    desc=f"eval {run.id}",
                    log=run.log,
                    max_infra_share=float(e.get("max_infra_error_share", 0.25)),
                )
            except InfrastructureError as exc:
                raise InfrastructureError(f"eval stopped: {exc.one_line()}; fix it and continue with: "
                                          f"cuda-agent eval --resume {run.dir}") from exc
            extra = _extra_environment(cfg, backend, executor)
        except KeyboardInterrupt:
            import sys

            done = len(ResultStore(run.path(RESULTS_FILE)).finished())
            print(
                f"\ninterrupted: {done} of {len(tasks)} tasks finished and saved; "
                f"continue with: cuda-agent eval --resume {run.dir}",
                file=sys.stderr,
            )
            raise
        finally:
            executor.close()
        wall = time.perf_counter() - t0
        info.update(
            title=e.get("title") or f"KernelBench evaluation: {run.id}",
            label=e.get("label") or label,
            wall_seconds=round(run.earlier_seconds + wall, 2),  # all sessions of the run folder
            wall_seconds_this_session=round(wall, 2),
            tasks_selected=len(tasks),
            tasks_scored=len(scored(results)),
            workers=workers,
            devices=_device_count(executor),
        )
        return _finish(run, results, info, collect_environment(results, extra), cfg, store.samples_of(results))


def _finish(run: Any, results: list[TaskResult], info: dict, environment: dict, cfg: DictConfig,
            samples: list[SampleResult]) -> dict:
    e = cfg.eval
    report = build_report(results, info=info, environment=environment, margin=float(e.get("margin", 0.05)),
                          samples=samples)
    formats = list(_plain(e.get("formats")) or ["json", "md", "html"])
    paths = write_reports(report, run.dir, formats)
    o = report["metrics"]["overall"]
    flat = {k: v for k, v in o.items() if isinstance(v, (int, float)) and v is not None}
    flat.update({f"pass_at_{k}": v for k, v in (o.get("pass_at_k") or {}).items() if v is not None})
    run.pm.hook.on_step_end(run=run, step=0, metrics={f"eval/{k}": v for k, v in flat.items()})
    run.log.info("eval.done", **{k: flat.get(k) for k in ("n", "n_correct", "pass_rate", "faster_compile", "geomean_vs_compile")})
    summary = markdown_table(main_table(report))
    if o.get("n_samples", 0) > o.get("tasks_with_samples", 0):  # several samples of a task: say how they did
        summary += "\n\n" + sample_summary(report)
    infra = [r for r in results if is_infra_error(r)]
    if infra:
        run.log.warning("eval.not_scored", infra_errors=len(infra), last=infra[-1].message)
        summary += (f"\n\n{len(infra)} task(s) not scored: the infrastructure failed ({infra[-1].message}); "
                    f"redo them with: cuda-agent eval --resume {run.dir}")
    return {"summary": summary, "paths": paths, "report": report, "run_dir": run.dir}


def rerender(run_dir: Path) -> dict:
    """Re-render the reports of a run folder from its results.jsonl (and earlier info)."""
    run_dir = Path(run_dir)
    store = ResultStore(run_dir / RESULTS_FILE)
    results = list(store.load().values())
    if not results:
        raise ConfigError(f"{run_dir}: no {RESULTS_FILE} results to report")
    prev = run_dir / "results.json"
    info, env = {}, None
    if prev.exists():
        data = json.loads(prev.read_text())
        info, env = data.get("info", {}), data.get("environment")
    info.pop("generated", None)
    # a run from before samples.jsonl has none: its reports stay without pass@k
    samples = store.samples_of(results) if store.samples.path.exists() else None
    report = build_report(results, info=info, environment=env or collect_environment(results), samples=samples)
    return write_reports(report, run_dir)


# --- baselines ---------------------------------------------------------------------


def measure_all_baselines(cfg: DictConfig, pm: Any = None) -> list[dict]:
    """Measure (or read from the cache) eager and compile times of every selected task."""
    from .baselines import measure_task_baselines

    pm = pm or get_plugin_manager()
    tasks = load_tasks(cfg, pm)
    if not tasks:
        raise ConfigError("no tasks selected (check eval.levels, eval.ids, eval.shard, eval.limit)")
    executor = make_executor(cfg, pm)
    try:
        return measure_task_baselines(
            tasks,
            executor,
            options=dict(_plain(cfg.eval.profile.get("options")) or {}),
            progress=bool(cfg.eval.get("progress", True)),
            timeout=cfg.eval.profile.get("timeout"),
        )
    finally:
        executor.close()
