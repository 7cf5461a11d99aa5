"""Scoring candidates through the sandbox's judge (:mod:`cuda_agent.sandbox.judge.pipeline`).

:class:`SolutionScorer` scores existing solutions (no agent): a workspace per sample, the
solution installed in it, the judge's build, verification and profiling; :class:`AgentScorer` runs a
policy through the agent loop and scores each task by the best correct candidate of its
episodes. Both return one :class:`~.metrics.TaskResult` per task and are what
:func:`~.runner.run_tasks` calls from its worker threads; the GPU work goes to the
executor as jobs (one job per GPU at a time).
"""

from __future__ import annotations

import fnmatch
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import FailureCategory, Task, Trajectory

from .metrics import TaskResult, best_result, infra_error_result, result_from_outcome
from .samples import SampleResult, sample_from_result
from .solutions import KERNELBENCH, Solution, install_solution, refused_outcome

# --- task selection ------------------------------------------------------------------


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    if shard in (None, "", "null"):
        return None
    try:
        i, n = (int(x) for x in str(shard).split("/"))
    except ValueError as exc:
        raise ConfigError(f"eval.shard must look like 'i/n' (e.g. 0/4), got {shard!r}") from exc
    if n < 1 or not 0 <= i < n:
        raise ConfigError(f"eval.shard {shard!r}: need 0 <= i < n")
    return i, n


def select_tasks(
    tasks: Sequence[Task],
    *,
    levels: Sequence[int] | None = None,
    ids: Sequence[str] | None = None,
    limit: int | None = None,
    shard: str | None = None,
) -> list[Task]:
    """Levels, ids (exact or glob), then shard ``i/n`` (every n-th task from i), then limit."""
    out = list(tasks)
    if levels:
        want = {int(x) for x in levels}
        out = [t for t in out if t.level in want]
    if ids:
        pats = [str(x) for x in ids]
        out = [t for t in out if any(t.id == p or fnmatch.fnmatchcase(t.id, p) or t.name == p for p in pats)]
    sh = parse_shard(shard)
    if sh is not None:
        i, n = sh
        out = out[i::n]
    if limit is not None and limit >= 0:
        out = out[: int(limit)]
    return out


# --- workspaces --------------------------------------------------------------------


def _safe(task_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)


def make_workspace(task: Task, dest: Path, backend: str, compiler: str | None = None) -> Path:
    """A fresh workspace for ``task`` at ``dest`` (the sandbox's template when installed)."""
    remove_workspace(dest)
    try:
        from cuda_agent.sandbox.workspace.workspace import create_workspace
    except ImportError:
        create_workspace = None
    if create_workspace is not None:
        ws = create_workspace(task, dest, backend=backend, compiler=compiler)
        return Path(getattr(ws, "root", dest))
    dest.mkdir(parents=True)
    (dest / "model.py").write_text(task.code)
    (dest / "kernels").mkdir()
    return dest


def remove_workspace(dest: Path) -> None:
    """Delete a workspace folder, read-only parts included."""
    if not Path(dest).exists():
        return
    try:
        from cuda_agent.sandbox.workspace.workspace import remove_workspace as _remove
    except ImportError:
        _remove = None
    if _remove is not None:
        _remove(dest)
    else:
        shutil.rmtree(dest, ignore_errors=True)


@dataclass
class ScoringOptions:
    backend: str = "cuda"
    compiler: Any = None  # {name, options} of the compiler for workspace-form solutions
    work_dir: str = "workspaces"
    verify_options: dict = field(default_factory=dict)
    profile_options: dict = field(default_factory=dict)
    verify_timeout: float | None = 300.0
    profile_timeout: float | None = 600.0
    enforce_rules: bool = True
    rules: str = "cuda-agent"  # the rule profile (cuda-agent | kernelbench | none); none when enforce_rules is off
    keep_workspaces: bool = False
    profile: bool = True  # time correct candidates (False: correctness only)
    one_job: bool = True  # verify and profile in one job (one worker start, one model load)
    # the judge's options for single files' builds (JudgeOptions fields: prebuild,
    # build_workers, build_jobs, build_timeout, build_arch, prebuilt_cache, torch_header)
    judge: dict = field(default_factory=dict)
    sample_workers: int = 0  # a task's samples judged side by side (0: all of them, up to 8; 1: one after another)


