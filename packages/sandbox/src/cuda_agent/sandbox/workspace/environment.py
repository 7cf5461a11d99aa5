"""``CudaEnvironment``: the agent loop's environment for KernelBench-style tasks.

It makes a workspace (:func:`cuda_agent.sandbox.workspace.workspace.create_workspace`), opens the
configured sandbox for the agent's shell, starts the workspace service that the tool
scripts (``python tools/compile.py | verify.py | profile.py``) talk to, and turns every
verification/profiling request into a :class:`~cuda_agent.core.types.Candidate`. At the
end it makes sure the best candidate is profiled, leaves its files in the workspace and
scores it with the reward plugin.

Concrete compilers, sandboxes, executors and rewards are reached only through plugins
(names in the run config), never imported here.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.core.agent import DEFAULT_SYSTEM_PROMPT, FolderEnvironment, build_tools, record_candidate
from cuda_agent.core.errors import ConfigError
from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.core.types import Candidate, CandidateOutcome, RewardResult, Task, ToolCall, ToolResult, Trajectory

CUDA_SYSTEM_PROMPT = """\
You are an expert GPU performance engineer. You work in a workspace folder through tools
(a bash shell, file tools, a todo list). Goal: write custom kernels and a ModelNew in
model_new.py that compute exactly what model.py computes, faster than torch.compile.
SKILL.md (below) gives the rules and the workflow; follow them. Compile, verify and
profile with `python tools/compile.py`, `python tools/verify.py` and
`python tools/profile.py` from the workspace root. Every verified version is recorded,
and the fastest correct one is your final answer.
When you are finished, answer without calling any tool and end your answer with a line
containing only DONE."""


@dataclass
class EnvironmentOptions:
    """How :class:`CudaEnvironment` sets up and ends an episode."""

    backend: str = "auto"  # auto | cuda | cpu
    tools: list[str] | None = None  # agent tools offered (all registered ones when None)
    evaluate_final: bool = True  # score the final files too when the agent never verified them
    profile_best: bool = True  # profile the best correct candidate at the end if it was only verified
    restore_best: bool = True  # leave the best candidate's files in the workspace
    system_prompt: str = ""  # replaces the built-in system prompt when set
    overwrite: bool = False  # reuse a non-empty workspace folder


def detect_backend(backend: str = "auto") -> str:
    """``cuda`` when a CUDA device is usable (for ``auto``), else ``cpu``."""
    if backend in ("cuda", "cpu"):
        return backend
    if backend != "auto":
        raise ConfigError(f"backend must be auto, cuda or cpu, got {backend!r}")
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def task_prompt(task: Task, backend: str) -> str:
    """The first user message of an episode on ``task`` (the task and where to start)."""
    return (
        f"Task {task.id}{' (' + task.name + ')' if task.name else ''}: write kernels that make model.py "
        f"faster than torch.compile on the {backend.upper()} backend.\n\nmodel.py:\n```python\n"
        f"{task.code.rstrip()}\n```\n\nThe workspace is your current folder. Start by reading SKILL.md's "
        "workflow above, then model_new.py."
    )


def _spec(spec: Any) -> Any:
    if spec is None:
        return None
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(spec, DictConfig):
            return OmegaConf.to_container(spec, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return spec


def _section(cfg: Any, key: str) -> Any:
    """A config section as plain data (None when absent)."""
    if cfg is None:
        return None
    node = cfg.get(key) if hasattr(cfg, "get") else None
    return _spec(node)


def environment_options(cfg: Any, **overrides: Any) -> EnvironmentOptions:
    """EnvironmentOptions of a run config: its ``environment:`` section (the fields, or under
    ``options:``), the top-level ``backend`` where the section sets none, then ``overrides``."""
    names = {f for f in EnvironmentOptions.__dataclass_fields__}
    node = _section(cfg, "environment") or {}
    if isinstance(node, dict) and isinstance(node.get("options"), dict):
        node = node["options"]
    merged = {k: v for k, v in (node or {}).items() if k in names}
    backend = _section(cfg, "backend")
    if backend and "backend" not in merged:
        merged["backend"] = backend
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"unknown environment option {unknown[0]!r}; valid: {', '.join(sorted(names))}")
    merged.update(overrides)
    return EnvironmentOptions(**merged)


class CudaEnvironment(FolderEnvironment):
    """Environment over a fresh workspace for ``task`` at ``workdir``.

    ``compiler``, ``sandbox``, ``executor`` and ``reward`` are ``{name, options}`` specs (or
    built components); ``service_options`` are the workspace service's options. An
    executor passed in is shared and not closed here. A compiler configured for the other
    backend is ignored (the backend's default compiler is used).

    Attributes: ``ws`` (the :class:`~cuda_agent.sandbox.workspace.workspace.Workspace`), ``workspace``
    (its root folder), ``service`` (the running WorkspaceService), ``backend``.
    """

    def __init__(
        self,
        task: Task,
        workdir: str | Path,
        options: EnvironmentOptions | None = None,
        *,
        compiler: Any = None,
        sandbox: Any = None,
        executor: Any = None,
        reward: Any = None,
        service_options: Any = None,
        pm: Any = None,
    ):
        from .service import ENV_SOCKET, WorkspaceService
        from .workspace import COMPILER_BACKEND, create_workspace

        self.options = options or EnvironmentOptions()
        self.task = task
        self.pm = pm or get_plugin_manager()
        self.backend = detect_backend(self.options.backend)
        compiler = _spec(compiler)
        if isinstance(compiler, dict) and compiler.get("name") is None:
            compiler = None
        compiler_name = compiler.get("name") if isinstance(compiler, dict) else (
            compiler if isinstance(compiler, str) or compiler is None else getattr(compiler, "name", None))
        if compiler_name is not None and COMPILER_BACKEND.get(compiler_name, self.backend) != self.backend:
            compiler, compiler_name = None, None  # configured for the other backend: use this one's default
        self.ws = create_workspace(task, workdir, backend=self.backend, compiler=compiler_name,
                                          overwrite=self.options.overwrite)
        self.initial_files = self.ws.snapshot()
        self._pending: list[dict] = []
        self._lock = threading.Lock()
        self.session = None
        self.service = None
        self._dirfd: int | None = None
        self._own_executor = None
        try:
            self.session = self._open_sandbox(_spec(sandbox))
            executor = _spec(executor)
            if isinstance(executor, (dict, str)):
                executor = self._make_executor(executor)
                self._own_executor = executor
            self.service = WorkspaceService(self.ws, compiler or self.ws.compiler, executor, service_options,
                                            reward=_spec(reward), on_result=self._on_result,
                                            socket_path=self._socket_path(), pm=self.pm).start()
        except BaseException:
            self.close()
            raise
        spawn = getattr(self.session, "spawn", None) if self.session is not None else None
        tools = build_tools(self.options.tools, pm=self.pm)
        super().__init__(
            self.ws.root,
            tools=tools,
            system_prompt=self.options.system_prompt or CUDA_SYSTEM_PROMPT,
            protected=list(self.ws.protected) + [".cuda_agent"],
            spawn=spawn,
            env={ENV_SOCKET: str(self.ws.service_socket)},
        )

    @classmethod
    def from_config(cls, task: Task, workdir: str | Path, cfg: Any, pm: Any = None, *, executor: Any = None,
                    options: EnvironmentOptions | None = None, service: dict | None = None,
                    sandbox: Any = None) -> "CudaEnvironment":
        """The environment a run config describes, made one way for every command (optimize,
        eval, the trainer): :func:`environment_options` (or ``options``), the ``compiler``,
        ``sandbox`` (or ``sandbox``), ``reward`` and ``service`` sections (``service`` merged
        over the latter, its verify/profile options key by key), and ``executor`` (shared and not
        closed here) or the config's ``executor`` spec (made and closed by the environment).
        ``pm`` makes every component, so plugins registered on a caller's own plugin manager
        (a reward, say) are found."""
        svc = dict(_section(cfg, "service") or {})
        for key, extra in (service or {}).items():
            if key in ("verify_options", "profile_options") and isinstance(extra, dict):
                svc[key] = {**(svc.get(key) or {}), **extra}
            else:
                svc[key] = extra
        return cls(task, workdir, options or environment_options(cfg),
                   compiler=_section(cfg, "compiler"),
                   sandbox=sandbox if sandbox is not None else _section(cfg, "sandbox"),
                   executor=executor if executor is not None else _section(cfg, "executor"),
                   reward=_section(cfg, "reward"), service_options=svc or None, pm=pm)

    # -- setup --------------------------------------------------------------------------

    def _socket_path(self) -> str | None:
        """Where the service binds. A path too long for a Unix socket address is reached
        through a directory descriptor (``/proc/self/fd/N/service.sock``), so the socket
        still lives in the workspace, where a sandbox with a private /tmp sees it; the tool
        scripts connect relative to its folder."""
        real = self.ws.service_socket
        if len(str(real)) < 100 or not os.path.isdir("/proc/self/fd"):
            return None
        real.parent.mkdir(parents=True, exist_ok=True)
        self._dirfd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{self._dirfd}/{real.name}"

    def _open_sandbox(self, spec: Any) -> Any:
        if spec is None or (isinstance(spec, dict) and spec.get("name") is None):
            return None  # plain local processes in the workspace
        sandbox = spec if hasattr(spec, "open") else self.pm.create("sandbox", spec, where="sandbox")
        return sandbox.open(self.ws.root, list(self.ws.protected))

    def _make_executor(self, spec: Any) -> Any:
        from ..executors.configured import executor_spec

        # the run's backend reaches the executor (local -> cpu, ray's backend option); under auto,
        # only the GPU pool changes on a machine without a usable GPU (it has nothing to run on
        # here), while a cluster's pool keeps its own setting (its nodes may have GPUs)
        if self.options.backend != "auto":
            spec = executor_spec(spec, self.options.backend, self.pm)
        elif self.backend == "cpu" and (spec if isinstance(spec, str) else spec.get("name")) == "local":
            spec = executor_spec(spec, "cpu", self.pm)
        return self.pm.create("executor", spec, where="executor")

    # -- the loop's hooks -------------------------------------------------------------

    def _on_result(self, entry: dict) -> None:
        with self._lock:
            self._pending.append(entry)

    def _drain(self, turn: int) -> list[Candidate]:
        with self._lock:
            entries, self._pending = self._pending, []
        return [Candidate(turn=turn, files=dict(e["files"]), outcome=e["outcome"], reward=e.get("reward"))
                for e in entries]

    def initial_messages(self, task: Task) -> list[dict]:
        msgs = super().initial_messages(task)
        msgs[1]["content"] = task_prompt(task, self.backend)
        return msgs

    def on_tool_result(self, call: ToolCall, result: ToolResult, turn: int) -> list[Candidate]:
        return self._drain(turn)

    def finalize(self, trajectory: Trajectory) -> RewardResult | None:
        turn = len(trajectory.turns)
        svc = self.service
        current = self.ws.snapshot()
        seen = [c.files for c in trajectory.candidates]
        if self.options.evaluate_final and current != self.initial_files and current not in seen:
            svc.evaluate()
            for cand in self._drain(turn):
                record_candidate(trajectory, cand)
        best = trajectory.best
        if best is not None and self.options.profile_best and best.outcome.profile is None:
            self.ws.restore(best.files)
            svc.profile()
            for cand in self._drain(turn):
                record_candidate(trajectory, cand)
            best = trajectory.best
        if best is not None:
            if self.options.restore_best:
                self.ws.restore(best.files)
            reward = svc.reward.score(best.outcome)
            best.reward = reward
        else:
            last = trajectory.candidates[-1].outcome if trajectory.candidates else CandidateOutcome()
            reward = svc.reward.score(last)
        return reward

    def close(self) -> None:
        super_close = getattr(super(), "close", None)
        if hasattr(self, "_ctx") and callable(super_close):
            super_close()
        if self.service is not None:
            self.service.close()
            self.service = None
        if getattr(self, "_dirfd", None) is not None:
            os.close(self._dirfd)
            self._dirfd = None
        if self._own_executor is not None:
            self._own_executor.close()
            self._own_executor = None
        if self.session is not None:
            try:
                self.session.close()
            finally:
                self.session = None

    def __enter__(self) -> "CudaEnvironment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
