"""EpisodeStepper: an episode whose turns come from another framework, over a real folder and real tools."""

from __future__ import annotations

import pytest

from cuda_agent.core.agent import AgentOptions, EpisodeOver, EpisodeStepper, FolderEnvironment, build_tools
from cuda_agent.core.types import RewardResult, Task

TASK = Task(id="t1", source="test", code="class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n")


def _env(tmp_path, seen):
    def score(traj, env):
        seen.append(traj.finish_reason)
        text = (env.workspace / "out.txt").read_text() if (env.workspace / "out.txt").exists() else ""
        return RewardResult(value=1.0 if text == "hello" else -1.0, reward="test")

    return FolderEnvironment(tmp_path, tools=build_tools(["read", "write", "bash"]), score=score)


def test_turns_text_and_structured_calls_then_reward(tmp_path):
    seen = []
    env = _env(tmp_path, seen)
    st = EpisodeStepper(TASK, env, AgentOptions(max_turns=5))
    assert st.messages[0]["role"] == "system" and set(st.tool_names) == {"read", "write", "bash"}
    r = st.step('Writing.\n<tool_call>\n{"name": "write", "arguments": {"path": "out.txt", "content": "hello"}}\n</tool_call>')
    assert not r.done and r.results[0].ok, r
    r = st.step("", [{"function": {"name": "bash", "arguments": '{"command": "cat out.txt"}'}}])
    assert r.results[0].ok and "hello" in r.observation
    r = st.step("", [{"name": "no_such_tool", "arguments": {}}, {"name": "read", "arguments": "{bad json"}])
    assert not r.done and not any(x.ok for x in r.results)
    assert "unknown tool 'no_such_tool'" in r.results[0].content and "not valid JSON" in r.results[1].content
    r = st.step("All written.\nDONE")
    assert r.done and r.finish_reason == "done"
    with pytest.raises(EpisodeOver, match="is over \\(done after 4 turns\\)"):
        st.call_tool("read", {"path": "out.txt"})
    traj = st.finish()
    assert traj.reward.value == 1.0 and st.reward == 1.0 and seen == ["done"]
    assert st.finish() is traj and seen == ["done"]  # scored once
    assert traj.metadata["tool_calls"] == 4 and traj.metadata["tool_errors"] == 2
    assert [m["role"] for m in traj.messages[2:]] == ["assistant", "tool", "assistant", "tool", "assistant", "tool",
                                                     "tool", "assistant"]
    env.close()


def test_turn_limit_is_a_terminal_step(tmp_path):
    seen = []
    env = _env(tmp_path, seen)
    st = EpisodeStepper(TASK, env, AgentOptions(max_turns=2))
    assert st.call_tool("bash", {"command": "true"}).ok
    assert st.turns_left == 1
    r = st.step("", [{"name": "write", "arguments": {"path": "out.txt", "content": "nope"}}])
    assert r.done and r.finish_reason == "max_turns" and st.turns_left == 0
    with pytest.raises(EpisodeOver, match="max_turns after 2 turns"):
        st.step("more")
    assert st.finish().reward.value == -1.0 and seen == ["max_turns"]
    env.close()
