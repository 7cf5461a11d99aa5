"""Built-in sandbox plugin: registers this package's components."""

from __future__ import annotations

from cuda_agent.core.hookspecs import hookimpl  # noqa: F401
