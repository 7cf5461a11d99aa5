"""Errors that reach users: each carries one line that names the problem."""

from __future__ import annotations

import difflib
from typing import Iterable


class CudaAgentError(Exception):
    """Base class for errors shown to users as a single line (no stack trace)."""

    def one_line(self) -> str:
        return " ".join(str(self).split())


class ConfigError(CudaAgentError):
    """A run configuration is wrong: unknown key, unknown plugin, bad value."""


class PluginError(CudaAgentError):
    """A plugin could not be found, loaded or built."""


class TaskError(CudaAgentError):
    """A task file is malformed (syntax error, missing get_inputs, ...)."""


class InfrastructureError(CudaAgentError):
    """A service the run depends on failed (a policy endpoint down after its retries).

    Such a failure says nothing about the model: an episode it ends is marked
    ``infra_error`` and is neither scored nor rewarded.
    """


def closest(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates closest to ``word``; falls back to prefix matches."""
    pool = sorted(set(candidates))
    found = difflib.get_close_matches(word, pool, n=n, cutoff=0.5)
    if not found:
        found = [c for c in pool if c.startswith(word[:2])][:n]
    return found


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    pool = sorted(set(candidates))
    near = closest(word, pool)
    if near:
        return "did you mean " + " or ".join(repr(x) for x in near) + "?"
    if pool:
        return "valid: " + ", ".join(pool)
    return "nothing is registered"
