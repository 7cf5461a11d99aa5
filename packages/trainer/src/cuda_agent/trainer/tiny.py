"""Tiny offline models and tokenizers: random weights from a config, a tokenizer trained in-process.

Used by the tests, the toy run and the GPU proof; no hub access is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
            "</tool_response>"]


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 2000, extra_tokens: Iterable[str] = ()):
    """A byte-level BPE tokenizer trained on ``texts``, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    extra = [t for t in extra_tokens if t not in fast.get_vocab()]
    if extra:
        fast.add_tokens(extra)
    fast.chat_template = CHATML_TEMPLATE
    return fast


def default_corpus() -> list[str]:
    """Text to train a small tokenizer on: Python source and docs shipped with the installed packages."""
    import cuda_agent.core as core
    import cuda_agent.trainer as trainer

    texts = []
    for pkg in (core, trainer):
        for p in sorted(Path(pkg.__file__).parent.rglob("*.py")):
            texts.append(p.read_text(errors="ignore"))
    texts.append("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                 '<tool_call>\n{"name": "bash", "arguments": {"command": "python tools/verify.py"}}\n</tool_call>\n')
    return texts


def build_tiny_causal_lm(out_dir: str | Path | None = None, tokenizer=None, hidden_size: int = 64,
                         num_layers: int = 2, num_heads: int = 4, num_kv_heads: int | None = None,
                         intermediate_size: int | None = None, max_position_embeddings: int = 4096,
                         vocab_size: int | None = None, seed: int = 0, arch: str = "qwen2",
                         tie_word_embeddings: bool = False):
    """A random-weight causal LM (Qwen2 or Llama layout); saved with its tokenizer when ``out_dir`` is set.

    Returns ``(model, tokenizer)``.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    if tokenizer is None:
        tokenizer = train_bpe_tokenizer(default_corpus(), vocab_size=1000)
    vocab = vocab_size or len(tokenizer)
    vocab = ((vocab + 63) // 64) * 64
    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch]
    cfg = cls(vocab_size=vocab, hidden_size=hidden_size, num_hidden_layers=num_layers,
              num_attention_heads=num_heads, num_key_value_heads=num_kv_heads or num_heads,
              intermediate_size=intermediate_size or 4 * hidden_size,
              max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings,
              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return model, tokenizer
