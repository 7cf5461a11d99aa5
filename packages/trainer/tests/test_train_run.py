"""The train command end to end on the toy environment: reward rises, four stages hand over
weights, a run killed with SIGKILL resumes from its last checkpoint, bad configs fail in one line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cuda_agent.core.config import compose
from cuda_agent.core.run import Run
from cuda_agent.trainer.stages import StageRunner

REPO = Path(__file__).resolve().parents[3]
TOY = REPO / "configs" / "toy.yaml"

FOUR_STAGES = [
    {"name": "warmup", "steps": 3, "agent": {"max_turns": 1},
     "algorithm": {"name": "ppo", "options": {"batch_size": 16, "mini_batch_size": 16, "micro_batch_size": 16,
                                               "actor_lr": 3e-3, "critic_lr": 3e-3}}},
    {"name": "rft", "steps": 2,
     "algorithm": {"name": "rft", "options": {"batch_size": 16, "mini_batch_size": 16, "micro_batch_size": 16,
                                               "actor_lr": 1e-3}}},
    {"name": "value", "steps": 2, "critic_init": "actor",
     "algorithm": {"name": "value", "options": {"batch_size": 8, "mini_batch_size": 8, "micro_batch_size": 8,
                                                 "critic_lr": 1e-3}}},
    {"name": "agentic", "steps": 3,
     "algorithm": {"name": "ppo", "options": {"batch_size": 16, "mini_batch_size": 16, "micro_batch_size": 16,
                                               "actor_lr": 3e-3, "critic_lr": 3e-3, "kl_coef": 0.01,
                                               "kl_mode": "loss", "kl_estimator": "k3"}}},
]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_toy_reward_rises(tmp_path):
    over = tmp_path / "over.yaml"
    stages = yaml.safe_load(TOY.read_text())["trainer"]["stages"]
    stages[0]["steps"] = 16
    over.write_text(yaml.safe_dump({"trainer": {"stages": stages}}))
    cfg = compose([TOY, over], [f"run.output_dir={tmp_path}", "logging.console=false"])
    with Run(cfg, command="train") as run:
        hist = StageRunner(cfg, run, show_progress=False).run_all()
    rewards = [h["reward/mean"] for h in hist]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    print("toy reward curve:", [round(r, 2) for r in rewards])
    assert last > first + 0.3, rewards
    m = _metrics(Path(run.dir))
    assert len(m) == 16
    for key in ("reward/mean", "pass_rate", "actor/entropy", "actor/approx_kl", "actor/clipfrac",
                "critic/explained_variance", "response/clipped_ratio", "turns/mean", "rollout/tokens_per_s",
                "train/tokens_per_s", "step_seconds"):
        assert key in m[-1], key
    assert m[-1]["actor/entropy"] < m[0]["actor/entropy"]


def test_grpo_stage_runs(tmp_path):
    over = tmp_path / "over.yaml"
    over.write_text(yaml.safe_dump({"trainer": {"stages": [
        {"name": "grpo", "steps": 2, "algorithm": {"name": "grpo", "options": {
            "batch_size": 16, "group_size": 4, "mini_batch_size": 16, "micro_batch_size": 16, "actor_lr": 1e-3}}}]}}))
    cfg = compose([TOY, over], [f"run.output_dir={tmp_path}", "logging.console=false"])
    with Run(cfg, command="train") as run:
        hist = StageRunner(cfg, run, show_progress=False).run_all()
    assert len(hist) == 2 and "actor/clipfrac" in hist[-1] and "critic/explained_variance" not in hist[-1]
    groups = hist[-1]["groups_all_same"]
    assert 0.0 <= groups <= 1.0


def _train_cmd(*args):
    return [sys.executable, "-m", "cuda_agent.core.cli", "train", *map(str, args), "--no-progress"]


def test_four_stages_and_resume_after_kill(tmp_path):
    over = tmp_path / "four.yaml"
    over.write_text(yaml.safe_dump({"trainer": {"stages": FOUR_STAGES}}))
    out = tmp_path / "runs"
    env = dict(os.environ, CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD="1", OMP_NUM_THREADS="1")
    p = subprocess.Popen(_train_cmd(TOY, over, f"run.output_dir={out}", "logging.console=false"), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # kill -9 once the RFT stage has written its first checkpoint
    target = None
    deadline = time.time() + 150
    while time.time() < deadline and p.poll() is None:
        found = list(out.glob("*/stages/01-rft/checkpoints/step-000000/COMPLETE"))
        if found:
            target = found[0]
            break
        time.sleep(0.05)
    assert target is not None, p.communicate()[0][-3000:] if p.poll() is not None else "no checkpoint in time"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    run_dir = target.parents[4]
    before = _metrics(run_dir)
    assert (run_dir / "stages" / "00-warmup" / "final" / "COMPLETE").exists()
    r = subprocess.run(_train_cmd(TOY, over, f"run.output_dir={out}", f"run.resume={run_dir}",
                                  "logging.console=false"), env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    after = _metrics(run_dir)
    steps = [m["step"] for m in after]
    total = sum(s["steps"] for s in FOUR_STAGES)
    assert sorted(set(steps)) == list(range(total))
    # nothing before the last checkpoint ran twice; at most the step in progress was repeated
    repeated = [s for s in set(steps) if steps.count(s) > 1]
    assert len(repeated) <= 1 and all(s >= 3 for s in repeated), steps
    resumed = after[len(before):]
    # warm-up (3 steps) and RFT step 0 were kept; the run goes on after the last logged step,
    # or repeats it when it was killed between logging and checkpointing that step
    assert resumed[0]["step"] >= 4
    assert resumed[0]["step"] in (before[-1]["step"], before[-1]["step"] + 1), (before[-1]["step"], resumed[0]["step"])
    for i, name in enumerate(s["name"] for s in FOUR_STAGES):
        assert (run_dir / "stages" / f"{i:02d}-{name}" / "final" / "COMPLETE").exists()
    assert (run_dir / "stages" / "03-agentic" / "final" / "critic" / "value_head.safetensors").exists()
    assert list((run_dir / "stages" / "01-rft" / "kept").glob("step-*.jsonl"))
    stage_of = {m["step"]: m["stage"] for m in after}
    assert stage_of[0] == 0 and stage_of[total - 1] == 3
    assert "kl_ref" in after[-1] and "actor/kl_loss" in after[-1]
    assert any("rft/keep_rate" in m for m in after)


def test_bad_stage_key_is_one_line_error(tmp_path, capsys):
    from cuda_agent.core.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"trainer": {"stages": [{"name": "x", "algorithm": {"name": "ppo"}, "stepz": 3}]}}))
    assert main(["train", str(TOY), str(bad), f"run.output_dir={tmp_path}", "logging.console=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stepz" in err[0] and "steps" in err[0]
    bad.write_text(yaml.safe_dump({"trainer": {"stages": [{"name": "x", "algorithm": {"name": "ppo",
                                                                                      "options": {"clip_hi": 1}}}]}}))
    assert main(["train", str(TOY), str(bad), f"run.output_dir={tmp_path}"]) == 2
    assert "clip_high" in capsys.readouterr().err


def test_paper_preset():
    cfg = compose([REPO / "configs" / "paper.yaml"])
    stages = cfg.trainer.stages
    assert [s.algorithm.name for s in stages] == ["ppo", "rft", "value", "ppo"]
    warm, rft, value, ppo = stages
    assert warm.agent.max_turns == 1 and warm.agent.context_tokens == 32768
    o = ppo.algorithm.options
    assert (o.batch_size, o.mini_batch_size, o.epochs) == (1024, 1024, 1)
    assert (o.actor_lr, o.critic_lr, o.clip_low, o.clip_high) == (3e-6, 6e-6, 0.2, 0.28)
    assert ppo.steps == 150 and ppo.agent.max_turns == 150 and ppo.agent.context_tokens == 131072
    assert (value.algorithm.options.gamma, value.algorithm.options.lam) == (1.0, 0.95)
    assert value.algorithm.options.value_clip is None and value.algorithm.options.loss_agg == "token-mean"
    assert rft.algorithm.options.min_reward == 0.0 and rft.algorithm.options.drop_loops
    # the fragment's defaults are the same preset
    base = compose([])
    assert base.trainer.stages[3].algorithm.options.actor_lr == 3e-6


def _policy_engine_config(tmp_path, policy: dict):
    """The toy run, 3 PPO steps, rollouts sampled by the ``policy:`` plugin."""
    over = tmp_path / "over.yaml"
    over.write_text(yaml.safe_dump({
        "policy": policy,
        "trainer": {"rollout": {"engine": "policy"}, "stages": [
            {"name": "ppo", "steps": 3, "algorithm": {"name": "ppo", "options": {
                "batch_size": 8, "mini_batch_size": 8, "micro_batch_size": 8, "actor_lr": 1e-2,
                "critic_lr": 1e-2}}}]}}))
    return compose([TOY, over], [f"run.output_dir={tmp_path}", "logging.console=false"])


def test_rollouts_through_policy_plugin_with_weight_sync(tmp_path):
    """trainer.rollout.engine=policy: the core ``hf`` policy samples; its weights follow every update."""
    cfg = _policy_engine_config(tmp_path, {"name": "hf", "options": {"model": "", "max_new_tokens": 4}})
    with Run(cfg, command="train") as run:
        hist = StageRunner(cfg, run, show_progress=False).run_all()
    # the sampler's log-probs equal the trainer's recomputation at every step: weights were synced
    for h in hist:
        assert h["rollout/logp_diff"] < 1e-4, h["rollout/logp_diff"]
    assert hist[-1]["actor/grad_norm"] > 0


def test_rollouts_through_vllm_server_protocol_with_weight_sync(tmp_path):
    """trainer.rollout.engine=policy with ``vllm_server``: rollouts over loopback HTTP from a
    server speaking vLLM's token-level protocol; the trainer pushes weights after every update
    (and once before the first rollout), so sampled log-probs equal the trainer's."""
    from omegaconf import OmegaConf

    from cuda_agent.core.policies.hf_server import HFTokenServer

    cfg = _policy_engine_config(tmp_path, {"name": "vllm_server", "options": {
        "base_urls": ["http://127.0.0.1:1/v1"], "model": "", "max_retries": 1}})
    with Run(cfg, command="train") as run:
        runner = StageRunner(cfg, run, show_progress=False)
        base = runner.base_model_dir()
        # the server starts from other weights than the actor: the first sync must fix that
        from cuda_agent.core.policies.hf import HFPolicy

        served = HFPolicy(HFPolicy.Options(model=str(base), max_new_tokens=1 << 20))
        with torch_no_grad():
            for p in served.model.parameters():
                p.mul_(-1.0)
        with HFTokenServer(policy=served, served_name="toy") as server:
            OmegaConf.update(runner.cfg, "policy.options.base_urls", [server.url])
            hist = runner.run_all()
            loads = server.stats["weight_loads"]
    for h in hist:
        assert h["rollout/logp_diff"] < 1e-4, h["rollout/logp_diff"]
    assert loads == 1 + len(hist)  # before the first rollout, then after each update
    assert hist[-1]["actor/grad_norm"] > 0


def torch_no_grad():
    import torch

    return torch.no_grad()
