"""A generic loader: a folder of KernelBench-style ``*.py`` files, or JSON-lines/Parquet rows.

``.py`` files become tasks named by their path stem (``sub/name``); a ``levelN`` folder
in the path sets the level. Rows need a ``code`` column and may carry ``id``, ``name``,
``level``, ``ops`` and ``split``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import Task

from .base import TaskDataset
from .ops6k import parse_ops
from .selection import SelectionOptions
from .tables import TABLE_SUFFIXES, read_rows


@dataclass
class FolderOptions(SelectionOptions):
    path: str | None = None  # a folder of .py files / table files, or one file
    recursive: bool = True
    source: str = "folder"


class FolderDataset(TaskDataset):
    name = "folder"
    description = "Tasks from a folder of KernelBench-style .py files or from .jsonl/.parquet rows with a code column."
    Options = FolderOptions

    def __init__(self, options=None):
        super().__init__(options)
        self._splits: set[str] = set()

    def available_splits(self) -> tuple[str, ...]:
        self.all_tasks()
        return tuple(sorted(self._splits)) or ("train",)

    def load(self) -> list[Task]:
        if not self.options.path:
            raise ConfigError("dataset 'folder' needs a location: set dataset.options.path=<folder or file>")
        root = Path(os.path.expanduser(self.options.path))
        if not root.exists():
            raise ConfigError(f"task folder not found: {root}")
        files = [root] if root.is_file() else sorted(root.rglob("*") if self.options.recursive else root.glob("*"))
        tasks: list[Task] = []
        base = root.parent if root.is_file() else root
        for f in files:
            if not f.is_file():
                continue
            rel = f.relative_to(base)
            if f.suffix == ".py":
                if f.name.startswith("_"):
                    continue
                tasks.append(self._py_task(f, rel))
            elif f.suffix.lower() in TABLE_SUFFIXES:
                tasks.extend(self._row_tasks(f, rel))
        self._splits = {t.metadata.get("split", "train") for t in tasks}
        return tasks

    def _level(self, rel: Path) -> int | None:
        for part in rel.parts[:-1]:
            m = re.fullmatch(r"level_?(\d+)", part.lower())
            if m:
                return int(m.group(1))
        return None

    def _py_task(self, f: Path, rel: Path) -> Task:
        tid = rel.with_suffix("").as_posix()
        m = re.match(r"^(\d+)_(.+)$", f.stem)
        name = m.group(2) if m else f.stem
        return Task(
            id=tid,
            source=self.options.source,
            code=f.read_text(encoding="utf-8", errors="replace"),
            name=name,
            level=self._level(rel),
            metadata={"file": str(f), "split": "train"},
        )

    def _row_tasks(self, f: Path, rel: Path) -> list[Task]:
        rows = read_rows(f)
        out = []
        stem = rel.with_suffix("").as_posix()
        for i, row in enumerate(rows):
            if "code" not in row:
                raise ConfigError(f"{f}: row {i} has no 'code' column; found {', '.join(map(str, row))}")
            tid = str(row.get("id") or row.get("data_source") or f"{stem}/{i}")
            ops = parse_ops(row.get("ops"))
            level = row.get("level")
            out.append(
                Task(
                    id=tid,
                    source=str(row.get("source") or self.options.source),
                    code=str(row["code"]),
                    name=str(row.get("name") or tid),
                    level=int(level) if level not in (None, "") else self._level(rel),
                    metadata={"file": str(f), "row": i, "ops": ops, "split": str(row.get("split") or "train")},
                )
            )
        return out
