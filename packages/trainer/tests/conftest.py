import pytest
import torch

# the suite runs beside other work on two cores: one thread per test process avoids oversubscription
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory):
    """A tiny random Qwen2 model with the toy environment's word-level tokenizer."""
    from cuda_agent.trainer.envs.toy import build_toy_tokenizer
    from cuda_agent.trainer.tiny import build_tiny_causal_lm

    out = tmp_path_factory.mktemp("toy_model")
    build_tiny_causal_lm(out, tokenizer=build_toy_tokenizer(), hidden_size=32, num_layers=2, num_heads=2,
                         intermediate_size=64, max_position_embeddings=256)
    return out
