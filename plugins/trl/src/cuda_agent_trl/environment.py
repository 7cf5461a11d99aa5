"""The multi-turn CUDA environment for ``GRPOTrainer(environment_factory=...)`` (TRL 1.16).

TRL builds one environment instance per rollout (and reuses them, calling ``reset``):
its public methods are the tools the model may call, ``reset(**row)`` starts an episode
and returns the text appended to the prompt's last user message, and ``get_reward()``
scores the finished rollout. :class:`CudaToolEnvFactory` is that factory: each instance
opens a :class:`~cuda_agent.sandbox.workspace.episodes.Episode` for the row's ``task_id``, offers our
agent tools as methods, and ``get_reward`` returns the judge's reward (milestone or
speedup), logged by TRL as ``rewards/CudaToolEnv/mean``.

Bad input never stops the trainer: an unknown tool is answered by TRL itself, a tool error
or a call after the turn limit raises a one-line error that TRL hands to the model as
``{"error": ...}`` and counts in ``tools/failure_frequency``.
"""

from __future__ import annotations

import threading
from typing import Any

from cuda_agent.core.agent import build_tools
from cuda_agent.core.errors import ConfigError, CudaAgentError, TaskError
from cuda_agent.sandbox.workspace.episodes import Episode, EpisodeFactory

from .tools import method_name, tool_method

RESERVED = ("reset", "get_reward")


class ToolFailed(CudaAgentError):
    """A tool call that ran and failed; its message is what the model reads."""


class CudaToolEnv:
    """Base of the generated environment class; its tool methods are added per tool set."""

    _factory: "CudaToolEnvFactory"

    def __init__(self) -> None:
        self._episode: Episode | None = None

    def reset(self, task_id: str | None = None, **row: Any) -> str:
        """Start a new episode on ``task_id`` (the dataset column); returns the task text."""
        self._close_episode()
        episodes = self._factory.episodes
        tid = task_id if task_id is not None else self._factory.next_task_id()
        self._episode = episodes.open(tid, framework="trl")
        from cuda_agent.sandbox.workspace.environment import task_prompt

        return task_prompt(self._episode.task, episodes.backend)

    def get_reward(self) -> float | None:
        """The judge's reward of the rollout that just ended (None when it could not be scored)."""
        ep = self._episode
        if ep is None:
            return None
        traj = ep.finish("trl_end")
        value = traj.reward.value if traj.reward is not None else None
        self._factory.record(ep, traj, value)
        return value

    def _call(self, tool: str, arguments: dict) -> str:
        if self._episode is None:
            raise TaskError("no episode: TRL must call reset() before the tools (environment_factory contract)")
        result = self._episode.stepper.call_tool(tool, arguments)  # EpisodeOver after the turn limit
        if not result.ok:
            raise ToolFailed(result.content)
        return result.content

    def _close_episode(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None

    @property
    def episode(self) -> Episode | None:
        """The episode of the current rollout (its trajectory, workspace and reward)."""
        return self._episode


class CudaToolEnvFactory:
    """``environment_factory`` for TRL's GRPOTrainer over an :class:`EpisodeFactory`.

    ``factory()`` returns a new environment instance. ``scored`` lists every rollout scored
    so far (task id, reward value, finish reason, turns, tool calls, whether a candidate passed
    verification and was judged correct), in scoring order.
    """

    def __init__(self, episodes: EpisodeFactory):
        self.episodes = episodes
        schemas = [t.schema() for t in build_tools(episodes.options.tools, pm=episodes.pm)]
        methods: dict[str, Any] = {}
        for schema in schemas:
            fn = tool_method(schema)
            if fn.__name__ in RESERVED or fn.__name__.startswith("_"):
                raise ConfigError(f"agent tool {schema['function']['name']!r} cannot be offered through TRL: "
                                  f"{', '.join(RESERVED)} are the environment's own methods; rename the tool")
            methods[fn.__name__] = fn
        self.tool_names = [method_name(s["function"]["name"]) for s in schemas]
        self.env_class = type("CudaToolEnv", (CudaToolEnv,), {**methods, "_factory": self,
                                                             "__doc__": CudaToolEnv.__doc__})
        self.scored: list[dict] = []
        self._lock = threading.Lock()
        self._cursor = 0

    def __call__(self) -> CudaToolEnv:
        return self.env_class()

    def next_task_id(self) -> str:
        """Tasks in turn, for a trainer run without a dataset (the environment owns the data)."""
        with self._lock:
            ids = list(self.episodes.tasks)
            tid = ids[self._cursor % len(ids)]
            self._cursor += 1
            return tid

    def record(self, episode: Episode, traj: Any, value: float | None) -> None:
        with self._lock:
            self.scored.append({"task_id": episode.task.id, "reward": value, "finish_reason": traj.finish_reason,
                                "turns": len(traj.turns), "tool_calls": traj.metadata.get("tool_calls", 0),
                                "correct": bool(traj.reward is not None and traj.reward.correct),
                                "verified": any(c.outcome.verify is not None and c.outcome.verify.ok
                                                for c in traj.candidates)})

    def close(self) -> None:
        self.episodes.close()
