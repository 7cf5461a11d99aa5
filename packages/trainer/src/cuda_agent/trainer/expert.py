"""Easy synthesised tasks and a scripted expert that solves them in the agent's tool format.

The tasks (:func:`easy_tasks`) are element-wise chains of unary operators (``torch.relu``,
``torch.tanh``, ``x * 2.0``, ...) on one tensor, optionally closed by a reduction over the last
dimension (``torch.sum``/``mean``/``amax``/``amin``). Each line of ``forward`` is one operator, so a
solution translates line by line into C++ (:data:`UNARY`, :data:`REDUCE`).

The expert (:class:`ScriptedExpert`) is a token-level policy: it reads the task's ``model.py``
from the episode's prompt, writes ``kernels/fused.cpp`` and ``model_new.py`` for the CPU backend
(g++), compiles and verifies from the shell, and ends with ``DONE``. It writes exactly what a
model would (``<tool_call>`` blocks, ChatML end of turn), so its episodes, run through the real
loop and scored by the judge, are supervised fine-tuning data in the model's own tokens.
:func:`recorded_turns` turns a recorded chat episode (``cuda-agent demo``'s) into the same text.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path
from typing import Any, Callable

from cuda_agent.core.agent.toolcalls import format_tool_call
from cuda_agent.core.types import Task

# one line of forward (its right-hand side, applied to x) -> one C++ statement on v
UNARY: dict[str, tuple[str, str]] = {
    "relu": ("torch.relu(x)", "v = v > 0.0f ? v : 0.0f;"),
    "sigmoid": ("torch.sigmoid(x)", "v = 1.0f / (1.0f + std::exp(-v));"),
    "tanh": ("torch.tanh(x)", "v = std::tanh(v);"),
    "exp": ("torch.exp(x)", "v = std::exp(v);"),
    "abs": ("torch.abs(x)", "v = std::fabs(v);"),
    "sin": ("torch.sin(x)", "v = std::sin(v);"),
    "cos": ("torch.cos(x)", "v = std::cos(v);"),
    "neg": ("-x", "v = -v;"),
    "square": ("x * x", "v = v * v;"),
    "double": ("x * 2.0", "v = v * 2.0f;"),
    "half": ("x * 0.5", "v = v * 0.5f;"),
    "plus1": ("x + 1.0", "v = v + 1.0f;"),
    "minus1": ("x - 1.0", "v = v - 1.0f;"),
}
# a reduction over the last dimension -> (initial accumulator, update, final value)
REDUCE: dict[str, tuple[str, str, str, str]] = {
    "sum": ("torch.sum(x, dim=-1)", "0.0f", "acc += v;", "acc"),
    "mean": ("torch.mean(x, dim=-1)", "0.0f", "acc += v;", "acc / (float)n"),
    "amax": ("torch.amax(x, dim=-1)", "-INFINITY", "acc = v > acc ? v : acc;", "acc"),
    "amin": ("torch.amin(x, dim=-1)", "INFINITY", "acc = v < acc ? v : acc;", "acc"),
}
SHAPE = (64, 256)

_MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{body}


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return []
'''


def task_code(ops: tuple[str, ...], reduce: str | None = None, shape: tuple[int, int] = SHAPE) -> str:
    lines = [f"        x = {UNARY[op][0]}" for op in ops]
    lines.append(f"        return {REDUCE[reduce][0]}" if reduce else "        return x")
    return _MODEL.format(body="\n".join(lines), rows=shape[0], cols=shape[1])


def task_id(ops: tuple[str, ...], reduce: str | None) -> str:
    return "easy/" + "-".join(ops) + (f"-{reduce}" if reduce else "")


def make_task(ops: tuple[str, ...], reduce: str | None = None) -> Task:
    kind = "reduction" if reduce else "elementwise"
    return Task(id=task_id(ops, reduce), source="easy", code=task_code(ops, reduce), category=kind,
                name=" then ".join(list(ops) + ([reduce] if reduce else [])),
                metadata={"ops": list(ops), "reduce": reduce})


def easy_tasks(seed: int = 0, max_ops: int = 2) -> list[Task]:
    """Every chain of 1..max_ops distinct unary operators, without and with each reduction,
    in a seeded order (13 + 156 chains of up to two operators, times 5)."""
    chains = [c for k in range(1, max_ops + 1) for c in itertools.permutations(sorted(UNARY), k)]
    tasks = [make_task(c, r) for c in chains for r in [None, *sorted(REDUCE)]]
    random.Random(seed).shuffle(tasks)
    return tasks


# -- reading a task back ---------------------------------------------------------------------

_RHS = {v[0]: k for k, v in UNARY.items()}
_RED = {v[0]: k for k, v in REDUCE.items()}


def parse_task(code: str) -> tuple[tuple[str, ...], str | None] | None:
    """The operator chain and reduction of an easy task's ``model.py`` (None when it is not one)."""
    m = re.search(r"def forward\(self, x[^)]*\)[^:]*:\n(.*?)\n\n", code + "\n\n", re.S)
    if not m:
        return None
    ops: list[str] = []
    reduce = None
    for line in [ln.strip() for ln in m.group(1).splitlines() if ln.strip()]:
        if line.startswith("x = ") and line[4:] in _RHS:
            ops.append(_RHS[line[4:]])
        elif line == "return x":
            break
        elif line.startswith("return ") and line[7:] in _RED:
            reduce = _RED[line[7:]]
            break
        else:
            return None
    return tuple(ops), reduce


