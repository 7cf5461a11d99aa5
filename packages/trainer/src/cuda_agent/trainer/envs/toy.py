"""A synthetic environment with a learnable target, for CPU tests of the whole training loop.

Each task names a target word. The agent has one tool, ``guess(word)``, which answers
``correct`` or ``wrong``; the reward is 1 when a guess was right, else 0. The toy
tokenizer is word-level and has one token per complete tool call (its text is the full
``<tool_call>{"name": "guess", ...}</tool_call>``), so a tiny random model can find the
right call by chance and learn to make it: the reward rises within a few dozen steps.
The episode runs through the core agent loop like any other.
"""

from __future__ import annotations

import json
import random
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.core.configcheck import bounds
from cuda_agent.core.interfaces import AgentTool, EnvironmentFactory
from cuda_agent.core.tools.base import ToolContext
from cuda_agent.core.types import RewardResult, Task, ToolResult, Trajectory

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "orbit", "maple", "delta", "ember", "frost"]
FILLER = ["the", "a", "word", "is", "find", "guess", "call", "tool", "with", "target", "you", "must", "and", "then",
          "stop", "hello", "ok", "no", "yes", "maybe", "think", "try", "again"]
SYSTEM = "You must call the guess tool with the target word and then stop"


def call_text(word: str) -> str:
    return "<tool_call>" + json.dumps({"name": "guess", "arguments": {"word": word}}) + "</tool_call>"


def build_toy_tokenizer(words: list[str] | None = None):
    """Word-level tokenizer: chat specials, plain words, and one token per guess call."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ..tiny import CHATML_TEMPLATE

    words = list(words or WORDS)
    plain = ["[UNK]"] + sorted(set(FILLER + words + ["correct", "wrong", "DONE", "system", "user", "assistant",
                                                      "target", ":", "."]))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(plain)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_response>", "</tool_response>"]
    fast.add_special_tokens({"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                             "additional_special_tokens": specials[1:]})
    fast.add_tokens([call_text(w) for w in words])
    fast.chat_template = CHATML_TEMPLATE
    return fast


class GuessTool(AgentTool):
    name = "guess"
    description = "Guess the target word."

    def schema(self) -> dict:
        return {"type": "function", "function": {
            "name": "guess", "description": self.description,
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}

    def call(self, arguments: dict, context: Any) -> ToolResult:
        target = context.state["target"]
        word = str(arguments.get("word", ""))
        right = word == target
        context.state.setdefault("guesses", []).append(word)
        if right:
            context.state["solved"] = True
        return ToolResult(call_id="", name="guess", content="correct" if right else "wrong", ok=True)


class ToyEnvironment:
    """One episode of the guessing game (implements the core Environment protocol)."""

    def __init__(self, task: Task, workspace: Path, turn_penalty: float = 0.0):
        self.task = task
        self._ctx = ToolContext(workspace)
        self._ctx.state["target"] = task.metadata["target"]
        self._tools = [GuessTool()]
        self.turn_penalty = turn_penalty

    def tools(self):
        return self._tools

    def tool_context(self):
        return self._ctx

    def initial_messages(self, task: Task) -> list[dict]:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"target : {task.metadata['target']}"}]

    def on_tool_result(self, call, result, turn):
        return []

    def finalize(self, trajectory: Trajectory) -> RewardResult:
        solved = bool(self._ctx.state.get("solved"))
        guesses = self._ctx.state.get("guesses", [])
        value = (1.0 - self.turn_penalty * max(len(trajectory.turns) - 1, 0)) if solved else 0.0
        return RewardResult(value=value, reward="toy_guess", correct=solved, raw={"guesses": guesses})

    def close(self) -> None:
        self._ctx.close()


class ToyEnvironmentFactory(EnvironmentFactory):
    """Tasks and environments of the guessing game."""

    name = "toy"
    description = "A guessing game whose reward a tiny random model learns to raise (CPU tests of training)."
    makes_tasks = True

    @dataclass
    class Options:
        num_targets: int = field(default=4, metadata=bounds(min=1))  # target words drawn from (at most len(WORDS))
        turn_penalty: float = 0.0  # reward taken off per turn after the first
        workdir: str | None = None  # the folder every episode shares (a temporary one when None)

    def __init__(self, options: Options | None = None):
        super().__init__(options)
        self.words = WORDS[: max(1, min(self.options.num_targets, len(WORDS)))]
        self._tmp = None
        self._tmp_lock = threading.Lock()  # episodes are made from several threads at once

    def tasks(self, n: int, rng: random.Random) -> list[Task]:
        out = []
        for _ in range(n):
            w = rng.choice(self.words)
            out.append(Task(id=f"toy-{w}", source="toy", code="", name=w, metadata={"target": w}))
        return out

    def make(self, task: Task, dest: Path | None = None) -> ToyEnvironment:
        if dest is None and self.options.workdir:
            dest = Path(self.options.workdir)
        if dest is None:
            with self._tmp_lock:  # one shared folder: a second one would be deleted under the first's users
                if self._tmp is None:
                    self._tmp = tempfile.TemporaryDirectory(prefix="toy-env-")
                dest = Path(self._tmp.name)
        Path(dest).mkdir(parents=True, exist_ok=True)
        return ToyEnvironment(task, Path(dest), self.options.turn_penalty)

    def tokenizer(self):
        return build_toy_tokenizer(WORDS)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
