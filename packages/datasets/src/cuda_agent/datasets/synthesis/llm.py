"""The LLM composer: asks a policy plugin to stack seed operators into one model.

The policy is any chat-level policy plugin (``create("policy", {name, options})``, e.g.
``openai`` for an OpenAI-compatible server). Candidate ``i`` gets a seeded choice of
1-5 seed operators (the same op-count mix as the rule composer) and a prompt with a
KernelBench-style example; the reply's Python code block becomes the candidate, which
then goes through the same filters as rule-composed ones.
"""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path
from typing import Any

from cuda_agent.core.errors import ConfigError

from .composer import PAPER_MIX, Candidate, RuleComposer, normalise_mix
from .ops import OpDef

DEFAULT_PROMPT = """You write PyTorch programs in the KernelBench format.

Write one complete Python file that defines:
- `class Model(nn.Module)` whose `forward` applies these operators in a sensible order: {ops}
- module-level size constants, `get_inputs()` returning the list of input tensors and
  `get_init_inputs()` returning the list of constructor arguments of Model.

Rules: use only torch (and transformers modules when named); no randomness inside the model
(no dropout, no rand*); the output must depend on the input; shapes must be consistent.
Keep the eager run time of one forward pass between {min_ms} and {max_ms} ms on a {device}.

Example of the format:
```python
{example}
```

Answer with the file in a single ```python code block."""

_CODE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    blocks = _CODE_RE.findall(text or "")
    if blocks:
        return max(blocks, key=len).strip() + "\n"
    if "class Model" in (text or ""):
        return text.strip() + "\n"
    return ""


def _run(coro):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    raise RuntimeError("the LLM composer must be called outside a running event loop")


class LLMComposer:
    name = "llm"

    def __init__(
        self,
        policy: Any,
        seeds: dict[str, OpDef],
        op_mix: dict | None = None,
        seed: int = 0,
        temperature: float = 0.8,
        max_tokens: int = 2048,
        prompt: str | None = None,
        window_ms: tuple[float, float] = (1.0, 100.0),
        device: str = "GPU",
    ):
        if not hasattr(policy, "chat"):
            raise ConfigError(f"policy {getattr(policy, 'name', policy)!r} has no chat(); the LLM composer needs a chat-level policy")
        self.policy = policy
        self.seeds = seeds
        self.mix = normalise_mix(op_mix or PAPER_MIX)
        self.seed = seed
        self.sampling = {"temperature": temperature, "max_tokens": max_tokens}
        self.template = Path(prompt).read_text() if prompt else DEFAULT_PROMPT
        self.window = window_ms
        self.device = device
        example = RuleComposer(seeds, "small", {"2": 1.0}, 0.0, seed).compose(0)
        self.example = example.code.strip() if example else ""
        self.names = sorted(n for n, o in seeds.items() if not o.stochastic)

    def prompt_for(self, index: int) -> tuple[list[str], str]:
        rng = random.Random(f"llm:{self.seed}:{index}")
        ks = list(self.mix)
        k = rng.choices(ks, weights=[self.mix[x] for x in ks], k=1)[0]
        ops = rng.sample(self.names, min(k, len(self.names)))
        text = self.template.format(
            ops=", ".join(o.split("[")[0] for o in ops),
            example=self.example,
            min_ms=self.window[0],
            max_ms=self.window[1],
            device=self.device,
        )
        return ops, text

    def compose(self, index: int) -> Candidate:
        ops, text = self.prompt_for(index)
        messages = [{"role": "user", "content": text}]
        src = "transformers" if any(o.startswith("transformers.") for o in ops) else "torch"
        try:
            reply = _run(self.policy.chat(messages, [], dict(self.sampling)))
        except Exception as exc:  # noqa: BLE001 - one failed request costs one candidate
            return Candidate(index, "", ops, src, "llm", {"error": f"policy failed: {type(exc).__name__}: {exc}"[:300]})
        content = getattr(reply, "content", reply if isinstance(reply, str) else "")
        code = extract_code(content)
        meta = {} if code else {"error": "no Python code block in the reply"}
        return Candidate(index, code, ops, src, "llm", meta)


def build_composer(opts: Any, pm: Any = None) -> Any:
    """The composer named by ``synthesis.composer`` (rule or llm)."""
    from .seeds import collect_seeds

    seeds = collect_seeds(opts.transformers, include_stochastic=opts.stochastic_seeds)
    if opts.composer == "rule":
        return RuleComposer(seeds, opts.shapes, opts.op_mix, opts.transformers_share, opts.seed)
    if opts.composer != "llm":
        raise ConfigError(f"unknown composer {opts.composer!r}; use rule or llm")
    spec = dict(opts.llm.policy or {})
    if not spec.get("name"):
        raise ConfigError("the llm composer needs a policy: set synthesis.llm.policy.name (e.g. openai) and its options")
    if pm is None:
        from cuda_agent.core.plugins import get_plugin_manager

        pm = get_plugin_manager()
    policy = pm.create("policy", spec, where="synthesis.llm.policy")
    return LLMComposer(
        policy,
        seeds,
        opts.op_mix,
        opts.seed,
        opts.llm.temperature,
        opts.llm.max_tokens,
        opts.llm.prompt,
        (opts.filters.min_ms, opts.filters.max_ms),
        "GPU" if opts.device.startswith("cuda") else "CPU",
    )