# -- the expert's files and turns ------------------------------------------------------------

def kernel_source(ops: tuple[str, ...], reduce: str | None) -> str:
    """The fused C++ kernel: each line of ``forward`` quoted as a comment above its statement."""
    pad = "      " if reduce else "    "
    body = "\n".join(f"{pad}// x = {UNARY[op][0]}\n{pad}{UNARY[op][1]}" for op in ops)
    if reduce is None:
        return ("#include <cmath>\n#include <cstdint>\n\n"
                'extern "C" void fused(const float* __restrict x, float* __restrict out, int64_t n) {\n'
                "#pragma omp parallel for simd schedule(static)\n"
                "  for (int64_t i = 0; i < n; ++i) {\n    float v = x[i];\n"
                + (body + "\n" if body else "") + "    out[i] = v;\n  }\n}\n")
    init, update, final = REDUCE[reduce][1:]
    return ("#include <cmath>\n#include <cstdint>\n\n"
            'extern "C" void fused(const float* __restrict x, float* __restrict out, int64_t rows, int64_t n) {\n'
            "#pragma omp parallel for schedule(static)\n"
            "  for (int64_t r = 0; r < rows; ++r) {\n    const float* row = x + r * n;\n"
            f"    float acc = {init};\n"
            "    for (int64_t i = 0; i < n; ++i) {\n      float v = row[i];\n"
            + (body + "\n" if body else "") +
            f"      // return {REDUCE[reduce][0]}\n      {update}\n    }}\n    out[r] = {final};\n  }}\n}}\n")


def model_new_source(reduce: str | None) -> str:
    if reduce is None:
        alloc, call = "out = torch.empty_like(x)", "kernels.fused(x, out, x.numel())"
    else:
        alloc = "out = torch.empty(x.shape[0], dtype=x.dtype)"
        call = "kernels.fused(x, out, x.shape[0], x.shape[1])"
    return ("import torch\nimport torch.nn as nn\n\nfrom cuda_agent_runtime import load_kernels\n\n"
            "kernels = load_kernels()\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n\n    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
            f"        x = x.contiguous()\n        {alloc}\n        {call}\n        return out\n")


def expert_turns(code: str) -> list[str] | None:
    """The expert's assistant messages (without the end-of-turn token) for an easy task."""
    parsed = parse_task(code)
    if parsed is None:
        return None
    ops, reduce = parsed
    # the task is read back after the skeleton, so that the lines of forward stand just above the turn that
    # translates them; what the answer depends on is then quoted (the last line of forward, then
    # each line above its C++ statement): a small model copies before it translates
    last = f"return {REDUCE[reduce][0]}" if reduce else "return x"
    shape = "one output per row" if reduce else "one output per element"
    return [
        "I read the skeleton I have to fill in, then the model I have to make faster.\n"
        + format_tool_call("read", {"path": "model_new.py"}) + "\n" + format_tool_call("read", {"path": "model.py"}),
        f"The last line of forward is `{last}`: {shape}. I write each line of forward as one C++ statement "
        "in one fused loop and call it from ModelNew.\n"
        + format_tool_call("write", {"path": "kernels/fused.cpp", "content": kernel_source(ops, reduce)}) + "\n"
        + format_tool_call("write", {"path": "model_new.py", "content": model_new_source(reduce)}),
        format_tool_call("bash", {"command": "python tools/compile.py && python tools/verify.py"}),
        "The kernel is verified.\n\nDONE",
    ]


