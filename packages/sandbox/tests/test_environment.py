"""Whole episodes in CudaEnvironment on the CPU backend: a scripted chat server on loopback
drives the openai policy through the real workspace, g++ builds, verification and reward."""

from __future__ import annotations

import importlib.util

import pytest

from cuda_agent.core.agent import AgentOptions, run_episode_sync
from cuda_agent.core.agent.testing import ScriptedChatServer, reply, tool_call
from cuda_agent.core.policies import OpenAIPolicy
from cuda_agent.core.types import Task

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("cuda_agent.sandbox.judge.jobs") is None,
    reason="verification/profiling jobs (cuda_agent.sandbox.judge.jobs) are not installed",
)

MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, a: float):
        super().__init__()
        self.a = a

    def forward(self, x):
        return torch.relu(x) * self.a + 1.0


def get_inputs():
    return [torch.randn(128, 256)]


def get_init_inputs():
    return [2.0]
'''

KERNEL = '''#include <cstdint>
extern "C" void relu_axpb(const float* __restrict x, float* __restrict out, float a, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] > 0.0f ? x[i] : 0.0f;
    out[i] = v * a + 1.0f;
  }
}
'''
WRONG_KERNEL = KERNEL.replace("x[i] > 0.0f ? x[i] : 0.0f", "x[i]")

MODEL_NEW = '''import torch
import torch.nn as nn

from cuda_agent_runtime import load_kernels

kernels = load_kernels()


class ModelNew(nn.Module):
    def __init__(self, a: float):
        super().__init__()
        self.a = a

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        kernels.relu_axpb(x, out, self.a, x.numel())
        return out
