"""Whole episodes: the openai policy against a real HTTP server on loopback, real tools."""

from __future__ import annotations

import json

import pytest

from cuda_agent.core.agent import (
    AgentOptions,
    FolderEnvironment,
    TrajectoryStore,
    render_transcript,
    run_episode_sync,
)
from cuda_agent.core.agent.testing import ScriptedChatServer, reply, tool_call
from cuda_agent.core.hookspecs import hookimpl
from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.core.policies import OpenAIPolicy
from cuda_agent.core.types import (
    Candidate,
    CandidateOutcome,
    CompileResult,
    ProfileResult,
    RewardResult,
    Task,
    Timing,
    VerifyResult,
)

TASK = Task(id="t1", source="test", code="import torch\n\nclass Model(torch.nn.Module):\n    pass\n")


def policy(server, **kw):
    return OpenAIPolicy(OpenAIPolicy.Options(model="scripted", base_url=server.base_url, backoff=0.01, **kw))


def env_for(tmp_path, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "model.py").write_text(TASK.code)
    return FolderEnvironment(tmp_path, protected=["model.py"], **kw)


def test_episode_with_tools_malformed_calls_and_long_output(tmp_path):
    script = [
        reply("Let me look around.", [tool_call("read", {"path": "model.py"}, "c1"),
                                      tool_call("bash", {"command": "ls"}, "c2")]),
        reply("", [tool_call("write", '{"path": "x.py", "content": ', "c3")]),  # malformed JSON
        reply("", [tool_call("frobnicate", {}, "c4")]),  # unknown tool
        reply("", [tool_call("write", {"path": "model.py", "content": "hacked"}, "c5")]),  # protected
        reply("", [tool_call("bash", {"command": "python3 -c \"print('x' * 50000)\""}, "c6")]),
        reply("", [tool_call("write", {"path": "model_new.py", "content": "print('new')\n"}, "c7")]),
        reply("All work is finished.\n\nDONE"),
    ]
    with ScriptedChatServer(script) as server:
        env = env_for(tmp_path)
        try:
            traj = run_episode_sync(TASK, policy(server), env, AgentOptions(tool_output_chars=2000))
        finally:
            env.close()
    assert traj.finish_reason == "done"
    assert len(traj.turns) == 7 and len(server.requests) == 7
    assert (tmp_path / "model_new.py").read_text() == "print('new')\n"
    assert (tmp_path / "model.py").read_text() == TASK.code
    results = {r.call_id: r for t in traj.turns for r in t.tool_results}
    assert "class Model" in results["c1"].content and "model.py" in results["c2"].content
    assert not results["c3"].ok and "not valid JSON" in results["c3"].content
    assert not results["c4"].ok and "unknown tool 'frobnicate'" in results["c4"].content
    assert not results["c5"].ok and "read-only" in results["c5"].content
    long = results["c6"]
    assert long.truncated and "characters" in long.content and "omitted" in long.content
    assert len(long.content) < 2200
    # the server saw tools, then each tool result as a tool message with its call id
    first, second = server.requests[0], server.requests[1]
    assert {t["function"]["name"] for t in first["tools"]} >= {"bash", "read", "write", "edit", "grep", "todo"}
    assert first["messages"][0]["role"] == "system" and first["messages"][1]["role"] == "user"
    tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["c1", "c2"]
    third = server.requests[2]
    bad = [m for m in third["messages"] if m.get("tool_call_id") == "c3"][0]
    assert "not valid JSON" in bad["content"]
    md = render_transcript(traj)
    assert "## Turn 0" in md and "**read**" in md and "not valid JSON" in md and "finish: done" in md


def test_refusal_ends_cleanly(tmp_path):
    with ScriptedChatServer([reply(refusal="I can't help with that.")]) as server:
        env = env_for(tmp_path)
        traj = run_episode_sync(TASK, policy(server), env)
        env.close()
    assert traj.finish_reason == "no_tool_call"
    assert traj.turns[0].assistant == "I can't help with that."


def test_retries_dropped_connection_and_server_errors(tmp_path):
    script = [
        {"drop": True},
        {"status": 503, "body": "overloaded"},
        {"status": 429, "body": "slow down", "headers": {"Retry-After": "0"}},
        reply("", [tool_call("bash", {"command": "echo hi"})]),
        {"drop": True},
        reply("ok\nDONE"),
    ]
    with ScriptedChatServer(script) as server:
        env = env_for(tmp_path)
        pol = policy(server, requests_per_second=50)
        traj = run_episode_sync(TASK, pol, env)
        env.close()
    assert traj.finish_reason == "done"
    assert pol.retries == 4 and len(server.requests) == 6
    assert traj.turns[0].tool_results[0].content == "hi"


