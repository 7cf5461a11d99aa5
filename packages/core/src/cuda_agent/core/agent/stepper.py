"""An episode driven from outside: another framework supplies the model's turns.

RL frameworks with a generation loop of their own (TRL's GRPO trainer, an OpenEnv server,
verl's agent loops) call into an environment once per model turn or per tool call.
:class:`EpisodeStepper` gives them the agent loop's semantics without its generation:
the same tool dispatch (unknown tools, malformed calls, ``check_tool_call`` refusals and
tool errors become error results the model reads), candidate tracking, turn limit and
reward from ``env.finalize``. A step after the end raises :class:`EpisodeOver`, a
one-line error the framework can show or turn into a terminal step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import CudaAgentError
from ..types import Task, ToolCall, ToolResult, Trajectory, Turn
from .environment import Environment
from .loop import AgentOptions, _is_done, _openai_call, _Runner, run_sync
from .toolcalls import parse_tool_calls


class EpisodeOver(CudaAgentError):
    """A step was sent to an episode that has ended (turn limit, final answer or finish())."""


@dataclass
class StepResult:
    """What one model turn produced: its tool results and whether the episode ended."""

    results: list[ToolResult] = field(default_factory=list)
    done: bool = False
    finish_reason: str = ""  # set when done: "done", "no_tool_call", "max_turns", ...

    @property
    def observation(self) -> str:
        """The tool results as one text, in call order."""
        return "\n\n".join(r.content for r in self.results)


class _External:
    """Stands for the policy of another framework (only its name is recorded)."""

    token_level = False

    def __init__(self, name: str):
        self.name = name


def as_tool_call(call: Any, call_id: str) -> ToolCall:
    """A :class:`ToolCall` from a ToolCall, ``{"name", "arguments"}`` or an OpenAI ``{"function": ...}`` mapping.

    Arguments given as a JSON string are parsed; anything unreadable becomes a call with
    ``error`` set, which the loop answers with an error result.
    """
    import json

    if isinstance(call, ToolCall):
        return call
    if not isinstance(call, dict):
        return ToolCall(id=call_id, name="", raw_arguments=str(call),
                        error='a tool call must be {"name": ..., "arguments": {...}}')
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    name = fn.get("name")
    args = fn.get("arguments", {})
    cid = str(call.get("id") or call_id)
    if not isinstance(name, str) or not name:
        return ToolCall(id=cid, name="", raw_arguments=json.dumps(call, default=str),
                        error='a tool call needs a "name"')
    raw = args if isinstance(args, str) else json.dumps(args, default=str)
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(id=cid, name=name, raw_arguments=raw, error=f"arguments of {name} are not valid JSON ({exc.msg})")
    if not isinstance(args, dict):
        return ToolCall(id=cid, name=name, raw_arguments=raw, error=f"arguments of {name} must be a JSON object")
    return ToolCall(id=cid, name=name, arguments=args, raw_arguments=raw)


class EpisodeStepper:
    """One episode of ``task`` in ``env``, advanced by :meth:`step` (a model turn) or
    :meth:`call_tool` (one call, for frameworks that dispatch calls themselves).

    ``options.max_turns`` bounds the turns; ``finish()`` ends the episode and returns the
    trajectory with its reward (once; later calls return the same trajectory). ``pm``: whose
    ``check_tool_call`` hook is asked (as in :func:`~cuda_agent.core.agent.run_episode`). The
    environment is not closed here.
    """

    def __init__(self, task: Task, env: Environment, options: AgentOptions | None = None,
                 framework: str = "external", pm: Any = None):
        self.task = task
        self.env = env
        self.options = options or AgentOptions()
        self._runner = _Runner(task, _External(framework), env, self.options, None, pm)
        self.traj: Trajectory = self._runner.traj
        self.traj.messages = [dict(m) for m in env.initial_messages(task)]
        self._ended = False

    # -- what the framework shows the model ---------------------------------------------

    @property
    def messages(self) -> list[dict]:
        return self.traj.messages

    @property
    def schemas(self) -> list[dict]:
        """The tools offered, as OpenAI function schemas."""
        return list(self._runner.schemas)

    @property
    def tool_names(self) -> list[str]:
        return list(self._runner.tools)

    @property
    def done(self) -> bool:
        return bool(self.traj.finish_reason)

    @property
    def turns_left(self) -> int:
        return max(0, self.options.max_turns - len(self.traj.turns))

    # -- stepping -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.done:
            raise EpisodeOver(f"episode of task {self.task.id} is over ({self.traj.finish_reason} after "
                              f"{len(self.traj.turns)} turns); start a new episode (reset) to go on")

    def step(self, content: str = "", tool_calls: list | None = None) -> StepResult:
        """One model turn: ``content`` (text; ``<tool_call>`` blocks are parsed when
        ``tool_calls`` is None) and its tool calls, run in order."""
        self._check_open()
        index = len(self.traj.turns)
        if tool_calls is None:
            content, calls = parse_tool_calls(content or "", id_prefix=f"call_{index}_")
        else:
            calls = [as_tool_call(c, f"call_{index}_{i}") for i, c in enumerate(tool_calls)]
        turn = Turn(index=index, assistant=content or "", tool_calls=calls)
        msg: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if calls:
            msg["tool_calls"] = [_openai_call(c) for c in calls]
        self.traj.messages.append(msg)
        self.traj.turns.append(turn)
        if not calls:
            self._end("done" if _is_done(content or "", self.options.done_marker) else "no_tool_call")
            return StepResult([], True, self.traj.finish_reason)
        for call in calls:
            result = run_sync(self._runner.run_tool(call, index))
            turn.tool_results.append(result)
            self.traj.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name,
                                       "content": result.content})
        if len(self.traj.turns) >= self.options.max_turns:
            self._end("max_turns")
        return StepResult(list(turn.tool_results), self.done, self.traj.finish_reason)

    def call_tool(self, name: str, arguments: dict | str | None = None) -> ToolResult:
        """Run one tool call as a turn of its own; raises :class:`EpisodeOver` after the end."""
        self._check_open()
        index = len(self.traj.turns)
        result = self.step("", [{"id": f"call_{index}_0", "name": name, "arguments": arguments or {}}])
        return result.results[0]

    def _end(self, reason: str) -> None:
        if not self.traj.finish_reason:
            self._runner.summarize(reason)

    def finish(self, reason: str = "stopped") -> Trajectory:
        """End the episode (``reason`` when it is still running) and score it; returns the trajectory."""
        self._end(reason)
        if not self._ended:
            self._ended = True
            run_sync(self._runner.finalize())
        return self.traj

    @property
    def reward(self) -> float | None:
        """The reward value once finished (None before, or when the environment gave none)."""
        r = self.traj.reward
        return r.value if (self._ended and r is not None) else None
