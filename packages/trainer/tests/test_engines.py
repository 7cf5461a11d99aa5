"""Real optimiser steps: accelerate, DeepSpeed ZeRO-2/3 in one process, and data parallel over gloo."""

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
needs_ds = pytest.mark.skipif(not HAVE_DS, reason="deepspeed is not installed (pip install --no-deps deepspeed ...)")


def _run(tmp_path, backend, stage, model, world=1):
    """Rank 0's result of one PPO step over ``world`` gloo processes."""
    return launch(tmp_path / f"{backend}-{stage}-{world}", backend, stage, model, world, timeout=240)[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, toy_model):
    return _run(tmp_path_factory.mktemp("acc"), "accelerate", 2, toy_model)


def test_accelerate_step_changes_weights(reference, toy_model):
    m = reference["metrics"]
    assert m["actor/grad_norm"] > 0 and m["critic/grad_norm"] > 0
    assert "actor/clipfrac" in m and "critic/explained_variance" in m and "actor/entropy" in m


@needs_ds
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_single_process_step_matches_accelerate(tmp_path, reference, toy_model, stage):
    ds = _run(tmp_path, "deepspeed", stage, toy_model)
    assert ds["metrics"]["actor/loss"] == pytest.approx(reference["metrics"]["actor/loss"], rel=1e-4, abs=1e-6)
    assert ds["metrics"]["critic/loss"] == pytest.approx(reference["metrics"]["critic/loss"], rel=1e-4, abs=1e-6)
    assert ds["actor_probe"] == pytest.approx(reference["actor_probe"], abs=1e-5)
    assert ds["actor_sum"] == pytest.approx(reference["actor_sum"], rel=1e-5)
    assert ds["critic_sum"] == pytest.approx(reference["critic_sum"], rel=1e-5)


def test_two_processes_match_one_process(tmp_path, reference, toy_model):
    dp = _run(tmp_path, "accelerate", 2, toy_model, world=2)
    assert dp["world"] == 2
    for k in ("actor/grad_norm", "critic/grad_norm"):
        assert dp["metrics"][k] == pytest.approx(reference["metrics"][k], rel=1e-4)
    assert dp["actor_probe"] == pytest.approx(reference["actor_probe"], abs=1e-5)
    assert dp["actor_sum"] == pytest.approx(reference["actor_sum"], rel=1e-5)
    assert dp["critic_sum"] == pytest.approx(reference["critic_sum"], rel=1e-5)