'''

TASK = Task(id="relu_axpb", source="test", code=MODEL)


def make_env(tmp_path, **kw):
    from cuda_agent.sandbox.workspace.environment import CudaEnvironment, EnvironmentOptions

    return CudaEnvironment(TASK, tmp_path / "ws", EnvironmentOptions(backend="cpu", **kw),
                           executor={"name": "cpu"}, reward={"name": "milestone"})


def policy(server):
    return OpenAIPolicy(OpenAIPolicy.Options(model="scripted", base_url=server.base_url, backoff=0.01))


def test_episode_keeps_the_best_verified_candidate(tmp_path):
    script = [
        reply("Reading the skeleton.", [tool_call("read", {"path": "model_new.py"}, "r1")]),
        reply("", [tool_call("write", {"path": "kernels/k.cpp", "content": KERNEL}, "w1"),
                   tool_call("write", {"path": "model_new.py", "content": MODEL_NEW}, "w2")]),
        {"drop": True},  # the connection drops once; the policy retries
        reply("", [tool_call("bash", {"command": "python tools/verify.py"}, "v1")]),
        reply("", [tool_call("write", '{"path": "kernels/k.cpp", "content": "oops', "bad")]),  # malformed
        reply("", [tool_call("bash", {"command": "yes 'long line of output' | head -n 2000"}, "long")]),
        reply("A faster version without the branch.", [tool_call("read", {"path": "kernels/k.cpp"}, "r2")]),
        reply("", [tool_call("write", {"path": "kernels/k.cpp", "content": WRONG_KERNEL}, "w3")]),
        reply("", [tool_call("bash", {"command": "python tools/verify.py"}, "v2")]),
        reply("The second version is wrong; the first one stands.\nDONE"),
    ]
    with ScriptedChatServer(script) as server:
        env = make_env(tmp_path)
        try:
            traj = run_episode_sync(TASK, policy(server), env, AgentOptions(tool_output_chars=3000))
        finally:
            env.close()
    results = {r.call_id: r for t in traj.turns for r in t.tool_results}
    assert traj.finish_reason == "done", traj.metadata
    assert "PASS" in results["v1"].content.upper() and results["v1"].ok
    assert not results["v2"].ok and "FAIL" in results["v2"].content.upper()
    assert not results["bad"].ok and "not valid JSON" in results["bad"].content
    assert results["long"].truncated and "omitted" in results["long"].content
    # two verified candidates (+ the profile of the best at the end), the correct one is best
    assert [c.outcome.correct for c in traj.candidates] == [True, False]
    assert traj.best is traj.candidates[0] and traj.best.files["kernels/k.cpp"] == KERNEL
    assert traj.best.outcome.profile is not None and traj.best.outcome.profile.ok
    assert traj.reward is not None and traj.reward.correct and traj.reward.value >= 1
    # the workspace is left with the best version, never the worse final one
    assert (tmp_path / "ws" / "kernels" / "k.cpp").read_text() == KERNEL


def test_refusal_scores_missing(tmp_path):
    with ScriptedChatServer([reply(refusal="I can't help with that.")]) as server:
        env = make_env(tmp_path)
        try:
            traj = run_episode_sync(TASK, policy(server), env)
        finally:
            env.close()
    assert traj.finish_reason == "no_tool_call" and traj.candidates == []
    assert traj.reward.value == -1 and traj.reward.failure.value == "missing"


def test_unverified_final_files_are_evaluated(tmp_path):
    script = [
        reply("", [tool_call("read", {"path": "model_new.py"})]),
        reply("", [tool_call("write", {"path": "kernels/k.cpp", "content": KERNEL}),
                   tool_call("write", {"path": "model_new.py", "content": MODEL_NEW})]),
        reply("Done without checking.\nDONE"),
    ]
    with ScriptedChatServer(script) as server:
        env = make_env(tmp_path, profile_best=False)
        try:
            traj = run_episode_sync(TASK, policy(server), env)
        finally:
            env.close()
    assert len(traj.candidates) == 1 and traj.best is not None
    assert traj.reward.correct and traj.reward.value >= 1


def test_protected_files_and_state_dir_are_refused(tmp_path):
    script = [
        reply("", [tool_call("read", {"path": "model.py"}), tool_call("write", {"path": "model.py", "content": "x"}),
                   tool_call("write", {"path": ".cuda_agent/x", "content": "x"}),
                   tool_call("write", {"path": "tools/verify.py", "content": "print('PASS')"})]),
        reply("DONE"),
    ]
    with ScriptedChatServer(script) as server:
        env = make_env(tmp_path, evaluate_final=False)
        try:
            traj = run_episode_sync(TASK, policy(server), env)
        finally:
            env.close()
    res = traj.turns[0].tool_results
    assert res[0].ok and not any(r.ok for r in res[1:])
    assert (tmp_path / "ws" / "model.py").read_text() == MODEL


def test_shell_tools_through_the_local_sandbox(tmp_path):
    from cuda_agent.sandbox.workspace.environment import CudaEnvironment, EnvironmentOptions

    script = [
        reply("", [tool_call("bash", {"command": "cd kernels && export MARK=42"}, "b1")]),
        reply("", [tool_call("bash", {"command": "pwd; echo $MARK"}, "b2")]),
        reply("", [tool_call("bash", {"command": "sleep 0.3; echo from-background", "run_in_background": True}, "b3")]),
        reply("", [tool_call("bash", {"command": "sleep 1"}, "b4")]),
        reply("", [tool_call("bash_output", {"job_id": "job1"}, "b5")]),
        reply("", [tool_call("bash", {"command": "echo hacked > ../model.py"}, "b6")]),
        reply("", [tool_call("bash", {"command": "python ../tools/compile.py"}, "b7")]),
        reply("DONE"),
    ]
    with ScriptedChatServer(script) as server:
        ws = tmp_path / ("long-workspace-name-" * 5)  # too long for a Unix socket address
        env = CudaEnvironment(TASK, ws, EnvironmentOptions(backend="cpu", evaluate_final=False),
                              sandbox={"name": "local"}, executor={"name": "cpu"})
        try:
            assert env.session is not None
            traj = run_episode_sync(TASK, policy(server), env)
        finally:
            env.close()
    res = {r.call_id: r for t in traj.turns for r in t.tool_results}
    assert res["b2"].content.splitlines()[-1] == "42" and res["b2"].content.splitlines()[0].endswith("kernels")
    assert "from-background" in res["b5"].content and "exited with status 0" in res["b5"].content
    assert not res["b6"].ok
    assert (ws / "model.py").read_text() == MODEL
    assert res["b7"].content.startswith("COMPILE"), res["b7"].content  # the service answered  # the tool script reaches the workspace service from the sandbox


def test_an_environment_from_config_uses_the_callers_own_plugin_manager(tmp_path):
    # a reward registered on a plugin manager of the caller's own (not the process-wide one)
    from dataclasses import dataclass

    from omegaconf import OmegaConf

    from cuda_agent.core.hookspecs import hookimpl
    from cuda_agent.core.interfaces import RewardFunction
    from cuda_agent.core.plugins import PluginManager, get_plugin_manager
    from cuda_agent.core.types import CandidateOutcome, RewardResult
    from cuda_agent.sandbox.workspace.environment import CudaEnvironment, environment_options

    @dataclass
    class Opts:
        value: float = 0.5

    class OwnReward(RewardFunction):
        name = "own_pm_reward"
        description = "A test's reward, on its own plugin manager only."
        Options = Opts

        def score(self, outcome):
            return RewardResult(value=self.options.value, reward=self.name, correct=outcome.correct)

    class Plugin:
        @hookimpl
        def register_rewards(self, register):
            register(OwnReward)

    pm = PluginManager()
    pm.register(Plugin(), "own-pm-test")
    assert "own_pm_reward" not in get_plugin_manager().components("reward")
    cfg = OmegaConf.create({"backend": "cpu", "environment": {"evaluate_final": False},
                            "reward": {"name": "own_pm_reward", "options": {"value": 0.75}},
                            "executor": {"name": "cpu"}, "compiler": {"name": "gxx"}})
    opts = environment_options(cfg)
    assert opts.backend == "cpu" and opts.evaluate_final is False
    env = CudaEnvironment.from_config(TASK, tmp_path / "ws", cfg, pm)
    try:
        r = env.service.reward.score(CandidateOutcome())
        assert r.reward == "own_pm_reward" and r.value == 0.75
        assert env.service.jobs.compiler.name == "gxx"
    finally:
        env.close()
