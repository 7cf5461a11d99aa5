"""``cuda-agent baselines``: eager and torch.compile times of a whole task set, cached.

Tasks are measured in chunks, one chunk per job, so each worker imports torch once and
reuses inductor's compile workers; the executor runs one job per GPU. A chunk whose job
fails (crash, timeout) is retried task by task, so one bad task costs only itself.
Measured baselines land in the sandbox's BaselineCache, where every later profiling job
finds them; a second run costs nothing (cached tasks are read back), which also makes an
interrupted run resumable.
"""

from __future__ import annotations

import math
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, Sequence

from cuda_agent.core.types import Task

JOB = "cuda_agent.evaluation.jobs:baselines_chunk"


def chunks(tasks: Sequence[Task], devices: int, size: int = 0) -> list[list[Task]]:
    """Split into chunks: about four per device, at most 8 tasks each (or ``size``)."""
    if not tasks:
        return []
    if size <= 0:
        size = max(1, min(8, math.ceil(len(tasks) / (4 * max(1, devices)))))
    return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]


def _submit(executor: Any, chunk: list[Task], options: dict, timeout: float | None) -> Any:
    from cuda_agent.sandbox.executors import Job

    return executor.submit(
        Job(
            fn=JOB,
            kwargs={"tasks": [{"id": t.id, "code": t.code} for t in chunk], "options": options},
            kind="baseline",
            timeout=(timeout * len(chunk)) if timeout else None,
            label=chunk[0].id if len(chunk) == 1 else f"{chunk[0].id} +{len(chunk) - 1}",
        )
    )


def measure_task_baselines(
    tasks: Sequence[Task],
    executor: Any,
    *,
    options: dict | None = None,
    progress: bool = True,
    timeout: float | None = 600.0,
    chunk_size: int = 0,
) -> list[dict]:
    """One row per task: ``task_id, eager_ms, compile_ms, cached, error, seconds``."""
    from cuda_agent.sandbox.executors import JobError

    options = dict(options or {})
    try:
        devices = max(1, len(executor.devices))
    except Exception:
        devices = 1
    order = {t.id: i for i, t in enumerate(tasks)}
    rows: dict[str, dict] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks), desc="baselines", unit="task", dynamic_ncols=True)
    pending: dict[Any, list[Task]] = {}
    try:
        for ch in chunks(tasks, devices, chunk_size):
            pending[_submit(executor, ch, options, timeout)] = ch
        while pending:
            done, _ = wait(list(pending), timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in done:
                ch = pending.pop(fut)
                try:
                    got = fut.result()
                except JobError as exc:
                    if len(ch) > 1:  # find the task that broke it: one job each
                        for t in ch:
                            pending[_submit(executor, [t], options, timeout)] = [t]
                        continue
                    got = [{"task_id": ch[0].id, "eager_ms": None, "compile_ms": None, "cached": False,
                            "error": f"{exc.reason}: {exc.message}"[:300], "seconds": exc.seconds}]
                for row in got:
                    rows[row["task_id"]] = row
                if bar is not None:
                    bar.update(len(got))
                    bar.set_postfix_str(f"cached {sum(1 for r in rows.values() if r.get('cached'))}", refresh=False)
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise
    finally:
        if bar is not None:
            bar.close()
    return sorted(rows.values(), key=lambda r: order.get(r["task_id"], 10**9))
