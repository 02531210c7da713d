"""Native runtime vs transformers on the built-in pretrained models (float32).

Logits must agree within 1e-3 on random prompts, including one longer than Gemma's 512-token
sliding window. Greedy decoding of 64 tokens on 20 prompts must be identical; where a token
differs, transformers' own top-2 logits at that position must be a numerical tie (gap below
TIE_GAP), and the comparison stops there since the continuations diverge. Speculative greedy
decoding (prompt-lookup drafts, verification forwards, rollbacks) must equal 1-token decoding
exactly with int8 weights and with the GGUF's own 4-bit blocks, whose kernels are bit-identical across
batch sizes. float32 and bfloat16
promise no such thing (their matrix products round differently for different row counts), so no
test forgives their flips: `quickdraft bench --dtype bfloat16` measures how often they differ.
"""

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, DynamicCache

from quickdraft.models.native import native_runner_for
from quickdraft.models.store import converted_from

pytestmark = pytest.mark.real_model

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
FP32_TOL = 1e-3
TIE_GAP = 1e-3  # a top-2 gap this small can flip under float32 reassociation (our logits differ by ~1e-4)
GREEDY_TOKENS = 64
PROMPTS = (
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
    "Translate to French: Good morning, how are you?",
    "List five fruits:\n1.",
    "In 1969, astronauts",
    "import numpy as np\nx = np.arange(10)\n",
    "Q: What is 17 times 23?\nA:",
    "The best way to learn a language is",
    "Photosynthesis converts",
    "Dear hiring manager,\n",
    "SELECT name, age FROM users WHERE",
    "Summarise: The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "The mitochondria is",
    "Here is a recipe for pancakes:",
    "<html>\n<head>\n<title>",
    "Rain rain go away,",
    "Explain recursion to a child.",
)


@pytest.fixture(scope="module", params=MODELS)
def real(request, builtin_model_dir):
    """(directory, transformers float32 model, native float32 runner) for one built-in model."""
    path = builtin_model_dir(request.param)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, native_runner_for(path, "float32", "cpu")


def _hf_greedy(model, prompt, steps):
    """transformers greedy tokens and each step's logits top-2 gap."""
    cache, tokens, gaps, ids = DynamicCache(config=model.config), [], [], prompt
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            top2 = logits.topk(2).values
            tokens.append(int(logits.argmax()))
            gaps.append(float(top2[0] - top2[1]))
            ids = [tokens[-1]]
    return tokens, gaps


def _native_greedy(runner, prompt, steps):
    tokens = [int(runner.prefill(prompt).argmax())]
    while len(tokens) < steps:
        tokens.append(int(runner.forward([tokens[-1]])[0].argmax()))
    return tokens


@pytest.mark.parametrize("length", [7, 100, 600])
def test_logits_match_transformers(real, length):
    _, model, runner = real
    ids = torch.randint(0, runner.info.vocab_size, (length + 4,), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        reference = model(ids[None], logits_to_keep=5).logits[0]  # [5, vocab]: positions length-1 .. length+3
    assert (runner.prefill(ids[:length].tolist()) - reference[0]).abs().max().item() <= FP32_TOL
    assert (runner.forward(ids[length:].tolist()) - reference[1:]).abs().max().item() <= FP32_TOL


def test_greedy_matches_transformers(real):
    path, model, runner = real
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt).ids
        expected, gaps = _hf_greedy(model, ids, GREEDY_TOKENS)
        got = _native_greedy(runner, ids, GREEDY_TOKENS)
        first = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), None)
        if first is not None:
            assert gaps[first] < TIE_GAP, f"{prompt!r}: token {first} differs with top-2 gap {gaps[first]}"


def _lookup_draft(context, k):
    """Prompt lookup: the k tokens that followed the latest earlier occurrence of the last two tokens."""
    tail = context[-2:]
    for start in range(len(context) - 3, -1, -1):
        if context[start : start + 2] == tail:
            return context[start + 2 : start + 2 + k]
    return []


def _speculative(runner, prompt, steps, k=4):
    out = [int(runner.prefill(prompt).argmax())]
    while len(out) < steps:
        draft = _lookup_draft(prompt + out, k)
        base = runner.cache_length
        targets = runner.forward([out[-1]] + draft).argmax(dim=-1).tolist()
        accepted = next((i for i, (d, t) in enumerate(zip(draft, targets)) if d != t), len(draft))
        out.extend(targets[: accepted + 1])
        runner.rollback(base + accepted + 1)
    return out[:steps]


def _plain(runner, prompt, steps):
    """1-token greedy decoding."""
    tokens = [int(runner.prefill(prompt).argmax())]
    while len(tokens) < steps:
        tokens.append(int(runner.forward([tokens[-1]])[0].argmax()))
    return tokens


@pytest.mark.parametrize("dtype", ["int8", "gguf"])
def test_speculative_greedy_equals_target_alone_with_quantized_weights(real, dtype):
    path, _, _ = real
    runner = native_runner_for(path, dtype, "cpu", converted_from(path))
    if dtype == "gguf":  # both built-in files store most layer matrices in 4-bit blocks (Q4_1; Q4_K)
        assert sum(linear.form == "int4" for linear in runner.linear_layers()) >= 27
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    for prompt in PROMPTS[:6]:
        ids = tokenizer.encode(prompt * 2).ids  # repeated text gives the lookup drafter matches
        assert _speculative(runner, ids, 48) == _plain(runner, ids, 48), prompt
