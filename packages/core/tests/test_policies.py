"""Policies: token-exact episodes with a tiny offline HF model; replay; chat response parsing."""

from __future__ import annotations

import json

import pytest

from cuda_agent.core.agent import (
    AgentOptions,
    FolderEnvironment,
    TrajectoryStore,
    format_tool_call,
    parse_tool_calls,
    run_episode_sync,
)
from cuda_agent.core.policies import ReplayPolicy, parse_chat_response
from cuda_agent.core.types import Task

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TASK = Task(id="tiny", source="test", code="import torch\n\nclass Model(torch.nn.Module):\n    pass\n")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from cuda_agent.core.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def hf(tiny_model):
    from cuda_agent.core.policies.hf import HFPolicy

    return HFPolicy(HFPolicy.Options(model=str(tiny_model), max_new_tokens=48, seed=1))


def make_env(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "model.py").write_text(TASK.code)
    return FolderEnvironment(tmp_path, protected=["model.py"])


class ForcedPolicy:
    """Token-level policy that emits scripted text; log-probs come from the tiny model."""

    token_level = True

    def __init__(self, hf, turns):
        self.hf = hf
        self.tokenizer = hf.tokenizer
        self.turns = list(turns)  # (text, closed)

    def generate(self, prompt_ids, sampling):
        text, closed = self.turns.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if closed:
            ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        return ids, self.hf.score(list(prompt_ids) + ids, len(prompt_ids)), "stop" if closed else "length"


def check_logprobs(hf, traj, atol=1e-4):
    full = traj.prompt_ids + traj.response_ids
    recomputed = hf.score(full, len(traj.prompt_ids))
    for i, m in enumerate(traj.loss_mask):
        if m:
            assert recomputed[i] == pytest.approx(traj.rollout_logprobs[i], abs=atol), i
        else:
            assert traj.rollout_logprobs[i] == 0.0


def test_sampled_logprobs_match_recomputed(hf):
    prompt = hf.tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    ids, lps, reason = hf.generate(prompt, {"max_tokens": 40, "temperature": 1.0})
    assert reason in ("stop", "length") and len(ids) == len(lps) > 0
    assert hf.score(prompt + ids, len(prompt), temperature=1.0) == pytest.approx(lps, abs=1e-4)
    g_ids, g_lps, _ = hf.generate(prompt, {"max_tokens": 10, "temperature": 0})
    assert g_ids == hf.generate(prompt, {"max_tokens": 10, "temperature": 0})[0]  # greedy is deterministic


def test_token_exact_multi_turn_episode(hf, tmp_path):
    turns = [
        ("Let me read it.\n" + format_tool_call("read", {"path": "model.py"}), True),
        (format_tool_call("write", {"path": "model_new.py", "content": "x = 1\n"}) + "\n"
         + format_tool_call("bash", {"command": "cat model_new.py; echo ok"}), True),
        ("All set.\nDONE", True),
    ]
    env = make_env(tmp_path)
    traj = run_episode_sync(TASK, ForcedPolicy(hf, turns), env)
    env.close()
    assert traj.finish_reason == "done" and len(traj.turns) == 3
    assert (tmp_path / "model_new.py").read_text() == "x = 1\n"
    tok = hf.tokenizer
    n = len(traj.response_ids)
    assert len(traj.loss_mask) == len(traj.rollout_logprobs) == n
    # masks line up with turn boundaries: 1 exactly inside each turn's span
    inside = set()
    for t in traj.turns:
        a, b = t.response_span
        inside.update(range(a, b))
        assert tok.decode(traj.response_ids[a:b], skip_special_tokens=False).startswith(turns[t.index][0][:10])
    assert [i for i in range(n) if traj.loss_mask[i]] == sorted(inside)
    # the ids decode to the conversation exactly as the chat template renders it
    text = tok.decode(traj.prompt_ids + traj.response_ids, skip_special_tokens=False)
    tools = [t.schema() for t in env.tools()]
    rendered = tok.apply_chat_template(traj.messages, tools=tools, tokenize=False)
    assert text + "\n" == rendered
    assert "<tool_response>\nx = 1\nok\n</tool_response>" in text
    check_logprobs(hf, traj)


