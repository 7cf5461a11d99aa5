"""Reading and writing row tables: JSON lines, Parquet and Arrow (pyarrow when installed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from cuda_agent.core.errors import ConfigError

TABLE_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".feather")


def _pyarrow(path: Path):
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"reading {path.name} needs pyarrow (pip install pyarrow), or convert it to .jsonl"
        ) from exc
    import pyarrow as pa

    return pa


def read_rows(path: Path) -> list[dict]:
    """Rows of one table file as dicts."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8")
        if suffix == ".json" and text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = []
            for n, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{n}: not a JSON line ({exc.msg})") from exc
        return [r for r in rows if isinstance(r, dict)]
    if suffix == ".parquet":
        _pyarrow(path)
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix in (".arrow", ".feather"):
        _pyarrow(path)
        import pyarrow.ipc as ipc

        # Hugging Face ``save_to_disk`` writes the IPC stream format; feather/arrow files the file format
        try:
            with open(path, "rb") as f:
                return ipc.open_stream(f).read_all().to_pylist()
        except Exception:  # noqa: BLE001
            with open(path, "rb") as f:
                return ipc.open_file(f).read_all().to_pylist()
    raise ConfigError(f"unsupported table file {path.name}; use one of {', '.join(TABLE_SUFFIXES)}")


def table_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    # a synthesis output folder: its rows are tasks.* (candidates.jsonl is the judging log)
    own = [path / n for n in ("tasks.parquet", "tasks.jsonl") if (path / n).is_file()]
    if own and (path / "candidates.jsonl").exists():
        return own[:1]
    # in folders, .json files are metadata (save_to_disk's dataset_info.json, state.json); name one to read it
    return [
        p for p in sorted(path.rglob("*"))
        if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES and p.suffix.lower() != ".json"
    ]


def write_rows(rows: Iterable[dict], path: Path) -> Path:
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        return path
    pa = _pyarrow(path)
    table = pa.Table.from_pylist(rows)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif suffix in (".arrow", ".feather"):
        import pyarrow.ipc as ipc

        with open(path, "wb") as f, ipc.new_stream(f, table.schema) as w:
            w.write_table(table)
    else:
        raise ConfigError(f"unsupported output format {path.suffix}")
    return path
