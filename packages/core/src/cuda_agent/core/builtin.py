"""Core's own built-in plugin: registered through the same hooks as any other."""

from __future__ import annotations

from .hookspecs import hookimpl
from .trackers import ConsoleTracker, JsonlTracker


@hookimpl
def register_trackers(register):
    register(JsonlTracker)
    register(ConsoleTracker)