def test_endpoint_down_is_an_infra_error_with_every_retry_logged(tmp_path):
    """An endpoint that answers 500 past the retries ends the episode as an infrastructure
    error: not the model's failure, so no reward; each retry is a line of the run's log.jsonl."""
    from cuda_agent.core.config import compose
    from cuda_agent.core.run import Run

    finals = []

    class Scored(FolderEnvironment):
        def finalize(self, traj):
            finals.append(traj.id)
            return RewardResult(value=-1.0, reward="test")

    cfg = compose([], [f"run.output_dir={tmp_path / 'runs'}", "logging.console=false"])
    with ScriptedChatServer([], final={"status": 500, "body": "upstream down"}) as server, \
            Run(cfg, command="unit") as run:
        (tmp_path / "ws").mkdir()
        (tmp_path / "ws" / "model.py").write_text(TASK.code)
        env = Scored(tmp_path / "ws", protected=["model.py"])
        traj = run_episode_sync(TASK, policy(server, max_retries=2), env)
        env.close()
    assert traj.finish_reason == "infra_error" and traj.infra_error
    assert "HTTP 500" in traj.metadata["error"] and "gave up after 3 attempts" in traj.metadata["error"]
    assert traj.reward is None and finals == []  # never scored: finalize would have given -1
    assert len(server.requests) == 3
    events = [json.loads(x) for x in (run.dir / "log.jsonl").read_text().splitlines()]
    retries = [e for e in events if e["event"] == "policy.retry"]
    assert [(e["attempt"], e["attempts"]) for e in retries] == [(1, 3), (2, 3)]
    assert all("HTTP 500" in e["error"] and "upstream down" in e["error"] for e in retries)
    assert [e["event"] for e in events].count("policy.unavailable") == 1

