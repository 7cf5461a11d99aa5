"""Training with rollouts from two real ``vllm serve`` processes (vLLM's CPU build) on loopback.

Both servers run the shared tiny model with the project's weight-sync extension in dev mode.
The trainer runs PPO on the toy environment through the ``vllm_server`` policy: rollouts come
from both servers, every update's weights are pushed (``update_weights``) and the prefix caches
dropped, so the sampled log-probs equal the trainer's own at every step; afterwards the servers
answer fixed prompts with the trained policy's log-probs, not the base model's. A server killed
in the middle of a rollout makes its episodes infrastructure errors (unscored, dropped), not
failures of the model. Every server process is gone after the module.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]

REPO = Path(__file__).resolve().parents[3]
TOY = REPO / "configs" / "toy.yaml"
TOLERANCE = 2e-3  # float32 on both sides; vLLM's CPU kernels sum in another order than torch's
# longer than two of the CPU backend's 128-token cache blocks, so a repeated prompt hits the prefix cache
FIXED_PROMPTS = [
    "<|im_start|>user\n" + "Read model.py, write kernels/fused.cpp and model_new.py, compile, verify and profile. " * 12
    + "<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\n" + "The quick brown fox jumps over the lazy dog. 0123456789 " * 20
    + "<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def servers(vllm_tiny_model, tmp_path_factory):
    from cuda_agent.core.policies.vllm_launch import VLLMServe, cpu_args

    logs = tmp_path_factory.mktemp("vllm-logs")
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    pair = [VLLMServe(vllm_tiny_model, extra=cpu_args(kv_cache_bytes=64 << 20, max_model_len=2048), env=env,
                      log_path=logs / f"server{i}.log") for i in range(2)]
    try:
        for s in pair:  # both start together: the engine processes' imports overlap
            s.start()
        for s in pair:
            s.wait_ready()
        yield pair
    finally:
        for s in pair:
            s.stop()
        for s in pair:
            assert s.group_gone(), f"processes of the server on port {s.port} outlived it"


def client(model, urls, sync_dir, **kw):
    from cuda_agent.core.policies.vllm_server import VLLMServerPolicy

    return VLLMServerPolicy(VLLMServerPolicy.Options(base_urls=urls, model=str(model), weight_sync_dir=str(sync_dir),
                                                     max_retries=1, backoff=0.05, **kw))


def served_logprobs(model, server, prompts: list[list[int]], sync_dir) -> list[tuple[list[int], list[float]]]:
    """Eight tokens after each prompt, sampled by one server with their log-probs."""
    pol = client(model, [server.url], sync_dir, seed=0)
    return [asyncio.run(pol.generate(p, {"max_tokens": 8, "temperature": 1.0}))[:2] for p in prompts]


def completions(server) -> float:
    """Requests the server finished (its Prometheus counter)."""
    text = httpx.get(server.root + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def ppo_config(tmp_path, model, urls, sync_dir, steps: int):
    from cuda_agent.core.config import compose

    over = tmp_path / "over.yaml"
    over.write_text(yaml.safe_dump({
        "policy": {"name": "vllm_server", "options": {
            "base_urls": urls, "model": "", "weight_sync_dir": str(sync_dir), "max_retries": 1, "backoff": 0.05,
            "seed": 0}},
        "trainer": {
            "model": {"path": str(model)},
            "environment": {"name": "toy", "options": {"num_targets": 12}},
            "agent_defaults": {"max_turns": 2, "context_tokens": 2048, "max_tokens_per_turn": 8},
            "rollout": {"engine": "policy"},
            "stages": [{"name": "ppo", "steps": steps, "algorithm": {"name": "ppo", "options": {
                "batch_size": 8, "mini_batch_size": 8, "micro_batch_size": 8,
                "actor_lr": 1e-2, "critic_lr": 1e-2}}}]}}))
    return compose([TOY, over], [f"run.output_dir={tmp_path / 'runs'}", "logging.console=false"])


def test_ppo_rollouts_from_two_servers_with_weight_sync(servers, vllm_tiny_model, tmp_path):
    from cuda_agent.core.policies.hf import HFPolicy
    from cuda_agent.core.run import Run
    from cuda_agent.trainer.stages import StageRunner

    base = HFPolicy(HFPolicy.Options(model=str(vllm_tiny_model)))
    prompts = [base.tokenizer.encode(p, add_special_tokens=False) for p in FIXED_PROMPTS]
    assert all(len(p) > 256 for p in prompts)
    # the servers start from the base weights; asking now also fills their prefix caches
    before = [served_logprobs(vllm_tiny_model, s, prompts, tmp_path / "probe") for s in servers]
    for answers in before:
        for p, (ids, lps) in zip(prompts, answers):
            assert base.score(p + ids, len(p), 1.0) == pytest.approx(lps, abs=TOLERANCE)
    done0 = [completions(s) for s in servers]

    sync_dir = tmp_path / "weights"
    cfg = ppo_config(tmp_path, vllm_tiny_model, [s.url for s in servers], sync_dir, steps=2)
    with Run(cfg, command="train") as run:
        hist = StageRunner(cfg, run, show_progress=False).run_all()
        run_dir = Path(run.dir)
    assert len(hist) == 2
    for h in hist:  # the trainer's recomputation of every sampled token equals the servers' log-prob
        assert h["rollout/infra_errors"] == 0 and h["rollout/episodes"] == 8
        assert h["rollout/logp_diff"] < TOLERANCE, h["rollout/logp_diff"]
    assert hist[-1]["actor/grad_norm"] > 0
    served = [completions(s) - d for s, d in zip(servers, done0)]
    assert all(n > 0 for n in served) and sum(served) >= 16, served  # both servers, every turn of 16 episodes
    # one version before the first rollout, one after each update (the newest two stay on disk)
    assert sorted(p.name for p in sync_dir.glob("*.safetensors")) == ["weights-000002.safetensors",
                                                                      "weights-000003.safetensors"]

    trained = HFPolicy(HFPolicy.Options(model=str(run_dir / "stages" / "00-ppo" / "final" / "actor")))
    for server, old in zip(servers, before):
        after = served_logprobs(vllm_tiny_model, server, prompts, tmp_path / "probe")
        for p, (ids, lps), (old_ids, old_lps) in zip(prompts, after, old):
            assert trained.score(p + ids, len(p), 1.0) == pytest.approx(lps, abs=TOLERANCE)
            base_lps = base.score(p + ids, len(p), 1.0)
            assert max(abs(a - b) for a, b in zip(base_lps, lps)) > 10 * TOLERANCE  # not the old weights

    # the reset is what makes this hold: weights loaded without it leave the cached prompt's
    # keys and values of the trained weights in place, and the base weights' log-probs are missed
    from cuda_agent.core.policies.weight_sync import LOAD_METHOD, write_weights

    path = write_weights(base.model.state_dict().items(), tmp_path / "manual", 1)
    server = servers[0]
    httpx.post(server.root + "/collective_rpc", json={"method": LOAD_METHOD, "args": [str(path)]}, timeout=120)
    stale = served_logprobs(vllm_tiny_model, server, prompts[:1], tmp_path / "probe")[0]
    stale_err = max(abs(a - b) for a, b in zip(base.score(prompts[0] + stale[0], len(prompts[0]), 1.0), stale[1]))
    assert httpx.post(server.root + "/reset_prefix_cache", timeout=60).json()["success"] is True
    fresh = served_logprobs(vllm_tiny_model, server, prompts[:1], tmp_path / "probe")[0]
    assert base.score(prompts[0] + fresh[0], len(prompts[0]), 1.0) == pytest.approx(fresh[1], abs=TOLERANCE)
    assert stale_err > 10 * TOLERANCE, stale_err


def test_server_killed_mid_rollout_is_an_infrastructure_error(servers, vllm_tiny_model, tmp_path):
    """The last test of the module: it kills the second server while episodes wait on it."""
    import random

    from cuda_agent.core.agent import AgentOptions
    from cuda_agent.trainer.envs.toy import ToyEnvironmentFactory
    from cuda_agent.trainer.rollout import collect, drop_infra_errors

    pol = client(vllm_tiny_model, [s.url for s in servers], tmp_path / "sync")
    factory = ToyEnvironmentFactory(ToyEnvironmentFactory.Options(num_targets=12))
    tasks = factory.tasks(8, random.Random(0))
    victim = servers[1]

    killed, rollout_done, errors = threading.Event(), threading.Event(), []

    def kill_when_busy():  # as soon as the victim is generating for the rollout
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not rollout_done.is_set():
                try:
                    text = httpx.get(victim.root + "/metrics", timeout=10).text
                except httpx.TransportError:  # a busy host: ask again
                    time.sleep(0.05)
                    continue
                running = sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
                              if x.startswith("vllm:num_requests_running"))
                if running > 0:
                    victim.kill()
                    killed.set()
                    return
                time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(repr(exc))

    def rollout():
        return collect(tasks, pol, lambda t, i: factory.make(t, None), AgentOptions(
            max_turns=1, context_tokens=4096, max_tokens_per_turn=400, sampling={"temperature": 1.0}),
            concurrency=8, show_progress=False)

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    try:
        res = rollout()
        rollout_done.set()
        killer.join()
        assert not errors, errors
        if not killed.is_set():
            # the victim's requests were too short for the metrics to show one running: the same
            # rollout again with the victim killed while the policy still routes episodes to it
            victim.kill()
            killed.set()
            res = rollout()
    finally:
        rollout_done.set()
        killer.join()
        factory.close()
    deadline = time.monotonic() + 30  # its end, waited for (a killed process is reaped, not gone at once)
    while victim.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not victim.alive() and victim.group_gone(), f"the killed server on port {victim.port} still runs"
    on_victim = [t for t in res.trajectories if pol.server_for(t.prompt_ids) == victim.url]
    assert 0 < len(on_victim) < len(tasks)
    kept, dropped = drop_infra_errors(res.trajectories)
    assert dropped and all(t in on_victim for t in dropped)  # an episode that ended before the kill may stay
    for t in dropped:
        assert t.finish_reason == "infra_error" and t.reward is None  # unscored: no reward at all, not -1
        assert str(victim.port) in t.metadata["error"]
    for t in res.trajectories:
        if t not in on_victim:  # the other server's episodes are untouched
            assert t in kept and t.reward is not None and sum(t.loss_mask) > 0
