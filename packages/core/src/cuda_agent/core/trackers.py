"""Metric trackers: the built-ins (JSON lines, the default, and the console) and the hook
implementations through which a run hands its lifecycle events to the trackers it built."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from .hookspecs import Stage, hookimpl
from .interfaces import Tracker
from .types import Trajectory

if TYPE_CHECKING:
    from .run import Run


class TrackerHooks:
    """The lifecycle hooks, implemented by handing each event to every tracker of one run.

    :class:`~cuda_agent.core.run.Run` attaches one to its plugin manager while it runs, so
    whatever calls a lifecycle hook reaches the trackers the run's config lists; the run's
    end closes them.
    """

    def __init__(self, trackers: list[Tracker]):
        self.trackers = list(trackers)

    @hookimpl
    def on_run_start(self, run: Run) -> None:
        for t in self.trackers:
            t.run_started(run)

    @hookimpl
    def on_stage_start(self, run: Run, stage: Stage) -> None:
        for t in self.trackers:
            t.stage_started(stage)

    @hookimpl
    def on_step_end(self, run: Run, step: int, metrics: Mapping[str, float]) -> None:
        for t in self.trackers:
            t.log(step, dict(metrics))

    @hookimpl
    def on_trajectory_end(self, run: Run, trajectory: Trajectory) -> None:
        for t in self.trackers:
            t.trajectory_ended(trajectory)

    @hookimpl
    def on_run_end(self, run: Run, status: str) -> None:
        try:
            for t in self.trackers:
                t.run_ended(status)
        finally:
            for t in self.trackers:
                t.close()


@dataclass
class JsonlOptions:
    path: str = "metrics.jsonl"  # relative paths are inside the run folder


class JsonlTracker(Tracker):
    name = "jsonl"
    description = "Append each step's metrics as a JSON line."
    Options = JsonlOptions

    def __init__(self, options=None, run_dir: str | Path | None = None):
        super().__init__(options)
        path = Path(self.options.path)
        if run_dir is not None and not path.is_absolute():
            path = Path(run_dir) / path
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict) -> None:
        self._f.write(json.dumps({"step": step, "time": time.time(), **metrics}, default=float) + "\n")
        self._f.flush()

    def truncate(self, after_step: int) -> None:
        """Rewrite the file with the lines of steps up to ``after_step`` (a line cut short by a
        kill goes too), atomically: a kill during the rewrite leaves the old file."""
        self._f.close()
        kept = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                step = json.loads(line).get("step")
            except (ValueError, AttributeError):
                continue
            if isinstance(step, int) and step <= after_step:
                kept.append(line + "\n")
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._f = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        self._f.close()


@dataclass
class ConsoleOptions:
    keys: list[str] | None = None  # metrics to show; all when empty


class ConsoleTracker(Tracker):
    name = "console"
    description = "Print each step's metrics on one line."
    Options = ConsoleOptions

    def __init__(self, options=None, run_dir=None):
        super().__init__(options)

    def log(self, step: int, metrics: dict) -> None:
        keys = self.options.keys or sorted(metrics)
        parts = []
        for k in keys:
            v = metrics.get(k)
            parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
        print(f"step {step}: " + " ".join(parts), flush=True)
