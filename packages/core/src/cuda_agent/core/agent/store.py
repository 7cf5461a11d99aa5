"""Durable trajectory storage: one JSON line per finished trajectory.

Each append writes the record and its newline, flushes and fsyncs. A record torn by a
crash mid-write (no final newline, or bad JSON) is skipped on read, and the next append
starts on a fresh line so it is never glued to a torn one.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Iterator

from ..types import (
    Candidate,
    CandidateOutcome,
    CheckResult,
    CompileResult,
    FailureCategory,
    ProfileResult,
    RewardResult,
    Timing,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
    VerifyResult,
)


def _timing(d: dict | None) -> Timing | None:
    return Timing(**d) if d else None


def outcome_from_dict(d: dict | None) -> CandidateOutcome:
    d = d or {}
    c = d.get("compile")
    v = d.get("verify")
    p = d.get("profile")
    return CandidateOutcome(
        compile=CompileResult(**c) if c else None,
        verify=VerifyResult(
            **{**v, "failure": FailureCategory(v.get("failure", "none")),
               "checks": [CheckResult(**ch) for ch in v.get("checks", [])]}
        ) if v else None,
        profile=ProfileResult(
            **{**p, "failure": FailureCategory(p.get("failure", "none")), "candidate": _timing(p.get("candidate")),
               "eager": _timing(p.get("eager")), "compile": _timing(p.get("compile"))}
        ) if p else None,
    )


def reward_from_dict(d: dict | None) -> RewardResult | None:
    if not d:
        return None
    return RewardResult(**{**d, "failure": FailureCategory(d.get("failure", "none"))})


def candidate_from_dict(d: dict | None) -> Candidate | None:
    if not d:
        return None
    return Candidate(turn=d["turn"], files=dict(d.get("files", {})), outcome=outcome_from_dict(d.get("outcome")),
                     reward=reward_from_dict(d.get("reward")))


def trajectory_from_dict(d: dict) -> Trajectory:
    """Rebuild a :class:`Trajectory` (with nested dataclasses) from ``Trajectory.to_dict()``."""
    turns = []
    for t in d.get("turns", []):
        turns.append(Turn(
            index=t["index"], assistant=t.get("assistant", ""),
            tool_calls=[ToolCall(**c) for c in t.get("tool_calls", [])],
            tool_results=[ToolResult(**r) for r in t.get("tool_results", [])],
            response_span=tuple(t["response_span"]) if t.get("response_span") else None,
            seconds=t.get("seconds", 0.0),
        ))
    return Trajectory(
        id=d["id"], task_id=d["task_id"], turns=turns, messages=list(d.get("messages", [])),
        prompt_ids=list(d.get("prompt_ids", [])), response_ids=list(d.get("response_ids", [])),
        loss_mask=list(d.get("loss_mask", [])), rollout_logprobs=list(d.get("rollout_logprobs", [])),
        candidates=[candidate_from_dict(c) for c in d.get("candidates", [])],
        best=candidate_from_dict(d.get("best")), reward=reward_from_dict(d.get("reward")),
        finish_reason=d.get("finish_reason", ""), metadata=dict(d.get("metadata", {})),
    )


class TrajectoryStore:
    """Append-only JSONL file of trajectories (thread-safe within a process)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.skipped = 0  # torn or unreadable lines met by the last read

    def append(self, trajectory: Trajectory | dict) -> None:
        record = trajectory.to_dict() if isinstance(trajectory, Trajectory) else trajectory
        line = (json.dumps(record, default=str) + "\n").encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size:
                    os.lseek(fd, size - 1, os.SEEK_SET)
                    if os.read(fd, 1) != b"\n":
                        line = b"\n" + line  # a torn record before us: start on a new line
                view = memoryview(line)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)

    def records(self) -> Iterator[dict[str, Any]]:
        """Complete records in file order; torn or corrupt lines are skipped (counted in ``skipped``)."""
        self.skipped = 0
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    self.skipped += 1  # torn last line
                    continue
                text = raw.strip()
                if not text:
                    continue
                try:
                    yield json.loads(text)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    self.skipped += 1

    def __iter__(self) -> Iterator[Trajectory]:
        for rec in self.records():
            yield trajectory_from_dict(rec)

    def ids(self) -> set[str]:
        return {r.get("id") for r in self.records()}
