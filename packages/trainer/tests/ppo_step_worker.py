"""One PPO update on fixed trajectories; run as a separate process (optionally one of several ranks).

usage: python ppo_step_worker.py OUT_DIR BACKEND ZERO_STAGE MODEL_DIR  (writes OUT_DIR/rank<r>.json)
Environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT for several processes.
:func:`launch` starts the ranks and returns their results.
"""

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

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
    opts = EngineOptions(backend=backend, zero_stage=stage, device="cpu", mixed_precision="no", gradient_checkpointing=False)
    actor = build_engine(load_causal_lm(model_dir), 1e-3, 1.0, opts)
    critic = build_engine(ValueModel.from_pretrained(model_dir), 1e-3, 1.0, opts)
    algo = PPO(PPO.Options(batch_size=4, mini_batch_size=4, micro_batch_size=1, value_clip=0.2))
    trajs = trajectories()
    ws, r = world_size(), rank()
    share = len(trajs) // ws
    mine = trajs[r * share:(r + 1) * share]
    metrics = Trainer(actor, critic, pad_id=0).update(mine, algo, step=0)
    sd = actor.full_state_dict()  # ZeRO-3 gathers the full weights on rank 0 only
    csd = critic.full_state_dict()
    res = {"world": ws, "trajectories": len(mine), "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)}}
    if sd:
        res.update(actor_sum=float(sum(v.double().abs().sum() for v in sd.values())),
                   actor_probe=sd["model.embed_tokens.weight"][:3, :3].flatten().tolist(),
                   critic_sum=float(sum(v.double().abs().sum() for v in csd.values())))
    Path(out, f"rank{r}.json").write_text(json.dumps(res))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # leave together: a rank exiting early aborts the other's gloo threads
        dist.barrier()
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(out: Path, backend: str, stage: int, model: Path, world: int = 1, timeout: float = 300) -> list[dict]:
    """Run ``world`` ranks of this file on the CPU over gloo; the result of each rank."""
    out.mkdir(parents=True, exist_ok=True)
    port = str(_port())
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                   CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD="1", DS_ACCELERATOR="cpu")
        procs.append(subprocess.Popen([sys.executable, __file__, str(out), backend, str(stage), str(model)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


if __name__ == "__main__":
    os.environ.setdefault("CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD", "1")
    main()
    # the result is written: skip interpreter teardown, where gloo/DeepSpeed background
    # threads can abort the process (std::terminate) after the work succeeded
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
