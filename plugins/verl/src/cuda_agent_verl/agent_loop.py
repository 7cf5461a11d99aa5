"""``CudaAgentLoop``: our agent loop as a verl agent loop (verl 0.9.1 ``AgentLoopBase``).

verl's ``AgentLoopWorker`` builds one agent loop per sample and awaits ``run``. Ours opens a
fresh CUDA workspace for the sample's ``task_id``, runs cuda-agent's own ReAct loop with a
token-level policy that samples from verl's LLM servers (``server_manager.generate``), so
the tool calls, tool-output tokens (mask 0), turn limit and context budget are exactly
those of our trainer, and returns the token ids, response mask, rollout log-probs and the
judge's reward as verl's ``AgentLoopOutput``.

Configure it under ``cuda_agent:`` in verl's trainer config (the fields of
:class:`~cuda_agent.sandbox.workspace.episodes.EpisodeOptions` plus ``dataset``), or hand a built
:class:`~cuda_agent.sandbox.workspace.episodes.EpisodeFactory` to :func:`use_episodes`.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from cuda_agent.core.agent import AgentOptions, run_episode
from cuda_agent.core.agent.loop import render_prompt_ids
from cuda_agent.core.errors import ConfigError, TaskError
from cuda_agent.sandbox.workspace.episodes import EpisodeFactory, EpisodeOptions

AGENT_NAME = "cuda_agent"

_lock = threading.Lock()
_factories: dict[str, EpisodeFactory] = {}
_given: list[EpisodeFactory] = []


def use_episodes(factory: EpisodeFactory | None) -> None:
    """Make every CudaAgentLoop of this process use ``factory`` (None: build one from the config)."""
    with _lock:
        _given[:] = [factory] if factory is not None else []


def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node


def episodes_from_config(section: Any) -> EpisodeFactory:
    """The process-wide factory for a ``cuda_agent:`` config section (built once per section)."""
    spec = dict(_plain(section) or {})
    key = repr(sorted(spec.items()))
    with _lock:
        if _given:
            return _given[0]
        if key not in _factories:
            dataset = spec.pop("dataset", None)
            fields = set(EpisodeOptions.__dataclass_fields__)
            unknown = sorted(set(spec) - fields)
            if unknown:
                from cuda_agent.core.errors import did_you_mean

                raise ConfigError(f"unknown key cuda_agent.{unknown[0]}; {did_you_mean(unknown[0], fields | {'dataset'})}")
            if dataset is None:
                raise ConfigError("cuda_agent.dataset is required (a {name, options} dataset spec), "
                                  "or call cuda_agent_verl.use_episodes(factory)")
            _factories[key] = EpisodeFactory(dataset=dataset, options=EpisodeOptions(**spec))
        return _factories[key]


def sample_task_id(kwargs: dict) -> str:
    """The task of a verl sample: a ``task_id`` column, or ``extra_info.task_id``."""
    if kwargs.get("task_id") is not None:
        return str(kwargs["task_id"])
    extra = kwargs.get("extra_info") or {}
    if isinstance(extra, dict) and extra.get("task_id") is not None:
        return str(extra["task_id"])
    raise TaskError("the verl sample has no task_id (add a task_id column or extra_info.task_id to the dataset)")


class VerlServerPolicy:
    """A token-level policy over verl's LLM servers: exact ids and log-probs of every turn."""

    name = "verl"
    token_level = True

    def __init__(self, server_manager: Any, tokenizer: Any, sampling_params: dict, request_id: str,
                 response_budget: int, prompt_cap: Any = None):
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id  # one id per episode: verl keeps its turns on one server (prefix cache)
        self.response_budget = response_budget
        self.prompt_cap = prompt_cap
        self.prompt_len: int | None = None
        self.seconds = 0.0
        self.calls = 0

    def render_prompt(self, messages: list[dict], schemas: list[dict]) -> list[int]:
        ids = render_prompt_ids(self.tokenizer, messages, schemas)
        if self.prompt_cap is not None:
            ids = self.prompt_cap(ids)
        self.prompt_len = len(ids)
        return ids

    async def generate(self, prompt_ids: list[int], sampling: dict) -> tuple[list[int], list[float], str]:
        used = len(prompt_ids) - (self.prompt_len or 0)
        cap = min(int(sampling.get("max_tokens") or self.response_budget), self.response_budget - used)
        if cap <= 0:
            return [], [], "length"
        params = {**self.sampling_params, "max_tokens": cap}
        t0 = time.monotonic()
        out = await self.server_manager.generate(request_id=self.request_id, prompt_ids=list(prompt_ids),
                                                 sampling_params=params)
        self.seconds += time.monotonic() - t0
        self.calls += 1
        ids = [int(i) for i in out.token_ids][:cap]
        logprobs = [float(x) for x in out.log_probs][: len(ids)] if out.log_probs else [0.0] * len(ids)
        return ids, logprobs, "length" if len(ids) >= cap else "stop"


@register(AGENT_NAME)
class CudaAgentLoop(AgentLoopBase):
    """verl agent loop ``cuda_agent`` (``actor_rollout_ref.rollout.agent.default_agent_loop=cuda_agent``
    or an ``agent_name`` column)."""

    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any, dataset_cls: Any,
                 data_config: Any, hf_model_type: str | None = None, **kwargs: Any):
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config,
                         hf_model_type=hf_model_type, **kwargs)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.episodes = episodes_from_config(self.config.get("cuda_agent"))

    def agent_options(self, prompt_tokens: int) -> AgentOptions:
        """Our loop's limits; its context budget is verl's: the prompt plus ``response_length``."""
        base = self.episodes.agent_options()
        base.context_tokens = prompt_tokens + self.response_length
        base.min_generation_tokens = 1
        return base

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        import asyncio

        task_id = sample_task_id(kwargs)
        episode = await asyncio.to_thread(self.episodes.open, task_id, "verl")
        policy = VerlServerPolicy(self.server_manager, self.tokenizer, sampling_params, uuid.uuid4().hex,
                                  self.response_length, prompt_cap=self._cap_text_prompt_length)
        t0 = time.monotonic()
        try:
            prompt = policy.render_prompt(episode.stepper.messages, episode.stepper.schemas)
            traj = await run_episode(episode.task, policy, episode.env, self.agent_options(len(prompt)))
            episode.record(traj)
        finally:
            await asyncio.to_thread(episode.close)
        seconds = time.monotonic() - t0
        n = self.response_length
        reward = traj.reward
        tool_seconds = sum(r.seconds for t in traj.turns for r in t.tool_results)
        return AgentLoopOutput(
            prompt_ids=list(traj.prompt_ids),
            response_ids=list(traj.response_ids[:n]),
            response_mask=list(traj.loss_mask[:n]),
            response_logprobs=list(traj.rollout_logprobs[:n]) if sampling_params.get("logprobs") else None,
            reward_score=reward.value if reward is not None else None,
            num_turns=1 + sum(1 + (1 if t.tool_results else 0) for t in traj.turns),
            metrics=AgentLoopMetrics(generate_sequences=policy.seconds, tool_calls=tool_seconds,
                                     compute_score=max(0.0, seconds - policy.seconds - tool_seconds)),
            extra_fields={"task_id": task_id, "finish_reason": traj.finish_reason,
                          "correct": bool(reward is not None and reward.correct),
                          "speedup_vs_compile": reward.speedup_vs_compile if reward is not None else None,
                          "tool_calls": traj.metadata.get("tool_calls", 0),
                          "tool_errors": traj.metadata.get("tool_errors", 0),
                          "truncated": len(traj.response_ids) > n},
        )
