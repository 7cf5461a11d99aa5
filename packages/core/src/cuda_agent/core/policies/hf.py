"""``hf`` policy: a local transformers causal LM, token-level (ids in, ids + log-probs out).

transformers and torch are imported only when the policy is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..interfaces import Policy


@dataclass
class HFOptions:
    model: str = ""  # a local model folder, or a known model's name (cuda-agent models list)
    device: str = "cpu"
    dtype: str = "float32"  # float32 | bfloat16 | float16
    max_new_tokens: int = 512  # default cap of one turn (the loop's max_tokens wins when smaller)
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = 0  # None: not reproducible
    stop_tokens: list[str] = field(default_factory=lambda: ["<|im_end|>"])  # besides the EOS token


class HFPolicy(Policy):
    """Samples token by token with a KV cache and records each sampled token's log-prob.

    The recorded log-prob is ``log_softmax(logits / temperature)`` at the sampled id
    (plain ``log_softmax(logits)`` when greedy), before top-p filtering: the quantity a
    trainer recomputes with :meth:`score`.
    """

    name = "hf"
    description = "Local transformers model, token-level with log-probs (small models, tests)."
    Options = HFOptions
    token_level = True

    def __init__(self, options: HFOptions | None = None, model: Any = None, tokenizer: Any = None):
        super().__init__(options)
        try:
            import torch
            import transformers
        except ImportError as exc:  # pragma: no cover
            raise ConfigError(f"policy hf needs torch and transformers: {exc}")
        self.torch = torch
        o = self.options
        if tokenizer is None or model is None:
            if not o.model:
                raise ConfigError("policy hf needs options.model (a local model folder)")
        dtype = getattr(torch, o.dtype, None)
        if dtype is None:
            raise ConfigError(f"policy hf: unknown dtype {o.dtype!r}")
        path = o.model
        if tokenizer is None or model is None:
            from ..models import resolve_model

            path = resolve_model(o.model)
        self.tokenizer = tokenizer or transformers.AutoTokenizer.from_pretrained(path)
        if model is None:
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            except TypeError:  # older transformers
                model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype)
        self.model = model.to(o.device).eval()
        self.stop_ids = set()
        if self.tokenizer.eos_token_id is not None:
            self.stop_ids.add(int(self.tokenizer.eos_token_id))
        for t in o.stop_tokens:
            tid = self.tokenizer.convert_tokens_to_ids(t)
            if tid is not None and tid != self.tokenizer.unk_token_id:
                self.stop_ids.add(int(tid))
        import inspect

        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x
        self.generator = torch.Generator(device="cpu")
        if o.seed is not None:
            self.generator.manual_seed(int(o.seed))

    def _logp(self, logits: Any, temperature: float) -> Any:
        logits = logits.float()
        if temperature and temperature > 0:
            logits = logits / temperature
        return self.torch.log_softmax(logits, dim=-1)

    def _pick(self, logp: Any, temperature: float, top_p: float) -> int:
        torch = self.torch
        if not temperature or temperature <= 0:
            return int(torch.argmax(logp))
        probs = logp.exp()
        if top_p < 1.0:
            sorted_p, idx = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
            mask = torch.zeros_like(probs, dtype=torch.bool)
            mask[idx[keep]] = True
            probs = torch.where(mask, probs, torch.zeros_like(probs))
            probs = probs / probs.sum()
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    def generate(self, prompt_ids: list[int], sampling: dict) -> tuple[list[int], list[float], str]:
        """Sample up to ``sampling['max_tokens']`` ids after ``prompt_ids``; finish "stop" or "length"."""
        torch = self.torch
        o = self.options
        max_tokens = min(int(sampling.get("max_tokens") or o.max_new_tokens), o.max_new_tokens)
        temperature = float(sampling.get("temperature", o.temperature))
        top_p = float(sampling.get("top_p", o.top_p))
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit:
            max_tokens = min(max_tokens, int(limit) - len(prompt_ids))
        ids: list[int] = []
        lps: list[float] = []
        if max_tokens <= 0:
            return ids, lps, "length"
        with torch.no_grad():
            x = torch.tensor([prompt_ids], device=o.device)
            out = self.model(input_ids=x, use_cache=True)
            past = self._past(out)
            logits = out.logits[0, -1]
            for _ in range(max_tokens):
                logp = self._logp(logits, temperature)
                tok = self._pick(logp, temperature, top_p)
                ids.append(tok)
                lps.append(float(logp[tok]))
                if tok in self.stop_ids:
                    return ids, lps, "stop"
                out = self.model(input_ids=torch.tensor([[tok]], device=o.device), use_cache=True,
                                 **{self._cache_arg: past})
                past = self._past(out)
                logits = out.logits[0, -1]
        return ids, lps, "length"

    def _past(self, out: Any) -> Any:
        past = getattr(out, "cache", None)
        return past if past is not None else getattr(out, "past_key_values", None)

    def score(self, ids: list[int], start: int, temperature: float | None = None) -> list[float]:
        """Log-probs of ``ids[start:]`` given their prefix, in one forward pass (teacher forcing)."""
        torch = self.torch
        t = self.options.temperature if temperature is None else temperature
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids], device=self.options.device)).logits[0]
            logp = self._logp(logits[start - 1 : len(ids) - 1], t)
            target = torch.tensor(ids[start:], device=self.options.device)
            return logp.gather(1, target[:, None])[:, 0].tolist()
