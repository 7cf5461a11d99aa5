"""SmolLM2-135M-Instruct served by the in-process ``vllm`` policy (vLLM's CPU build) for the trainer.

An agent episode sampled by the engine at the rollout temperature is scored again by the trainer
(``collate`` + ``actor_forward``): every model token's log-prob agrees within 2e-3. Then the
trainer updates the weights on an expert episode, the engine receives them through
``update_weights`` and its greedy output changes to the updated model's, and a new episode's
log-probs agree with the updated model (and no longer with the old one).

The measured numbers for more episodes are ``scripts/real_model_vllm.py``.
"""

from __future__ import annotations

import asyncio
import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.xdist_group("vllm"), pytest.mark.timeout(900)]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

TEMPERATURE = 0.7  # the PPO stage's rollout temperature in scripts/real_model.py
TOLERANCE = 2e-3  # float32 on both sides; vLLM's CPU kernels sum in another order than torch's
TOOLS = ["bash", "read", "write"]


def make_env(path, score=None):
    """The compact prompt over a plain folder with the task's files (no compiler: the episode's
    tokens are what is checked here, the judge is test_real_model's)."""
    from cuda_agent.core.agent import FolderEnvironment
    from cuda_agent.core.agent.environment import build_tools
    from cuda_agent.trainer.expert import CompactPrompt, easy_tasks, model_new_source

    task = easy_tasks()[0]
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.py").write_text(task.code)
    (path / "model_new.py").write_text(model_new_source(task.metadata["reduce"]))
    env = FolderEnvironment(path, tools=build_tools(TOOLS), protected=["model.py"], score=score)
    return task, CompactPrompt(env)


def options(temperature: float, turns: int = 2, tokens: int = 48):
    from cuda_agent.core.agent import AgentOptions

    return AgentOptions(max_turns=turns, context_tokens=4096, max_tokens_per_turn=tokens, min_generation_tokens=8,
                        sampling={"temperature": temperature}, check_hooks=False)


@pytest.fixture(scope="module")
def models(smollm2, tmp_path_factory):
    """``(tokenizer, base, updated, expert)``: the model, a copy the trainer updated on the
    expert's episode until its greedy answer changed, and that episode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cuda_agent.core.agent import run_episode_sync
    from cuda_agent.core.policies.hf import HFOptions, HFPolicy
    from cuda_agent.core.types import RewardResult
    from cuda_agent.trainer.algorithms.rft import RFT, RFTOptions
    from cuda_agent.trainer.engine import EngineOptions, build_engine
    from cuda_agent.trainer.expert import ScriptedExpert
    from cuda_agent.trainer.loop import Trainer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(smollm2))
    base = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    updated = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32)
    folder = tmp_path_factory.mktemp("expert")
    task, env = make_env(folder, score=lambda traj, env: RewardResult(1.0, "test", correct=True))
    expert = run_episode_sync(task, ScriptedExpert(tok), env, options(0.0, turns=2, tokens=640))
    env.close()
    assert [c.name for t in expert.turns for c in t.tool_calls][:2] == ["read", "write"], expert.turns
    engine = build_engine(updated, 1e-3, 1.0, EngineOptions(backend="accelerate", mixed_precision="no", device="cpu",
                                                            gradient_checkpointing=False, train_layers=4))
    trainer = Trainer(engine, None, None, pad_id=tok.pad_token_id, max_length=4096)
    algo = RFT(RFTOptions(batch_size=1, mini_batch_size=1, micro_batch_size=1, actor_lr=1e-3))

    def greedy(model):
        pol = HFPolicy(HFOptions(model="smollm2-135m", temperature=0.0, max_new_tokens=16), model=model, tokenizer=tok)
        return pol.generate(expert.prompt_ids, {"max_tokens": 16})[0]

    before = greedy(base)
    for step in range(8):
        trainer.update([expert], algo, step=step)
        if greedy(updated) != before:
            break
    updated.eval()
    assert greedy(updated) != before, "eight updates on the expert's episode left the greedy answer unchanged"
    return tok, base, updated, expert


@pytest.fixture(scope="module")
def engine(smollm2, models, in_process_vllm):
    """The engine in this process, started after the updates."""
    with in_process_vllm(model="smollm2-135m", max_model_len=4096, max_new_tokens=640,
                         engine_args={"kv_cache_memory_bytes": 256 << 20}) as pol:
        yield pol


def test_vllm_logprobs_match_the_trainer_and_pushed_weights_change_outputs(models, engine, tmp_path):
    from cuda_agent.core.agent import run_episode_sync
    from cuda_agent.trainer.agreement import agreement

    tok, base, updated, expert = models
    pad = tok.pad_token_id
    # an episode of the untrained model sampled by the engine, scored by the trainer
    task, env = make_env(tmp_path / "before")
    before = run_episode_sync(task, engine, env, options(TEMPERATURE))
    env.close()
    assert before.prompt_ids == expert.prompt_ids  # the same prompt, rendered by the engine's tokenizer
    ag = agreement(base, [before], TEMPERATURE, pad)
    assert ag.tokens > 0 and ag.max_abs <= TOLERANCE, ag
    greedy_before = asyncio.run(engine.generate(expert.prompt_ids, {"max_tokens": 16, "temperature": 0.0}))[0]

    # the trainer's weights into the engine
    state = updated.state_dict()
    assert engine.update_weights(iter(state.items())) == len(state)
    greedy_after = asyncio.run(engine.generate(expert.prompt_ids, {"max_tokens": 16, "temperature": 0.0}))[0]
    assert greedy_after != greedy_before
    with torch.no_grad():  # the updated model's own greedy answer
        x = torch.tensor([expert.prompt_ids])
        ref = updated.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=len(greedy_after),
                               do_sample=False, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=pad)
    assert greedy_after == ref[0, x.shape[1]:].tolist()

    task, env = make_env(tmp_path / "after")
    after = run_episode_sync(task, engine, env, options(TEMPERATURE))
    env.close()
    ag_new = agreement(updated, [after], TEMPERATURE, pad)
    assert ag_new.tokens > 0 and ag_new.max_abs <= TOLERANCE, ag_new
    assert agreement(base, [after], TEMPERATURE, pad).max_abs > 50 * TOLERANCE  # sampled from the new weights
    # the tool output of a turn is the environment's: recorded with loss mask 0 and log-prob 0
    tail = [i for i, m in enumerate(after.loss_mask) if not m]
    assert all(after.rollout_logprobs[i] == 0.0 for i in tail)
