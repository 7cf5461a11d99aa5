"""``CudaOpenEnv``: an OpenEnv ``Environment`` over our CUDA episodes.

Every session (one client's WebSocket) gets its own instance; ``reset(task_id=...)`` opens
a fresh workspace through the shared :class:`~cuda_agent.sandbox.workspace.episodes.EpisodeFactory`,
``step(CudaAction)`` runs one model turn's tool calls through our agent tools, and the step
that ends the episode (an answer without tool calls, or the turn limit) carries the
judge's reward. A step before ``reset`` or after the end is refused with a one-line error
the client raises; an unknown tool or a failing call is an error result the model reads.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from cuda_agent.core.errors import TaskError
from cuda_agent.sandbox.workspace.episodes import Episode, EpisodeFactory

from .models import CudaAction, CudaObservation, CudaState, ToolOutput


class CudaOpenEnv(Environment[CudaAction, CudaObservation, CudaState]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # one workspace per session; the job pool is shared

    def __init__(self, episodes: EpisodeFactory, cursor: Any = None):
        super().__init__()
        self.episodes = episodes
        self._cursor = cursor if cursor is not None else itertools.count()
        self._episode: Episode | None = None
        self._episode_id: str | None = None

    def _close_episode(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **kwargs: Any) -> CudaObservation:
        """A new episode on ``task_id`` (by default the ``seed``-th task, or the next one in turn)."""
        self._close_episode()
        if task_id is None:
            ids = list(self.episodes.tasks)
            task_id = ids[(seed if seed is not None else next(self._cursor)) % len(ids)]
        self._episode = self.episodes.open(task_id, framework="openenv")
        self._episode_id = episode_id or uuid.uuid4().hex[:12]
        st = self._episode.stepper
        return CudaObservation(task_id=self._episode.task.id, messages=[dict(m) for m in st.messages],
                               tools=st.schemas, turns_left=st.turns_left)

    def step(self, action: CudaAction, timeout_s: float | None = None, **kwargs: Any) -> CudaObservation:
        if self._episode is None:
            raise TaskError("no episode: send reset (optionally with task_id) before step")
        st = self._episode.stepper
        calls = [c.model_dump() for c in action.tool_calls] if action.tool_calls else None
        if calls is not None:
            for c in calls:
                c["id"] = c["id"] or None
        result = st.step(action.content, calls)  # EpisodeOver after the end: the client gets the message
        obs = CudaObservation(task_id=self._episode.task.id,
                              results=[ToolOutput(call_id=r.call_id, name=r.name, content=r.content, ok=r.ok)
                                       for r in result.results],
                              finish_reason=result.finish_reason, turns_left=st.turns_left)
        if result.done:
            traj = self._episode.finish(result.finish_reason)
            r = traj.reward
            obs.done = True
            obs.reward = r.value if r is not None else None
            obs.verdict = ({"reward": r.reward, "correct": r.correct, "failure": r.failure.value,
                            "speedup_vs_eager": r.speedup_vs_eager, "speedup_vs_compile": r.speedup_vs_compile}
                           if r is not None else {"error": traj.metadata.get("finalize_error", "not scored")})
        return obs

    @property
    def state(self) -> CudaState:
        ep = self._episode
        if ep is None:
            return CudaState(episode_id=self._episode_id)
        traj = ep.stepper.traj
        return CudaState(episode_id=self._episode_id, step_count=len(traj.turns), task_id=ep.task.id,
                         finish_reason=traj.finish_reason, turns_left=ep.stepper.turns_left,
                         reward=ep.stepper.reward)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="cuda-agent",
            description=(f"Write kernels faster than torch.compile ({self.episodes.backend} backend, "
                         f"{len(self.episodes.tasks)} tasks, reward {self.episodes.options.reward})"),
            version="0.1.0",
        )

    def close(self) -> None:
        self._close_episode()
