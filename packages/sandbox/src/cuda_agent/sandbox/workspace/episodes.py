"""CUDA episodes for trainers and servers outside cuda-agent (the TRL, OpenEnv and verl adapters).

:class:`EpisodeFactory` holds the tasks (given, or read from a dataset plugin), one
executor shared by every episode (the GPU or CPU job pool) and the reward spec; ``open``
makes a fresh :class:`~cuda_agent.sandbox.workspace.environment.CudaEnvironment` workspace for a
task and returns an :class:`Episode`: the environment with its
:class:`~cuda_agent.core.agent.EpisodeStepper`, whose workspace is removed on close.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from cuda_agent.core.agent import AgentOptions, EpisodeStepper
from cuda_agent.core.errors import ConfigError, TaskError, did_you_mean
from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.core.types import RewardResult, Task, Trajectory

from .environment import CudaEnvironment, EnvironmentOptions, detect_backend


@dataclass
class EpisodeOptions:
    """How the factory's episodes are set up and judged."""

    backend: str = "auto"  # auto | cuda | cpu
    reward: Any = "milestone"  # a reward name or {name, options}: milestone (-1/1/2/3) or speedup
    executor: Any = None  # {name, options}; default: the GPU pool ("local") on cuda, "cpu" on cpu
    sandbox: Any = None  # {name, options} for the agent's shell; None runs it as local processes
    compiler: Any = None  # None: the backend's default compiler
    tools: list[str] | None = None  # agent tools offered (all registered ones when None)
    max_turns: int = 150
    tool_output_chars: int = 8000
    workdir: str | None = None  # where workspaces go (a temporary folder when None)
    keep_workspaces: bool = False
    environment: dict = field(default_factory=dict)  # more EnvironmentOptions (profile_best, system_prompt, ...)
    service: dict = field(default_factory=dict)  # the workspace service's options (timeouts, job options)


class Episode:
    """One open episode: ``env`` (the CudaEnvironment), ``stepper`` and ``task``."""

    def __init__(self, task: Task, env: CudaEnvironment, stepper: EpisodeStepper, keep: bool, on_end: Any = None,
                 on_close: Any = None):
        self.task = task
        self.env = env
        self.stepper = stepper
        self._keep = keep
        self._on_end = on_end
        self._on_close = on_close
        self._closed = False

    @property
    def workspace(self) -> Path:
        return Path(self.env.workspace)

    def finish(self, reason: str = "stopped") -> Trajectory:
        """Score the episode (once) and return its trajectory, reward included."""
        first = not self.stepper._ended
        traj = self.stepper.finish(reason)
        if first and self._on_end is not None:
            self._on_end(self, traj)
        return traj

    def reward(self) -> RewardResult | None:
        return self.finish().reward

    def record(self, traj: Trajectory) -> None:
        """Report a trajectory scored outside the stepper (an adapter that ran the whole loop itself)."""
        if not self.stepper._ended:
            self.stepper._ended = True
            if self._on_end is not None:
                self._on_end(self, traj)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._on_close is not None:
            self._on_close(self)
        try:
            self.env.close()
        finally:
            if not self._keep:
                from .workspace import remove_workspace

                remove_workspace(self.env.workspace)


class EpisodeFactory:
    """Tasks by id, a shared executor and one CudaEnvironment per episode.

    ``tasks``: Task objects; ``dataset``: a ``{name, options}`` dataset spec read once
    (``kernelbench``, ``ops6k``, ``folder``, ``jsonl``...). ``on_end(episode, trajectory)`` is
    called once per scored episode (adapters log rewards through it).
    """

    def __init__(self, tasks: Iterable[Task] | None = None, dataset: Any = None,
                 options: EpisodeOptions | None = None, pm: Any = None, on_end: Any = None):
        self.options = options or EpisodeOptions()
        self.pm = pm or get_plugin_manager()
        self.backend = detect_backend(self.options.backend)
        loaded = list(tasks or [])
        if dataset is not None:
            loaded += list(self.pm.create("dataset", dataset, where="dataset").tasks())
        if not loaded:
            raise ConfigError("no tasks: pass tasks=[...] or a dataset spec such as {name: folder, options: {path: ...}}")
        self.tasks: dict[str, Task] = {t.id: t for t in loaded}
        self.on_end = on_end
        self._executor = None
        self._lock = threading.Lock()
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._open: set[Episode] = set()
        self._env_options = EnvironmentOptions(backend=self.backend, tools=self.options.tools,
                                               **dict(self.options.environment or {}))

    # -- tasks --------------------------------------------------------------------------

    def task(self, task: Task | str) -> Task:
        """The task named ``task`` (or ``task`` itself); a one-line TaskError for an unknown id."""
        if isinstance(task, Task):
            return task
        if task in self.tasks:
            return self.tasks[task]
        raise TaskError(f"unknown task {task!r} ({len(self.tasks)} tasks loaded); {did_you_mean(str(task), self.tasks)}")

    def agent_options(self) -> AgentOptions:
        return AgentOptions(max_turns=self.options.max_turns, tool_output_chars=self.options.tool_output_chars)

    # -- episodes -----------------------------------------------------------------------

    def executor(self) -> Any:
        """The job pool every episode shares (built on first use)."""
        with self._lock:
            if self._executor is None:
                spec = self.options.executor or {"name": "local" if self.backend == "cuda" else "cpu"}
                if isinstance(spec, str):
                    spec = {"name": spec}
                if self.backend == "cpu" and spec.get("name") == "local":
                    spec = {"name": "cpu"}
                self._executor = self.pm.create("executor", spec, where="executor")
            return self._executor

    def _root(self) -> Path:
        if self.options.workdir:
            root = Path(self.options.workdir)
            root.mkdir(parents=True, exist_ok=True)
            return root
        with self._lock:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="cuda-agent-episodes-")
        return Path(self._tmp.name)

    def open(self, task: Task | str, framework: str = "external") -> Episode:
        """A fresh workspace and environment for ``task``, ready for its first step."""
        task = self.task(task)
        dest = self._root() / f"{task.id.replace('/', '_')}-{uuid.uuid4().hex[:8]}"
        env = CudaEnvironment(task, dest, self._env_options, compiler=self.options.compiler,
                              sandbox=self.options.sandbox, executor=self.executor(), reward=self.options.reward,
                              service_options=dict(self.options.service or {}) or None, pm=self.pm)
        try:
            stepper = EpisodeStepper(task, env, self.agent_options(), framework=framework)
        except BaseException:
            env.close()
            raise
        episode = Episode(task, env, stepper, self.options.keep_workspaces, self.on_end, self._forget)
        with self._lock:
            self._open.add(episode)
        return episode

    def _forget(self, episode: Episode) -> None:
        with self._lock:
            self._open.discard(episode)

    def close(self) -> None:
        """Close every episode still open, the shared executor and the temporary workspaces."""
        with self._lock:
            still_open = list(self._open)
        for episode in still_open:
            episode.close()
        with self._lock:
            if self._executor is not None and hasattr(self._executor, "close"):
                self._executor.close()
            self._executor = None
            if self._tmp is not None and not self.options.keep_workspaces:
                self._tmp.cleanup()
                self._tmp = None

    def __enter__(self) -> "EpisodeFactory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
