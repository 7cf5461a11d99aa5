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

from cuda_agent.sandbox.workspace.episodes import EpisodeFactory


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

    ``scored`` lists every completion scored so far (task id, reward value, tool calls run,
    whether a candidate was judged correct).
    """

    __name__ = "cuda_reward"  # the name TRL logs it under: rewards/cuda_reward/mean

    def __init__(self, episodes: EpisodeFactory, workers: int = 4, tokenizer: Any = None):
        self.episodes = episodes
        self.workers = max(1, int(workers))
        # with a tokenizer, completions are read from their token ids with special tokens kept:
        # TRL's text drops them, and some tokenizers declare the <tool_call> tags special
        self.tokenizer = tokenizer
        self.scored: list[dict] = []

    def _one(self, completion: Any, task_id: str) -> dict:
        text, calls = assistant_turn(completion)
        ep = self.episodes.open(task_id, framework="trl")
        try:
            ep.stepper.step(text, calls)
            traj = ep.finish("single_turn")
        finally:
            ep.close()
        r = traj.reward
        return {"task_id": task_id, "reward": r.value if r is not None else None,
                "tool_calls": traj.metadata.get("tool_calls", 0), "correct": bool(r is not None and r.correct),
                "verified": any(c.outcome.verify is not None and c.outcome.verify.ok for c in traj.candidates)}

    def _text(self, ids: list[int]) -> str:
        tok = self.tokenizer
        drop = {tok.eos_token_id, tok.pad_token_id} - {None}
        return tok.decode([i for i in ids if i not in drop], skip_special_tokens=False)

    def __call__(self, prompts: list, completions: list, task_id: list[str] | None = None,
                 completion_ids: list | None = None, **kwargs: Any) -> list[float | None]:
        if task_id is None:
            raise ValueError("CudaReward needs a task_id column in the training dataset "
                             "(cuda_agent_trl.task_dataset(..., task_in_prompt=True) makes one)")
        if self.tokenizer is not None and completion_ids is not None:
            completions = [self._text(list(ids)) for ids in completion_ids]
        with ThreadPoolExecutor(self.workers) as pool:
            records = list(pool.map(self._one, completions, task_id))
        self.scored += records
        return [r["reward"] for r in records]

    def close(self) -> None:
        self.episodes.close()
