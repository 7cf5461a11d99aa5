"""Concurrent generation requests gathered into batched calls.

Episodes run concurrently on one asyncio loop and each asks for one completion at a time. A
:class:`RequestBatcher` collects the requests that arrive close together (up to ``max_batch``)
and hands them to a blocking batch function that runs in a worker thread, so the tools and
rewards of other episodes go on while the model generates. Used by the trainer's actor policy
(HF ``generate``) and the in-process ``vllm`` policy.
"""

from __future__ import annotations

import asyncio
from typing import Callable

Result = tuple[list[int], list[float], str]


def zero_stats() -> dict:
    return {"generated_tokens": 0, "generate_seconds": 0.0, "calls": 0, "batches": 0}


class BatchStats:
    """Counters of batched generation (``stats``), which the trainer's rollout metrics read
    through ``reset_stats()``; a policy sets ``self.stats = zero_stats()`` and records each call."""

    stats: dict

    def record_batch(self, tokens: int, seconds: float, calls: int) -> None:
        self.stats["generated_tokens"] += int(tokens)
        self.stats["generate_seconds"] += float(seconds)
        self.stats["calls"] += int(calls)
        self.stats["batches"] += 1

    def reset_stats(self) -> dict:
        """The counters since the last reset (generated tokens, seconds, requests, batched calls)."""
        s, self.stats = self.stats, zero_stats()
        return s


class RequestBatcher:
    """``await submit(prompt_ids, sampling)`` -> ``run_batch([prompt], [sampling])[i]``, batched."""

    def __init__(self, run_batch: Callable[[list[list[int]], list[dict]], list[Result]], max_batch: int = 64,
                 gather_s: float = 0.005, windows: int = 20):
        self.run_batch = run_batch
        self.max_batch = max(1, int(max_batch))
        self.gather_s = float(gather_s)
        self.windows = int(windows)
        self._pending: list[tuple[list[int], dict, asyncio.Future]] = []
        self._flush_task: asyncio.Task | None = None

    async def submit(self, prompt_ids: list[int], sampling: dict) -> Result:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((list(prompt_ids), dict(sampling), fut))
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = loop.create_task(self._flush_soon())
        return await fut

    async def _flush_soon(self) -> None:
        # gather: keep waiting while new requests arrive (up to `windows` windows) or until a batch is full
        seen = -1
        for _ in range(self.windows):
            await asyncio.sleep(self.gather_s)
            if len(self._pending) == seen or len(self._pending) >= self.max_batch:
                break
            seen = len(self._pending)
        while self._pending:
            reqs, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
            try:
                outs = await asyncio.to_thread(self.run_batch, [r[0] for r in reqs], [r[1] for r in reqs])
                for (_, _, fut), out in zip(reqs, outs):
                    if not fut.done():
                        fut.set_result(out)
            except Exception as exc:  # every waiting episode sees the failure
                for _, _, fut in reqs:
                    if not fut.done():
                        fut.set_exception(exc)
            await asyncio.sleep(self.gather_s)
