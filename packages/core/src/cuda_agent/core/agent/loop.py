"""The ReAct agent loop: generate, call tools, feed results back, until done or a limit."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from ..configcheck import bounds
from ..errors import CudaAgentError, InfrastructureError
from ..interfaces import AgentTool
from ..tools.base import ToolContext, ToolError
from ..types import INFRA_ERROR, Candidate, Task, ToolCall, ToolResult, Trajectory, Turn
from .budget import ContextBudget, truncate_middle
from .environment import Environment
from .formats import get_format, with_tools_in_system
from .toolcalls import parse_tool_calls


@dataclass
class AgentOptions:
    """Limits and sampling of one episode (``agent:`` in the run config)."""

    max_turns: int = field(default=150, metadata=bounds(min=1))  # 150 in training, 200 in evaluation (paper)
    context_tokens: int = field(default=131072, metadata=bounds(min=1))
    # longer tool outputs keep head + tail with a marker (0: no limit)
    tool_output_chars: int = field(default=8000, metadata=bounds(min=0))
    max_tokens_per_turn: int = field(default=8192, metadata=bounds(min=1))  # generation cap of one model turn
    min_generation_tokens: int = field(default=64, metadata=bounds(min=0))  # stop with "context" when less room is left
    sampling: dict = field(default_factory=dict)  # temperature, top_p, ... passed to the policy
    tool_format: str = "chatml"  # token-level policies: how tool results are rendered
    done_marker: str = "DONE"  # a last line equal to this, with no tool call, ends with "done"
    check_hooks: bool = True  # ask plugins' check_tool_call hook before each call


class PolicyError(CudaAgentError):
    """A policy could not produce an answer (server down after retries, bad response)."""


@dataclass
class ChatReply:
    """What a chat-level policy returns for one turn."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop", "tool_calls", "length", "content_filter"
    usage: dict = field(default_factory=dict)  # prompt_tokens, completion_tokens, total_tokens


Event = Callable[[dict], None]


# --- candidates -------------------------------------------------------------------


def candidate_key(c: Candidate) -> tuple[int, float]:
    """Order of candidates: correct ones first, then higher speedup against torch.compile."""
    if not c.outcome.correct:
        return (0, 0.0)
    s = c.speedup_vs_compile
    return (1, float(s) if s is not None else 0.0)


def best_candidate(candidates: list[Candidate]) -> Candidate | None:
    """The correct candidate with the highest speedup vs compile (earliest on ties); None if none is correct."""
    best = None
    for c in candidates:
        if c.outcome.correct and (best is None or candidate_key(c) > candidate_key(best)):
            best = c
    return best


def record_candidate(traj: Trajectory, cand: Candidate) -> Candidate:
    """Add ``cand``; results for files already seen are merged into that candidate."""
    for existing in traj.candidates:
        if existing.files == cand.files:
            for part in ("compile", "verify", "profile"):
                value = getattr(cand.outcome, part)
                if value is not None:
                    setattr(existing.outcome, part, value)
            if cand.reward is not None:
                existing.reward = cand.reward
            existing.turn = max(existing.turn, cand.turn)
            break
    else:
        traj.candidates.append(cand)
        existing = cand
    traj.best = best_candidate(traj.candidates)
    return existing


# --- helpers ------------------------------------------------------------------------


def tool_call_check(pm: Any, env: Any) -> Callable[..., str | None]:
    """The ``check_tool_call`` hook of the episode's caller: the plugin manager it passed, else
    its environment's (``env.pm``), else the process-wide one."""
    pm = pm if pm is not None else getattr(env, "pm", None)
    if pm is None:
        from ..plugins import get_plugin_manager

        pm = get_plugin_manager()
    return pm.hook.check_tool_call


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def template_renders_tools(tokenizer: Any, messages: list[dict], schemas: list[dict]) -> bool:
    """Whether the tokenizer's chat template writes the tool schemas into the prompt (many
    instruct models' templates, SmolLM2's among them, drop them without a word)."""
    if not schemas:
        return True
    try:
        plain = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        with_tools = tokenizer.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=False)
    except Exception:
        return True
    return plain != with_tools


