"""The environment an agent acts in: its tools, first messages, candidates and reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from ..interfaces import AgentTool
from ..types import Candidate, RewardResult, Task, ToolCall, ToolResult, Trajectory
from ..tools.base import ToolContext

DEFAULT_SYSTEM_PROMPT = """\
You are an expert performance engineer working in a workspace folder through tools.
Goal: make the program in model.py faster with custom kernels while keeping its results
correct. Work step by step: read the files, plan, write code, compile, verify, profile,
improve. Call tools to act; every tool result comes back to you.
When you are finished, answer without calling any tool and end your answer with a line
containing only DONE."""


@runtime_checkable
class Environment(Protocol):
    """What :func:`~cuda_agent.core.agent.run_episode` needs from an environment.

    * ``tools()``: the tools offered (their ``schema()`` is sent to the model).
    * ``tool_context()``: the :class:`ToolContext` the tools run in (workspace, sandbox spawn).
    * ``initial_messages(task)``: the chat messages the episode starts from.
    * ``on_tool_result(call, result, turn)``: called after each tool call; returns the
      candidates it produced (new or updated; the loop merges by identical files).
    * ``finalize(trajectory)``: called once at the end (``trajectory.best`` is set); returns
      the episode's reward (or None) and may leave the best files in the workspace.
    * ``close()``: release everything.
    """

    def tools(self) -> list[AgentTool]: ...

    def tool_context(self) -> ToolContext: ...

    def initial_messages(self, task: Task) -> list[dict]: ...

    def on_tool_result(self, call: ToolCall, result: ToolResult, turn: int) -> list[Candidate]: ...

    def finalize(self, trajectory: Trajectory) -> RewardResult | None: ...

    def close(self) -> None: ...


def build_tools(names: Iterable[str] | None = None, pm: Any = None, options: dict | None = None) -> list[AgentTool]:
    """Instantiate agent tools by name through the plugin manager (all registered ones by default).

    ``options`` maps a tool name to its options mapping.
    """
    from ..plugins import get_plugin_manager
    from ..tools import DEFAULT_TOOL_NAMES

    pm = pm or get_plugin_manager()
    wanted = list(names) if names is not None else DEFAULT_TOOL_NAMES
    opts = options or {}
    return [pm.create("agent_tool", {"name": n, "options": opts.get(n, {})}, where="tools") for n in wanted]


def task_message(task: Task, workspace_note: str = "") -> str:
    head = f"Task {task.id}" + (f" ({task.name})" if task.name else "")
    body = [head + ": make this PyTorch program faster.", "", "model.py:", "```python", task.code.rstrip(), "```"]
    if workspace_note:
        body += ["", workspace_note]
    return "\n".join(body)


class FolderEnvironment:
    """A plain environment over a folder: real tools, no compiler, a pluggable score.

    Good for tests, synthetic training environments and as a base class.
    ``score(trajectory, env) -> RewardResult | None`` gives the reward;
    ``check(call, result, turn, env) -> list[Candidate]`` may record candidates.
    SKILL.md in the folder, if present, is added to the system prompt.
    """

    def __init__(
        self,
        workspace: str | Path,
        tools: list[AgentTool] | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        protected: list[str] | None = None,
        score: Callable[[Trajectory, "FolderEnvironment"], RewardResult | None] | None = None,
        check: Callable[..., list[Candidate]] | None = None,
        spawn: Any = None,
        env: dict[str, str] | None = None,
    ):
        self.workspace = Path(workspace)
        self._tools = tools if tools is not None else build_tools()
        self.system_prompt = system_prompt
        self._score = score
        self._check = check
        self._ctx = ToolContext(self.workspace, protected=list(protected or []), spawn=spawn, env=dict(env or {}))

    def tools(self) -> list[AgentTool]:
        return self._tools

    def tool_context(self) -> ToolContext:
        return self._ctx

    def skill_text(self) -> str:
        skill = self.workspace / "SKILL.md"
        return skill.read_text() if skill.exists() else ""

    def initial_messages(self, task: Task) -> list[dict]:
        system = self.system_prompt
        skill = self.skill_text()
        if skill:
            system = f"{system}\n\n# SKILL.md\n\n{skill.strip()}"
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": task_message(task, f"Your workspace is {self.workspace}.")},
        ]

    def on_tool_result(self, call: ToolCall, result: ToolResult, turn: int) -> list[Candidate]:
        return list(self._check(call, result, turn, self) or []) if self._check else []

    def finalize(self, trajectory: Trajectory) -> RewardResult | None:
        return self._score(trajectory, self) if self._score else None

    def close(self) -> None:
        self._ctx.close()
