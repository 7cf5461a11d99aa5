"""Tiny offline chat models for tests: a random-weight Qwen2 and a BPE tokenizer trained in-process.

``build_tiny_model(dest)`` writes a folder that ``transformers`` (and vLLM) load like any
model: config + weights + a ByteLevel BPE tokenizer with the ChatML special tokens
(``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``), the Hermes tool tags as added tokens,
and a ChatML chat template with tools (Qwen2.5 layout). Takes a few seconds on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}"
    "{{ '\\n\\n' }}# Tools\n\nYou may call one or more functions. Function signatures are within <tools></tools>:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for tc in message.tool_calls or [] %}"
    "{% if (message.content or '') or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\":"
    "{% if tc.function.arguments is string %} {{ tc.function.arguments }}{% else %} {{ tc.function.arguments | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "You are an expert performance engineer working in a workspace folder through tools.",
    "Read model.py, write kernels/fused.cpp and model_new.py, compile, verify and profile.",
    "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x) * 2.0\n",
    'def get_inputs():\n    return [torch.randn(1024, 1024)]\n\ndef get_init_inputs():\n    return []\n',
    '{"name": "bash", "arguments": {"command": "python tools/compile.py"}}',
    '{"name": "read", "arguments": {"path": "model.py"}}',
    '{"name": "write", "arguments": {"path": "model_new.py", "content": "..."}}',
    "extern \"C\" void fused(const float* x, float* y, long n) {\n#pragma omp parallel for\n  for (long i = 0; i < n; ++i) y[i] = x[i] > 0 ? 2 * x[i] : 0;\n}\n",
    "compile ok. verify: 5/5 inputs match (max abs err 0.0). profile: 3.1x faster than eager, 1.2x than compile.",
    "The quick brown fox jumps over the lazy dog. 0123456789 (){}[]<>:;,.!?\"'`~@#$%^&*-_=+/\\|",
    "DONE",
]


def train_tokenizer(vocab_size: int = 800):
    """A ByteLevel BPE ``PreTrainedTokenizerFast`` trained on a small built-in corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(TOOL_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    dest: str | Path,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 16384,
    vocab_size: int = 800,
    seed: int = 0,
) -> Path:
    """Write a random-weight Qwen2 causal LM and its tokenizer to ``dest``; returns ``dest``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    (dest / "cuda_agent_tiny.json").write_text(json.dumps({"hidden_size": hidden_size, "layers": num_layers, "seed": seed}))
    return dest