def render_prompt_ids(tokenizer: Any, messages: list[dict], schemas: list[dict]) -> list[int]:
    """Token ids of the initial prompt (chat template applied once, with the generation header).

    A template that ignores ``tools`` gets them in the system message instead, with the
    ``<tool_call>`` format the loop parses (:func:`~.formats.tools_system_text`)."""
    if schemas and not template_renders_tools(tokenizer, messages, schemas):
        messages = with_tools_in_system(messages, schemas)
        schemas = []
    out = tokenizer.apply_chat_template(messages, tools=schemas or None, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(x) for x in out]


def _openai_call(call: ToolCall) -> dict:
    args = call.raw_arguments if (call.error or not call.arguments) and call.raw_arguments else json.dumps(call.arguments)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": args}}


def _call_detail(call: ToolCall) -> str:
    """A short reminder of what a tool call does, for progress displays (a bash command, a path)."""
    args = call.arguments if isinstance(call.arguments, dict) else {}
    detail = args.get("command") or args.get("path") or args.get("pattern") or ""
    return " ".join(str(detail).split())[:80]


def _is_done(text: str, marker: str) -> bool:
    if not marker:
        return False
    lines = [ln.strip().strip("*_`#.!").strip() for ln in text.strip().splitlines() if ln.strip()]
    return bool(lines) and lines[-1].upper() == marker.upper()


