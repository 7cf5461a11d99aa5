"""LLM backends ("policies"): ``openai`` and ``replay`` (chat-level), ``hf`` and ``vllm``
(token-level, heavy imports deferred). :mod:`.tiny` builds tiny offline models for tests."""

from .openai import OpenAIPolicy, parse_chat_response
from .replay import ReplayPolicy, load_turns


def policy_classes() -> list[type]:
    """Every policy class of core (hf and vllm import their heavy libraries only when built)."""
    from .hf import HFPolicy
    from .vllm import VLLMPolicy

    return [OpenAIPolicy, ReplayPolicy, HFPolicy, VLLMPolicy]


__all__ = ["OpenAIPolicy", "ReplayPolicy", "load_turns", "parse_chat_response", "policy_classes"]
