"""GAE, rewards and losses against values computed by hand."""

import math

import pytest
import torch

from cuda_agent.trainer.gae import compute_gae, group_advantages, masked_whiten, token_rewards
from cuda_agent.trainer.losses import (
    aggregate,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    policy_loss,
    sft_loss,
    value_loss,
)


def test_gae_single_row_by_hand():
    # three model tokens, reward 1 at the end, gamma 0.9, lambda 0.5
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3)
    adv, ret = compute_gae(r, v, m, gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.7                      # terminal: next value 0
    d1 = 0.0 + 0.9 * 0.7 - 0.6
    d0 = 0.0 + 0.9 * 0.6 - 0.5
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a1 + 0.6, a2 + 0.7], abs=1e-6)


def test_gae_bridges_tool_tokens_and_ignores_their_values():
    # model tokens at 0,1 then tool output at 2,3 then model tokens at 4,5; padding at 6
    m = torch.tensor([[1, 1, 0, 0, 1, 1, 0]], dtype=torch.float32)
    r = token_rewards(torch.tensor([2.0]), m)
    assert r[0].tolist() == [0, 0, 0, 0, 0, 2.0, 0]
    v = torch.tensor([[0.1, 0.2, 9.0, -9.0, 0.3, 0.4, 5.0]])
    adv, ret = compute_gae(r, v, m, gamma=1.0, lam=0.95)
    # the same episode with the gap removed
    adv_c, ret_c = compute_gae(torch.tensor([[0, 0, 0, 2.0]]), torch.tensor([[0.1, 0.2, 0.3, 0.4]]),
                               torch.ones(1, 4), gamma=1.0, lam=0.95)
    assert adv[0, [0, 1, 4, 5]].tolist() == pytest.approx(adv_c[0].tolist(), abs=1e-6)
    assert ret[0, [0, 1, 4, 5]].tolist() == pytest.approx(ret_c[0].tolist(), abs=1e-6)
    assert adv[0, [2, 3, 6]].tolist() == [0, 0, 0]
    # any values (and rewards) at masked positions leave every advantage unchanged
    v2 = v.clone()
    v2[0, [2, 3, 6]] = torch.tensor([123.0, -55.0, 7.0])
    r2 = r.clone()
    r2[0, 2] = 100.0
    adv2, _ = compute_gae(r2, v2, m, gamma=1.0, lam=0.95)
    assert torch.equal(adv, adv2)
    # by hand (gamma 1, lambda 0.95): deltas 0.1, 0.1, 0.1, 1.6
    lam = 0.95
    a3 = 1.6
    a2 = 0.1 + lam * a3
    a1 = 0.1 + lam * a2
    a0 = 0.1 + lam * a1
    assert adv_c[0].tolist() == pytest.approx([a0, a1, a2, a3], abs=1e-6)


def test_gae_batched_rows_are_independent():
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.float32)
    r = token_rewards(torch.tensor([1.0, -1.0]), m)
    v = torch.rand(2, 4)
    adv, _ = compute_gae(r, v, m, 1.0, 0.9)
    a0, _ = compute_gae(r[:1], v[:1], m[:1], 1.0, 0.9)
    a1, _ = compute_gae(r[1:], v[1:], m[1:], 1.0, 0.9)
    assert torch.allclose(adv, torch.cat([a0, a1]))


def test_token_rewards_kl_in_reward():
    m = torch.tensor([[0, 1, 1]], dtype=torch.float32)
    kl = torch.tensor([[5.0, 0.5, 0.25]])
    r = token_rewards(torch.tensor([1.0]), m, kl, kl_coef=0.1)
    assert r[0].tolist() == pytest.approx([0.0, -0.05, 1.0 - 0.025])


def test_whiten_and_group_advantages():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    w = masked_whiten(x, m)
    assert w[0, 3] == 0
    assert w[0, :3].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert w[0, :3].pow(2).mean().item() == pytest.approx(1.0, abs=1e-4)
    scores = torch.tensor([1.0, 0.0, 3.0, 3.0])
    mask = torch.ones(4, 2)
    a = group_advantages(scores, ["a", "a", "b", "b"], mask)
    s = math.sqrt(0.5)  # unbiased std of [1, 0]
    assert a[:, 0].tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0, 0.0], abs=1e-4)


def test_policy_loss_clip_higher_by_hand():
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.1, 0.7
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    mask = torch.ones(1, 4)
    loss, st = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # token losses: max(-A r, -A clip(r, 0.8, 1.28))
    t0 = max(-1.5, -1.28)        # clipped high
    t1 = max(0.5, 0.8)           # negative advantage, clipped low
    t2 = max(-1.1, -1.1)
    t3 = max(-0.7, -0.8)         # not clipped: A>0 with r<1-eps uses unclipped
    assert loss.item() == pytest.approx((t0 + t1 + t2 + t3) / 4, abs=1e-6)
    assert st["clipfrac"] == pytest.approx(0.5)
    assert st["clipfrac_high"] == pytest.approx(0.25)
    assert st["clipfrac_low"] == pytest.approx(0.25)
    # masked tokens do not count; an explicit normaliser replaces the token count
    mask2 = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    loss2, _ = policy_loss(logp, old, adv, mask2, 0.2, 0.28)
    assert loss2.item() == pytest.approx((t0 + t1) / 2, abs=1e-6)
    loss3, _ = policy_loss(logp, old, adv, mask2, 0.2, 0.28, normalizer=8.0)
    assert loss3.item() == pytest.approx((t0 + t1) / 8, abs=1e-6)


def test_dual_clip_bounds_negative_advantage_loss():
    logp = torch.log(torch.tensor([[10.0]]))
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)


def test_value_loss_clipping_by_hand():
    v = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[2.0, 1.0]])
    m = torch.ones(1, 2)
    loss, st = value_loss(v, old, ret, m, clip=0.2)
    # token 0: unclipped (1-2)^2=1, clipped (0.2-2)^2=3.24 -> 3.24; token 1: 1 and 1
    assert loss.item() == pytest.approx(0.5 * (3.24 + 1.0) / 2, abs=1e-6)
    assert st["vf_clipfrac"] == pytest.approx(0.5)
    mse, _ = value_loss(v, old, ret, m, clip=None)
    assert mse.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)


def test_entropy_kl_sft_and_explained_variance():
    logits = torch.zeros(2, 4)
    assert entropy_from_logits(logits).tolist() == pytest.approx([math.log(4)] * 2)
    lp = torch.tensor([[-1.0]])
    ref = torch.tensor([[-2.0]])
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(math.exp(-1) + 1 - 1)
    assert sft_loss(torch.tensor([[-1.0, -3.0]]), torch.tensor([[1, 1]])).item() == pytest.approx(2.0)
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    m = torch.ones(1, 4)
    assert explained_variance(ret, ret, m) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4) + 2.5, ret, m) == pytest.approx(0.0)
    assert explained_variance(-ret, ret, m) < 0


def test_aggregations():
    loss = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate(loss, m, "token-mean").item() == pytest.approx(2.0)
    assert aggregate(loss, m, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert aggregate(loss, m, "seq-mean-token-sum").item() == pytest.approx(3.0)
    with pytest.raises(ValueError):
        aggregate(loss, m, "bogus")
