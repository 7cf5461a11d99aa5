"""Our tasks as the prompt dataset TRL's GRPOTrainer reads (``prompt`` + ``task_id`` columns).

Two forms: for the multi-turn environment the user message is left empty, since the
environment's ``reset`` appends the task to it; for the single-turn reward function the
prompt holds the whole task. The system message is the environment's own (our system
prompt and SKILL.md for the backend), read from one probe episode.
"""

from __future__ import annotations

from typing import Any, Iterable

from cuda_agent.sandbox.workspace.environment import task_prompt
from cuda_agent.sandbox.workspace.episodes import EpisodeFactory


def system_message(episodes: EpisodeFactory) -> str:
    """The system prompt our episodes start from (opens and closes one episode)."""
    first = next(iter(episodes.tasks))
    ep = episodes.open(first, framework="trl")
    try:
        return ep.stepper.messages[0]["content"]
    finally:
        ep.close()


def task_dataset(episodes: EpisodeFactory, task_ids: Iterable[str] | None = None, repeat: int = 1,
                 task_in_prompt: bool = False, system: str | None = None) -> Any:
    """A ``datasets.Dataset`` with one row per task (``repeat`` times).

    ``task_in_prompt=False`` (for :class:`~cuda_agent_trl.CudaToolEnvFactory`): an empty user
    message that ``reset`` fills; ``True`` (for :class:`~cuda_agent_trl.CudaReward`): the task
    is in the prompt. ``system`` replaces the environment's system message.
    """
    from datasets import Dataset

    ids = list(task_ids) if task_ids is not None else list(episodes.tasks)
    system = system if system is not None else system_message(episodes)
    rows: dict[str, list] = {"prompt": [], "task_id": []}
    for _ in range(max(1, int(repeat))):
        for tid in ids:
            task = episodes.task(tid)
            user = task_prompt(task, episodes.backend) if task_in_prompt else ""
            rows["prompt"].append([{"role": "system", "content": system}, {"role": "user", "content": user}])
            rows["task_id"].append(task.id)
    return Dataset.from_dict(rows)
