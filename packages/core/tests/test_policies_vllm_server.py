"""The ``vllm_server`` policy over real HTTP on loopback.

The server is :mod:`cuda_agent.core.policies.hf_server` on the tiny offline model: it speaks
the token-level part of vLLM's API and loads weights through the same worker extension a
vLLM server is started with. Real ``vllm serve`` processes: ``packages/trainer/tests/test_vllm_servers.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cuda_agent.core.agent.loop import PolicyError  # noqa: E402
from cuda_agent.core.errors import ConfigError  # noqa: E402
from cuda_agent.core.policies.hf import HFPolicy  # noqa: E402
from cuda_agent.core.policies.hf_server import HFTokenServer  # noqa: E402
from cuda_agent.core.policies.tiny import build_tiny_model  # noqa: E402
from cuda_agent.core.policies.vllm_server import VLLMServerPolicy, parse_completion  # noqa: E402
from cuda_agent.core.policies.weight_sync import read_weights, write_weights  # noqa: E402

PROMPT = "<|im_start|>user\nwrite a kernel<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture()
def server(tiny):
    with HFTokenServer(str(tiny)) as s:
        yield s


def client(tiny, urls, tmp_path, **kw) -> VLLMServerPolicy:
    return VLLMServerPolicy(VLLMServerPolicy.Options(base_urls=urls, model=str(tiny), max_retries=1, backoff=0.05,
                                                     weight_sync_dir=str(tmp_path / "sync"), **kw))


def run(coro):
    import asyncio

    return asyncio.run(coro)


def test_token_ids_and_logprobs_match_the_model(server, tiny, tmp_path):
    pol = client(tiny, [server.url], tmp_path)
    prompt = pol.tokenizer.encode(PROMPT, add_special_tokens=False)
    ids, lps, reason = run(pol.generate(prompt, {"max_tokens": 12, "temperature": 1.0}))
    assert 0 < len(ids) <= 12 and len(lps) == len(ids) and reason in ("stop", "length")
    assert reason == "length" or ids[-1] in pol.stop_ids
    # the trainer's recomputation of the same tokens: identical weights give identical log-probs
    ref = HFPolicy(HFPolicy.Options(model=str(tiny)))
    assert ref.score(prompt + ids, len(prompt), temperature=1.0) == pytest.approx(lps, abs=1e-4)
    assert server.stats["completions"] == 1


def test_weight_update_reaches_the_server(server, tiny, tmp_path):
    pol = client(tiny, [server.url], tmp_path)
    prompt = pol.tokenizer.encode(PROMPT, add_special_tokens=False)
    trained = HFPolicy(HFPolicy.Options(model=str(tiny)))
    with torch.no_grad():
        for p in trained.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    before = run(pol.generate(prompt, {"max_tokens": 8, "temperature": 1.0}))
    assert trained.score(prompt + before[0], len(prompt), 1.0) != pytest.approx(before[1], abs=1e-3)
    n = pol.update_weights(iter(trained.model.state_dict().items()))
    assert n == len(trained.model.state_dict())
    assert server.stats["weight_loads"] == 1 and server.stats["prefix_cache_resets"] == 1
    served = dict(server.policy.model.state_dict())
    for name, t in trained.model.state_dict().items():
        assert torch.equal(served[name], t), name
    ids, lps, _ = run(pol.generate(prompt, {"max_tokens": 8, "temperature": 1.0}))
    assert trained.score(prompt + ids, len(prompt), 1.0) == pytest.approx(lps, abs=1e-4)
    # versions on disk: the newest two stay
    for _ in range(3):
        pol.update_weights(iter(trained.model.state_dict().items()))
    assert sorted(p.name for p in (tmp_path / "sync").glob("*.safetensors")) == [
        "weights-000003.safetensors", "weights-000004.safetensors"]


def test_episodes_stick_to_one_of_several_servers(tiny, tmp_path):
    with HFTokenServer(str(tiny)) as a, HFTokenServer(str(tiny)) as b:
        pol = client(tiny, [a.url, b.url], tmp_path)
        prompts = [pol.tokenizer.encode(f"<|im_start|>user\ntask {i}<|im_end|>\n", add_special_tokens=False)
                   for i in range(12)]
        chosen = {pol.server_for(p) for p in prompts}
        assert chosen == {a.url, b.url}
        for p in prompts[:4]:  # a later turn of the same episode (a longer prompt) goes to the same server
            assert pol.server_for(p) == pol.server_for(p + [5, 6, 7])
        trained = HFPolicy(HFPolicy.Options(model=str(tiny)))
        with torch.no_grad():
            next(trained.model.parameters()).mul_(1.5)
        pol.update_weights(iter(trained.model.state_dict().items()))
        assert a.stats["weight_loads"] == b.stats["weight_loads"] == 1


def test_episodes_sharing_a_long_system_prompt_spread_over_servers(tiny, tmp_path):
    pol = client(tiny, ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"], tmp_path)
    head = [3 + i % 500 for i in range(1200)]  # one system prompt, longer than any fixed head of the prompt
    firsts = [head + [600 + i, 601] for i in range(6)]
    chosen = [pol.server_for(p) for p in firsts]
    assert chosen.count(pol.base_urls[0]) == chosen.count(pol.base_urls[1]) == 3
    for p, url in zip(firsts, chosen):  # a later turn: the episode's ids and more
        assert pol.server_for(p + [7, 8, 9] * 40) == url
    assert pol.server_for(head[:700]) in pol.base_urls  # a prompt no episode started with: a new episode


def test_clear_errors(tiny, tmp_path):
    with pytest.raises(ConfigError, match="base_urls"):
        VLLMServerPolicy(VLLMServerPolicy.Options(base_urls=["localhost:8000"], model=str(tiny)))
    with pytest.raises(ConfigError, match="tokenizer"):
        VLLMServerPolicy(VLLMServerPolicy.Options(model=""))
    # nothing listens: the URL is named, after the retries
    pol = client(tiny, ["http://127.0.0.1:9/v1"], tmp_path, served_model_name="m")
    with pytest.raises(PolicyError, match="127.0.0.1:9"):
        run(pol.generate([1, 2, 3], {"max_tokens": 2}))
    with pytest.raises(PolicyError, match="token ids but"):
        parse_completion({"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [0.0]}}]}, "srv")
    with pytest.raises(PolicyError, match="no choices"):
        parse_completion({"error": "x"}, "srv")
    assert parse_completion({"choices": [{"logprobs": {"tokens": ["token_id:7", "token_id:9"],
                                                       "token_logprobs": [-0.5, -1.5]},
                                          "finish_reason": "stop"}]}) == ([7, 9], [-0.5, -1.5], "stop")


def test_server_without_weight_sync_is_named(tiny, tmp_path):
    # an OpenAI-compatible server without the dev endpoints: the message says how to start vLLM
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    class NoRPC(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.send_response(404)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NoRPC)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        pol = client(tiny, [f"http://127.0.0.1:{httpd.server_address[1]}/v1"], tmp_path, served_model_name="m")
        with pytest.raises(PolicyError, match="VLLM_SERVER_DEV_MODE=1"):
            pol.update_weights(iter({"w": torch.zeros(2)}.items()))
    finally:
        httpd.shutdown()


def test_weight_files_round_trip_tied_weights(tmp_path):
    shared = torch.randn(4, 3)
    path = write_weights([("embed.weight", shared), ("lm_head.weight", shared), ("b", torch.ones(2))], tmp_path, 1)
    got = dict(read_weights(path))
    assert set(got) == {"embed.weight", "lm_head.weight", "b"}
    assert torch.equal(got["lm_head.weight"], shared) and torch.equal(got["b"], torch.ones(2))
    with pytest.raises(ValueError, match="no weights"):
        write_weights([], tmp_path, 2)


def test_config_fragment_composes_into_a_working_policy(server, tiny):
    """configs/vllm-servers.yaml on top of the paper's run config builds this policy."""
    from pathlib import Path

    from cuda_agent.core.config import compose
    from cuda_agent.core.plugins import get_plugin_manager

    repo = Path(__file__).resolve().parents[3]
    cfg = compose([repo / "configs" / "paper.yaml", repo / "configs" / "vllm-servers.yaml"],
                  [f"policy.options.model={tiny}", f"policy.options.base_urls=[{server.url}]"])
    assert cfg.trainer.rollout.engine == "policy"
    pol = get_plugin_manager().create("policy", cfg.policy, where="policy")
    assert isinstance(pol, VLLMServerPolicy) and pol.base_urls == [server.url]
    ids, lps, _ = run(pol.generate(pol.tokenizer.encode(PROMPT, add_special_tokens=False), {"max_tokens": 4}))
    assert len(ids) == len(lps) > 0
