"""KernelBench levels 1-3 from a folder in KernelBench's layout.

``<root>/level1/19_ReLU.py`` becomes task ``L1/19_ReLU`` (name ``ReLU``, level 1).
The root is ``dataset.options.root`` or the environment variable CUDA_AGENT_KERNELBENCH.
Both ``<root>/levelN`` and ``<root>/KernelBench/levelN`` layouts are accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import Task

from .base import TaskDataset, resolve_path
from .selection import SelectionOptions

ENV_VAR = "CUDA_AGENT_KERNELBENCH"
WHERE_TO_GET = ("get it with `git clone https://github.com/ScalingIntelligence/KernelBench` and point at the "
                "clone's KernelBench/ folder (the one holding level1/, level2/, level3/)")
_FILE_RE = re.compile(r"^(\d+)_(.+)\.py$")


@dataclass
class KernelBenchOptions(SelectionOptions):
    root: str | None = None  # folder holding level1/, level2/, level3/


def find_level_dirs(root: Path) -> dict[int, Path]:
    for base in (root, root / "KernelBench"):
        dirs = {}
        for d in sorted(base.glob("level*")) if base.is_dir() else []:
            m = re.fullmatch(r"level(\d+)", d.name)
            if m and d.is_dir():
                dirs[int(m.group(1))] = d
        if dirs:
            return dirs
    return {}


def read_kernelbench(root: Path) -> list[Task]:
    levels = find_level_dirs(root)
    if not levels:
        raise ConfigError(f"{root} holds no level1/, level2/, level3/ folders (KernelBench layout); {WHERE_TO_GET}")
    tasks = []
    for level, d in sorted(levels.items()):
        entries = []
        for f in d.glob("*.py"):
            m = _FILE_RE.match(f.name)
            if m:
                entries.append((int(m.group(1)), m.group(2), f))
        for pid, name, f in sorted(entries):
            code = f.read_text(encoding="utf-8", errors="replace")
            tasks.append(
                Task(
                    id=f"L{level}/{pid}_{name}",
                    source="kernelbench",
                    code=code,
                    name=name,
                    level=level,
                    category=f"level{level}",
                    metadata={"problem_id": pid, "file": str(f), "level": level, "split": "test"},
                )
            )
    return tasks


class KernelBenchDataset(TaskDataset):
    name = "kernelbench"
    description = "KernelBench levels 1-3 from a local folder (dataset.options.root or $CUDA_AGENT_KERNELBENCH)."
    Options = KernelBenchOptions
    splits = ("test",)

    def root(self) -> Path:
        return resolve_path(self.options.root, ENV_VAR, "KernelBench", "dataset.options.root", WHERE_TO_GET)

    def load(self) -> list[Task]:
        return read_kernelbench(self.root())
