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
    # every step once: a step logged but not checkpointed when the kill came was dropped and redone
    assert steps == list(range(total)), steps
    # warm-up (3 steps) and RFT step 0 were kept
    assert after[:4] == [m for m in before if m["step"] < 4]
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


def test_kill_during_checkpoint_write_logs_every_step_once(tmp_path):
    """kill -9 while a step's checkpoint is being written (``step-00000N.tmp*`` exists): that
    step was already logged; the resumed run redoes it and metrics.jsonl still holds every
    step once (the resumed stage drops what was logged after its last complete checkpoint)."""
    over = tmp_path / "small.yaml"
    over.write_text(yaml.safe_dump({"trainer": {"stages": [
        {"name": "ppo", "steps": 5, "algorithm": {"name": "ppo", "options": {
            "batch_size": 8, "mini_batch_size": 8, "micro_batch_size": 8, "actor_lr": 3e-3, "critic_lr": 3e-3}}}]}}))
    env = dict(os.environ, CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD="1", OMP_NUM_THREADS="1")
    killed = None
    for attempt in range(4):  # the write lasts a fraction of a second: try again if the kill came late
        out = tmp_path / f"runs{attempt}"
        p = subprocess.Popen(_train_cmd(TOY, over, f"run.output_dir={out}", "logging.console=false"), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            tmp = [d for d in out.glob("*/stages/00-ppo/checkpoints/step-*.tmp*") if not d.name.startswith("step-000000")]
            if tmp:
                os.kill(p.pid, signal.SIGKILL)
                break
            time.sleep(0.002)
        if p.poll() is None and time.time() >= deadline:
            os.kill(p.pid, signal.SIGKILL)
        log = p.communicate()[0]
        assert p.returncode in (0, -signal.SIGKILL), log[-3000:]
        leftovers = list(out.glob("*/stages/00-ppo/checkpoints/step-*.tmp*"))
        if p.returncode == -signal.SIGKILL and leftovers:
            killed = leftovers[0]
            break
    assert killed is not None, "never killed while a checkpoint was being written"
    run_dir = killed.parents[3]
    step = int(killed.name.split(".")[0].split("-")[1])
    before = [m["step"] for m in _metrics(run_dir)]
    assert before[-1] == step and not (killed.parent / f"step-{step:06d}").exists()  # logged, not saved
    r = subprocess.run(_train_cmd(TOY, over, f"run.output_dir={out}", f"run.resume={run_dir}", "logging.console=false"),
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    steps = [m["step"] for m in _metrics(run_dir)]
    assert steps == list(range(5)), steps
    assert not list(killed.parent.glob("*.tmp*"))


def test_rollout_endpoint_failures_are_dropped_not_rewarded(tmp_path):
    """Rollouts from a vLLM-protocol server on loopback whose first three completions answer
    HTTP 500: those three episodes are infrastructure errors, dropped from step 0's batch and
    counted (rollout/infra_errors), never rewarded; the update trains on the other five."""
    cfg = _policy_engine_config(tmp_path, {"name": "vllm_server", "options": {
        "base_urls": ["http://127.0.0.1:1/v1"], "model": "", "max_retries": 0}})
    with Run(cfg, command="train") as run:
        hist = _run_with_flaky_server(cfg, run, failures=3)
    first, later = hist[0], hist[1:]
    assert first["rollout/infra_errors"] == 3 and first["rollout/episodes"] == 5
    assert first["train/trajectories"] == 5  # the update saw only the model's own episodes
    assert "finish/infra_error" not in first  # nor did the reward statistics
    assert all(h["rollout/infra_errors"] == 0 and h["train/trajectories"] == 8 for h in later)
    events = [json.loads(x) for x in (Path(run.dir) / "log.jsonl").read_text().splitlines()]
    dropped = [e for e in events if e["event"] == "rollout.infra_errors"]
    assert len(dropped) == 1 and dropped[0]["dropped"] == 3 and "HTTP 500" in dropped[0]["error"]
    assert sum(e["event"] == "policy.unavailable" for e in events) == 3


def test_rollout_with_endpoint_down_stops_with_one_line(tmp_path):
    """Every episode of a step failing for infrastructure reasons (the server answers every
    completion with HTTP 500, past one retry) stops the run, resumable, with the reason in one
    line and run.end status infra_error."""
    from cuda_agent.core.errors import InfrastructureError

    cfg = _policy_engine_config(tmp_path, {"name": "vllm_server", "options": {
        "base_urls": ["http://127.0.0.1:1/v1"], "model": "", "max_retries": 1, "backoff": 0.01}})
    with pytest.raises(InfrastructureError, match=r"step 0: all 8 episodes failed for infrastructure reasons") as err:
        with Run(cfg, command="train") as run:
            _run_with_flaky_server(cfg, run, failures=10 ** 9)
    assert "HTTP 500" in err.value.one_line() and f"run.resume={run.dir}" in err.value.one_line()
    events = [json.loads(x) for x in (Path(run.dir) / "log.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "run.end" and events[-1]["status"] == "infra_error"
    assert sum(e["event"] == "policy.retry" for e in events) == 8
    assert not (Path(run.dir) / "metrics.jsonl").read_text().strip()  # no step was logged


def _run_with_flaky_server(cfg, run, failures: int) -> list[dict]:
    """The stages, sampled through a vLLM-protocol server on loopback (the base weights) whose
    first ``failures`` completions answer HTTP 500."""
    import threading

    from omegaconf import OmegaConf

    from cuda_agent.core.policies.hf import HFPolicy
    from cuda_agent.core.policies.hf_server import HFTokenServer

    class FlakyServer(HFTokenServer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.calls, self.count_lock = 0, threading.Lock()

        def complete(self, body):
            with self.count_lock:
                self.calls += 1
                fail = self.calls <= failures
            if fail:
                return 500, {"error": {"message": "engine restarting"}}
            return super().complete(body)

    runner = StageRunner(cfg, run, show_progress=False)
    served = HFPolicy(HFPolicy.Options(model=str(runner.base_model_dir()), max_new_tokens=1 << 20))
    with FlakyServer(policy=served, served_name="toy") as server:
        OmegaConf.update(runner.cfg, "policy.options.base_urls", [server.url])
        return runner.run_all()