def judge_for(executor: Any, o: ScoringOptions, pm: Any = None) -> Any:
    """The sandbox's judge (:class:`cuda_agent.sandbox.judge.pipeline.Judge`) for these options."""
    try:
        from cuda_agent.sandbox.judge.pipeline import Judge, JudgeOptions
    except ImportError as exc:  # pragma: no cover
        raise ConfigError(f"scoring solutions needs cuda-agent-sandbox: {exc}") from exc
    verify = dict(o.verify_options)
    verify.setdefault("rules", o.rules if o.enforce_rules else "none")
    if not o.enforce_rules:  # plain PyTorch (the references, say) can be scored
        verify["rules"] = "none"
    names = set(JudgeOptions.__dataclass_fields__)
    unknown = sorted(set(o.judge) - names)
    if unknown:
        from cuda_agent.core.errors import did_you_mean

        raise ConfigError(f"unknown eval.judge option {unknown[0]!r}; {did_you_mean(unknown[0], names)}")
    opts = JudgeOptions(verify_options=verify, profile_options=dict(o.profile_options),
                        verify_timeout=o.verify_timeout, profile_timeout=o.profile_timeout, **o.judge)
    opts.check_job_options("eval")
    return Judge(opts, executor, o.compiler if _compiler_name(o.compiler) else None, o.backend, pm=pm)


class SolutionScorer:
    """Scores existing solutions: for each task, every sample, keeping the best correct one
    (and every sample's verdict in :attr:`TaskResult.samples`)."""

    def __init__(self, executor: Any, solutions: dict[str, list[Solution]], options: ScoringOptions, pm: Any = None):
        self.solutions = solutions
        self.o = options
        self.judge = judge_for(executor, options, pm)

    def score_solution(self, task: Task, sol: Solution, index: int = 0) -> TaskResult:
        t0 = time.perf_counter()
        dest = Path(self.o.work_dir) / _safe(task.id) / (_safe(sol.sample) if sol.sample else f"s{index}")
        if sol.refused:  # links and the like: nothing of it is built, read or run
            outcome = refused_outcome(sol.refused)
            r = result_from_outcome(task.id, outcome, level=task.level, name=task.name, source=str(sol.path))
            r.metadata["form"] = sol.form
            r.seconds = time.perf_counter() - t0
            return r
        root = make_workspace(task, dest, self.o.backend, _compiler_name(self.o.compiler))
        install_solution(sol, root)
        try:
            outcome = self.judge.judge(root, single_file=sol.form == KERNELBENCH, profile=self.o.profile,
                                       one_job=self.o.one_job)
        finally:
            if not self.o.keep_workspaces:
                remove_workspace(dest)
                try:
                    dest.parent.rmdir()  # the task's folder, once its last sample is gone
                except OSError:
                    pass
        r = result_from_outcome(task.id, outcome, level=task.level, name=task.name, source=str(sol.path))
        r.metadata["form"] = sol.form
        r.seconds = time.perf_counter() - t0
        return r

    def score(self, task: Task) -> TaskResult:
        sols = self.solutions.get(task.id) or []
        if not sols:
            return TaskResult(
                task_id=task.id,
                level=task.level,
                name=task.name,
                correct=False,
                failure=FailureCategory.MISSING.value,
                message="no solution for this task",
            )
        scored = self._score_samples(task, sols)
        best = best_result(scored)
        best.samples = [sample_from_result(r, sample=s.sample or f"s{i}", index=i)
                        for i, (s, r) in enumerate(zip(sols, scored))]
        return best

    def _score_samples(self, task: Task, sols: list[Solution]) -> list[TaskResult]:
        """Every sample of ``task``, side by side (``sample_workers`` at a time): each one's
        refusals that need no GPU come at once and its build starts in the judge's build pool
        while the others wait for theirs or for the GPU; the judge measures the task's baselines
        once, for the first sample that verifies. Results in the samples' order."""
        n = max(1, min(len(sols), self.o.sample_workers or 8))
        if n == 1:
            return [self.score_solution(task, s, i) for i, s in enumerate(sols)]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(n, thread_name_prefix="sample") as pool:
            return list(pool.map(lambda a: self.score_solution(task, a[1], a[0]), enumerate(sols)))