def test_connection_refused_is_an_infra_error(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pol = OpenAIPolicy(OpenAIPolicy.Options(model="m", base_url=f"http://127.0.0.1:{port}/v1", backoff=0.01,
                                            max_retries=1))
    env = env_for(tmp_path)
    traj = run_episode_sync(TASK, pol, env)
    env.close()
    assert traj.finish_reason == "infra_error" and "ConnectError" in traj.metadata["error"]
    assert pol.retries == 1 and traj.reward is None


def test_bad_request_is_the_policy_error_it_was(tmp_path):
    """A 4xx that is not retryable fails at once, and stays an ordinary policy error."""
    with ScriptedChatServer([{"status": 400, "body": "bad request"}]) as server:
        env = env_for(tmp_path)
        traj = run_episode_sync(TASK, policy(server), env)
        env.close()
    assert traj.finish_reason == "error" and len(server.requests) == 1


def test_turn_and_context_limits(tmp_path):
    forever = reply("", [tool_call("bash", {"command": "echo again"})])
    with ScriptedChatServer([], final=forever) as server:
        env = env_for(tmp_path)
        traj = run_episode_sync(TASK, policy(server), env, AgentOptions(max_turns=3))
        env.close()
    assert traj.finish_reason == "max_turns" and len(traj.turns) == 3
    big = reply("", [tool_call("bash", {"command": "python3 -c \"print('y' * 4000)\""})])
    with ScriptedChatServer([], final=big) as server:
        env = env_for(tmp_path)
        traj = run_episode_sync(TASK, policy(server), env,
                                AgentOptions(max_turns=50, context_tokens=5000, tool_output_chars=4000))
        env.close()
    assert traj.finish_reason == "context"
    assert 2 <= len(traj.turns) < 10


def _outcome(correct: bool, speedup: float) -> CandidateOutcome:
    t = 1.0 / speedup
    return CandidateOutcome(
        compile=CompileResult(ok=True),
        verify=VerifyResult(ok=correct),
        profile=ProfileResult(ok=True, candidate=Timing(t), eager=Timing(2.0), compile=Timing(1.0)),
    )


def test_best_candidate_is_kept_and_scored(tmp_path):
    """Candidates come from the environment; the final answer is the best correct one."""

    def check(call, result, turn, env):
        if call.name != "bash" or not result.content.startswith("RESULT"):
            return []
        _, correct, speedup = result.content.split()
        files = {"model_new.py": (env.workspace / "model_new.py").read_text()}
        return [Candidate(turn=turn, files=files, outcome=_outcome(correct == "1", float(speedup)))]

    def score(traj, env):
        best = traj.best
        if best is None:
            return RewardResult(value=-1, reward="test")
        return RewardResult(value=best.speedup_vs_compile, reward="test", correct=True,
                            speedup_vs_compile=best.speedup_vs_compile)

    script = []
    for i, (correct, speedup) in enumerate([(1, 1.5), (0, 3.0), (1, 2.0), (1, 1.2)]):
        script.append(reply("", [tool_call("write", {"path": "model_new.py", "content": f"v{i}\n"})]))
        script.append(reply("", [tool_call("bash", {"command": f"rm -f model_new.py.bak; echo RESULT {correct} {speedup}"})]))
        # write needs a read before overwriting
        script.append(reply("", [tool_call("read", {"path": "model_new.py"})]))
    script.append(reply("DONE"))
    events = []
    with ScriptedChatServer(script) as server:
        env = env_for(tmp_path, check=check, score=score)
        traj = run_episode_sync(TASK, policy(server), env, on_event=events.append)
        env.close()
    assert len(traj.candidates) == 4
    assert traj.best.files == {"model_new.py": "v2\n"}
    assert traj.reward.value == pytest.approx(2.0)
    bests = [e["best"] for e in events if e["type"] == "candidate"]
    assert bests == [pytest.approx(1.5), pytest.approx(1.5), pytest.approx(2.0), pytest.approx(2.0)]
    assert "| 7 (best) | yes |" in render_transcript(traj)


class _Guard:
    @hookimpl
    def check_tool_call(self, tool_name, arguments, workspace):
        if tool_name == "bash" and "rm -rf" in arguments.get("command", ""):
            return "destructive command refused by policy"
        return None


def test_check_tool_call_hook_refuses(tmp_path):
    pm = get_plugin_manager()
    pm.register(_Guard(), "test-guard")
    try:
        script = [reply("", [tool_call("bash", {"command": "rm -rf ."})]), reply("DONE")]
        with ScriptedChatServer(script) as server:
            env = env_for(tmp_path)
            traj = run_episode_sync(TASK, policy(server), env)
            env.close()
    finally:
        pm.unregister("test-guard")
    res = traj.turns[0].tool_results[0]
    assert not res.ok and "refused: destructive" in res.content
    assert (tmp_path / "model.py").exists()


def test_store_survives_torn_writes(tmp_path):
    with ScriptedChatServer([reply("", [tool_call("todo", {"items": [{"content": "a", "status": "pending"}]})]),
                             reply("DONE")]) as server:
        env = env_for(tmp_path / "ws")
        traj = run_episode_sync(TASK, policy(server), env)
        env.close()
    store = TrajectoryStore(tmp_path / "t.jsonl")
    store.append(traj)
    with open(store.path, "ab") as f:  # a crash in the middle of the second record
        f.write(json.dumps(traj.to_dict()).encode()[:100])
    assert [t.id for t in store] == [traj.id] and store.skipped == 1
    store.append(traj)  # the next record starts on its own line
    back = list(store)
    assert len(back) == 2 and store.skipped == 1
    assert back[1].to_dict() == traj.to_dict()


def test_request_timeout_is_retried_and_requests_are_paced(tmp_path):
    import time

    script = [
        {"delay": 1.5, **reply("", [tool_call("bash", {"command": "echo late"})])},  # times out on the client
        reply("", [tool_call("bash", {"command": "echo a"})]),
        reply("", [tool_call("bash", {"command": "echo b"})]),
        reply("DONE"),
    ]
    with ScriptedChatServer(script) as server:
        env = env_for(tmp_path)
        pol = policy(server, timeout=0.5, requests_per_second=4)
        t0 = time.monotonic()
        traj = run_episode_sync(TASK, pol, env)
        took = time.monotonic() - t0
        env.close()
    assert traj.finish_reason == "done" and pol.retries == 1
    assert [t.tool_results[0].content for t in traj.turns[:2]] == ["a", "b"]
    assert took >= 0.75  # four requests at most 4 per second


def test_one_policy_serves_concurrent_episodes(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    step = reply("", [tool_call("bash", {"command": "echo hi"})])
    with ScriptedChatServer([step] * 4) as server:
        pol = policy(server, requests_per_second=20)

        def one(i):
            env = env_for(tmp_path / f"ws{i}")
            try:
                return run_episode_sync(TASK, pol, env)
            finally:
                env.close()

        with ThreadPoolExecutor(4) as ex:
            trajs = list(ex.map(one, range(4)))
    assert [t.finish_reason for t in trajs] == ["done"] * 4
    assert sum(len(t.turns) for t in trajs) == 8
