"""Step checkpoints that survive ``kill -9``: written to a temporary folder, then renamed.

Layout of one stage folder (``<run>/stages/<NN>-<name>/``)::

    checkpoints/step-000007/   actor/ critic/ (HF weights), actor_state/ critic_state/
                               (optimiser or DeepSpeed state), trainer.json, COMPLETE
    final/                     actor/ critic/ and COMPLETE when the stage has finished
    kept/step-000007.jsonl     trajectories an RFT step kept (value pretraining reads them)

A folder without ``COMPLETE`` (a crash while writing) is ignored and removed on resume.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"


def step_dir(stage_dir: Path, step: int) -> Path:
    return Path(stage_dir) / "checkpoints" / f"step-{step:06d}"


def is_complete(path: Path) -> bool:
    return (Path(path) / MARKER).exists()


def latest_checkpoint(stage_dir: Path) -> tuple[int, Path] | None:
    """The newest complete step checkpoint of a stage; incomplete leftovers are deleted."""
    root = Path(stage_dir) / "checkpoints"
    if not root.exists():
        return None
    best = None
    for p in sorted(root.iterdir()):
        if p.name.startswith("step-") and p.is_dir() and is_complete(p) and "." not in p.name:
            step = int(p.name.split("-")[1])
            if best is None or step > best[0]:
                best = (step, p)
        elif ".tmp" in p.name:
            shutil.rmtree(p, ignore_errors=True)
    return best


class CheckpointWriter:
    """Writes one checkpoint folder atomically: ``with CheckpointWriter(final_path) as tmp: ...``."""

    def __init__(self, final: Path, is_main: bool = True):
        self.final = Path(final)
        self.tmp = self.final.with_name(self.final.name + f".tmp{os.getpid()}")
        self.is_main = is_main

    def __enter__(self) -> Path:
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        _fsync_tree(self.tmp)
        (self.tmp / MARKER).write_text("ok\n")
        if self.final.exists():
            shutil.rmtree(self.final)
        os.replace(self.tmp, self.final)
        _fsync_dir(self.final.parent)


def prune(stage_dir: Path, keep: int) -> None:
    root = Path(stage_dir) / "checkpoints"
    if keep <= 0 or not root.exists():
        return
    done = sorted(p for p in root.iterdir() if p.name.startswith("step-") and "." not in p.name and is_complete(p))
    for p in done[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def write_json(path: Path, data: Any) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float))
    os.replace(tmp, path)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                pass


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
