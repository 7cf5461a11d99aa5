"""A resumable, parallel runner over a task set.

Each finished task is appended as one JSON line to ``results.jsonl`` in the run folder
(flushed and synced), so an interrupted run restarted on the same folder skips the
tasks already scored; its samples go to ``samples.jsonl`` beside it just before, as a batch
the task row names (:mod:`.samples`). Tasks run on a thread pool: each thread prepares a task's
candidates and waits on jobs it submitted to the executor, which keeps one job per GPU.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from cuda_agent.core.errors import InfrastructureError
from cuda_agent.core.types import FailureCategory, Task

from .jsonl import append_lines, dumps, read_records
from .metrics import TaskResult, is_infra_error
from .samples import BATCH_KEY, SAMPLES_FILE, SampleResult, SampleStore

RESULTS_FILE = "results.jsonl"


class ResultStore:
    """Append-only JSON lines of :class:`TaskResult`; the last line for a task wins. The
    tasks' samples are kept beside it (:attr:`samples`, ``samples.jsonl``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.samples = SampleStore(self.path.with_name(SAMPLES_FILE))

    def samples_of(self, results: Iterable[TaskResult]) -> list[SampleResult]:
        """The recorded samples of these task rows (those of the batch each row names)."""
        return self.samples.current({r.task_id: r for r in results})

    def compact_samples(self) -> None:
        """Keep in samples.jsonl only the batches the current task rows name: a task redone
        on resume replaces its samples, and a batch whose task row a kill prevented goes."""
        self.samples.compact(self.load())

    def load(self) -> dict[str, TaskResult]:
        return {r.task_id: r for r in read_records(self.path, TaskResult.from_dict)}

    def finished(self) -> dict[str, TaskResult]:
        """Results that count as done (a harness or infrastructure error is retried on resume)."""
        return {k: r for k, r in self.load().items() if not r.metadata.get("harness_error") and not is_infra_error(r)}

    def append(self, result: TaskResult) -> None:
        if result.samples:  # the samples first: a task row always finds its batch
            batch = uuid.uuid4().hex[:16]
            self.samples.append_batch(batch, result.samples)
            result.metadata[BATCH_KEY] = batch
        with self._lock:
            append_lines(self.path, [dumps(result.to_dict())])


def harness_error_result(task: Task, exc: BaseException, seconds: float) -> TaskResult:
    """A task the harness itself failed on (not the candidate's fault): retried on resume."""
    msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    return TaskResult(
        task_id=task.id,
        level=task.level,
        name=task.name,
        correct=False,
        failure=FailureCategory.CRASH.value,
        message=f"evaluation error: {msg}",
        seconds=seconds,
        metadata={"harness_error": True, "traceback": traceback.format_exc()[-4000:]},
    )


def run_tasks(
    tasks: Sequence[Task],
    score: Callable[[Task], TaskResult],
    store: ResultStore,
    *,
    workers: int = 1,
    progress: bool = True,
    desc: str = "eval",
    on_result: Callable[[TaskResult], Any] | None = None,
    log: Any = None,
    max_infra_share: float | None = None,
) -> list[TaskResult]:
    """Score every task not already in ``store``; returns the results of all ``tasks``.

    ``samples.jsonl`` is first reduced to the batches the task rows name, so the samples of
    a task redone now replace its earlier ones.

    ``score(task)`` returns the task's :class:`TaskResult`; an exception it raises is
    recorded as a harness error (retried when the run is resumed). On
    KeyboardInterrupt, tasks not started are dropped, results that arrive after it
    are not recorded, and the interrupt propagates. Once more than ``max_infra_share``
    of the results of this call are infrastructure errors (recorded, and redone on
    resume), the run stops the same way with an :class:`InfrastructureError`.
    """
    store.compact_samples()
    done = store.finished()
    todo = [t for t in tasks if t.id not in done]
    ids = {t.id for t in tasks}
    results: dict[str, TaskResult] = {k: v for k, v in done.items() if k in ids}
    if log is not None:
        log.info("eval.tasks", total=len(tasks), finished=len(results), todo=len(todo), workers=workers)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks), initial=len(results), desc=desc, unit="task", dynamic_ncols=True, smoothing=0.1)
        _postfix(bar, results.values())
    stop = threading.Event()
    session = {"done": 0, "infra": 0}

    def one(task: Task) -> TaskResult | None:
        if stop.is_set():
            return None
        t0 = time.perf_counter()
        try:
            r = score(task)
        except Exception as exc:  # the harness failed, not the candidate
            r = harness_error_result(task, exc, time.perf_counter() - t0)
        if not r.seconds:
            r.seconds = time.perf_counter() - t0
        if stop.is_set():
            return None
        store.append(r)
        return r

    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="eval")
    pending: set[Future] = set()
    try:
        it = iter(todo)
        # keep at most `workers` tasks in flight so an interrupt leaves little unfinished
        for task in it:
            pending.add(pool.submit(one, task))
            if len(pending) >= max(1, workers):
                break
        while pending:
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in finished:
                r = fut.result()
                if r is None:
                    continue
                results[r.task_id] = r
                if on_result is not None:
                    on_result(r)
                if log is not None:
                    log.info(
                        "eval.task",
                        task_id=r.task_id,
                        correct=r.correct,
                        failure=r.failure,
                        speedup_vs_compile=r.speedup_vs_compile,
                        seconds=round(r.seconds, 2),
                    )
                if bar is not None:
                    bar.update(1)
                    _postfix(bar, results.values())
                _count_infra(session, r, max_infra_share, log)
                nxt = next(it, None)
                if nxt is not None:
                    pending.add(pool.submit(one, nxt))
    except BaseException:
        stop.set()
        for fut in pending:
            fut.cancel()
        raise
    finally:
        pool.shutdown(wait=not stop.is_set(), cancel_futures=True)
        if bar is not None:
            bar.close()
    return [results[t.id] for t in tasks if t.id in results]


def _count_infra(session: dict, r: TaskResult, max_share: float | None, log: Any) -> None:
    """Count ``r`` in this session; raise once infrastructure errors pass ``max_share`` of it."""
    session["done"] += 1
    if not is_infra_error(r):
        return
    session["infra"] += 1
    if log is not None:
        log.warning("eval.infra_error", task_id=r.task_id, error=r.message, count=session["infra"],
                    of=session["done"])
    if max_share is not None and session["infra"] > max_share * session["done"]:
        raise InfrastructureError(
            f"{session['infra']} of {session['done']} episodes finished in this session failed for "
            f"infrastructure reasons (more than eval.max_infra_error_share={max_share:g}); last: {r.message}")


def _postfix(bar: Any, results: Iterable[TaskResult]) -> None:
    rs = [r for r in results if not is_infra_error(r)]
    if not rs:
        return
    ok = sum(r.correct for r in rs)
    fast = sum(1 for r in rs if r.correct and (r.speedup_vs_compile or 0) > 1 / 0.95)
    bar.set_postfix_str(f"pass {ok}/{len(rs)} faster-than-compile {fast}", refresh=False)
