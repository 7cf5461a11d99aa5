"""CUDA-Agent-Ops-6K: string columns ``ops``, ``data_source`` and ``code``.

Reads local Parquet, JSON-lines or Arrow files (``dataset.options.path``, or the
environment variable CUDA_AGENT_OPS6K). Without a local path it tries the Hugging Face
hub through the optional ``datasets`` package, and says how to go offline when that fails.
The same schema is what ``cuda-agent data synthesize`` writes.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import Task

from .base import TaskDataset
from .tables import read_rows, table_files

ENV_VAR = "CUDA_AGENT_OPS6K"
REPO_ID = "BytedTsinghua-SIA/CUDA-Agent-Ops-6K"
COLUMNS = ("ops", "data_source", "code")

from .selection import SelectionOptions  # noqa: E402


@dataclass
class Ops6KOptions(SelectionOptions):
    path: str | None = None  # local file or folder of .parquet/.jsonl/.arrow files
    repo_id: str = REPO_ID
    hub: str = "auto"  # auto: try the hub when no local path is given | never | always
    hub_timeout_s: float = 5.0


def parse_ops(value) -> list[str]:
    """The ``ops`` column as a list: JSON or Python list text, or comma separated names."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    text = str(value).strip()
    if not text:
        return []
    for parse in (json.loads, ast.literal_eval):
        try:
            parsed = parse(text)
        except (ValueError, SyntaxError, TypeError):
            continue
        if isinstance(parsed, (list, tuple)):
            return [str(v) for v in parsed]
        if isinstance(parsed, str):
            text = parsed
            break
    return [p.strip().strip("'\"") for p in re.split(r"[,;]", text.strip("[]")) if p.strip()]


def _short(op: str) -> str:
    return op.rsplit(".", 1)[-1]


def rows_to_tasks(rows: list[dict], origin: str, split: str = "train") -> list[Task]:
    if rows:
        missing = [c for c in ("code",) if c not in rows[0]]
        if missing:
            raise ConfigError(
                f"{origin}: no column {missing[0]!r}; found {', '.join(map(str, rows[0].keys()))} "
                f"(expected {', '.join(COLUMNS)})"
            )
    seen: dict[str, int] = {}
    tasks = []
    for i, row in enumerate(rows):
        ops = parse_ops(row.get("ops"))
        ds = str(row.get("data_source") or "").strip()
        tid = ds or f"ops6k/{i}"
        if tid in seen:
            seen[tid] += 1
            tid = f"{tid}~{seen[tid]}"
        else:
            seen[tid] = 0
        kind = ds.split("#", 1)[0] if "#" in ds else (ds or "ops6k")
        tasks.append(
            Task(
                id=tid,
                source="ops6k",
                code=str(row.get("code") or ""),
                name="_".join(_short(o) for o in ops) or tid,
                level=None,
                category=kind,
                metadata={
                    "ops": ops,
                    "n_ops": len(ops),
                    "data_source": ds,
                    "row": i,
                    "file": origin,
                    "split": str(row.get("split") or split),
                },
            )
        )
    return tasks


def _split_of(path: Path) -> str:
    stem = path.stem.lower()
    for name in ("train", "validation", "test"):
        if stem == name or stem.startswith(name + "-") or stem.startswith(name + "_") or path.parent.name == name:
            return name
    return "train"


def hub_reachable(timeout: float) -> bool:
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        httpx.head(endpoint, timeout=timeout)
        return True
    except httpx.HTTPError:
        return False


class Ops6KDataset(TaskDataset):
    name = "ops6k"
    description = "CUDA-Agent-Ops-6K (ops, data_source, code) from local parquet/jsonl/arrow files or the HF hub."
    Options = Ops6KOptions

    def __init__(self, options=None):
        super().__init__(options)
        self._splits: set[str] = set()

    def available_splits(self) -> tuple[str, ...]:
        self.all_tasks()
        return tuple(sorted(self._splits)) or ("train",)

    def load(self) -> list[Task]:
        path = self.options.path or os.environ.get(ENV_VAR)
        if path and self.options.hub != "always":
            tasks = self.load_local(Path(os.path.expanduser(path)))
        elif self.options.hub == "never":
            raise ConfigError(
                f"no local Ops-6K files: set dataset.options.path=<file or folder> or ${ENV_VAR} "
                "(hub access is off: dataset.options.hub=never)"
            )
        else:
            tasks = self.load_hub()
        self._splits = {t.metadata.get("split", "train") for t in tasks}
        return tasks

    def load_local(self, path: Path) -> list[Task]:
        if not path.exists():
            raise ConfigError(f"Ops-6K files not found at {path}")
        files = table_files(path)
        if not files:
            raise ConfigError(f"{path} holds no .parquet, .jsonl or .arrow files")
        tasks: list[Task] = []
        for f in files:
            tasks.extend(rows_to_tasks(read_rows(f), str(f), _split_of(f)))
        return tasks

    def load_hub(self) -> list[Task]:
        hint = f"download {self.options.repo_id} where the hub is reachable and set dataset.options.path"
        try:
            import datasets as hf_datasets
        except ImportError as exc:
            raise ConfigError(
                f"no local Ops-6K files and the 'datasets' package is not installed; {hint} "
                f"(or ${ENV_VAR}), or pip install datasets"
            ) from exc
        if not hub_reachable(self.options.hub_timeout_s):
            raise ConfigError(f"the Hugging Face hub is unreachable (offline?); {hint} (or ${ENV_VAR})")
        try:
            dd = hf_datasets.load_dataset(self.options.repo_id)
        except Exception as exc:  # noqa: BLE001 - any hub failure becomes one line
            raise ConfigError(
                f"could not load {self.options.repo_id} from the hub ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); {hint}"
            ) from exc
        tasks: list[Task] = []
        for split in dd:
            tasks.extend(rows_to_tasks(list(dd[split]), f"hf://{self.options.repo_id}", split))
        return tasks
