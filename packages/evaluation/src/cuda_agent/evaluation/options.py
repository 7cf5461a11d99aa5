"""The types and bounds of the ``eval:`` config section, for the checks made when a run
config is composed. The defaults live in ``configs/eval.yaml``; this class only types them
(its fields have no defaults of their own)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cuda_agent.core.configcheck import bounds


@dataclass
class EvalOptions:
    dataset: dict | None
    levels: int | list | None
    ids: str | list | None
    limit: int | None = field(metadata=bounds(min=0))
    shard: str | None
    solutions: str | None
    attempts: int = field(metadata=bounds(min=1))
    max_turns: int = field(metadata=bounds(min=1))
    workers: int = field(metadata=bounds(min=0))
    margin: float = field(metadata=bounds(min=0.0))
    max_infra_error_share: float = field(metadata=bounds(min=0.0, max=1.0))
    enforce_rules: bool
    rules: str
    verify: dict
    profile: dict
    judge: dict
    formats: list
    title: str | None
    label: str | None
    work_dir: str | None
    keep_workspaces: bool
    progress: bool
