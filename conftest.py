"""Test-suite wide settings: no third-party plugin autoload; GPU and extra markers."""

from __future__ import annotations

import importlib.util
import os

os.environ["CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ.pop("CUDA_AGENT_PLUGINS", None)

import pytest  # noqa: E402


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the GPU machine)")
    config.addinivalue_line("markers", "vllm: needs the optional vllm extra")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def pytest_collection_modifyitems(config, items):
    cuda = _has_cuda()
    vllm = importlib.util.find_spec("vllm") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_vllm = pytest.mark.skip(reason="needs vLLM (bash scripts/install_vllm.sh)")
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(skip_gpu)
        if "vllm" in item.keywords and not vllm:
            item.add_marker(skip_vllm)


@pytest.fixture(scope="session")
def vllm_tiny_model(tmp_path_factory):
    """The one tiny model of every ``vllm`` test: a random Qwen2 with head size 64 (vLLM's CPU
    attention refuses 16) and its in-process tokenizer. Tests that use it are marked
    ``xdist_group("vllm")`` so that they share one worker and never start engines side by side."""
    from cuda_agent.core.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm-tiny") / "model", hidden_size=128, num_heads=2)
