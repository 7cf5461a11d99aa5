"""JSON-lines files of a run that may be killed at any moment: appends are flushed and
synced and start on a fresh line, a line cut short is skipped when read, and a rewrite
replaces the file atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")


def append_lines(path: Path, lines: Iterable[str]) -> None:
    """Append ``lines`` (without their newlines) to ``path``, synced to disk."""
    text = "".join(line + "\n" for line in lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        if f.tell() > 0:  # a kill can cut the previous write short: start on a fresh line
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write("\n")
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read_records(path: Path, make: Callable[[dict], T]) -> Iterator[T]:
    """``make(record)`` for every whole line of ``path`` (none when it does not exist)."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield make(json.loads(line))
            except (json.JSONDecodeError, TypeError):
                continue  # a line cut short by a kill


def rewrite_lines(path: Path, lines: Iterable[str]) -> None:
    """Replace ``path`` by ``lines`` at once: a kill leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def dumps(record: Any) -> str:
    return json.dumps(record, default=str)


def known_fields(cls: type[T], d: dict) -> T:
    """A dataclass ``cls`` from a record, ignoring keys it has no field for."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in d.items() if k in names})
