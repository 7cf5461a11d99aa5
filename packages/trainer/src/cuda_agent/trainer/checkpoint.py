"""Step checkpoints that survive ``kill -9``: written to a temporary folder, then renamed.

Layout of one stage folder (``<run>/stages/<NN>-<name>/``)::

    checkpoints/step-000007/   actor/ critic/ (HF weights), actor_state/ critic_state/
                               (optimiser or DeepSpeed state), trainer.json, COMPLETE
    final/                     actor/ critic/ and COMPLETE when the stage has finished
    kept/step-000007.jsonl     trajectories an RFT step kept (value pretraining reads them)

A folder without ``COMPLETE`` (a crash while writing) is ignored and removed on resume.

Step checkpoints are written by :class:`StepCheckpoints`, an ``on_step_end`` hook
implementation a stage attaches to the run's plugin manager while it trains.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from cuda_agent.core.hookspecs import hookimpl

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


class StepCheckpoints:
    """Checkpointing of one training stage, as the ``on_step_end`` hook: every ``every`` steps
    of the stage and after its last (``every`` 0: never), after the trackers have the step's
    metrics (``trylast``), so a run killed while a checkpoint is written has logged that step
    and redoes it. Keeps the newest ``keep``. Every rank takes part (DeepSpeed state is sharded).

    ``stage_offset``: the run's step number of the stage's step 0 (the hook gets run steps).
    """

    def __init__(self, stage_dir: Path, stage_index: int, stage_offset: int, steps: int, every: int, keep: int,
                 actor: Any, critic: Any, tokenizer: Any, is_main: bool = True):
        self.stage_dir = Path(stage_dir)
        self.index, self.offset, self.steps = stage_index, stage_offset, steps
        self.every, self.keep = every, keep
        self.actor, self.critic, self.tokenizer = actor, critic, tokenizer
        self.is_main = is_main

    @hookimpl(trylast=True)
    def on_step_end(self, run: Any, step: int, metrics: Mapping[str, float]) -> None:
        local = step - self.offset
        if self.every <= 0 or not ((local + 1) % self.every == 0 or local == self.steps - 1):
            return
        self.save(step_dir(self.stage_dir, local), {"stage": self.index, "step": local, "metrics": dict(metrics)})
        if self.is_main:
            prune(self.stage_dir, self.keep)

    def save(self, path: Path, info: dict) -> None:
        actor, critic = self.actor, self.critic
        actor_sd = actor.full_state_dict() if actor is not None else None
        critic_sd = critic.full_state_dict() if critic is not None else None
        writer = CheckpointWriter(path, is_main=self.is_main)
        tmp = writer.tmp
        if self.is_main:
            writer.__enter__()
        _barrier()
        try:
            if actor is not None:
                actor.save_state(tmp / "actor_state")
            if critic is not None:
                critic.save_state(tmp / "critic_state")
            if self.is_main:
                if actor is not None:
                    actor.module.save_pretrained(tmp / "actor", state_dict=actor_sd)
                    self.tokenizer.save_pretrained(tmp / "actor")
                if critic is not None:
                    critic.module.save_pretrained(tmp / "critic", state_dict=critic_sd)
                write_json(tmp / "trainer.json", info)
        except BaseException as exc:
            if self.is_main:
                writer.__exit__(type(exc), exc, None)
            raise
        _barrier()
        if self.is_main:
            writer.__exit__(None, None, None)
        _barrier()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


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
            _fsync(os.path.join(dirpath, name))


def _fsync_dir(path: Path) -> None:
    _fsync(str(path))


def _fsync(path: str) -> None:
    """Flush a file's (or a folder's entries') data to disk; a path that cannot be opened is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
