"""``vllm_server`` policy: token-level rollouts from one or more vLLM servers over HTTP.

Token ids go in and come out (``POST /v1/completions`` with the prompt as token ids,
``return_token_ids`` and ``logprobs=0``), so nothing is re-tokenized between turns and
the trainer gets the exact sampled ids with their log-probs. An episode sticks to one server
(new episodes go to the least used server; a prompt that extends an episode's first prompt follows
it), so its growing prompt hits that server's prefix cache.

Weights follow the trainer: :meth:`VLLMServerPolicy.update_weights` writes the new weights
to ``weight_sync_dir`` (a folder every server can read: the same host or a shared file
system) and asks each server to load them through ``POST /collective_rpc``, then drops the
servers' prefix caches. Start each server so that it accepts this::

    VLLM_SERVER_DEV_MODE=1 vllm serve <model folder> --port 8000 \\
        --worker-extension-cls cuda_agent.core.policies.weight_sync.WeightSyncExtension \\
        --logprobs-mode processed_logprobs

(the dev mode exposes ``/collective_rpc``: keep such servers on a private network).
``processed_logprobs`` makes the returned log-probs those after temperature, the quantity
the trainer recomputes. ``cuda_agent.core.policies.hf_server`` serves the same protocol
from a transformers model, for machines without vLLM.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..agent.loop import PolicyError, run_sync
from ..errors import ConfigError
from ..interfaces import Policy
from .http import PolicyUnavailable, RetryingHTTPClient

TOKEN_ID_PREFIX = "token_id:"
MAX_ROUTES = 65536  # episodes whose server is remembered


@dataclass
class VLLMServerOptions:
    base_urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000/v1"])
    model: str = ""  # local folder with the tokenizer (the trainer sets it to the stage's weights)
    served_model_name: str = ""  # "" : the first model the first server lists
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8192
    seed: int | None = None  # per-request seed; None: the server's randomness
    stop_tokens: list[str] = field(default_factory=lambda: ["<|im_end|>"])
    weight_sync_dir: str = ""  # "" : a temporary folder (servers on this host only)
    api_key_env: str = "VLLM_API_KEY"
    timeout: float = 600.0
    connect_timeout: float = 10.0
    max_retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0
    requests_per_second: float = 0.0


class VLLMServerPolicy(RetryingHTTPClient, Policy):
    """Token ids in, token ids and log-probs out, from vLLM servers; weights synced by file."""

    name = "vllm_server"
    description = "vLLM servers over HTTP, token-level with log-probs; weights synced after each update."
    Options = VLLMServerOptions
    token_level = True
    shared_across_ranks = True  # one set of servers for every trainer rank: rank 0 pushes weights

    def __init__(self, options: VLLMServerOptions | None = None, tokenizer: Any = None):
        super().__init__(options)
        o = self.options
        if not o.base_urls:
            raise ConfigError("policy vllm_server needs options.base_urls (e.g. [http://127.0.0.1:8000/v1])")
        for url in o.base_urls:
            if not str(url).startswith(("http://", "https://")):
                raise ConfigError(f"policy vllm_server: base_urls entry {url!r} is not an http(s) URL")
        self._init_http()
        self.base_urls = [str(u).rstrip("/") for u in o.base_urls]
        if tokenizer is None:
            if not o.model:
                raise ConfigError("policy vllm_server needs options.model: a local folder with the tokenizer")
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:  # pragma: no cover
                raise ConfigError(f"policy vllm_server needs transformers for its tokenizer: {exc}")
            tokenizer = AutoTokenizer.from_pretrained(o.model)
        self.tokenizer = tokenizer
        stop = []
        for t in o.stop_tokens:
            tid = tokenizer.convert_tokens_to_ids(t)
            if tid is not None and tid != getattr(tokenizer, "unk_token_id", None):
                stop.append(int(tid))
        if tokenizer.eos_token_id is not None and int(tokenizer.eos_token_id) not in stop:
            stop.append(int(tokenizer.eos_token_id))
        self.stop_ids = stop
        self.weights_version = 0
        self._sync_dir = o.weight_sync_dir or tempfile.mkdtemp(prefix="cuda-agent-weights-")
        self._served = o.served_model_name
        self._route_lock = threading.Lock()
        self._routes: OrderedDict[tuple[int, str], str] = OrderedDict()  # (length, digest) of a first prompt -> server
        self._route_lengths: dict[int, int] = {}  # lengths of the remembered first prompts -> how many
        self._episodes = {u: 0 for u in self.base_urls}

    # -- generation ------------------------------------------------------------------------

    def server_for(self, prompt_ids: list[int]) -> str:
        """The server of an episode. A prompt that extends the first prompt of an episode seen
        before (a later turn: the same ids and more) goes to that episode's server; any other
        prompt starts an episode on the server with the fewest episodes so far. (Episodes share
        long system prompts, so no fixed-length head of the prompt tells them apart.)"""
        if len(self.base_urls) == 1:
            return self.base_urls[0]
        with self._route_lock:
            digests = _prefix_digests(prompt_ids, sorted(n for n in self._route_lengths if n <= len(prompt_ids)))
            for key in sorted(digests, key=lambda k: -k[0]):  # the longest known first prompt it extends
                url = self._routes.get(key)
                if url is not None:
                    self._routes.move_to_end(key)
                    return url
            url = min(self.base_urls, key=lambda u: self._episodes[u])
            self._episodes[url] += 1
            key = (len(prompt_ids), _prefix_digests(prompt_ids, [len(prompt_ids)])[0][1])
            self._routes[key] = url
            self._route_lengths[key[0]] = self._route_lengths.get(key[0], 0) + 1
            while len(self._routes) > MAX_ROUTES:  # the oldest episodes are over
                (n, _), _ = self._routes.popitem(last=False)
                self._route_lengths[n] -= 1
                if not self._route_lengths[n]:
                    del self._route_lengths[n]
            return url

    async def served_model(self) -> str:
        if not self._served:
            import httpx

            url = self.base_urls[0] + "/models"
            try:
                async with httpx.AsyncClient(timeout=self.options.connect_timeout + 5) as client:
                    r = await client.get(url, headers=self._headers())
                self._served = r.json()["data"][0]["id"]
            except httpx.TransportError as exc:
                raise PolicyUnavailable(f"could not reach {url} to ask for its model name "
                                        f"({type(exc).__name__}: {exc})") from exc
            except Exception as exc:
                raise PolicyError(f"could not ask {url} for its model name ({type(exc).__name__}: {exc}); "
                                  "set policy.options.served_model_name")
        return self._served

    def request_body(self, model: str, prompt_ids: list[int], sampling: dict) -> dict:
        o = self.options
        body: dict[str, Any] = {
            "model": model,
            "prompt": [int(i) for i in prompt_ids],
            "max_tokens": int(sampling.get("max_tokens") or o.max_new_tokens),
            "temperature": float(sampling.get("temperature", o.temperature)),
            "top_p": float(sampling.get("top_p", o.top_p)),
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "stop_token_ids": self.stop_ids,
            "skip_special_tokens": False,
        }
        if o.seed is not None:
            body["seed"] = int(o.seed)
        return body

    async def generate(self, prompt_ids: list[int], sampling: dict) -> tuple[list[int], list[float], str]:
        url = self.server_for(prompt_ids) + "/completions"
        data = await self.post_url(url, self.request_body(await self.served_model(), prompt_ids, sampling))
        return parse_completion(data, url)

    # -- weights ---------------------------------------------------------------------------

    def root_of(self, base_url: str) -> str:
        return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url

    def update_weights(self, named_tensors) -> int:
        """Write the weights once, have every server load them, drop the servers' prefix
        caches; returns how many tensors each worker loaded (the smallest count)."""
        from .weight_sync import LOAD_METHOD, write_weights

        self.weights_version += 1
        path = write_weights(named_tensors, self._sync_dir, self.weights_version)
        counts = run_sync(self._load_everywhere(LOAD_METHOD, str(path)))
        return min(counts) if counts else 0

    async def _load_everywhere(self, method: str, path: str) -> list[int]:
        async def one(base: str) -> int:
            root = self.root_of(base)
            try:
                data = await self.post_url(root + "/collective_rpc", {"method": method, "args": [path]})
            except PolicyError as exc:
                if "HTTP 404" in str(exc):
                    raise PolicyError(
                        f"{root} has no /collective_rpc: start the server with VLLM_SERVER_DEV_MODE=1 and "
                        "--worker-extension-cls cuda_agent.core.policies.weight_sync.WeightSyncExtension") from None
                raise
            await self.post_url(root + "/reset_prefix_cache", {})
            results = (data or {}).get("results") if isinstance(data, dict) else None
            if not results:
                return 0
            try:
                return min(int(r) for r in results)
            except (TypeError, ValueError):
                raise PolicyError(f"{root}/collective_rpc: unexpected results {str(results)[:200]}")

        return list(await asyncio.gather(*(one(b) for b in self.base_urls)))


def _prefix_digests(ids: list[int], lengths: list[int]) -> list[tuple[int, str]]:
    """``(n, digest of ids[:n])`` for each of the ascending ``lengths``, in one pass."""
    h = hashlib.blake2b(digest_size=16)
    out, done = [], 0
    for n in lengths:
        if n > done:
            h.update(array("q", ids[done:n]).tobytes())
            done = n
        out.append((n, h.hexdigest()))
    return out


def parse_completion(data: dict, url: str = "the server") -> tuple[list[int], list[float], str]:
    """Sampled ids, their log-probs and ``stop``/``length`` from a completions response."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise PolicyError(f"no choices in the response of {url}: {str(data)[:300]}")
    lp = choice.get("logprobs") or {}
    lps = lp.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None:  # servers without return_token_ids: the tokens as "token_id:<id>"
        tokens = lp.get("tokens") or []
        try:
            ids = [int(t[len(TOKEN_ID_PREFIX):]) if str(t).startswith(TOKEN_ID_PREFIX) else int(t) for t in tokens]
        except ValueError:
            raise PolicyError(f"{url} returned tokens as text, not ids (is this a vLLM server? "
                              f"return_tokens_as_token_ids was asked for): {str(tokens[:5])}")
    if lps is None:
        raise PolicyError(f"{url} returned no log-probs (logprobs=0 was asked for)")
    ids = [int(i) for i in ids]
    lps = [float(x) if x is not None else 0.0 for x in lps]
    if len(ids) != len(lps):
        raise PolicyError(f"{url} returned {len(ids)} token ids but {len(lps)} log-probs")
    reason = "stop" if choice.get("finish_reason") == "stop" else "length"
    return ids, lps, reason
