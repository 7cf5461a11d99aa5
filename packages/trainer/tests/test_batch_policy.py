"""Collation into action coordinates, rollouts through the core agent loop, log-prob agreement."""

import random

import pytest
import torch

from cuda_agent.core.agent import AgentOptions
from cuda_agent.core.types import RewardResult, Trajectory
from cuda_agent.trainer.batch import collate
from cuda_agent.trainer.envs.toy import ToyEnvironmentFactory
from cuda_agent.trainer.models import actor_forward, load_causal_lm
from cuda_agent.trainer.policy import ActorPolicy
from cuda_agent.trainer.rollout import collect, load_trajectories, rollout_metrics, save_trajectories


def _traj(prompt, resp, mask, lps, reward):
    t = Trajectory(id="t", task_id="x", prompt_ids=prompt, response_ids=resp, loss_mask=mask, rollout_logprobs=lps)
    t.reward = RewardResult(value=reward, reward="r")
    return t


def test_collate_action_coordinates():
    a = _traj([5, 6], [7, 8, 9], [1, 0, 1], [-0.1, 0.0, -0.3], 1.0)
    b = _traj([5], [4], [1], [-0.2], -1.0)
    batch = collate([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 4, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # action t chooses input_ids[t+1]
    assert batch.action_mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]
    assert batch.rollout_logp[0].tolist() == pytest.approx([0.0, -0.1, 0.0, -0.3])
    assert batch.scores.tolist() == [1.0, -1.0]
    sub = batch.select([1])
    assert sub.input_ids.shape == (1, 2) and sub.action_mask.shape == (1, 1)
    cut = collate([a], max_length=3)
    assert cut.truncated == [True] and cut.action_mask.tolist() == [[0, 1]]


def test_rollouts_through_agent_loop_record_exact_logprobs(toy_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(toy_model))
    model = load_causal_lm(toy_model)
    torch.manual_seed(0)
    policy = ActorPolicy(model, tok, max_batch=16, max_new_tokens=4)
    fac = ToyEnvironmentFactory(ToyEnvironmentFactory.Options(num_targets=4))
    tasks = fac.tasks(6, random.Random(0))
    opts = AgentOptions(max_turns=3, context_tokens=256, max_tokens_per_turn=4, min_generation_tokens=4,
                        check_hooks=False)
    res = collect(tasks, policy, lambda t, i: fac.make(t), opts, concurrency=8, samples_per_task=2,
                  show_progress=False)
    fac.close()
    trajs = res.trajectories
    assert len(trajs) == 12 and res.generated_tokens > 0
    assert all(t.reward is not None for t in trajs)
    assert {t.metadata["group"] for t in trajs} == {f"{t.id}@0" for t in tasks}
    multi = [t for t in trajs if 0 in t.loss_mask]
    assert multi, "some episodes should have tool output tokens (loss mask 0)"
    m = rollout_metrics(trajs)
    assert 0.0 <= m["reward/mean"] <= 1.0 and m["turns/mean"] >= 1
    # the trainer's recomputed log-probs equal the sampler's at every model token
    batch = collate(trajs, pad_id=tok.pad_token_id)
    with torch.no_grad():
        lp, _ = actor_forward(model, batch.input_ids, batch.attention_mask)
    diff = ((lp - batch.rollout_logp).abs() * batch.action_mask).max().item()
    assert diff < 1e-4
    assert batch.num_action_tokens == sum(sum(t.loss_mask) for t in trajs)
    with torch.no_grad():  # the output head at the model's tokens only: the same numbers there
        kept, _ = actor_forward(model, batch.input_ids, batch.attention_mask, action_mask=batch.action_mask)
    assert ((kept - batch.rollout_logp).abs() * batch.action_mask).max().item() < 1e-4


def test_output_head_at_model_tokens_only_gives_the_same_loss_and_gradients(toy_model):
    from cuda_agent.trainer.losses import aggregate
    from cuda_agent.trainer.models import accepts_logits_to_keep

    model = load_causal_lm(toy_model)
    assert accepts_logits_to_keep(model)
    a = _traj([5, 6, 7], [8, 9, 10, 11, 12], [1, 1, 0, 0, 1], [0.0] * 5, 1.0)
    b = _traj([5], [13, 14], [0, 1], [0.0] * 2, -1.0)
    batch = collate([a, b], pad_id=0)
    results = []
    for mask in (None, batch.action_mask):
        model.zero_grad()
        lp, ent = actor_forward(model, batch.input_ids, batch.attention_mask, 0.7, with_entropy=True, action_mask=mask)
        loss = aggregate(-lp + 0.1 * ent, batch.action_mask)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        m = batch.action_mask.bool()
        results.append((loss.item(), lp[m], ent[m], grads))
        if mask is not None:  # positions without a model token in any row are never computed
            assert lp[:, ~batch.action_mask.bool().any(0)].abs().sum().item() == 0.0
    (l0, lp0, e0, g0), (l1, lp1, e1, g1) = results
    assert l1 == pytest.approx(l0, rel=1e-5)
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)
    assert len(g0) == len(g1) and all(torch.allclose(x, y, atol=1e-6) for x, y in zip(g0, g1))


def test_trajectory_roundtrip(tmp_path):
    a = _traj([1, 2], [3, 4], [1, 0], [-0.5, 0.0], 2.0)
    save_trajectories([a], tmp_path / "t.jsonl")
    back = load_trajectories(tmp_path / "t.jsonl")
    assert back[0].response_ids == [3, 4] and back[0].reward.value == 2.0