def recorded_turns(path: str | Path) -> list[str]:
    """A recorded chat episode (``{"turns": [{"content", "tool_calls"}]}``) as assistant texts."""
    data = json.loads(Path(path).read_text())
    out = []
    for turn in data["turns"]:
        parts = [turn.get("content") or ""]
        parts += [format_tool_call(c["name"], c.get("arguments") or {}) for c in turn.get("tool_calls") or []]
        out.append("\n".join(p for p in parts if p))
    return out


def prompt_task_code(text: str) -> str:
    """The ``model.py`` an episode's first user message quotes."""
    m = re.search(r"model\.py:\n```python\n(.*?)```", text, re.S)
    return m.group(1) if m else ""


class ScriptedExpert:
    """A token-level policy that writes scripted turns: ``turns_for(model_py) -> [text, ...]``
    (the expert's by default). The turn is the number of assistant messages in the prompt so far;
    a task it has no script for, or a turn past the script, gets ``DONE``. Log-probs are 0."""

    name = "expert"
    token_level = True

    def __init__(self, tokenizer: Any, turns_for: Callable[[str], list[str] | None] = expert_turns,
                 end_of_turn: str = "<|im_end|>", assistant_header: str = "<|im_start|>assistant"):
        self.tokenizer = tokenizer
        self.turns_for = turns_for
        self.end = end_of_turn
        self.header = assistant_header

    def generate(self, prompt_ids: list[int], sampling: dict) -> tuple[list[int], list[float], str]:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        turn = text.count(self.header) - 1
        turns = self.turns_for(prompt_task_code(text)) or []
        reply = turns[turn] if 0 <= turn < len(turns) else "DONE"
        ids = [int(i) for i in self.tokenizer.encode(reply + self.end, add_special_tokens=False)]
        cap = int(sampling.get("max_tokens") or len(ids))
        finish = "stop" if len(ids) <= cap else "length"
        ids = ids[:cap]
        return ids, [0.0] * len(ids), finish


# -- a short prompt for small models ---------------------------------------------------------

COMPACT_SYSTEM = """\
You write C++ kernels for the CPU that replace a PyTorch model, working in a workspace through tools.
1. Read model_new.py.
2. Write kernels/fused.cpp: extern "C" functions on float pointers (built with g++ -O3 -fopenmp), and
   model_new.py: class ModelNew, same constructor as Model, whose forward allocates outputs
   (torch.empty_like, torch.empty) and calls kernels = cuda_agent_runtime.load_kernels(); no torch
   operators in forward.
3. Run: python tools/compile.py && python tools/verify.py
When it prints VERIFY PASSED, answer without a tool call and end with a line DONE."""


def compact_task_message(task: Task) -> str:
    return f"Task {task.id}: write a faster ModelNew for this model.py.\n\nmodel.py:\n```python\n{task.code.rstrip()}\n```"


class CompactPrompt:
    """An episode environment whose first messages are :data:`COMPACT_SYSTEM` and the task alone
    (no SKILL.md in the prompt; it stays in the workspace): about 700 tokens with three tools
    instead of about 3,000, for models trained on a small CPU budget."""

    def __init__(self, env: Any, system: str = COMPACT_SYSTEM):
        self._env = env
        self._system = system

    def initial_messages(self, task: Task) -> list[dict]:
        return [{"role": "system", "content": self._system}, {"role": "user", "content": compact_task_message(task)}]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class CompactPromptFactory:
    """An environment factory (``trainer.environment``'s ``cuda``) whose episodes use :class:`CompactPrompt`."""

    def __init__(self, factory: Any, system: str = COMPACT_SYSTEM):
        self._factory = factory
        self._system = system

    def make(self, task: Task, dest: Any = None) -> CompactPrompt:
        return CompactPrompt(self._factory.make(task, dest), self._system)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._factory, name)
