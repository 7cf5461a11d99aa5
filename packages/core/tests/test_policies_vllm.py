"""The vllm policy on the tiny offline model (needs the optional vllm extra)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_vllm_policy_token_level(tmp_path):
    pytest.importorskip("vllm")
    from cuda_agent.core.policies.hf import HFPolicy
    from cuda_agent.core.policies.tiny import build_tiny_model
    from cuda_agent.core.policies.vllm import VLLMPolicy

    path = build_tiny_model(tmp_path / "tiny")
    pol = VLLMPolicy(VLLMPolicy.Options(model=str(path), max_model_len=4096, gpu_memory_utilization=0.2))
    prompt = pol.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    ids, lps, reason = pol.generate(prompt, {"max_tokens": 16, "temperature": 1.0})
    assert len(ids) == len(lps) > 0 and reason in ("stop", "length")
    ref = HFPolicy(HFPolicy.Options(model=str(path)))
    assert ref.score(prompt + ids, len(prompt), temperature=1.0) == pytest.approx(lps, abs=2e-2)