def test_unclosed_tool_call_is_an_error_result(hf, tmp_path):
    turns = [('<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi', False), ("DONE", True)]
    env = make_env(tmp_path)
    traj = run_episode_sync(TASK, ForcedPolicy(hf, turns), env)
    env.close()
    res = traj.turns[0].tool_results[0]
    assert not res.ok and "not closed" in res.content
    a, b = traj.turns[0].response_span
    tail = hf.tokenizer.decode(traj.response_ids[b:traj.turns[1].response_span[0]], skip_special_tokens=False)
    assert tail.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")  # the turn was closed for the model
    check_logprobs(hf, traj)


def test_sampled_episode_with_tiny_model(hf, tmp_path):
    env = make_env(tmp_path)
    traj = run_episode_sync(TASK, hf, env, AgentOptions(max_turns=2, max_tokens_per_turn=24))
    env.close()
    assert traj.finish_reason in ("no_tool_call", "max_turns", "done")
    assert sum(traj.loss_mask) > 0
    check_logprobs(hf, traj)


def test_context_budget_counts_tokens(hf, tmp_path):
    env = make_env(tmp_path)
    prompt_len = len(hf.tokenizer.apply_chat_template(
        env.initial_messages(TASK), tools=[t.schema() for t in env.tools()], add_generation_prompt=True,
        tokenize=True)["input_ids"])
    budget = prompt_len + 30
    traj = run_episode_sync(TASK, hf, env, AgentOptions(max_turns=5, context_tokens=budget,
                                                        max_tokens_per_turn=64, min_generation_tokens=8))
    env.close()
    assert len(traj.prompt_ids) + len(traj.response_ids) <= budget or traj.finish_reason == "context"
    assert len(traj.response_ids) <= 30 + 200  # generation was capped by the budget


def test_parse_tool_calls_text():
    text = "thinking\n" + format_tool_call("bash", {"command": "ls"}) + '\n<tool_call>\n{"name": "read", "arguments": "{\\"path\\": \\"a\\"}"}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "thinking"
    assert [(c.name, c.arguments, c.error) for c in calls] == [("bash", {"command": "ls"}, None), ("read", {"path": "a"}, None)]
    _, calls = parse_tool_calls("<tool_call>\n{name: bash}\n</tool_call>")
    assert calls[0].error and "not valid JSON" in calls[0].error


def test_chat_response_parsing():
    r = parse_chat_response({"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "a", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
        {"id": "b", "function": {"name": "write", "arguments": '{"path": '}},
        {"id": "c", "function": {"name": "read", "arguments": '[1, 2]'}},
    ]}, "finish_reason": "tool_calls"}], "usage": {"total_tokens": 12}})
    assert [c.error is None for c in r.tool_calls] == [True, False, False]
    assert r.usage["total_tokens"] == 12
    hermes = parse_chat_response({"choices": [{"message": {"content": format_tool_call("glob", {"pattern": "*"})}}]})
    assert hermes.tool_calls[0].name == "glob" and hermes.content == ""


def test_replay_reproduces_a_recorded_trajectory(hf, tmp_path):
    turns = [(format_tool_call("bash", {"command": "echo one > f.txt"}), True),
             (format_tool_call("read", {"path": "f.txt"}), True), ("DONE", True)]
    env = make_env(tmp_path / "a")
    first = run_episode_sync(TASK, ForcedPolicy(hf, turns), env)
    env.close()
    store = TrajectoryStore(tmp_path / "rec.jsonl")
    store.append(first)
    env = make_env(tmp_path / "b")
    again = run_episode_sync(TASK, ReplayPolicy(ReplayPolicy.Options(path=str(store.path))), env)
    env.close()
    assert again.finish_reason == "done"
    assert [r.content for t in again.turns for r in t.tool_results] == [r.content for t in first.turns for r in t.tool_results]
    assert (tmp_path / "b" / "f.txt").read_text() == "one\n"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"content": "hi", "tool_calls": [{"name": "todo", "arguments": {}}]}]}))
    env = make_env(tmp_path / "c")
    t3 = run_episode_sync(TASK, ReplayPolicy(ReplayPolicy.Options(path=str(script))), env)
    env.close()
    assert t3.finish_reason == "done" and t3.turns[0].tool_calls[0].name == "todo"
