"""DeepSpeed ZeRO-3 data parallel over two gloo processes gives the PPO step of one process.

ZeRO-3 shards parameters, gradients and optimiser state over the ranks, so this is the
multi-process path that differs most from one process. Each rank scores and trains on half
of a fixed global batch; the losses of all ranks (combined), the gradient norms and the
weights after the step must equal those of one accelerate process that sees the whole batch.
The ranks run ``ppo_step_worker.py``.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from ppo_step_worker import launch  # noqa: E402

try:
    import deepspeed  # noqa: F401

    HAVE_DS = True
except Exception:
    HAVE_DS = False


def _launch(out: Path, backend: str, stage: int, model: Path, world: int) -> dict:
    """Run ``world`` ranks of ``ppo_step_worker.py``; returns the combined result."""
    ranks = launch(out, backend, stage, model, world)
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
