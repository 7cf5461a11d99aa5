"""The in-process ``vllm`` policy on vLLM's CPU build with the shared tiny model.

The engine runs inside the test process (no engine-core or worker process to leave behind).
A copy of the tiny model is taught one short episode (a bash call, then DONE) in a few
optimiser steps; its weights go into the engine through ``update_weights``; then a real agent
episode samples from the engine: the sampled ids and their log-probs equal what the taught
model scores for the same ids, the tool output carries loss mask 0, and the engine's log-probs
before the update were the untaught model's.
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]

torch = pytest.importorskip("torch")

from cuda_agent.core.agent import AgentOptions, FolderEnvironment, format_tool_call, run_episode_sync  # noqa: E402
from cuda_agent.core.agent.environment import build_tools  # noqa: E402
from cuda_agent.core.types import Task  # noqa: E402

TASK = Task(id="tiny", source="test", code="import torch\n\nclass Model(torch.nn.Module):\n    pass\n")
SCRIPT = [format_tool_call("bash", {"command": "echo ok"}), "DONE"]
TEMPERATURE = 0.6  # log-probs after temperature (processed_logprobs) are what the trainer recomputes
TOLERANCE = 2e-3  # float32 on both sides; vLLM's CPU kernels sum in another order than torch's


class ScriptedPolicy:
    """Emits the script's turns, closed with <|im_end|> (log-probs are not needed to teach)."""

    token_level = True

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.turns = list(SCRIPT)

    def generate(self, prompt_ids, sampling):
        ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False)
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        return ids, [0.0] * len(ids), "stop"


def make_env(path):
    """A folder with one tool and a one-line system prompt: a prompt of a few hundred tokens."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.py").write_text(TASK.code)
    return FolderEnvironment(path, protected=["model.py"], tools=build_tools(["bash"]),
                             system_prompt="Call bash once, then answer DONE.")


def teach(model, ids: list[int], mask: list[int], steps: int = 1500) -> float:
    """Optimise the masked tokens' likelihood until the model repeats them (at most ``steps``; a prompt
    whose length depends on the temporary folder's path takes more on some runs); returns the last loss."""
    labels = torch.tensor([[i if m else -100 for i, m in zip(ids, mask)]])
    x = torch.tensor([ids])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    loss = torch.tensor(0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # beside another test process on two cores, two threads each wait on the other
    try:
        for _ in range(steps):
            loss = model(input_ids=x, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() < 4e-3:
                break
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return float(loss.detach())


@pytest.fixture(scope="module")
def taught(vllm_tiny_model, tmp_path_factory):
    """``(base, taught, script, folder)``: the tiny model, a copy taught the script's episode, that
    episode, and its workspace (the folder's path is in the prompt: the taught episode runs there)."""
    from cuda_agent.core.policies.hf import HFPolicy

    base = HFPolicy(HFPolicy.Options(model=str(vllm_tiny_model)))
    copy = HFPolicy(HFPolicy.Options(model=str(vllm_tiny_model)))
    # the script as an episode of the environment: the exact ids the agent loop builds
    folder = tmp_path_factory.mktemp("workspace")
    script = run_episode_sync(TASK, ScriptedPolicy(copy.tokenizer), make_env(folder))
    ids = script.prompt_ids + script.response_ids
    assert teach(copy.model, ids, [0] * len(script.prompt_ids) + script.loss_mask) < 0.02
    return base, copy, script, folder


@pytest.fixture(scope="module")
def engine(vllm_tiny_model, taught, in_process_vllm):
    """The engine, started after the teaching: once it runs in this process, vLLM keeps torch's
    thread count where it was (``torch.set_num_threads`` does nothing until it is closed)."""
    with in_process_vllm(model=str(vllm_tiny_model), max_model_len=4096, max_new_tokens=64,
                         engine_args={"kv_cache_memory_bytes": 64 << 20}) as pol:
        yield pol


def test_episode_tokens_logprobs_and_masks_after_a_weight_update(engine, taught):
    base, taught, script, folder = taught
    prompt = script.prompt_ids
    before, before_lps, _ = asyncio.run(engine.generate(prompt, {"max_tokens": 8, "temperature": 1.0}))
    assert base.score(prompt + before, len(prompt), 1.0) == pytest.approx(before_lps, abs=TOLERANCE)

    state = taught.model.state_dict()
    assert engine.update_weights(iter(state.items())) == len(state)

    env = make_env(folder)
    traj = run_episode_sync(TASK, engine, env, AgentOptions(max_turns=3, max_tokens_per_turn=48,
                                                            sampling={"temperature": TEMPERATURE}))
    env.close()
    assert traj.finish_reason == "done", (traj.finish_reason, traj.metadata)
    calls = [c for t in traj.turns for c in t.tool_calls]
    results = [r for t in traj.turns for r in t.tool_results]
    assert [c.name for c in calls] == ["bash"] and results[0].ok and "ok" in results[0].content

    # token-in/token-out: what the engine sampled is what the trainer's model scores
    full = traj.prompt_ids + traj.response_ids
    rescored = taught.score(full, len(traj.prompt_ids), TEMPERATURE)
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    assert len(sampled) == sum(len(range(*t.response_span)) for t in traj.turns) > 0
    assert [rescored[i] for i in sampled] == pytest.approx([traj.rollout_logprobs[i] for i in sampled], abs=TOLERANCE)
    # the untaught weights give other log-probs: the engine sampled from the pushed weights
    old = base.score(full, len(traj.prompt_ids), TEMPERATURE)
    assert max(abs(old[i] - traj.rollout_logprobs[i]) for i in sampled) > 0.5
    # the tool output is the environment's, never trained on
    tail = [i for i, m in enumerate(traj.loss_mask) if not m]
    assert tail and all(traj.rollout_logprobs[i] == 0.0 for i in tail)
    text = taught.tokenizer.decode([traj.response_ids[i] for i in tail], skip_special_tokens=False)
    assert "<tool_response>\nok\n</tool_response>" in text


def test_concurrent_episodes_share_engine_calls(engine, tmp_path):
    """Episodes on one event loop: their requests are sampled together, each gets its own answer."""
    from cuda_agent.core.agent import run_episode

    async def episodes():
        envs = [make_env(tmp_path / f"e{i}") for i in range(4)]
        try:
            return await asyncio.gather(*(run_episode(TASK, engine, env, AgentOptions(
                max_turns=1, max_tokens_per_turn=16, sampling={"temperature": 1.0})) for env in envs))
        finally:
            for env in envs:
                env.close()

    engine.reset_stats()
    trajs = asyncio.run(episodes())
    stats = engine.reset_stats()
    assert stats["calls"] == 4 and stats["batches"] < 4, stats
    assert stats["generated_tokens"] == sum(sum(t.loss_mask) for t in trajs) > 0
    assert all(t.finish_reason != "error" and len(t.rollout_logprobs) == len(t.response_ids) for t in trajs)
