"""What every agent tool receives: the workspace, its protected paths and per-episode state."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..safefs import Tree, UnsafePath
from ..types import ToolResult

TREE_KEY = "files.tree"


class ToolError(Exception):
    """A tool call failed in a way the agent should read (bad path, no match, ...)."""


class LocalProcess:
    """A child process in its own process group: ``stdin``/``stdout`` pipes, ``kill()`` kills the group."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self._p = subprocess.Popen(
            argv,
            cwd=str(cwd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )
        self.stdin = self._p.stdin
        self.stdout = self._p.stdout
        self.pid = self._p.pid

    def poll(self) -> int | None:
        return self._p.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._p.wait(timeout)

    def kill(self) -> None:
        try:
            os.killpg(self._p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self._p.kill()
        except ProcessLookupError:
            pass
        try:
            self._p.wait(5)
        except subprocess.TimeoutExpired:
            pass


Spawn = Callable[..., Any]


@dataclass
class ToolContext:
    """Per-episode context handed to :meth:`AgentTool.call`.

    ``workspace``: the folder the agent works in; file tools reach it through :attr:`tree`
    (no symbolic link is followed) and refuse paths outside it. ``protected``: workspace-relative paths (files or folders) the
    agent may read but never write. ``spawn(argv, env=None)``: starts a process inside the
    sandbox (the sandbox session's ``spawn``); a local process in the workspace by default.
    ``env``: extra environment variables for shell commands. ``state``: free per-episode
    state of the tools (files read, shell sessions, background jobs, todos).
    """

    workspace: Path
    protected: list[str] = field(default_factory=list)
    spawn: Spawn | None = None
    env: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.workspace = Path(self.workspace).resolve()

    def start_process(self, argv: list[str], env: dict[str, str] | None = None) -> Any:
        merged = dict(self.env)
        merged.update(env or {})
        if self.spawn is not None:
            return self.spawn(argv, env=merged)
        return LocalProcess(argv, self.workspace, merged)

    @property
    def tree(self) -> Tree:
        """The workspace, reached without following symbolic links (:mod:`cuda_agent.core.safefs`)."""
        tree = self.state.get(TREE_KEY)
        if tree is None or tree.root != self.workspace:
            tree = self.state[TREE_KEY] = Tree(self.workspace)
        return tree

    def locate(self, path: str, for_write: bool = False) -> str:
        """``path`` as a workspace-relative path ("." for the workspace itself); ToolError
        when it leaves the workspace, or names a protected path and ``for_write``. Links
        are not resolved: the file operations refuse them (see :attr:`tree`)."""
        if not isinstance(path, str) or not path.strip():
            raise ToolError("a file path is required")
        try:
            rel = self.tree.rel(path)
        except UnsafePath as exc:
            raise ToolError(str(exc)) from None
        if for_write:
            for prot in self.protected:
                prot = prot.strip("/")
                if rel == prot or rel.startswith(prot + "/"):
                    raise ToolError(f"{rel} is read-only (protected); write only your own files")
        return rel

    def relative(self, path: Path | str) -> str:
        """A path of the workspace as the agent names it (relative to the workspace)."""
        try:
            return self.tree.rel(str(path))
        except UnsafePath:
            return str(path)

    def on_close(self, fn: Callable[[], None]) -> None:
        self._closers.append(fn)

    def close(self) -> None:
        """Stop everything the tools started (shells, background jobs)."""
        while self._closers:
            fn = self._closers.pop()
            try:
                fn()
            except Exception:
                pass


def ok(call_name: str, content: str) -> ToolResult:
    return ToolResult(call_id="", name=call_name, content=content, ok=True)


def fail(call_name: str, content: str) -> ToolResult:
    return ToolResult(call_id="", name=call_name, content=content, ok=False)


def function_schema(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """An OpenAI function-calling tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }
