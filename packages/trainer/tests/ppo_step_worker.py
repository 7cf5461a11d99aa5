"""One PPO update on fixed trajectories; run as a separate process (optionally one of several ranks).

usage: python ppo_step_worker.py OUT.json BACKEND ZERO_STAGE MODEL_DIR
Environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT for several processes.
"""

import json
import os
import random
import sys

import torch

from cuda_agent.core.types import RewardResult, Trajectory
from cuda_agent.trainer.algorithms import PPO
from cuda_agent.trainer.engine import EngineOptions, build_engine, rank, world_size
from cuda_agent.trainer.loop import Trainer
from cuda_agent.trainer.models import ValueModel, load_causal_lm


def trajectories(n=4, vocab=60):
    rng = random.Random(7)
    out = []
    for i in range(n):
        p = [rng.randrange(1, vocab) for _ in range(3 + i % 2)]
        r = [rng.randrange(1, vocab) for _ in range(5 + i)]
        mask = [1, 1, 0, 0] + [1] * (len(r) - 4)
        t = Trajectory(id=f"t{i}", task_id=f"task{i % 2}", prompt_ids=p, response_ids=r, loss_mask=mask,
                       rollout_logprobs=[-1.0 if m else 0.0 for m in mask])
        t.reward = RewardResult(value=float(i % 3) - 1.0, reward="x")
        out.append(t)
    return out


def main():
    out, backend, stage, model_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.manual_seed(0)
    opts = EngineOptions(backend=backend, zero_stage=stage, device="cpu", mixed_precision="no")
    actor = build_engine(load_causal_lm(model_dir), 1e-3, 1.0, opts)
    critic = build_engine(ValueModel.from_pretrained(model_dir), 1e-3, 1.0, opts)
    algo = PPO(PPO.Options(batch_size=4, mini_batch_size=4, micro_batch_size=1, value_clip=0.2))
    trajs = trajectories()
    ws, r = world_size(), rank()
    share = len(trajs) // ws
    mine = trajs[r * share:(r + 1) * share]
    metrics = Trainer(actor, critic, pad_id=0).update(mine, algo, step=0)
    sd = actor.full_state_dict()
    csd = critic.full_state_dict()
    res = {
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
        "actor_sum": float(sum(v.double().abs().sum() for v in sd.values())),
        "actor_probe": sd["model.embed_tokens.weight"][:3, :3].flatten().tolist(),
        "critic_sum": float(sum(v.double().abs().sum() for v in csd.values())),
        "world": ws,
    }
    if r == 0:
        with open(out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    os.environ.setdefault("CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD", "1")
    main()
