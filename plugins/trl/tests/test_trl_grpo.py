"""TRL's real GRPOTrainer trains a tiny offline model on CPU-backend tasks through our environment.

The policy is a random-weight Qwen2 whose tokenizer is trained in-process, taught in a few
seconds to answer with one bash call that copies the workspace's example solution and
one call of a tool that does not exist. TRL runs the calls through our agent tools; the
judge compiles, verifies and profiles what is left in the workspace, and the reward it
returns is the one TRL logs. The unknown tool, a call past the turn limit and a failing
tool reach the model as errors while training goes on.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

trl = pytest.importorskip("trl", reason="the trl package is not installed (pip install -e 'plugins/trl[trl]')")
torch = pytest.importorskip("torch")

from cuda_agent.core.types import Task  # noqa: E402
from cuda_agent_trl import (  # noqa: E402
    CudaReward,
    CudaToolEnvFactory,
    EpisodeFactory,
    EpisodeOptions,
    ToolFailed,
    task_dataset,
)

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = (REPO / "tools" / "template" / "gxx" / "examples" / "model.py").read_text()
# the same program with the coefficients swapped: the example's kernel is wrong for it
SWAPPED = EXAMPLE.replace("self.alpha * a + self.beta * b", "self.beta * a + self.alpha * b")
SYSTEM = "You write fast CPU kernels with the bash tool."
ANSWER = ('<tool_call>\n{"name": "bash", "arguments": {"command": "cp -r examples/kernels examples/model_new.py ."}}\n'
          '</tool_call>\n<tool_call>\n{"name": "nvcc_magic", "arguments": {}}\n</tool_call><|im_end|>')


# one timing each (no repeats on a noisy spread): the reward's milestones, not its speedup, are checked
ONE_TIMING = {"profile_options": {"attempts": 1, "num_input_sets": 1}}


def _tasks():
    return [Task(id="axpby", source="test", code=EXAMPLE), Task(id="axpby_swapped", source="test", code=SWAPPED)]


def _policy(prompts: list[list[dict]], tools: list | None):
    """A tiny Qwen2 (random init, tokenizer trained here) fitted to answer ANSWER after each prompt."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from cuda_agent.trainer.tiny import build_tiny_causal_lm, train_bpe_tokenizer

    texts = [m["content"] for p in prompts for m in p] + [ANSWER, qwen2_5_chat_template]
    tok = train_bpe_tokenizer(texts, vocab_size=1000)
    tok.chat_template = qwen2_5_chat_template
    model, tok = build_tiny_causal_lm(tokenizer=tok, hidden_size=64, num_layers=2, num_heads=4,
                                      max_position_embeddings=4096, seed=0)
    answer = tok.encode(ANSWER, add_special_tokens=False)
    rows = []
    for p in prompts:
        ids = tok.apply_chat_template(p, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
        rows.append((list(ids), answer))
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (a, b) in enumerate(rows):
        seq = torch.tensor(a + b)
        ids[i, : len(seq)], mask[i, : len(seq)] = seq, 1
        labels[i, len(a): len(seq)] = torch.tensor(b)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(200):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if loss.item() < 0.005:
            break
    tok.padding_side = "left"
    return model, tok


def _config(tmp_path, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                max_completion_length=192, learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
                bf16=False, save_strategy="no", temperature=0.7, seed=0, disable_tqdm=True)
    base.update(kw)
    return GRPOConfig(**base)


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.fixture(autouse=True)
def _quiet_and_one_thread(monkeypatch):
    """One torch thread: a model this small runs ~10x slower when two threads contend on a busy machine."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_environment_factory_reward_is_the_judges(tmp_path):
    from trl import GRPOTrainer

    episodes = EpisodeFactory(_tasks(), options=EpisodeOptions(backend="cpu", max_turns=1, tools=["bash"],
                                                               workdir=str(tmp_path / "ws"), service=ONE_TIMING))
    envs = CudaToolEnvFactory(episodes)
    dataset = task_dataset(episodes, repeat=2, system=SYSTEM)
    probe = envs()
    prompts = []
    for tid in episodes.tasks:
        row = [dict(m) for m in dataset[0]["prompt"]]
        row[-1]["content"] = probe.reset(task_id=tid)
        prompts.append(row)
    probe._close_episode()
    model, tok = _policy(prompts, [getattr(probe, n) for n in envs.tool_names])
    trainer = GRPOTrainer(model=model, args=_config(tmp_path, max_steps=2, max_tool_calling_iterations=2),
                          train_dataset=dataset, processing_class=tok, environment_factory=envs)
    try:
        trainer.train()
    finally:
        envs.close()
    assert trainer.state.global_step == 2
    logged = _logged(trainer, "rewards/CudaToolEnv/mean")
    assert len(logged) == 2 and len(envs.scored) == 4, (logged, envs.scored)
    # one step = one prompt x 2 generations, scored in order: the judge's values are what TRL logged
    for step, value in enumerate(logged):
        ours = [s["reward"] for s in envs.scored[2 * step: 2 * step + 2]]
        assert math.isclose(value, sum(ours) / 2, abs_tol=1e-6), (step, value, envs.scored)
    assert _logged(trainer, "reward") == logged
    # the model's calls ran through our tools; the unknown tool and the call past the turn
    # limit came back as errors while training went on
    ran = [s for s in envs.scored if s["tool_calls"] > 0]
    assert ran, envs.scored
    assert all(s["finish_reason"] == "max_turns" for s in ran)
    assert max(_logged(trainer, "tools/failure_frequency")) > 0
    assert all(s["reward"] in (-1.0, 1.0, 2.0, 3.0) for s in envs.scored)
    for s in ran:  # the copied example passes verification on its own task, fails on the swapped one
        assert s["verified"] == (s["task_id"] == "axpby"), envs.scored
        if s["task_id"] == "axpby_swapped":
            assert s["reward"] == -1.0 and not s["correct"]


def test_bad_calls_are_errors_for_the_model_not_crashes(tmp_path):
    episodes = EpisodeFactory(_tasks()[:1], options=EpisodeOptions(backend="cpu", max_turns=2, tools=["bash", "read"],
                                                                   workdir=str(tmp_path / "ws")))
    envs = CudaToolEnvFactory(episodes)
    env = envs()
    try:
        with pytest.raises(Exception, match="must call reset"):
            env.bash(command="ls")
        assert "Task axpby" in env.reset(task_id="axpby")
        assert "model.py" in env.bash(command="ls")
        with pytest.raises(ToolFailed, match="outside the workspace"):
            env.read(path="/etc/hostname")
        with pytest.raises(Exception, match="is over \\(max_turns after 2 turns\\)"):
            env.bash(command="ls")
        assert env.get_reward() == -1.0  # nothing written: a missing candidate
        with pytest.raises(Exception, match="unknown task 'nope'"):
            env.reset(task_id="nope")
    finally:
        envs.close()


def test_reward_function_scores_single_turn_completions(tmp_path):
    from trl import GRPOTrainer

    episodes = EpisodeFactory(_tasks(), options=EpisodeOptions(backend="cpu", tools=["bash"],
                                                               workdir=str(tmp_path / "ws"), service=ONE_TIMING))
    dataset = task_dataset(episodes, repeat=1, system=SYSTEM, task_in_prompt=True)
    model, tok = _policy([dataset[i]["prompt"] for i in range(len(dataset))], None)
    reward = CudaReward(episodes, workers=2, tokenizer=tok)  # this tokenizer's tool tags are special tokens
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=_config(tmp_path, max_steps=1),
                          train_dataset=dataset, processing_class=tok)
    try:
        trainer.train()
    finally:
        reward.close()
    logged = _logged(trainer, "rewards/cuda_reward/mean")
    assert len(logged) == 1 and len(reward.scored) == 2
    assert math.isclose(logged[0], sum(s["reward"] for s in reward.scored) / 2, abs_tol=1e-6), reward.scored
    # the completions' calls ran (bash + the unknown tool) and what they left was judged
    ran = [s for s in reward.scored if s["tool_calls"] == 2]
    assert ran, reward.scored
    for s in ran:
        assert s["verified"] == (s["task_id"] == "axpby"), reward.scored
    with pytest.raises(ValueError, match="needs a task_id column"):
        reward(prompts=["p"], completions=["c"])
