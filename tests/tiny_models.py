"""Tiny random-weight models with a real (trained-in-process) tokenizer, saved as HF directories."""

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "Speculative decoding drafts tokens and the target verifies them in one pass.",
    "Once upon a time there was a small model that wanted to be fast.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "Ünïcödé text: café, naïve, 東京, emoji 🙂 and more.",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<bos>", "<eos>", "<pad>", "<|end|>"]


def build_tokenizer(vocab_size: int = 320, corpus: list[str] = CORPUS) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama_config(vocab_size: int, **overrides) -> LlamaConfig:
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def gemma3_config(vocab_size: int, **overrides) -> Gemma3TextConfig:
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        initializer_range=0.3,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    fields.update(overrides)
    return Gemma3TextConfig(**fields)


def save_tiny_model(directory: Path, config, seed: int = 0) -> Path:
    """Random weights from `config` plus the test tokenizer, saved as safetensors."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(directory, safe_serialization=True)
    build_tokenizer(config.vocab_size).save_pretrained(directory)
    return directory
