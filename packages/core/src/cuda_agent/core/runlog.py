"""Structured logs: JSON lines in the run folder, a readable form on the console.

Ids bound with :func:`bind` (run_id, task_id, trajectory_id, turn) travel with every
event through context variables, also across asyncio tasks.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

import structlog
from structlog.contextvars import bind_contextvars, bound_contextvars, unbind_contextvars

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class _Sinks:
    def __init__(self) -> None:
        self.files: list[TextIO] = []
        self.console = True
        self.console_level = 20
        self.lock = threading.Lock()

    def tee_json(self, logger: Any, method: str, event: dict) -> dict:
        if self.files:
            line = json.dumps(event, default=str)
            with self.lock:
                for f in self.files:
                    f.write(line + "\n")
                    f.flush()
        if not self.console or _LEVELS.get(method, 20) < self.console_level:
            raise structlog.DropEvent
        return event


_sinks = _Sinks()


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is now (it may be replaced after configure())."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()
_configured = False


def configure(level: str = "info", console: bool = True) -> None:
    """Set up structlog once per process; later calls adjust the console."""
    global _configured
    _sinks.console = console
    _sinks.console_level = _LEVELS.get(level, 20)
    if _configured:
        return
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _sinks.tee_json,
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    _configured = True


def attach_file(path: str | Path) -> TextIO:
    """Write every event as a JSON line to ``path`` (appending)."""
    configure(console=_sinks.console)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", encoding="utf-8")
    with _sinks.lock:
        _sinks.files.append(f)
    return f


def detach_file(f: TextIO) -> None:
    with _sinks.lock:
        if f in _sinks.files:
            _sinks.files.remove(f)
    f.close()


def get_logger(**initial: Any) -> Any:
    configure(console=_sinks.console)
    return structlog.get_logger().bind(**initial)


bind = bind_contextvars
unbind = unbind_contextvars
bound = bound_contextvars
