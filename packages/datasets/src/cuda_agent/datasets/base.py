"""Shared machinery of the dataset plugins: loading, static checks, selection, skip reports."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.interfaces import Dataset
from cuda_agent.core.types import Task

from .selection import select
from .validate import TaskReport, static_problems


class TaskDataset(Dataset):
    """A dataset that loads all its tasks, skips malformed ones (reported) and selects."""

    splits: tuple[str, ...] = ("train",)

    def __init__(self, options=None):
        super().__init__(options)
        self.skipped: list[TaskReport] = []
        self._cache: list[Task] | None = None

    def load(self) -> list[Task]:  # pragma: no cover - abstract
        raise NotImplementedError

    def available_splits(self) -> tuple[str, ...]:
        return self.splits

    def all_tasks(self) -> list[Task]:
        """Every well-formed task before selection (malformed ones go to ``skipped``)."""
        if self._cache is None:
            self.skipped = []
            good = []
            for task in self.load():
                if getattr(self.options, "validate", "static") != "none":
                    problems = static_problems(task.code)
                    if problems:
                        self.skipped.append(TaskReport(task.id, False, "static", "; ".join(problems)))
                        continue
                good.append(task)
            self._cache = good
        return self._cache

    def select(self) -> list[Task]:
        return select(self.all_tasks(), self.options, self.available_splits())

    def tasks(self) -> Iterator[Task]:
        yield from self.select()

    def __len__(self) -> int:
        return len(self.select())


def resolve_path(value: str | None, env_var: str, what: str, option: str, hint: str = "") -> Path:
    """A path from an option, else from an environment variable, else a one-line error
    (ending with ``hint``: where to get the data, when given)."""
    raw = value or os.environ.get(env_var)
    tail = f"; {hint}" if hint else ""
    if not raw:
        raise ConfigError(
            f"no {what} location: set {option}=<path> or the environment variable {env_var}{tail}"
        )
    path = Path(os.path.expanduser(str(raw)))
    if not path.exists():
        src = option if value else env_var
        raise ConfigError(f"{what} not found at {path} (from {src}){tail}")
    return path
