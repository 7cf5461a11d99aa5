"""Scoring candidates through the sandbox: workspace, build, verification and profiling jobs.

:class:`SolutionScorer` scores existing solutions (no agent); :class:`AgentScorer` runs a
policy through the agent loop and scores each task by the best correct candidate of its
episodes. Both return one :class:`~.metrics.TaskResult` per task and are what
:func:`~.runner.run_tasks` calls from its worker threads; the GPU work goes to the
executor as jobs (one job per GPU at a time).
"""

from __future__ import annotations

import fnmatch
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import (
    CandidateOutcome,
    CompileResult,
    FailureCategory,
    ProfileResult,
    Task,
    Trajectory,
    VerifyResult,
)

from .metrics import TaskResult, best_result, infra_error_result, result_from_outcome
from .samples import SampleResult, sample_from_result
from .solutions import KERNELBENCH, Solution, install_solution

VERIFY_JOB = "cuda_agent.sandbox.judge.tasks:verify"
PROFILE_JOB = "cuda_agent.sandbox.judge.tasks:profile"
EVALUATE_JOB = "cuda_agent.sandbox.judge.tasks:evaluate"  # verify, then profile, in one worker
BUILD_JOB = "cuda_agent.sandbox.workspace.service_jobs:compile_job"  # a build sent to the executor's build_executor()


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


def _job(fn: str, kwargs: dict, kind: str, timeout: float | None, label: str) -> Any:
    from cuda_agent.sandbox.executors import Job

    return Job(fn=fn, kwargs=kwargs, kind=kind, timeout=timeout, label=label)


def _job_error_types() -> tuple[type, ...]:
    try:
        from cuda_agent.sandbox.executors import JobError

        return (JobError,)
    except ImportError:  # pragma: no cover
        return ()


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


class CandidateEvaluator:
    """Build, verify and profile the candidate in a workspace, through the executor."""

    def __init__(self, executor: Any, options: ScoringOptions, pm: Any = None):
        self.executor = executor
        self.o = options
        self.pm = pm
        self._compiler = None
        self._lock = threading.Lock()

    # the compiler is built lazily: single-file solutions never need one
    def compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                from cuda_agent.core.plugins import get_plugin_manager

                pm = self.pm or get_plugin_manager()
                spec = self.o.compiler
                if not spec or not (spec.get("name") if isinstance(spec, dict) else getattr(spec, "name", None)):
                    spec = {"name": "gxx" if self.o.backend == "cpu" else "cpp_extension"}
                self._compiler = pm.create("compiler", spec, where="compiler")
            return self._compiler

    def verify_job_options(self, form: str = "") -> dict:
        """VerifyOptions fields for the verification job.

        ``enforce_rules=False`` turns the anti-hacking rules off (no static source checks,
        no run-time operator guard) so plain PyTorch, e.g. the references, can be scored.
        Single-file solutions need nothing special: ModelNew is in ``model_new.py`` and
        builds its own kernels when imported inside the job.
        """
        opts = dict(self.o.verify_options)
        opts.setdefault("rules", self.o.rules if self.o.enforce_rules else "none")
        if not self.o.enforce_rules:
            opts["rules"] = "none"
        if form == KERNELBENCH:  # a single file: KernelBench's protocol for the weights (names are free)
            opts.setdefault("weights", "auto")
        return opts

    def profile_job_options(self, form: str = "") -> dict:
        opts = dict(self.o.profile_options)
        if form == KERNELBENCH:
            opts.setdefault("weights", "auto")
        return opts

    def build(self, root: Path) -> CompileResult:
        t0 = time.perf_counter()
        remote = getattr(self.executor, "build_executor", None)
        remote = remote() if callable(remote) else None
        try:
            if remote is not None:  # the executor builds elsewhere (CPU nodes of a cluster)
                job = _job(BUILD_JOB, {"compiler": self.compiler(), "workspace": str(root)}, "compile", 600.0, root.name)
                job.pass_device = False
                return remote.submit(job).result()
            return self.compiler().build(root)
        except Exception as exc:
            if isinstance(exc, ConfigError):
                raise
            return CompileResult(ok=False, errors=[f"{type(exc).__name__}: {exc}"[:500]], seconds=time.perf_counter() - t0)

    def _run(self, fn: str, root: Path, options: dict, kind: str, timeout: float | None, label: str) -> Any:
        job = _job(fn, {"workspace": str(root), "options": options}, kind, timeout, label)
        return self.executor.submit(job).result()

    def verify(self, root: Path, form: str, label: str) -> VerifyResult:
        try:
            return self._run(VERIFY_JOB, root, self.verify_job_options(form), "verify", self.o.verify_timeout, label)
        except _job_error_types() as exc:
            return VerifyResult(ok=False, failure=exc.failure, message=exc.message, seconds=exc.seconds)

    def profile(self, root: Path, form: str, label: str) -> ProfileResult:
        try:
            return self._run(PROFILE_JOB, root, self.profile_job_options(form), "profile", self.o.profile_timeout, label)
        except _job_error_types() as exc:
            return ProfileResult(ok=False, failure=exc.failure, message=exc.message, seconds=exc.seconds)

    def verify_and_profile(self, root: Path, label: str, form: str = "") -> tuple[VerifyResult, ProfileResult | None]:
        timeout = None
        if self.o.verify_timeout and self.o.profile_timeout:
            timeout = self.o.verify_timeout + self.o.profile_timeout
        job = _job(
            EVALUATE_JOB,
            {"workspace": str(root), "verify_options": self.verify_job_options(form), "profile_options": self.profile_job_options(form)},
            "evaluate",
            timeout,
            label,
        )
        try:
            return self.executor.submit(job).result()
        except _job_error_types() as exc:
            return VerifyResult(ok=False, failure=exc.failure, message=exc.message, seconds=exc.seconds), None

    def evaluate(self, root: Path, form: str, label: str) -> CandidateOutcome:
        outcome = CandidateOutcome()
        if form != KERNELBENCH:
            outcome.compile = self.build(root)
            if not outcome.compile.ok:
                return outcome
        if self.o.one_job and self.o.profile:
            outcome.verify, outcome.profile = self.verify_and_profile(root, label, form)
            return outcome
        outcome.verify = self.verify(root, form, label)
        if outcome.verify.ok and self.o.profile:
            outcome.profile = self.profile(root, form, label)
        return outcome


class SolutionScorer:
    """Scores existing solutions: for each task, every sample, keeping the best correct one
    (and every sample's verdict in :attr:`TaskResult.samples`)."""

    def __init__(self, executor: Any, solutions: dict[str, list[Solution]], options: ScoringOptions, pm: Any = None):
        self.solutions = solutions
        self.o = options
        self.evaluator = CandidateEvaluator(executor, options, pm)

    def score_solution(self, task: Task, sol: Solution, index: int = 0) -> TaskResult:
        t0 = time.perf_counter()
        dest = Path(self.o.work_dir) / _safe(task.id) / (_safe(sol.sample) if sol.sample else f"s{index}")
        root = make_workspace(task, dest, self.o.backend, _compiler_name(self.o.compiler))
        install_solution(sol, root)
        try:
            outcome = self.evaluator.evaluate(root, sol.form, task.id)
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
        scored = [self.score_solution(task, s, i) for i, s in enumerate(sols)]
        best = best_result(scored)
        best.samples = [sample_from_result(r, sample=s.sample or f"s{i}", index=i)
                        for i, (s, r) in enumerate(zip(sols, scored))]
        return best


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
