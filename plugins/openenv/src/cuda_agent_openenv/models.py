"""The wire types of the CUDA environment over OpenEnv: one action is one model turn."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel, ConfigDict, Field


class ToolCallSpec(BaseModel):
    """One tool call: a tool the observation's ``tools`` lists, with its JSON arguments."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="tool name, e.g. bash, read, write")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments")
    id: str = Field(default="", description="call id echoed in the result (optional)")


class CudaAction(Action):
    """One model turn: its text and the tool calls it makes.

    With ``tool_calls`` empty, ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks
    in ``content`` are the calls; a turn without calls ends the episode (end it with a line
    ``DONE``) and is scored.
    """

    content: str = Field(default="", description="what the model wrote this turn")
    tool_calls: list[ToolCallSpec] = Field(default_factory=list, description="tool calls, run in order")


class ToolOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_id: str
    name: str
    content: str
    ok: bool


class CudaObservation(Observation):
    """After reset: the task's first messages and the tools' schemas. After a step: the tool
    results. When ``done``: ``reward`` is the judge's reward and ``verdict`` says why."""

    task_id: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list, description="reset only: system + user messages")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="reset only: OpenAI function schemas")
    results: list[ToolOutput] = Field(default_factory=list)
    finish_reason: str = ""
    turns_left: int = 0
    verdict: dict[str, Any] = Field(default_factory=dict, description="when done: correct, failure, speedups")


class CudaState(State):
    task_id: str = ""
    finish_reason: str = ""
    turns_left: int = 0
    reward: float | None = None
