"""DeepSpeed ZeRO-3 data parallel over two gloo processes gives the PPO step of one process.

ZeRO-3 shards parameters, gradients and optimiser state over the ranks, so this is the
multi-process path that differs most from one process. Each rank scores and trains on half
of a fixed global batch; the losses of all ranks (combined), the gradient norms and the
weights after the step must equal those of one accelerate process that sees the whole batch.
This file is also the rank's program: ``python test_multiprocess_zero.py OUT_DIR BACKEND STAGE MODEL``.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import deepspeed  # noqa: F401

    HAVE_DS = True
except Exception:
    HAVE_DS = False


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path, backend: str, stage: int, model: Path, world: int) -> dict:
    """Run ``world`` ranks of this file; returns the combined result."""
    out.mkdir(parents=True, exist_ok=True)
    port = str(_port())
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                   CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD="1", DS_ACCELERATOR="cpu")
        procs.append(subprocess.Popen([sys.executable, __file__, str(out), backend, str(stage), str(model)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    n = sum(x["trajectories"] for x in ranks)
    combined = {k: sum(x["metrics"][k] * x["trajectories"] for x in ranks) / n for k in ("actor/loss", "critic/loss")}
    head = ranks[0]
    return {"world": head["world"], "losses": combined, "grad_norms": {k: head["metrics"][k] for k in
                                                                        ("actor/grad_norm", "critic/grad_norm")},
            "actor_sum": head["actor_sum"], "critic_sum": head["critic_sum"], "actor_probe": head["actor_probe"],
            "trajectories": [x["trajectories"] for x in ranks]}


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_DS, reason="deepspeed is not installed (pip install --no-deps deepspeed ...)")
def test_zero3_two_processes_match_one_process(tmp_path, toy_model):
    one = _launch(tmp_path / "one", "accelerate", 2, toy_model, world=1)
    dp = _launch(tmp_path / "zero3", "deepspeed", 3, toy_model, world=2)
    assert dp["world"] == 2 and dp["trajectories"] == [2, 2] and one["trajectories"] == [4]
    for k, v in one["losses"].items():  # micro-batches of one trajectory: the rank-weighted mean is the global one
        assert dp["losses"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    for k, v in one["grad_norms"].items():
        assert dp["grad_norms"][k] == pytest.approx(v, rel=1e-4), k
    assert dp["actor_probe"] == pytest.approx(one["actor_probe"], abs=1e-5)
    assert dp["actor_sum"] == pytest.approx(one["actor_sum"], rel=1e-5)
    assert dp["critic_sum"] == pytest.approx(one["critic_sum"], rel=1e-5)


def _rank_main(out: str, backend: str, stage: int, model_dir: str) -> None:
    import torch

    from cuda_agent.trainer.algorithms import PPO
    from cuda_agent.trainer.engine import EngineOptions, build_engine, rank, world_size
    from cuda_agent.trainer.loop import Trainer
    from cuda_agent.trainer.models import ValueModel, load_causal_lm
    from ppo_step_worker import trajectories  # the same fixed batch as test_engines

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


if __name__ == "__main__":
    os.environ.setdefault("CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD", "1")
    _rank_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
    # the result is written: skip interpreter teardown, where gloo/DeepSpeed background
    # threads can abort the process (std::terminate) after the work succeeded
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
