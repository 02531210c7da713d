"""Tiny models with a real (trained-in-process) tokenizer, saved as HF directories.

Random-weight models whose greedy output is varied and depends on the whole context (a model that
repeats one token whatever it reads cannot expose a cache, rollback, position or window bug), and
one trained for a few seconds on the corpus, which continues corpus text: its output copies its
context, so n-gram drafts get accepted as well as rejected. `assert_alive` checks a model is so.
"""

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
CHATML_TEMPLATE = (  # SmolLM2-135M-Instruct's chat template, as its tokenizer ships it
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


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


def chatml_tokenizer() -> PreTrainedTokenizerFast:
    """The test tokenizer with ChatML's control tokens added and a real ChatML template (for tokenizer tests only:
    its two extra ids lie beyond the tiny models' vocabulary)."""
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


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
        tie_word_embeddings=False,  # tied, the random model's output is its input token, repeated
    )
    fields.update(overrides)
    return Gemma3TextConfig(**fields)


def save_tiny_model(directory: Path, config, seed: int = 0, train_steps: int = 0) -> Path:
    """Random weights from `config` (trained `train_steps` steps on the corpus) plus the test tokenizer."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if train_steps:
        train_on_corpus(model, build_tokenizer(config.vocab_size), train_steps, seed)
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(directory, safe_serialization=True)
    build_tokenizer(config.vocab_size).save_pretrained(directory)
    return directory


def train_on_corpus(model, tokenizer, steps: int, seed: int, window: int = 48) -> None:
    """Adam on random windows of the corpus, repeated: a model that continues the corpus's text."""
    ids = torch.tensor(tokenizer("\n".join(CORPUS * 2))["input_ids"])  # [tokens]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - window, (8,), generator=generator)
        batch = torch.stack([ids[start : start + window] for start in starts])  # [8, window]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


ALIVE_PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):", "café 東京"]


def assert_alive(model, tokens: int = 24, min_distinct: int = 12) -> None:
    """Greedy outputs of a LoadedModel's runner on ALIVE_PROMPTS: each varied, and all different."""
    outputs = []
    for prompt in ALIVE_PROMPTS:
        ids = model.tokenizer(prompt)["input_ids"]
        logits = model.runner.prefill(ids)
        generated = []
        for _ in range(tokens):
            generated.append(int(logits.argmax()))
            logits = model.runner.forward(generated[-1:])[-1]
        outputs.append(tuple(generated))
        assert len(set(generated)) >= min_distinct, f"{model.info.name} repeats itself on {prompt!r}: {generated}"
    assert len(set(outputs)) == len(outputs), f"{model.info.name} writes the same whatever the prompt"
