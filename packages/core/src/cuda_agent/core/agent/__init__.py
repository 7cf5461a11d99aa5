"""The agent loop: multi-turn tool use with token-exact trajectories.

API summary
-----------
``run_episode(task, policy, env, options=None, on_event=None) -> Trajectory`` (async;
``run_episode_sync`` for plain callers) runs one ReAct episode:

1. ``env.initial_messages(task)`` gives the first chat messages (system prompt + SKILL.md +
   the task); ``env.tools()`` the tools offered (OpenAI function schemas);
   ``env.tool_context()`` the :class:`~cuda_agent.core.tools.ToolContext` they run in.
2. Each turn the policy answers:

   * chat-level policies (``openai``, ``replay``): ``policy.chat(messages, tool_schemas,
     sampling) -> ChatReply(content, tool_calls, finish_reason, usage)`` (sync or async);
   * token-level policies (``token_level = True``: ``hf``, ``vllm``): ``policy.tokenizer`` and
     ``policy.generate(prompt_ids, sampling) -> (ids, logprobs, finish_reason)``. The prompt is
     rendered once with the chat template; the sampled ids are appended as they are
     (loss mask 1, their log-probs), tool calls are parsed from the text
     (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, see :mod:`.toolcalls`), and
     tool results are appended as tokens of a fixed formatter (:mod:`.formats`, loss mask 0,
     log-prob 0) followed by the next assistant header. The history is never re-tokenised.

3. Tool calls run in order; malformed calls, unknown tools, refusals by the
   ``check_tool_call`` hook and tool errors become error results for the model. Outputs
   longer than ``options.tool_output_chars`` keep their head and tail.
   ``env.on_tool_result(call, result, turn)`` returns candidates; the loop merges them by
   files and keeps ``trajectory.best`` (correct, highest speedup vs torch.compile).
4. The episode ends with ``finish_reason`` "done" (no tool call and a last line ``DONE``),
   "no_tool_call" (a refusal or plain stop), "max_turns", "context" (budget of
   ``options.context_tokens`` spent) or "error" (policy failure); then
   ``env.finalize(trajectory)`` returns the reward.

Also here: :class:`Environment` (protocol) and :class:`FolderEnvironment` (a folder with real
tools and a pluggable score), :class:`TrajectoryStore` (durable JSONL),
:func:`render_transcript` (Markdown), :class:`ContextBudget` and :func:`truncate_middle`, and
:class:`EpisodeStepper` (an episode whose turns another framework supplies: TRL, OpenEnv, verl).

For tests: :mod:`cuda_agent.core.agent.testing` (``ScriptedChatServer``: a chat-completions
server on loopback with scripted answers, errors and dropped connections) and
:func:`cuda_agent.core.policies.tiny.build_tiny_model` (a random-weight Qwen2 with a
tokenizer trained in-process and a ChatML tool template, loadable by transformers/vLLM).
The CUDA/CPU environment is ``cuda_agent.sandbox.workspace.environment.CudaEnvironment``.
"""

from .budget import ContextBudget, truncate_middle
from .environment import DEFAULT_SYSTEM_PROMPT, Environment, FolderEnvironment, build_tools, task_message
from .formats import FORMATS, ToolFormat, get_format
from .loop import (
    AgentOptions,
    ChatReply,
    PolicyError,
    best_candidate,
    candidate_key,
    record_candidate,
    render_prompt_ids,
    run_episode,
    run_episode_sync,
)
from .stepper import EpisodeOver, EpisodeStepper, StepResult
from .store import TrajectoryStore, trajectory_from_dict
from .toolcalls import format_tool_call, parse_tool_calls
from .transcript import render_transcript

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "FORMATS",
    "AgentOptions",
    "ChatReply",
    "ContextBudget",
    "EpisodeOver",
    "EpisodeStepper",
    "Environment",
    "FolderEnvironment",
    "PolicyError",
    "StepResult",
    "ToolFormat",
    "TrajectoryStore",
    "best_candidate",
    "build_tools",
    "candidate_key",
    "format_tool_call",
    "get_format",
    "parse_tool_calls",
    "record_candidate",
    "render_prompt_ids",
    "render_transcript",
    "run_episode",
    "run_episode_sync",
    "task_message",
    "trajectory_from_dict",
    "truncate_middle",
]
