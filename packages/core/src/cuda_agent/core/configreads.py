"""Which config keys a command reads, and the refusal of overrides it would ignore.

The run config is one tree for every command (``train`` reads ``trainer``, ``eval`` reads
``eval``, ``executor check`` only ``executor`` and ``backend``), so a ``key=value`` that is
valid for the tree may still mean nothing to the command it is given to. Each command that
takes overrides declares what it reads (:func:`command_reads`), and :func:`check_overrides`
refuses any override outside it with a one-line :class:`ConfigError` that names the key,
what the command reads and which commands read the key instead.

A declared key covers everything below it (``executor`` covers ``executor.options.address``).
Config files are not checked: one file may serve several commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .errors import ConfigError

EVERYTHING = "*"  # a command that reads the whole config (config show)


@dataclass(frozen=True)
class Reads:
    """The config keys ``cuda-agent <command>`` reads (dotted prefixes, list items by index)."""

    command: str
    keys: tuple[str, ...]
    note: str = ""  # the run's mode that narrows the reads ("the toy environment")

    def covers(self, key: str) -> bool:
        if EVERYTHING in self.keys:
            return True
        return any(key == k or key.startswith(k + ".") for k in self.keys)

    def shown(self) -> str:
        return "every key" if EVERYTHING in self.keys else ", ".join(self.keys)


_REGISTRY: dict[str, Reads] = {}


def command_reads(command: str, *keys: str) -> Reads:
    """Declare (and register) what ``cuda-agent <command>`` reads of the run config."""
    if not keys:
        raise ValueError(f"command {command!r} must read at least one key")
    reads = Reads(command, tuple(keys))
    _REGISTRY[command] = reads
    return reads


def registered() -> dict[str, Reads]:
    """Every command's declared reads, by command path (``"executor check"``)."""
    return dict(_REGISTRY)


def _leaves(key: str, value: Any) -> list[str]:
    """The dotted keys an override sets: a mapping value sets each of its keys."""
    if isinstance(value, dict) and value:
        out: list[str] = []
        for k, v in value.items():
            out += _leaves(f"{key}.{k}", v)
        return out
    return [key]


def unread_keys(reads: Reads, overrides: Iterable[tuple[str, Any]]) -> list[str]:
    """The keys set by ``overrides`` (parsed ``(key, value)`` pairs) that the command does not
    read, in order."""
    out: list[str] = []
    for key, value in overrides:
        if reads.covers(key):
            continue
        out += [k for k in _leaves(key, value) if not reads.covers(k)]
    return out


def readers(key: str) -> list[str]:
    """The registered commands that read ``key`` (those that read everything, and modes of a
    command, left out)."""
    return sorted(c for c, r in _REGISTRY.items() if EVERYTHING not in r.keys and " --" not in c and r.covers(key))


def check_overrides(reads: Reads, overrides: Iterable[tuple[str, Any]]) -> None:
    """Raise a one-line ConfigError for the first override (a parsed ``(key, value)``) the
    command would ignore."""
    unread = unread_keys(reads, overrides)
    if not unread:
        return
    key = unread[0]
    others = [c for c in readers(key) if c != reads.command]  # a mode of this command: its other modes
    where = f"; it matters to: {', '.join('cuda-agent ' + c for c in others)}" if others else ""
    mode = f" ({reads.note})" if reads.note else ""
    raise ConfigError(f"{key} has no effect on `cuda-agent {reads.command}`{mode}, which reads {reads.shown()}; "
                      f"remove it{where}")