def _compiler_name(spec: Any) -> str | None:
    if spec is None:
        return None
    if isinstance(spec, dict):
        return spec.get("name")
    return getattr(spec, "name", None)


# --- the agent path -------------------------------------------------------------------


class AgentScorer:
    """Runs ``attempts`` agent episodes per task and scores the best correct candidate; each
    attempt is a sample (a row per verified candidate, one "missing" row when it verified none).

    An episode the infrastructure ended (``finish_reason`` "infra_error") makes the task an
    infrastructure error (:func:`~.metrics.infra_error_result`): no score, redone on resume.

    ``make_env(task, workspace_dir)`` builds the episode's environment (the sandbox's
    CudaEnvironment by default); trajectories are appended to ``trajectories`` (a
    TrajectoryStore) when given and handed to ``on_trajectory`` (the run's
    ``on_trajectory_end`` hook). ``pm``: whose ``check_tool_call`` hook the episodes ask.
    """

    def __init__(
        self,
        policy: Any,
        make_env: Any,
        *,
        attempts: int = 1,
        agent_options: Any = None,
        work_dir: str | Path = "workspaces",
        trajectories: Any = None,
        keep_workspaces: bool = False,
        on_trajectory: Callable[[Trajectory], None] | None = None,
        pm: Any = None,
    ):
        self.policy = policy
        self.make_env = make_env
        self.attempts = max(1, int(attempts))
        self.agent_options = agent_options
        self.work_dir = Path(work_dir)
        self.trajectories = trajectories
        self.keep = keep_workspaces
        self.on_trajectory = on_trajectory
        self.pm = pm

    def score(self, task: Task) -> TaskResult:
        from cuda_agent.core.agent import run_episode_sync

        results: list[TaskResult] = []
        samples: list[SampleResult] = []
        t0 = time.perf_counter()
        finish = []
        for attempt in range(self.attempts):
            dest = self.work_dir / _safe(task.id) / f"a{attempt}"
            env = self.make_env(task, dest)
            try:
                traj = run_episode_sync(task, self.policy, env, self.agent_options, pm=self.pm)
            finally:
                try:
                    env.close()
                finally:
                    if not self.keep:
                        remove_workspace(dest)
            finish.append(traj.finish_reason)
            if self.trajectories is not None:
                self.trajectories.append(traj)
            if self.on_trajectory is not None:
                self.on_trajectory(traj)
            if traj.infra_error:  # not the model's result: the task is redone on resume
                r = infra_error_result(task.id, str(traj.metadata.get("error") or "infrastructure error"),
                                       level=task.level, name=task.name, seconds=time.perf_counter() - t0)
                r.metadata.update(finish_reasons=finish, attempts=self.attempts, trajectory=traj.id)
                return r
            for j, cand in enumerate(traj.candidates):
                r = result_from_outcome(task.id, cand.outcome, level=task.level, name=task.name, source=f"{traj.id}#turn{cand.turn}")
                results.append(r)
                samples.append(sample_from_result(r, sample=f"a{attempt}", index=attempt, candidate=j, trajectory=traj.id))
            if not traj.candidates:  # the attempt is a sample too: it produced nothing
                samples.append(SampleResult(task.id, task.level, sample=f"a{attempt}", index=attempt, trajectory=traj.id,
                                            source=traj.id, failure=FailureCategory.MISSING.value,
                                            rule=FailureCategory.MISSING.value,
                                            message=f"no candidate verified ({traj.finish_reason})"))
        if not results:
            r = TaskResult(
                task_id=task.id,
                level=task.level,
                name=task.name,
                correct=False,
                failure=FailureCategory.MISSING.value,
                message=f"no candidate verified ({', '.join(finish)})",
            )
        else:
            r = best_result(results)
        r.metadata["finish_reasons"] = finish
        r.metadata["attempts"] = self.attempts
        r.seconds = time.perf_counter() - t0
        r.samples = samples
        return r
