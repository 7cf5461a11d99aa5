"""Selecting tasks from a dataset: by level, id, name pattern, split and random sample."""

from __future__ import annotations

import fnmatch
import random
import re
from dataclasses import dataclass
from typing import Iterable

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import Task


@dataclass
class SelectionOptions:
    """Options every dataset plugin shares (mixed into each plugin's ``Options``)."""

    levels: list[int] | None = None  # keep tasks of these levels (KernelBench 1-3)
    ids: list[str] | None = None  # keep these task ids (exact, or glob patterns like "L1/1*")
    pattern: str | None = None  # glob on the task name or id; "re:<regex>" for a regex
    split: str | None = None  # "train", "train[:100]", "train[10%:20%]"
    sample: int | None = None  # keep a random sample of this many tasks (seeded)
    seed: int = 0
    limit: int | None = None  # keep the first N after everything else
    validate: str = "static"  # none | static: skip tasks whose code is malformed (reported)


_SPLIT_RE = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:\[\s*([^\]:]*)\s*:\s*([^\]]*)\s*\])?\s*$")


def parse_split(spec: str) -> tuple[str, str | None, str | None]:
    m = _SPLIT_RE.match(spec)
    if not m:
        raise ConfigError(f"bad split {spec!r}; use NAME, NAME[a:b] or NAME[a%:b%]")
    return m.group(1), (m.group(2) or None), (m.group(3) or None)


def _bound(text: str | None, n: int, default: int) -> int:
    if text is None or text == "":
        return default
    text = text.strip()
    try:
        if text.endswith("%"):
            v = int(round(float(text[:-1]) * n / 100.0))
        else:
            v = int(text)
    except ValueError as exc:
        raise ConfigError(f"bad split bound {text!r}; use an integer or a percentage") from exc
    if v < 0:
        v += n
    return max(0, min(n, v))


def apply_split(tasks: list[Task], spec: str | None, available: Iterable[str]) -> list[Task]:
    """Keep the tasks of split ``spec`` (tasks carry ``metadata['split']``)."""
    if not spec:
        return tasks
    name, lo, hi = parse_split(spec)
    avail = sorted(set(available))
    if name not in avail:
        raise ConfigError(f"unknown split {name!r}; this dataset has: {', '.join(avail) or 'none'}")
    chosen = [t for t in tasks if t.metadata.get("split", avail[0] if len(avail) == 1 else None) == name]
    n = len(chosen)
    return chosen[_bound(lo, n, 0) : _bound(hi, n, n)]


def _matches(value: str, patterns: list[str]) -> bool:
    return any(value == p or fnmatch.fnmatchcase(value, p) for p in patterns)


def select(tasks: list[Task], opts: SelectionOptions, splits: Iterable[str] = ("train",)) -> list[Task]:
    """Apply split, levels, ids, pattern, sample and limit, in that order."""
    out = apply_split(list(tasks), opts.split, splits)
    if opts.levels:
        levels = {int(x) for x in opts.levels}
        out = [t for t in out if t.level in levels]
    if opts.ids:
        wanted = [str(i) for i in opts.ids]
        out = [t for t in out if _matches(t.id, wanted) or _matches(t.name, wanted)]
    if opts.pattern:
        pat = opts.pattern
        if pat.startswith("re:"):
            try:
                rx = re.compile(pat[3:])
            except re.error as exc:
                raise ConfigError(f"bad pattern regex {pat[3:]!r}: {exc}") from exc
            out = [t for t in out if rx.search(t.name) or rx.search(t.id)]
        else:
            out = [t for t in out if fnmatch.fnmatch(t.name, pat) or fnmatch.fnmatch(t.id, pat)]
    if opts.sample is not None:
        if opts.sample < 0:
            raise ConfigError(f"sample must be >= 0, got {opts.sample}")
        if opts.sample < len(out):
            rng = random.Random(opts.seed)
            keep = set(rng.sample(range(len(out)), opts.sample))
            out = [t for i, t in enumerate(out) if i in keep]
    if opts.limit is not None:
        out = out[: max(0, opts.limit)]
    return out
