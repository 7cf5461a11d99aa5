"""Rollout policies over the live actor weights.

:class:`ActorPolicy` is a token-level policy for the core agent loop (``generate(prompt_ids,
sampling) -> (ids, logprobs, finish_reason)``, awaitable) that samples with HF ``generate``
on the model being trained. Concurrent episodes' requests are gathered into one batched
(left-padded) ``generate`` call that runs in a worker thread (``RequestBatcher``), so tool
calls and rewards of other episodes proceed while the model generates. The recorded log-prob of a token is
``log_softmax(logits / temperature)`` at that token, the quantity the trainer recomputes.

:func:`sync_policy_weights` pushes new weights to an external rollout engine (vLLM) after
an update; the actor policy reads the trained module directly and needs no sync.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from cuda_agent.core.policies.batching import BatchStats, RequestBatcher, zero_stats


class ActorPolicy(BatchStats):
    name = "actor"
    token_level = True

    def __init__(self, model: Any, tokenizer: Any, device: Any = None, max_batch: int = 64,
                 temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 512,
                 stop_tokens: tuple[str, ...] = ("<|im_end|>",), gather_ms: float = 5.0, seed: int = 0,
                 autocast_dtype: torch.dtype | None = None, gather: Any = None):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device or next(model.parameters()).device
        self.max_batch = max_batch
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.gather_s = gather_ms / 1000.0
        self.stop_ids: list[int] = []
        if tokenizer.eos_token_id is not None:
            self.stop_ids.append(int(tokenizer.eos_token_id))
        vocab = tokenizer.get_vocab()
        for t in stop_tokens:
            if t in vocab and int(vocab[t]) not in self.stop_ids:
                self.stop_ids.append(int(vocab[t]))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self._batcher = RequestBatcher(self.generate_batch, max_batch, self.gather_s)
        self._lock = threading.Lock()
        self.stats = zero_stats()
        self.seed = seed
        self.autocast_dtype = autocast_dtype  # e.g. bfloat16: generate under autocast on CUDA
        self.gather = gather  # () -> context manager making partitioned (ZeRO-3) parameters whole

    # -- the agent loop's interface -------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: dict) -> tuple[list[int], list[float], str]:
        return await self._batcher.submit(prompt_ids, sampling)

    # -- batched sampling ------------------------------------------------------------

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], samplings: list[dict]) -> list[tuple[list[int], list[float], str]]:
        t0 = time.monotonic()
        with self._lock:
            temp = float(samplings[0].get("temperature", self.temperature))
            top_p = float(samplings[0].get("top_p", self.top_p))
            caps = [int(s.get("max_tokens") or self.max_new_tokens) for s in samplings]
            caps = [max(0, min(c, self.max_new_tokens)) for c in caps]
            limit = getattr(self.model.config, "max_position_embeddings", None)
            if limit:
                caps = [max(0, min(c, int(limit) - len(p))) for c, p in zip(caps, prompts)]
            max_new = max(caps) if caps else 0
            if max_new <= 0:
                return [([], [], "length") for _ in prompts]
            L = max(len(p) for p in prompts)
            ids = torch.full((len(prompts), L), self.pad_id, dtype=torch.long)
            attn = torch.zeros((len(prompts), L), dtype=torch.long)
            for i, p in enumerate(prompts):
                ids[i, L - len(p):] = torch.tensor(p, dtype=torch.long)
                attn[i, L - len(p):] = 1
            was_training = self.model.training
            self.model.eval()
            greedy = temp <= 0
            kwargs = dict(do_sample=not greedy, max_new_tokens=max_new, eos_token_id=self.stop_ids,
                          pad_token_id=self.pad_id, return_dict_in_generate=True, output_logits=True,
                          use_cache=True)
            if not greedy:
                kwargs.update(temperature=temp, top_p=top_p, top_k=0)
            dev = torch.device(self.device)
            import contextlib

            gathered = self.gather() if self.gather is not None else contextlib.nullcontext()
            autocast = (torch.autocast("cuda", dtype=self.autocast_dtype)
                        if self.autocast_dtype is not None and dev.type == "cuda" else contextlib.nullcontext())
            with gathered, autocast:
                out = self.model.generate(input_ids=ids.to(dev), attention_mask=attn.to(dev), **kwargs)
            if was_training:
                self.model.train()
            seqs = out.sequences[:, L:].cpu()
            logits = torch.stack(out.logits, dim=1).float()  # [B, steps, V]
            if not greedy:
                logits = logits / temp
            logp = torch.log_softmax(logits, dim=-1).gather(-1, seqs.to(logits.device)[..., None])[..., 0].cpu()
            results = []
            stop = set(self.stop_ids)
            n_tokens = 0
            for i in range(len(prompts)):
                row = seqs[i].tolist()
                cap = caps[i]
                end, reason = min(cap, len(row)), "length"
                for j, tok in enumerate(row[:cap]):
                    if tok in stop:
                        end, reason = j + 1, "stop"
                        break
                results.append((row[:end], logp[i, :end].tolist(), reason))
                n_tokens += end
            self.record_batch(n_tokens, time.monotonic() - t0, len(prompts))
            return results


def sync_policy_weights(policy: Any, state_dict: dict | None = None, engine: Any = None) -> str:
    """Make an external rollout policy use the latest weights; returns what was done.

    * the actor policy shares the trained module: nothing to do;
    * a policy with ``update_weights(named_tensors)`` (a vLLM engine or server client) gets them;
    * a policy holding an HF ``model`` (the core ``hf`` policy) loads the state dict.
    """
    if isinstance(policy, ActorPolicy):
        return "shared"
    if state_dict is None and engine is not None:
        state_dict = engine.full_state_dict()
    if state_dict is None:
        return "none"
    if hasattr(policy, "update_weights"):
        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        # servers shared by every rank get the weights once, from rank 0; the others wait
        # so that no rank samples from the old weights after the update
        if not (getattr(policy, "shared_across_ranks", False) and distributed and dist.get_rank() != 0):
            policy.update_weights(iter(state_dict.items()))
        if distributed and getattr(policy, "shared_across_ranks", False):
            dist.barrier()
        return "update_weights"
    model = getattr(policy, "model", None)
    if model is not None and hasattr(model, "load_state_dict"):
        model.load_state_dict(state_dict, strict=False)
        return "load_state_dict"
    return "unsupported"
