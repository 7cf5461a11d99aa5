"""LLM backends ("policies"): ``openai`` and ``replay`` (chat-level), ``hf``, ``vllm`` and
``vllm_server`` (token-level, heavy imports deferred). :mod:`.tiny` builds tiny offline
models for tests; :mod:`.hf_server` serves vLLM's token-level HTTP protocol from a
transformers model; :mod:`.weight_sync` moves trained weights into vLLM."""

from .openai import OpenAIPolicy, parse_chat_response
from .replay import ReplayPolicy, load_turns


def policy_classes() -> list[type]:
    """Every policy class of core (hf and vllm import their heavy libraries only when built)."""
    from .hf import HFPolicy
    from .vllm import VLLMPolicy
    from .vllm_server import VLLMServerPolicy

    return [OpenAIPolicy, ReplayPolicy, HFPolicy, VLLMPolicy, VLLMServerPolicy]


__all__ = ["OpenAIPolicy", "ReplayPolicy", "load_turns", "parse_chat_response", "policy_classes"]