class _Runner:
    def __init__(self, task: Task, policy: Any, env: Environment, options: AgentOptions, on_event: Event | None,
                 pm: Any = None):
        self._hook = tool_call_check(pm, env) if options.check_hooks else None
        self.task = task
        self.policy = policy
        self.env = env
        self.o = options
        self.on_event = on_event
        self.tools: dict[str, AgentTool] = {t.name: t for t in env.tools()}
        self.schemas = [t.schema() for t in env.tools()]
        self.ctx: ToolContext = env.tool_context()
        self.budget = ContextBudget(options.context_tokens, options.min_generation_tokens)
        self.traj = Trajectory(id=uuid.uuid4().hex[:12], task_id=task.id)
        self.traj.metadata.update(
            policy=getattr(policy, "name", type(policy).__name__),
            model=getattr(getattr(policy, "options", None), "model", ""),
            started=time.time(),
        )

    def emit(self, **event: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                pass

    # -- tools -------------------------------------------------------------------

    async def run_tool(self, call: ToolCall, turn: int) -> ToolResult:
        t0 = time.monotonic()
        if call.error:
            result = ToolResult(call.id, call.name, f"error: {call.error}", ok=False)
        elif call.name not in self.tools:
            result = ToolResult(call.id, call.name,
                                f"error: unknown tool {call.name!r}; available: {', '.join(self.tools)}", ok=False)
        else:
            reason = None
            if self._hook is not None:
                reason = self._hook(tool_name=call.name, arguments=call.arguments, workspace=self.ctx.workspace)
            if reason:
                result = ToolResult(call.id, call.name, f"refused: {reason}", ok=False)
            else:
                try:
                    out = await asyncio.to_thread(self.tools[call.name].call, call.arguments, self.ctx)
                    if isinstance(out, ToolResult):
                        result = out
                        result.call_id, result.name = call.id, call.name
                    else:
                        result = ToolResult(call.id, call.name, str(out))
                except ToolError as exc:
                    result = ToolResult(call.id, call.name, f"error: {exc}", ok=False)
                except Exception as exc:  # a tool bug must not end the episode
                    result = ToolResult(call.id, call.name, f"error: {call.name} failed: {type(exc).__name__}: {exc}",
                                        ok=False)
        result.content, cut = truncate_middle(result.content, self.o.tool_output_chars)
        result.truncated = result.truncated or cut
        result.seconds = time.monotonic() - t0
        try:
            cands = await asyncio.to_thread(self.env.on_tool_result, call, result, turn)
        except Exception as exc:
            cands = []
            self.traj.metadata.setdefault("env_errors", []).append(f"{type(exc).__name__}: {exc}")
        for cand in cands or []:
            merged = record_candidate(self.traj, cand)
            self.emit(type="candidate", turn=turn, correct=merged.outcome.correct,
                      speedup=merged.speedup_vs_compile, best=self.best_speedup())
        return result

    def best_speedup(self) -> float | None:
        b = self.traj.best
        return b.speedup_vs_compile if b is not None else None

    # -- the loop ----------------------------------------------------------------

    async def run(self) -> Trajectory:
        traj = self.traj
        messages = [dict(m) for m in self.env.initial_messages(self.task)]
        traj.messages = messages
        token_level = bool(getattr(self.policy, "token_level", False))
        fmt = get_format(self.o.tool_format) if token_level else None
        tokenizer = getattr(self.policy, "tokenizer", None) if token_level else None
        if token_level:
            render = getattr(self.policy, "render_prompt", None)
            traj.prompt_ids = (list(render(messages, self.schemas)) if render
                               else render_prompt_ids(tokenizer, messages, self.schemas))
        finish = ""
        try:
            for index in range(self.o.max_turns):
                if token_level:
                    self.budget.set_exact(len(traj.prompt_ids) + len(traj.response_ids))
                else:
                    self.budget.estimate_chat(messages, self.schemas)
                if self.budget.exhausted():
                    finish = "context"
                    break
                cap = self.budget.generation_cap(self.o.max_tokens_per_turn)
                sampling = {**self.o.sampling, "max_tokens": cap}
                self.emit(type="turn", turn=index, best=self.best_speedup())
                t0 = time.monotonic()
                turn = Turn(index=index)
                if token_level:
                    ids, logprobs, reason = await _maybe_await(
                        self.policy.generate(traj.prompt_ids + traj.response_ids, sampling))
                    ids = [int(i) for i in ids]
                    logprobs = [float(x) for x in logprobs]
                    if len(logprobs) != len(ids):
                        raise PolicyError(f"policy returned {len(ids)} ids but {len(logprobs)} log-probs")
                    start = len(traj.response_ids)
                    traj.response_ids += ids
                    traj.loss_mask += [1] * len(ids)
                    traj.rollout_logprobs += logprobs
                    turn.response_span = (start, len(traj.response_ids))
                    text = tokenizer.decode(ids, skip_special_tokens=False)
                    body, closed = fmt.strip_end(text)
                    content, calls = parse_tool_calls(body, id_prefix=f"call_{index}_")
                    turn.assistant = content
                else:
                    reply: ChatReply = await _maybe_await(self.policy.chat(messages, self.schemas, sampling))
                    usage = reply.usage or {}
                    self.budget.observe_usage(usage.get("total_tokens"))
                    content, calls = reply.content or "", list(reply.tool_calls)
                    for i, c in enumerate(calls):
                        c.id = c.id or f"call_{index}_{i}"
                    turn.assistant = content
                    reason = reply.finish_reason
                turn.tool_calls = calls
                msg: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    msg["tool_calls"] = [_openai_call(c) for c in calls]
                messages.append(msg)
                traj.turns.append(turn)
                if not calls:
                    turn.seconds = time.monotonic() - t0
                    if reason == "length" and not content.strip():
                        finish = "context" if self.budget.remaining <= cap else "no_tool_call"
                    else:
                        finish = "done" if _is_done(content, self.o.done_marker) else "no_tool_call"
                    self.emit(type="end_turn", turn=index, tool=None, best=self.best_speedup())
                    break
                for call in calls:
                    self.emit(type="tool_start", turn=index, tool=call.name, detail=_call_detail(call))
                    result = await self.run_tool(call, index)
                    turn.tool_results.append(result)
                    messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name,
                                     "content": result.content})
                    self.emit(type="tool", turn=index, tool=call.name, ok=result.ok, best=self.best_speedup())
                if token_level:
                    seg = fmt.render([r.content for r in turn.tool_results], closed=closed)
                    seg_ids = [int(i) for i in tokenizer.encode(seg, add_special_tokens=False)]
                    traj.response_ids += seg_ids
                    traj.loss_mask += [0] * len(seg_ids)
                    traj.rollout_logprobs += [0.0] * len(seg_ids)
                turn.seconds = time.monotonic() - t0
            else:
                finish = "max_turns"
        except InfrastructureError as exc:  # the endpoint, not the model: no result, no reward
            finish = INFRA_ERROR
            traj.metadata["error"] = exc.one_line()
        except PolicyError as exc:
            finish = "error"
            traj.metadata["error"] = exc.one_line()
        except asyncio.CancelledError:
            finish = "cancelled"
            raise
        finally:
            self.summarize(finish, token_level)
        return await self.finalize()

    def summarize(self, finish: str, token_level: bool = False) -> None:
        """Record how the episode ended and count its tool calls, malformed calls and tool errors."""
        traj = self.traj
        traj.finish_reason = finish or "error"
        traj.best = best_candidate(traj.candidates)
        traj.metadata["seconds"] = time.time() - traj.metadata["started"]
        traj.metadata["context_tokens_used"] = (len(traj.prompt_ids) + len(traj.response_ids)
                                               if token_level else self.budget.used)
        calls = [c for t in traj.turns for c in t.tool_calls]
        results = [r for t in traj.turns for r in t.tool_results]
        traj.metadata["tool_calls"] = len(calls)
        traj.metadata["malformed_tool_calls"] = sum(1 for c in calls if c.error)
        traj.metadata["tool_errors"] = sum(1 for r in results if not r.ok)

    async def finalize(self) -> Trajectory:
        """Ask the environment for the reward (a failure is recorded, never raised)."""
        traj = self.traj
        try:
            # an episode the infrastructure ended is not scored (finalize would reward it -1)
            traj.reward = None if traj.infra_error else await asyncio.to_thread(self.env.finalize, traj)
        except Exception as exc:
            traj.metadata["finalize_error"] = f"{type(exc).__name__}: {exc}"
            traj.reward = None
        traj.best = best_candidate(traj.candidates)
        self.emit(type="end", finish=traj.finish_reason, turns=len(traj.turns), best=self.best_speedup(),
                  reward=traj.reward.value if traj.reward else None)
        return traj


