"""``vllm`` policy: an in-process vLLM engine, token-level (optional extra: ``scripts/install_vllm.sh``).

On vLLM's CPU build give ``dtype: float32`` (what the trainer computes in) and a fixed KV-cache
size (``engine_args: {kv_cache_memory_bytes: ..., enforce_eager: true}``); its attention refuses a
head size of 16 (64 is tested). The engine starts its processes by spawn: a script that
builds this policy needs an ``if __name__ == "__main__":`` guard. With the environment variable
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and ``engine_args: {distributed_executor_backend: uni}`` the
engine runs inside the calling process instead.

After each trainer update the engine's weights are replaced in place
(:meth:`VLLMPolicy.update_weights`, through :mod:`.weight_sync`) and its prefix cache is
dropped, so the next rollout samples from the new policy.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..agent.loop import PolicyError
from ..errors import ConfigError
from ..interfaces import Policy
from .batching import BatchStats, RequestBatcher, zero_stats


@dataclass
class VLLMOptions:
    model: str = ""  # a local model folder, or a known model's name (cuda-agent models list)
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.8
    max_model_len: int = 131072
    tensor_parallel_size: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8192
    seed: int | None = 0
    max_batch: int = 256  # concurrent episodes' requests sampled in one engine call
    stop_tokens: list[str] = field(default_factory=lambda: ["<|im_end|>"])
    # sampled tokens' log-probs after temperature, the quantity the trainer recomputes
    logprobs_mode: str = "processed_logprobs"
    weight_sync_dir: str = ""  # where update_weights writes a version's weights ("": a temporary folder)
    engine_args: dict = field(default_factory=dict)  # passed to vllm.LLM as they are


class VLLMPolicy(BatchStats, Policy):
    """Token-level generation with ``vllm.LLM``: sampled ids and their log-probs (logprobs=0);
    requests of concurrent episodes are sampled together."""

    name = "vllm"
    description = "In-process vLLM engine, token-level with log-probs (needs the vllm extra)."
    Options = VLLMOptions
    token_level = True

    def __init__(self, options: VLLMOptions | None = None):
        super().__init__(options)
        try:
            import vllm
        except ImportError:
            raise ConfigError("policy vllm needs vLLM: bash scripts/install_vllm.sh "
                              "(the CPU build where there is no GPU; keeps torch)")
        o = self.options
        if not o.model:
            raise ConfigError("policy vllm needs options.model")
        from ..models import resolve_model
        from .weight_sync import EXTENSION

        self._vllm = vllm
        args = {"worker_extension_cls": EXTENSION, **o.engine_args}
        if o.logprobs_mode:
            args.setdefault("logprobs_mode", o.logprobs_mode)
        self.llm = vllm.LLM(model=resolve_model(o.model), dtype=o.dtype, gpu_memory_utilization=o.gpu_memory_utilization,
                            max_model_len=o.max_model_len, tensor_parallel_size=o.tensor_parallel_size,
                            seed=o.seed or 0, **args)
        self.weights_version = 0
        self._sync_dir = o.weight_sync_dir or tempfile.mkdtemp(prefix="cuda-agent-weights-")
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_ids = [self.tokenizer.convert_tokens_to_ids(t) for t in o.stop_tokens]
        self.stop_ids = [int(i) for i in self.stop_ids if i is not None and i != self.tokenizer.unk_token_id]
        self._lock = threading.Lock()
        self.stats = zero_stats()
        self._batcher = RequestBatcher(self.generate_batch, o.max_batch)

    async def generate(self, prompt_ids: list[int], sampling: dict) -> tuple[list[int], list[float], str]:
        """One completion; requests of concurrent episodes run as one batch (``generate_batch``)."""
        return await self._batcher.submit(prompt_ids, sampling)

    def params(self, sampling: dict) -> Any:
        o = self.options
        return self._vllm.SamplingParams(
            max_tokens=int(sampling.get("max_tokens") or o.max_new_tokens),
            temperature=float(sampling.get("temperature", o.temperature)),
            top_p=float(sampling.get("top_p", o.top_p)),
            logprobs=0,
            stop_token_ids=self.stop_ids,
            skip_special_tokens=False,
        )

    def generate_batch(self, prompts: list[list[int]],
                       samplings: list[dict]) -> list[tuple[list[int], list[float], str]]:
        """Sampled ids, their log-probs and ``stop``/``length`` for each prompt, in one engine call."""
        t0 = time.monotonic()
        with self._lock:  # one engine call at a time (weight updates included)
            outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts],
                                     [self.params(s) for s in samplings], use_tqdm=False)
        results = []
        for req in outs:
            out = req.outputs[0]
            ids = [int(i) for i in out.token_ids]
            lps = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs or [])]
            if len(lps) != len(ids):
                raise PolicyError(f"vLLM returned {len(ids)} token ids but {len(lps)} log-probs")
            results.append((ids, lps, "stop" if out.finish_reason == "stop" else "length"))
        self.record_batch(sum(len(r[0]) for r in results), time.monotonic() - t0, len(prompts))
        return results

    def update_weights(self, named_tensors) -> int:
        """Load new weights (``(name, tensor)`` pairs, Hugging Face names) into every worker of
        the engine; returns how many tensors each worker loaded."""
        from .weight_sync import LOAD_METHOD, write_weights

        self.weights_version += 1
        path = write_weights(named_tensors, self._sync_dir, self.weights_version)
        with self._lock:
            counts = self.llm.collective_rpc(LOAD_METHOD, args=(str(path),))
            # cached prefixes hold keys and values of the old weights; the reset is refused while
            # a request holds blocks (none does between two engine calls)
            if self.llm.reset_prefix_cache() is False:
                raise PolicyError("vLLM refused to drop its prefix cache after a weight update (a request "
                                  "still holds cache blocks); update weights only between rollouts")
        return int(min(int(c) for c in counts)) if counts else 0

    def close(self) -> None:
        """Stop the engine (and its processes, when it runs in several) and free its memory."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        del llm, engine, core
        import gc

        gc.collect()
