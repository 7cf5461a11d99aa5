"""CudaAgentLoop against verl's real agent-loop classes (the verl 0.9.1 wheel), without its rollout servers.

What runs: verl's ``AgentLoopBase`` constructor (its config wrappers, continuous-token
builder, prompt cap), our ``run`` and verl's ``AgentLoopOutput``/``as_dict``; the LLM server
is the one missing piece, so a stand-in answers ``generate`` with scripted turns tokenised
by a tiny Qwen2 tokenizer and the log-probs that tiny model (random weights) gives them.
The episode itself is real: CPU-backend workspace, our tools, g++ build, verification and
the milestone reward.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                    reason="verl is not installed (see plugins/verl/README.md)")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from cuda_agent.core.agent import format_tool_call, render_prompt_ids  # noqa: E402
from cuda_agent.core.types import Task  # noqa: E402
from cuda_agent_verl import AGENT_NAME, CudaAgentLoop, EpisodeFactory, EpisodeOptions, use_episodes  # noqa: E402

EXAMPLE = (Path(__file__).resolve().parents[3] / "tools" / "template" / "gxx" / "examples" / "model.py").read_text()
COPY = "cp -r examples/kernels examples/model_new.py ."


class ScriptedTokenServer:
    """Stands in for verl's LLMServerClient: each generate returns the next scripted turn's tokens
    with their log-probs under a tiny causal LM."""

    def __init__(self, tokenizer, model, turns: list[str]):
        self.tokenizer, self.model, self.turns = tokenizer, model, list(turns)
        self.requests: list[dict] = []
        self.returned: list[tuple[list[int], list[float]]] = []

    @torch.no_grad()
    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.requests.append({"request_id": request_id, "prompt_len": len(prompt_ids), **sampling_params})
        text = self.turns.pop(0) if self.turns else "Nothing more.\nDONE<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling_params["max_tokens"]]
        seq = torch.tensor([list(prompt_ids) + ids])
        logits = self.model(input_ids=seq).logits[0, len(prompt_ids) - 1: -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()
        self.returned.append((ids, lp))
        return TokenOutput(token_ids=ids, log_probs=lp, stop_reason="completed")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cuda_agent.core.policies.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.fixture
def episodes(tmp_path):
    scored = []
    factory = EpisodeFactory([Task(id="axpby", source="test", code=EXAMPLE)],
                             options=EpisodeOptions(backend="cpu", max_turns=3, tools=["bash", "read"],
                                                    workdir=str(tmp_path / "ws")),
                             on_end=lambda ep, traj: scored.append(traj.reward))
    use_episodes(factory)
    yield factory, scored
    use_episodes(None)
    factory.close()


def _loop(tokenizer, server, response_length=2048):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 16384,
                                                                 "response_length": response_length}},
                               "data": {}, "cuda_agent": {}})
    return CudaAgentLoop(DictConfigWrap(config), server, tokenizer, None, None, DictConfigWrap(config.data))


def _run(loop, **kwargs):
    import asyncio

    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    return asyncio.run(loop.run(sampling, **kwargs))


def test_registered_with_verl():
    assert _agent_loop_registry[AGENT_NAME] == {"_target_": "cuda_agent_verl.agent_loop.CudaAgentLoop"}


def test_episode_tokens_mask_logprobs_and_reward(tiny, episodes):
    tok, model = tiny
    factory, scored = episodes
    turns = [format_tool_call("bash", {"command": COPY}) + "<|im_end|>",
             "Reading it back.\n" + format_tool_call("read", {"path": "kernels/axpby.cpp"})
             + format_tool_call("nvcc_magic", {}) + "<|im_end|>",
             "The example kernel is in place.\nDONE<|im_end|>"]
    server = ScriptedTokenServer(tok, model, turns)
    out = _run(_loop(tok, server), extra_info={"task_id": "axpby"}, raw_prompt=[])
    assert out.extra_fields["finish_reason"] == "done" and out.extra_fields["tool_calls"] == 3
    assert out.extra_fields["tool_errors"] == 1  # the unknown tool: an error the model read, not a crash
    # the judge's reward is verl's reward_score
    assert scored and out.reward_score == scored[-1].value
    assert scored[-1].raw.get("verify_message", "").startswith("correct")
    # token-exact: the model's tokens (mask 1, the server's log-probs) then tool outputs (mask 0, log-prob 0)
    n_model = sum(len(ids) for ids, _ in server.returned)
    assert sum(out.response_mask) == n_model and len(out.response_ids) == len(out.response_mask)
    model_lp = [lp for m, lp in zip(out.response_mask, out.response_logprobs) if m == 1]
    assert model_lp == pytest.approx([x for _, lps in server.returned for x in lps])
    assert all(lp == 0.0 for m, lp in zip(out.response_mask, out.response_logprobs) if m == 0)
    first = server.returned[0][0]
    start = out.response_ids.index(first[0])
    assert out.response_ids[start:start + len(first)] == first
    tool_text = tok.decode([i for i, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert "extern \"C\"" in tool_text and "unknown tool 'nvcc_magic'" in tool_text
    assert len({r["request_id"] for r in server.requests}) == 1  # one sticky session per episode
    # verl's own conversion to tensors
    d = out.as_dict()
    assert d["rm_scores"][-1].item() == out.reward_score and d["responses"].shape == d["response_mask"].shape
    fresh = factory.open("axpby")
    assert out.prompt_ids == render_prompt_ids(tok, fresh.stepper.messages, fresh.stepper.schemas)
    fresh.close()


def test_turn_limit_and_response_length_end_the_episode_cleanly(tiny, episodes):
    tok, model = tiny
    _, scored = episodes
    chatter = [format_tool_call("bash", {"command": "echo " + "x" * 40}) + "<|im_end|>"] * 10
    out = _run(_loop(tok, ScriptedTokenServer(tok, model, chatter)), task_id="axpby", raw_prompt=[])
    assert out.extra_fields["finish_reason"] == "max_turns" and out.reward_score == -1.0
    # a response budget smaller than the episode: cut to response_length, ended by the context budget
    out = _run(_loop(tok, ScriptedTokenServer(tok, model, chatter), response_length=60), task_id="axpby",
               raw_prompt=[])
    assert len(out.response_ids) <= 60 and out.extra_fields["finish_reason"] == "context"
    assert out.reward_score is not None
    with pytest.raises(Exception, match="no task_id"):
        _run(_loop(tok, ScriptedTokenServer(tok, model, [])), raw_prompt=[])