async def run_episode(
    task: Task,
    policy: Any,
    env: Environment,
    options: AgentOptions | None = None,
    on_event: Event | None = None,
    pm: Any = None,
) -> Trajectory:
    """Run one episode of ``policy`` on ``task`` in ``env``; returns the finished trajectory.

    Ends with ``finish_reason``: "done" (no tool call, last line is the done marker),
    "no_tool_call" (an answer without tool calls: a refusal or a plain stop), "max_turns",
    "context" (context budget spent), "error" (the policy gave an unusable answer) or
    "infra_error" (the policy endpoint failed after its retries: no result, and no reward).
    ``on_event(dict)`` receives progress events (type: turn, tool_start, tool, candidate, end_turn, end).
    ``pm``: the plugin manager whose ``check_tool_call`` hook is asked before each tool call
    (default: the environment's ``pm``, else the process-wide one). The environment is not
    closed here.
    """
    return await _Runner(task, policy, env, options or AgentOptions(), on_event, pm).run()


def run_episode_sync(task: Task, policy: Any, env: Environment, options: AgentOptions | None = None,
                     on_event: Event | None = None, pm: Any = None) -> Trajectory:
    """:func:`run_episode` for synchronous callers (runs its own event loop, or a thread if one is running)."""
    return run_sync(run_episode(task, policy, env, options, on_event, pm))


def run_sync(coro: Any) -> Any:
    """Run ``coro`` to its end from synchronous code, also when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()
