"""A TRL reward function (``reward_funcs=[CudaReward(...)]``) for single-turn completions.

The completion is taken as one agent turn: its tool calls (``<tool_call>`` blocks in the
text, or the calls TRL parsed) run in a fresh workspace for the row's ``task_id``, then
the judge compiles, verifies and profiles the files left there and the reward plugin
scores them -- the paper's single-turn warm-up. A completion without usable calls scores
the reward of a missing candidate (-1 for milestone and speedup).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cuda_agent.sandbox.episodes import EpisodeFactory


def assistant_turn(completion: Any) -> tuple[str, list | None]:
    """``(text, tool_calls)`` of a completion: a string, or TRL's list of messages."""
    if isinstance(completion, str):
        return completion, None
    text, calls = [], []
    for msg in completion or []:
        if not isinstance(msg, dict) or msg.get("role", "assistant") != "assistant":
            continue
        content = msg.get("content") or ""
        if isinstance(content, list):  # content blocks
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        text.append(str(content))
        calls += list(msg.get("tool_calls") or [])
    joined = "\n".join(text)
    return (joined, calls) if calls else (joined, None)


class CudaReward:
    """Scores each completion with our judge; ``workers`` completions are judged at once.

    ``scored`` lists ``(task_id, reward)`` for every completion scored so far.
    """

    __name__ = "cuda_reward"  # the name TRL logs it under: rewards/cuda_reward/mean

    def __init__(self, episodes: EpisodeFactory, workers: int = 4):
        self.episodes = episodes
        self.workers = max(1, int(workers))
        self.scored: list[tuple[str, float | None]] = []

    def _one(self, completion: Any, task_id: str) -> float | None:
        text, calls = assistant_turn(completion)
        ep = self.episodes.open(task_id, framework="trl")
        try:
            ep.stepper.step(text, calls)
            traj = ep.finish("single_turn")
        finally:
            ep.close()
        return traj.reward.value if traj.reward is not None else None

    def __call__(self, prompts: list, completions: list, task_id: list[str] | None = None,
                 **kwargs: Any) -> list[float | None]:
        if task_id is None:
            raise ValueError("CudaReward needs a task_id column in the training dataset "
                             "(cuda_agent_trl.task_dataset(..., task_in_prompt=True) makes one)")
        with ThreadPoolExecutor(self.workers) as pool:
            values = list(pool.map(self._one, completions, task_id))
        self.scored += list(zip(task_id, values))
        return values

    def close(self) -> None:
        self.episodes.close()
